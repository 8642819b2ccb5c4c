//! `cargo xtask fuzz [--secs N] [TARGET...]`: the cargo-fuzz targets in `fuzz/` (libFuzzer with
//! AddressSanitizer, nightly), each for N seconds. The corpus grows in `target/fuzz/corpus/`
//! across runs; a crash leaves its input in `target/fuzz/artifacts/TARGET/` and fails the run
//! (replay it with `cargo fuzz run TARGET FILE` in `fuzz/`, then make it a regression test).
use std::{
    fs,
    path::Path,
    process::{Command, Stdio},
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

/// Runs `targets` for `secs` seconds each; returns (clean, crashed) target names.
pub fn run(root: &Path, secs: u64, targets: &[String]) -> Result<(Vec<String>, Vec<String>)> {
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
            running.push((target, child));
        }
        for (target, mut child) in running {
            match child.wait()?.success() {
                true => clean.push(target.clone()),
                false => crashed.push(target.clone()),
            }
        }
    }
    println!(
        "fuzz: {} targets for {secs} s each: {} clean{}",
        targets.len(),
        clean.len(),
        match crashed.is_empty() {
            true => String::new(),
            false => format!(
                ", CRASHED: {} (inputs in target/fuzz/artifacts/)",
                crashed.join(", ")
            ),
        }
    );
    Ok((clean, crashed))
}
