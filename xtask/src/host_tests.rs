//! The workspace's tests on this host: all of them through `cargo test`, or (`cargo xtask test
//! --reverse`) each test on its own, one at a time, in reverse name order, which shows a test
//! that passes only because another ran before it (a mount it made, a file it left).
use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::tally::Tally;

/// The order the tests run in.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// `cargo test`'s: the binaries one after another, two tests at a time within each.
    Cargo,
    /// The binaries in reverse name order, and within each its tests in reverse name order,
    /// one test per run of the binary (`--exact`), one at a time. Doc tests are left out.
    Reverse,
}

/// Runs the tests with `env` and the test-binary `filters` (`--skip ...`); returns what they
/// came to.
pub fn run(
    root: &Path,
    env: &[(&str, std::ffi::OsString)],
    filters: &[&str],
    order: Order,
) -> Result<Tally> {
    match order {
        Order::Cargo => {
            // Every test binary runs, whatever an earlier one found.
            let mut cargo = Command::new(cargo_program());
            cargo
                .args(["test", "--no-fail-fast", "--", "--test-threads=2"])
                .args(filters)
                .envs(env.iter().map(|(k, v)| (k, v)))
                .current_dir(root);
            let (tally, ok) = counted(&mut cargo)?;
            if !ok && tally.failed == 0 {
                bail!("`cargo test` failed");
            }
            Ok(tally)
        }
        Order::Reverse => reverse(root, env, filters),
    }
}

/// The sockets in /run/reaper-trace nobody listens on: left by a run that was killed.
pub fn dead_api_sockets() -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir("/run/reaper-trace") else {
        return Vec::new();
    };
    let mut dead: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "sock"))
        .filter(|p| std::os::unix::net::UnixStream::connect(p).is_err())
        .collect();
    dead.sort();
    dead
}

fn cargo_program() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

/// Runs `cmd`, passing its output through; returns what its tests came to and whether it
/// succeeded.
fn counted(cmd: &mut Command) -> Result<(Tally, bool)> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {cmd:?}"))?;
    let mut tally = Tally::default();
    for line in BufReader::new(child.stdout.take().context("test stdout")?).lines() {
        let line = line?;
        println!("{line}");
        tally.read(&line);
    }
    Ok((tally, child.wait()?.success()))
}

/// A test executable cargo built, and the folder cargo runs it in (its package's).
pub struct TestBinary {
    /// Its package and target, as a sort key.
    pub name: String,
    /// Its target's name (`lineage`) and kind (`test` for an integration test).
    pub target: String,
    pub kind: String,
    pub exe: PathBuf,
    pub dir: PathBuf,
}

/// The test executables `cargo test ARGS` builds (`args`: a profile, packages, targets;
/// `env`: cargo's environment for them, see `Arch::cargo_env`).
pub fn test_binaries(
    root: &Path,
    args: &[&str],
    env: &[(String, String)],
) -> Result<Vec<TestBinary>> {
    let out = Command::new(cargo_program())
        .args(["test", "--no-run", "--message-format=json"])
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .current_dir(root)
        .stderr(Stdio::inherit())
        .output()
        .context("building the tests")?;
    if !out.status.success() {
        bail!("building the tests failed ({})", out.status);
    }
    let mut binaries = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if v["reason"] != "compiler-artifact" || v["profile"]["test"] != true {
            continue;
        }
        let (Some(exe), Some(manifest)) = (v["executable"].as_str(), v["manifest_path"].as_str())
        else {
            continue;
        };
        let package = v["package_id"].as_str().unwrap_or("");
        let target = v["target"]["name"].as_str().unwrap_or("").to_owned();
        binaries.push(TestBinary {
            name: format!("{package} {target}"),
            target,
            kind: v["target"]["kind"][0].as_str().unwrap_or("").to_owned(),
            exe: PathBuf::from(exe),
            dir: Path::new(manifest).parent().context("manifest dir")?.into(),
        });
    }
    Ok(binaries)
}

fn reverse(root: &Path, env: &[(&str, std::ffi::OsString)], filters: &[&str]) -> Result<Tally> {
    let mut binaries = test_binaries(root, &[], &[])?;
    binaries.sort_by(|a, b| b.name.cmp(&a.name));
    let mut tally = Tally::default();
    for binary in &binaries {
        let listed = Command::new(&binary.exe)
            .args(["--list", "--format", "terse"])
            .args(filters)
            .current_dir(&binary.dir)
            .output()
            .with_context(|| format!("listing {}", binary.exe.display()))?;
        let mut names: Vec<String> = String::from_utf8_lossy(&listed.stdout)
            .lines()
            .filter_map(|l| l.strip_suffix(": test"))
            .map(str::to_owned)
            .collect();
        names.sort_by(|a, b| b.cmp(a));
        for name in names {
            println!("reverse order: {} {name}", binary.name);
            let (one, _) = counted(
                Command::new(&binary.exe)
                    .args(["--exact", &name, "--test-threads=1"])
                    .envs(env.iter().map(|(k, v)| (k, v)))
                    .current_dir(&binary.dir),
            )?;
            tally.add(one);
        }
    }
    Ok(tally)
}
