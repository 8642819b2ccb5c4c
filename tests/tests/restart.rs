//! A run's lineage across its own restarts (`--state-dir`): a helper that escaped and was
//! reparented while no reaper-trace ran is still its gateway's descendant in the next run,
//! whether the run before was stopped (SIGTERM: the checkpoint written at the stop) or killed
//! (SIGKILL: the one written every second). Needs root (see `state_test`).
use std::{
    collections::HashSet,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use reaper_tests::{
    OrphanLater, Run, end_once_checkpointed, flag, kept_run, patience, pid, pin_dir, read_json,
    reaper_trace, release_state, run_kept_until, state_test, wait_until,
};
use serde_json::Value;

/// The first run: traces the gateway `gw` until its checkpoint holds `pid`, then is ended by
/// `signal`. Returns its stream.
fn first_run(gw: u64, state: &Path, out: &Path, pid: u64, signal: i32) -> String {
    end_once_checkpointed(kept_run(state, out, gw, &[]), state, pid, signal);
    std::fs::read_to_string(out).expect("the first run's stream")
}

/// The second run, with the same selectors and state, until it flags `b` orphaned; with
/// what `reaper-trace why B --json` answered then.
fn second_run(gateway: &OrphanLater, state: &Path) -> (Run, Value) {
    let b = gateway.b;
    let mut asked = None;
    let run = run_kept_until(
        gateway.gateway,
        state,
        gateway.release(),
        "the helper flagged orphaned, and why answered",
        |events| {
            let flagged = events
                .iter()
                .any(|e| e["event"] == "flag" && pid(&e["pid"]) == b && e["reason"] == "orphaned");
            if flagged && asked.is_none() {
                asked = Some(why(&[&b.to_string(), "--json"]));
            }
            asked.is_some()
        },
    );
    let answer = asked.expect("asked");
    assert!(answer.status.success(), "{answer:?}\n{}", run.stderr);
    let answer = serde_json::from_slice(&answer.stdout).expect("one JSON object");
    (run, answer)
}

/// `reaper-trace why ARGS`.
fn why(args: &[&str]) -> std::process::Output {
    Command::new(reaper_trace())
        .arg("why")
        .args(args)
        .output()
        .expect("run reaper-trace why")
}

/// The events that carry a kernel time, as (event, pid, ts).
fn kernel_events<'a>(events: impl IntoIterator<Item = &'a Value>) -> HashSet<(String, u64, u64)> {
    events
        .into_iter()
        .filter(|e| ["fork", "exec", "exit", "setsid"].contains(&e["event"].as_str().unwrap_or("")))
        .map(|e| {
            (
                e["event"].to_string(),
                pid(&e["pid"]),
                e["ts"].as_u64().unwrap_or(0),
            )
        })
        .collect()
}

