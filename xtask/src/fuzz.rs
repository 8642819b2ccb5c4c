//! `cargo xtask fuzz [--secs N] [TARGET...]`: the cargo-fuzz targets in `fuzz/` (libFuzzer with
//! AddressSanitizer, nightly), each for N seconds. The corpus grows in `target/fuzz/corpus/`
//! across runs; a crash leaves its input in `target/fuzz/artifacts/TARGET/` and fails the run
//! (replay it with `cargo fuzz run TARGET FILE` in `fuzz/`, then make it a regression test).
use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::SystemTime,
};

use anyhow::{Context, Result, bail};

use crate::setup::NIGHTLY;

/// Every target, cheapest first.
pub const TARGETS: [&str; 6] = [
    "cli_values",
    "proc_stat",
    "proc_files",
    "decode",
    "btf",
    "audit",
];

/// cargo-fuzz, installed from crates.io when missing.
fn ensure_cargo_fuzz() -> Result<()> {
    let have = Command::new("cargo")
        .args(["fuzz", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if have {
        return Ok(());
    }
    eprintln!("xtask: installing cargo-fuzz (cargo install cargo-fuzz --locked, about a minute)");
    let ok = Command::new("cargo")
        .args(["install", "cargo-fuzz", "--locked"])
        .status()
        .context("running cargo install")?
        .success();
    if !ok {
        bail!("installing cargo-fuzz failed: try `cargo install cargo-fuzz --locked`");
    }
    Ok(())
}

/// A target that crashed, and the input it crashed on when libFuzzer left one.
pub struct Crash {
    pub target: String,
    pub input: Option<Artifact>,
}

/// An input libFuzzer wrote (`crash-…`, `oom-…`, `timeout-…`, `leak-…`), read once.
pub struct Artifact {
    path: PathBuf,
    bytes: Vec<u8>,
}

impl Crash {
    /// What the run's closing lines say of it: the input itself, escaped, as a CI log is
    /// all that outlives a clean clone's `target/`.
    pub fn said(&self) -> String {
        let Some(Artifact { path, bytes }) = &self.input else {
            return "crashed, and left no input in target/fuzz/artifacts/".to_owned();
        };
        let shown = bytes.iter().take(INPUT_SHOWN).copied();
        let more = match bytes.len() > INPUT_SHOWN {
            true => format!(" (the first {INPUT_SHOWN} of {} bytes)", bytes.len()),
            false => String::new(),
        };
        format!(
            "crashed on b\"{}\"{more}: {} (replay: cd fuzz && cargo fuzz run {} FILE)",
            shown
                .flat_map(std::ascii::escape_default)
                .map(char::from)
                .collect::<String>(),
            path.display(),
            self.target
        )
    }
}

/// How much of a crashing input the closing lines show.
const INPUT_SHOWN: usize = 200;

/// The newest artifact libFuzzer wrote in `dir` since `since`.
fn artifact_since(dir: &Path, since: SystemTime) -> Option<Artifact> {
    fs::read_dir(dir)
        .ok()?
        .filter_map(|e| {
            let e = e.ok()?;
            let modified = e.metadata().ok()?.modified().ok()?;
            (modified >= since).then(|| (modified, e.path()))
        })
        .max()
        .map(|(_, path)| Artifact {
            bytes: fs::read(&path).unwrap_or_default(),
            path,
        })
}

/// Runs `targets` for `secs` seconds each; returns the clean targets' names and the crashes.
pub fn run(root: &Path, secs: u64, targets: &[String]) -> Result<(Vec<String>, Vec<Crash>)> {
    ensure_cargo_fuzz()?;
    for t in targets {
        if !TARGETS.contains(&t.as_str()) {
            bail!("no fuzz target `{t}` (targets: {})", TARGETS.join(", "));
        }
    }
    // Built once, then the targets run two at a time: each libFuzzer run is one process on
    // one core, and these machines have two.
    let built = Command::new("rustup")
        .args(["run", NIGHTLY, "cargo", "fuzz", "build"])
        .current_dir(root.join("fuzz"))
        .status()
        .context("running cargo fuzz build")?;
    if !built.success() {
        bail!("`cargo fuzz build` failed ({built})");
    }
    let (mut clean, mut crashed) = (Vec::new(), Vec::new());
    for pair in targets.chunks(2) {
        let started = SystemTime::now();
        let mut running = Vec::new();
        for target in pair {
            let corpus = root.join("target/fuzz/corpus").join(target);
            let artifacts = root.join("target/fuzz/artifacts").join(target);
            fs::create_dir_all(&corpus)?;
            fs::create_dir_all(&artifacts)?;
            eprintln!("xtask: fuzzing {target} for {secs} s");
            let child = Command::new("rustup")
                .args(["run", NIGHTLY, "cargo", "fuzz", "run", target])
                .arg(&corpus)
                .arg("--")
                .arg(format!("-max_total_time={secs}"))
                .arg(format!("-artifact_prefix={}/", artifacts.display()))
                .args(["-rss_limit_mb=2048", "-print_final_stats=1"])
                .current_dir(root.join("fuzz"))
                .spawn()
                .with_context(|| format!("running cargo fuzz on {target}"))?;
            running.push((target, artifacts, child));
        }
        for (target, artifacts, mut child) in running {
            match child.wait()?.success() {
                true => clean.push(target.clone()),
                false => crashed.push(Crash {
                    target: target.clone(),
                    input: artifact_since(&artifacts, started),
                }),
            }
        }
    }
    println!(
        "fuzz: {} targets for {secs} s each: {} clean{}",
        targets.len(),
        clean.len(),
        match crashed.is_empty() {
            true => String::new(),
            false => format!(", {} CRASHED", crashed.len()),
        }
    );
    for crash in &crashed {
        println!("fuzz target {}: {}", crash.target, crash.said());
    }
    Ok((clean, crashed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_crash_shows_the_input_this_run_left_escaped() {
        let dir = std::env::temp_dir().join(format!("xtask-fuzz-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let old = dir.join("crash-old");
        fs::write(&old, b"from an earlier run").unwrap();
        let since = SystemTime::now() + std::time::Duration::from_secs(1);
        let new = dir.join("crash-new");
        fs::write(&new, b"9s 1000ms\n\xff").unwrap();
        let file = fs::File::options().write(true).open(&new).unwrap();
        file.set_modified(since).unwrap();
        let crash = Crash {
            target: "cli_values".into(),
            input: artifact_since(&dir, since),
        };
        let said = crash.said();
        fs::remove_dir_all(&dir).unwrap();
        assert!(
            said.starts_with(r#"crashed on b"9s 1000ms\n\xff": "#),
            "{said}"
        );
        assert!(said.contains("crash-new") && said.contains("cargo fuzz run cli_values"));
        let none = Crash {
            target: "cli_values".into(),
            input: artifact_since(Path::new("/nonexistent"), since),
        };
        assert!(none.said().contains("left no input"));
    }
}
