//! A run's lineage across its own restarts (`--state-dir`): a helper that escaped and was
//! reparented while no reaper-trace ran is still its gateway's descendant in the next run,
//! whether the run before was stopped (SIGTERM: the checkpoint written at the stop) or killed
//! (SIGKILL: the one written every second). Needs root (see `require_root`).
use std::{
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use reaper_tests::{
    OrphanLater, Then, checkpointed, flag, patience, pid, reaper_trace, require_root,
    run_reaper_until, scratch, wait_until,
};
use serde_json::Value;

/// The first run: traces the gateway `gw` until its checkpoint holds `helper`, then is ended
/// by `signal`. Returns its stream.
fn first_run(gw: u64, state: &Path, out: &Path, helper: u64, signal: i32) -> String {
    let mut first: Child = Command::new(reaper_trace())
        .args(["--quiet", "--gateway-pid", &gw.to_string(), "--state-dir"])
        .arg(state)
        .arg("--output")
        .arg(out)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("run reaper-trace");
    wait_until("the first run's checkpoint to hold the helper", || {
        checkpointed(state).contains(&helper)
    });
    // SAFETY: a plain signal to the child this test started.
    unsafe { libc::kill(first.id() as i32, signal) };
    first.wait().expect("wait for the first run");
    std::fs::read_to_string(out).expect("the first run's stream")
}

fn the_lineage_survives(test: &str, signal: i32) {
    if !require_root(test) {
        return;
    }
    let dir = scratch(test);
    let state = dir.join("state");
    let mut gateway = OrphanLater::start(&dir);
    let (gw, a, b) = (gateway.gateway, gateway.a, gateway.b);
    let first = first_run(gw, &state, &dir.join("first.ndjson"), b, signal);
    // While no run watches: A exits, and B is reparented.
    gateway.orphan_b();

    let second = run_reaper_until(
        &[
            "--gateway-pid",
            &gw.to_string(),
            "--state-dir",
            state.to_str().unwrap(),
        ],
        &[],
        gateway.release(),
        ("the helper flagged orphaned", Then::Release),
        |events| {
            events
                .iter()
                .any(|e| e["event"] == "flag" && pid(&e["pid"]) == b && e["reason"] == "orphaned")
        },
    );
    gateway.finish();
    let orphaned = flag(&second, b, "orphaned");
    assert_eq!(
        orphaned["lineage"],
        serde_json::json!([gw, a, b]),
        "the whole lineage, though A exited and B was reparented while no run watched:\n\
         first run:\n{first}\nsecond run's flag: {orphaned}"
    );
    let ready = &second.all("ready")[0];
    assert!(ready["resumed"]["adopted"].as_u64() >= Some(2), "{ready}");
    assert!(ready["resumed"]["gone"].as_u64() >= Some(1), "{ready}");
    // What the first run announced is not announced again.
    for kind in ["snapshot", "gateway"] {
        let again: Vec<&Value> = second
            .all(kind)
            .into_iter()
            .filter(|e| [gw, b].contains(&pid(&e["pid"])))
            .collect();
        assert!(again.is_empty(), "{kind} again: {again:?}");
    }
    let reparent = second.one("reparent", b);
    assert_eq!(pid(&reparent["old_ppid"]), a, "{reparent}");
    if signal == libc::SIGTERM {
        assert!(
            first.contains("\"event\":\"summary\""),
            "stopped cleanly:\n{first}"
        );
    }
    // --release-state leaves nothing behind.
    let released = Command::new(reaper_trace())
        .arg("--release-state")
        .arg(&state)
        .output()
        .expect("run --release-state");
    assert!(released.status.success(), "{released:?}");
    assert!(!state.exists(), "the state dir is gone");
}

#[test]
fn a_helper_orphaned_while_no_run_watches_keeps_its_lineage_after_a_stop() {
    the_lineage_survives(
        "a_helper_orphaned_while_no_run_watches_keeps_its_lineage_after_a_stop",
        libc::SIGTERM,
    );
}

#[test]
fn a_helper_orphaned_while_no_run_watches_keeps_its_lineage_after_a_crash() {
    the_lineage_survives(
        "a_helper_orphaned_while_no_run_watches_keeps_its_lineage_after_a_crash",
        libc::SIGKILL,
    );
}

#[test]
fn a_state_from_other_selectors_is_refused_naming_release_state() {
    let test = "a_state_from_other_selectors_is_refused_naming_release_state";
    if !require_root(test) {
        return;
    }
    let dir = scratch(test);
    let state = dir.join("state");
    // A checkpoint of a run that traced `sleep`'s pid, then a run for another pid.
    let mut sleeper = Command::new("sleep").arg("600").spawn().expect("sleep");
    let mut other = Command::new("sleep").arg("600").spawn().expect("sleep");
    let out = dir.join("first.ndjson");
    let mut first = Command::new(reaper_trace())
        .args([
            "--quiet",
            "--gateway-pid",
            &sleeper.id().to_string(),
            "--state-dir",
        ])
        .arg(&state)
        .arg("--output")
        .arg(&out)
        .spawn()
        .expect("run reaper-trace");
    wait_until("the first checkpoint", || {
        checkpointed(&state).contains(&u64::from(sleeper.id()))
    });
    // SAFETY: a plain signal to the child this test started.
    unsafe { libc::kill(first.id() as i32, libc::SIGTERM) };
    first.wait().expect("wait for the first run");
    let refused = Command::new(reaper_trace())
        .args([
            "--quiet",
            "--gateway-pid",
            &other.id().to_string(),
            "--state-dir",
        ])
        .arg(&state)
        .output()
        .expect("run reaper-trace");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(
        stderr.contains("--release-state") && stderr.contains(&format!("pid:{}", sleeper.id())),
        "{stderr}"
    );
    assert!(refused.stdout.is_empty(), "nothing traced");
    for child in [&mut sleeper, &mut other] {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Lines of a child's stderr as they come.
fn lines_of(stream: impl std::io::Read + Send + 'static) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stream)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

/// Waits for a line containing `text`, printing what came if it never does.
fn wait_for_line(lines: &std::sync::mpsc::Receiver<String>, text: &str) {
    let start = Instant::now();
    let mut seen = Vec::new();
    while start.elapsed() < patience() {
        if let Ok(line) = lines.recv_timeout(Duration::from_millis(100)) {
            if line.contains(text) {
                return;
            }
            seen.push(line);
        }
    }
    panic!(
        "no line with {text:?} on stderr; it said:\n{}",
        seen.join("\n")
    );
}

#[test]
fn a_checkpoint_that_cannot_be_written_is_said_and_tried_again_not_the_end_of_the_audit() {
    use std::os::unix::fs::PermissionsExt;
    let test =
        "a_checkpoint_that_cannot_be_written_is_said_and_tried_again_not_the_end_of_the_audit";
    if !require_root(test) {
        return;
    }
    let dir = scratch(test);
    let state = dir.join("state");
    // A gateway whose lineage keeps changing: a child every 100 ms.
    let mut gateway = Command::new("sh")
        .args(["-c", "while :; do sleep 0.1; done"])
        .spawn()
        .expect("start the gateway");
    let mut run = Command::new(reaper_trace())
        .args([
            "--quiet",
            "--json",
            "--gateway-pid",
            &gateway.id().to_string(),
        ])
        .arg("--state-dir")
        .arg(&state)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run reaper-trace");
    let stderr = lines_of(run.stderr.take().unwrap());
    wait_until("the first checkpoint", || {
        state.join("lineage.json").exists()
    });
    // reaper-trace keeps no CAP_DAC_OVERRIDE after attach: its owner's bits bind it too.
    let mode = |m| std::fs::set_permissions(&state, std::fs::Permissions::from_mode(m));
    mode(0o500).expect("chmod");
    wait_for_line(&stderr, "a restart now would lose what changed");
    mode(0o700).expect("chmod");
    wait_for_line(&stderr, "the lineage checkpoint is written again");
    // SAFETY: a plain signal to the child this test started.
    unsafe { libc::kill(run.id() as i32, libc::SIGTERM) };
    let status = run.wait().expect("wait for reaper-trace");
    assert!(
        status.success(),
        "the audit went on and ended well: {status:?}"
    );
    let _ = gateway.kill();
    let _ = gateway.wait();
}