/// The test: the gateway's child A forks the helper B, which calls setsid, and exits,
/// all while no run reads. The probes stayed attached, so the second run reads the gap from
/// the ring: each of its events once, with its kernel time, none from the first run again.
fn the_gap_is_read_from_the_ring(test: &str, signal: i32) {
    let Some((dir, state)) = state_test(test) else {
        return;
    };
    let mut gateway = OrphanLater::start_late(&dir);
    let (gw, a) = (gateway.gateway, gateway.a);
    let first = first_run(gw, &state, &dir.join("first.ndjson"), a, signal);
    gateway.orphan_b();
    let b = gateway.b;

    let (second, asked) = second_run(&gateway, &state);
    gateway.finish();
    let orphaned = flag(&second, b, "orphaned");
    assert_eq!(
        orphaned["lineage"],
        serde_json::json!([gw, a, b]),
        "the whole lineage, though B was born, escaped and was reparented while no run read:\n\
         first run:\n{first}\nsecond run's flag: {orphaned}"
    );
    // `why` asked of the run after the restart, and of the audit both runs wrote, read back:
    // B under its gateway through A, which exited while no run read.
    for (answer, whose) in [
        (&asked, "the running audit's"),
        (&read_back(&first, &second, b), "the audit read back"),
    ] {
        assert_eq!(
            answer["lineage"],
            serde_json::json!([gw, a, b]),
            "{whose}: {answer:#}"
        );
        assert!(
            answer["ancestors"][1]["exited"].is_u64(),
            "{whose}: A exited: {answer:#}"
        );
        let flags = answer["flags"].as_array().expect("flags");
        assert!(
            flags.iter().any(|f| f["reason"] == "orphaned"),
            "{whose}: {answer:#}"
        );
    }
    let ready = &second.all("ready")[0];
    assert_eq!(ready["resumed"]["kernel_kept"], true, "{ready}");
    // Exactly one event of each thing that happened in the gap, from the ring: before
    // `ready` in kernel time.
    for (kind, who) in [("fork", b), ("setsid", b), ("reparent", b), ("exit", a)] {
        let event = second.one(kind, who);
        if kind != "reparent" {
            assert!(
                event["ts"].as_u64() < ready["ts"].as_u64(),
                "{event} is the gap's"
            );
        }
    }
    assert_eq!(pid(&second.one("reparent", b)["old_ppid"]), a);
    let first_events: Vec<Value> = first
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let again: Vec<_> = kernel_events(&first_events)
        .intersection(&kernel_events(&second.events))
        .cloned()
        .collect();
    assert!(again.is_empty(), "events in both runs' streams: {again:?}");
    // What the first run announced is not announced again.
    for kind in ["snapshot", "gateway"] {
        let again: Vec<&Value> = second
            .all(kind)
            .into_iter()
            .filter(|e| [gw, a].contains(&pid(&e["pid"])))
            .collect();
        assert!(again.is_empty(), "{kind} again: {again:?}");
    }
    let delivery = &second.summary()["delivery"];
    assert_eq!(delivery["consistent"], true, "over both runs: {delivery}");
    if signal == libc::SIGTERM {
        assert!(
            first.contains("\"event\":\"summary\""),
            "stopped cleanly:\n{first}"
        );
        assert_eq!(
            ready["resumed"]["unsaved"], 0,
            "a stop saves everything: {ready}"
        );
    }
    release_leaves_nothing(&state);
}

/// `why B --from AUDIT`, the audit being both runs' streams one after the other (as one
/// `--output` file holds them): B as at its exit or the audit's end.
fn read_back(first: &str, second: &Run, b: u64) -> Value {
    let audit = reaper_tests::scratch(&format!("restart-read-back-{b}")).join("audit.ndjson");
    let mut lines = first.to_owned();
    for event in &second.events {
        lines.push_str(&format!("{event}\n"));
    }
    std::fs::write(&audit, lines).expect("write the audit");
    let answer = why(&[&b.to_string(), "--from", audit.to_str().unwrap(), "--json"]);
    assert!(answer.status.success(), "{answer:?}");
    let text = String::from_utf8_lossy(&answer.stdout);
    let last = text.lines().last().expect("an answer");
    serde_json::from_str(last).expect("a JSON object")
}

/// `--release-state` detaches, unpins and removes everything.
fn release_leaves_nothing(state: &Path) {
    let pins = pin_dir(state);
    assert!(pins.exists(), "{} pinned", pins.display());
    release_state(state);
    assert!(!state.exists(), "the state dir is gone");
    assert!(!pins.exists(), "{} is gone", pins.display());
}

#[test]
fn a_helper_born_and_orphaned_while_no_run_reads_is_read_from_the_ring_after_a_stop() {
    the_gap_is_read_from_the_ring(
        "a_helper_born_and_orphaned_while_no_run_reads_is_read_from_the_ring_after_a_stop",
        libc::SIGTERM,
    );
}

#[test]
fn a_helper_born_and_orphaned_while_no_run_reads_is_read_from_the_ring_after_a_crash() {
    the_gap_is_read_from_the_ring(
        "a_helper_born_and_orphaned_while_no_run_reads_is_read_from_the_ring_after_a_crash",
        libc::SIGKILL,
    );
}

