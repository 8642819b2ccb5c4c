//! Runs of reaper-trace with `--state-dir` (the restart tests): started on a gateway pid,
//! ended once their checkpoint holds a process, the next one run until a proof holds, and the
//! state released.
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::Value;

use crate::*;

/// Starts `reaper-trace --quiet --state-dir STATE --output OUT --gateway-pid GW ARGS`.
pub fn kept_run(state: &Path, out: &Path, gw: u64, args: &[&str]) -> Child {
    Command::new(reaper_trace())
        // Ended by a signal, maybe SIGKILL: no API, whose socket it would leave behind.
        .args([
            "--quiet",
            "--api",
            "off",
            "--gateway-pid",
            &gw.to_string(),
            "--state-dir",
        ])
        .arg(state)
        .arg("--output")
        .arg(out)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("run reaper-trace")
}

/// Ends `run` with `signal` once the checkpoint in `state` holds `pid`.
pub fn end_once_checkpointed(mut run: Child, state: &Path, pid: u64, signal: i32) {
    wait_until("the checkpoint to hold the process", || {
        checkpointed(state).contains(&pid)
    });
    // SAFETY: a plain signal to the child this test started.
    unsafe { libc::kill(run.id() as i32, signal) };
    let status = run.wait().expect("wait for reaper-trace");
    assert!(
        signal == libc::SIGKILL || status.success(),
        "stopped cleanly: {status:?}"
    );
}

/// The next run on gateway `gw` with `state`, until `proof` holds; `release` is the file
/// that lets the gateway end.
pub fn run_kept_until(
    gw: u64,
    state: &Path,
    release: &Path,
    what: &str,
    proof: impl FnMut(&[Value]) -> bool,
) -> Run {
    let args = [
        "--gateway-pid",
        &gw.to_string(),
        "--state-dir",
        state.to_str().unwrap(),
    ];
    run_reaper_until(&args, &[], release, (what, Then::Release), proof)
}

/// `reaper-trace --release-state STATE`, which must succeed.
pub fn release_state(state: &Path) {
    let released = Command::new(reaper_trace())
        .arg("--release-state")
        .arg(state)
        .output()
        .expect("run --release-state");
    assert!(released.status.success(), "{released:?}");
}

/// The events of an `--output` file.
pub fn stream(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

/// Where a state's kernel side is pinned, as its checkpoint says.
pub fn pin_dir(state: &Path) -> PathBuf {
    let checkpoint = read_json(&state.join("lineage.json"));
    let pins = checkpoint["kernel"]["pins"].as_str();
    PathBuf::from(pins.expect("a checkpoint written beside a kernel side"))
}

/// The pids the lineage checkpoint in `state` (a `--state-dir`) holds; none before the first.
pub fn checkpointed(state: &Path) -> Vec<u64> {
    let Ok(text) = std::fs::read(state.join("lineage.json")) else {
        return Vec::new();
    };
    let checkpoint: Value = serde_json::from_slice(&text).expect("a checkpoint is JSON");
    checkpoint["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|n| pid(&n["pid"]))
        .collect()
}

/// A restart test's scratch directory and the state directory in it; none when the test is
/// skipped (see [`require_root`]).
pub fn state_test(test: &str) -> Option<(PathBuf, PathBuf)> {
    if !require_root(test) {
        return None;
    }
    let dir = scratch(test);
    let state = dir.join("state");
    Some((dir, state))
}