/// Without its kernel side, the lineage is still taken back, and /proc says what became of
/// each process: a state as the release before this one wrote it (a checkpoint of the same
/// format, no kernel side kept), or one whose kernel side went (bpffs unmounted).
#[test]
fn a_state_of_the_release_before_without_its_kernel_side_gives_the_lineage_read_from_proc() {
    let test =
        "a_state_of_the_release_before_without_its_kernel_side_gives_the_lineage_read_from_proc";
    let Some((dir, state)) = state_test(test) else {
        return;
    };
    let mut gateway = OrphanLater::start(&dir);
    let (gw, a, b) = (gateway.gateway, gateway.a, gateway.b);
    let first = first_run(gw, &state, &dir.join("first.ndjson"), b, libc::SIGTERM);
    // Unpinning every link and map detaches the probes and drops the ring; the checkpoint
    // is then the one the release before wrote (it kept no kernel side).
    std::fs::remove_dir_all(pin_dir(&state)).expect("remove the pins");
    let file = state.join("lineage.json");
    let mut checkpoint = read_json(&file);
    checkpoint.as_object_mut().unwrap().remove("kernel");
    std::fs::write(&file, checkpoint.to_string()).expect("rewrite the checkpoint");
    gateway.orphan_b();

    let (second, _) = second_run(&gateway, &state);
    gateway.finish();
    let orphaned = flag(&second, b, "orphaned");
    assert_eq!(
        orphaned["lineage"],
        serde_json::json!([gw, a, b]),
        "first run:\n{first}\nsecond run's flag: {orphaned}"
    );
    let ready = &second.all("ready")[0];
    assert_eq!(ready["resumed"]["kernel_kept"], false, "{ready}");
    assert!(ready["resumed"]["adopted"].as_u64() >= Some(2), "{ready}");
    assert!(ready["resumed"]["gone"].as_u64() >= Some(1), "{ready}");
    assert_eq!(pid(&second.one("reparent", b)["old_ppid"]), a);
    release_leaves_nothing(&state);
}

#[test]
fn a_state_from_other_selectors_is_refused_naming_release_state() {
    let test = "a_state_from_other_selectors_is_refused_naming_release_state";
    let Some((dir, state)) = state_test(test) else {
        return;
    };
    // A checkpoint of a run that traced `sleep`'s pid, then a run for another pid.
    let mut sleeper = Command::new("sleep").arg("600").spawn().expect("sleep");
    let mut other = Command::new("sleep").arg("600").spawn().expect("sleep");
    let gw = u64::from(sleeper.id());
    let first = kept_run(&state, &dir.join("first.ndjson"), gw, &[]);
    end_once_checkpointed(first, &state, gw, libc::SIGTERM);
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
    release_leaves_nothing(&state);
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
    let Some((_, state)) = state_test(test) else {
        return;
    };
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
    release_leaves_nothing(&state);
    let _ = gateway.kill();
    let _ = gateway.wait();
}

/// What a test started, ended however it ends: the gateway released and waited for, a run
/// still going killed, its state released.
struct Started {
    release: PathBuf,
    state: PathBuf,
    gateway: Option<std::process::Child>,
    run: Option<std::process::Child>,
}

impl Drop for Started {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.release, "");
        if let Some(mut run) = self.run.take() {
            let _ = run.kill();
            let _ = run.wait();
        }
        if let Some(mut gateway) = self.gateway.take() {
            let _ = gateway.wait();
        }
        if self.state.exists() {
            let _ = Command::new(reaper_trace())
                .arg("--release-state")
                .arg(&self.state)
                .output();
        }
    }
}

/// Whether the stream written to `path` so far has its `ready` line (a line being written
/// is not read as one).
fn is_ready(path: &Path) -> bool {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let whole = text.rsplit_once('\n').map_or("", |(lines, _)| lines);
    whole.lines().any(|l| l.contains("\"event\":\"ready\""))
}

/// A checkpoint's sessions are read where the run that wrote it read them: a run that reads
/// them there too keeps them as they are; a run that reads them elsewhere (here other
/// `--session-env` names) keeps none of them, ends each in the stream at the checkpoint's
/// time, and reads every live process again.
#[test]
fn sessions_read_from_another_source_than_the_checkpoints_are_not_kept() {
    let test = "sessions_read_from_another_source_than_the_checkpoints_are_not_kept";
    let Some((dir, state)) = state_test(test) else {
        return;
    };
    let release = dir.join("release");
    let script = format!(
        "AGENT_SESSION_ID=sess-kept OTHER_SESSION_ID=sess-other sleep 633 & \
         echo $! > {d}/child; while [ ! -e {r} ]; do sleep 0.05; done; kill $!",
        d = dir.display(),
        r = release.display()
    );
    let gateway = Command::new("sh")
        .args(["-c", &script])
        .spawn()
        .expect("sh");
    let gw = u64::from(gateway.id());
    let mut started = Started {
        release: release.clone(),
        state: state.clone(),
        gateway: Some(gateway),
        run: None,
    };
    wait_until("the child started", || {
        reaper_tests::pid_in(&dir, "child").is_some()
    });
    let child = u64::from(reaper_tests::pid_in(&dir, "child").unwrap());
    let checkpoint = |state: &Path| -> Option<Value> {
        let text = std::fs::read(state.join("lineage.json")).ok()?;
        serde_json::from_slice::<Value>(&text).ok()
    };
    // The child's session as the checkpoint in `state` keeps it (base64), if it is there.
    let kept = |state: &Path| -> Option<Value> {
        let checkpoint = checkpoint(state)?;
        let nodes = checkpoint["nodes"].as_array()?;
        let node = nodes.iter().find(|n| pid(&n["pid"]) == child)?;
        Some(node["session"].clone())
    };
    // "sess-kept", base64.
    let sess_kept = Value::from("c2Vzcy1rZXB0");
    // The first run (the hosts' variables): the child's session, read from /proc at its
    // start, is in its checkpoint.
    let first = kept_run(&state, &dir.join("first.ndjson"), gw, &[]);
    wait_until("the checkpoint to keep the child's session", || {
        kept(&state) == Some(sess_kept.clone())
    });
    end_once_checkpointed(first, &state, child, libc::SIGTERM);

    // A run that reads sessions where the first did: the value is kept, no session ends.
    let same = dir.join("same.ndjson");
    let second = started.run.insert(kept_run(&state, &same, gw, &[]));
    wait_until("the second run ready", || is_ready(&same));
    // SAFETY: a plain signal to the child this test started.
    unsafe { libc::kill(second.id() as i32, libc::SIGTERM) };
    assert!(second.wait().expect("wait for reaper-trace").success());
    started.run = None;
    let sessions: Vec<Value> = (reaper_tests::stream(&same).into_iter())
        .filter(|e| e["event"] == "session")
        .collect();
    assert!(sessions.is_empty(), "nothing read again: {sessions:?}");
    assert_eq!(kept(&state), Some(sess_kept), "kept as it was");
    let written = checkpoint(&state).expect("a checkpoint")["written"].clone();

    // A run that reads another variable: the kept value ends, and the child read again.
    let run = reaper_tests::run_reaper_until(
        &[
            "--gateway-pid",
            &gw.to_string(),
            "--state-dir",
            state.to_str().unwrap(),
            "--session-env",
            "OTHER_SESSION_ID",
        ],
        &[],
        &release,
        (
            "the kept session ended, the other read",
            reaper_tests::Then::Release,
        ),
        |events| {
            let read = |value: &str| {
                (events.iter()).any(|e| {
                    e["event"] == "session" && pid(&e["pid"]) == child && e["session"] == value
                })
            };
            read("") && read("sess-other")
        },
    );
    let _ = started.gateway.take().map(|mut g| g.wait());
    let sessions = run.all("session");
    let values: Vec<&Value> = sessions.iter().map(|e| &e["session"]).collect();
    assert_eq!(values, ["", "sess-other"], "ended, then read again");
    assert_eq!(sessions[0]["ts"], written, "ended at the checkpoint's time");
    let source = checkpoint(&state).expect("a checkpoint")["sessions"].clone();
    assert_eq!(source, "environment OTHER_SESSION_ID", "read there now");
    release_leaves_nothing(&state);
}
