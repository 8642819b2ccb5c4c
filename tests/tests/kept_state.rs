//! The kernel side of `--state-dir`: what it leaves in bpffs (nothing without it, nothing after
//! `--release-state`), what a gap costs when it outgrows the ring or outlasts `--state-keep`
//! (counted as lost, the lineage repaired from /proc), and a state of another record layout
//! (refused, naming `--release-state`). Needs root (see `require_root`).
use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::Mutex,
};

use reaper_tests::{
    OrphanLater, Then, checkpointed, pid, pin_dir, read_json, reaper_trace, require_root,
    run_reaper, run_reaper_until, scratch, wait_until,
};
use serde_json::Value;

/// The tests here that look at bpffs as a whole run one at a time.
static BPFFS: Mutex<()> = Mutex::new(());

/// Every path under /sys/fs/bpf.
fn bpffs() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            out.push(path.clone());
            if path.is_dir() {
                walk(&path, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(Path::new("/sys/fs/bpf"), &mut out);
    out.sort();
    out
}

/// Starts `reaper-trace --quiet --output OUT --state-dir STATE ARGS`.
fn kept_run(state: &Path, out: &Path, args: &[&str]) -> Child {
    Command::new(reaper_trace())
        .args(["--quiet", "--state-dir"])
        .arg(state)
        .arg("--output")
        .arg(out)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("run reaper-trace")
}

/// Ends a run with SIGTERM, once its checkpoint holds `pid`.
fn stop_once_checkpointed(mut run: Child, state: &Path, pid: u64) {
    wait_until("the checkpoint to hold the gateway", || {
        checkpointed(state).contains(&pid)
    });
    // SAFETY: a plain signal to the child this test started.
    unsafe { libc::kill(run.id() as i32, libc::SIGTERM) };
    let status = run.wait().expect("wait for reaper-trace");
    assert!(status.success(), "{status:?}");
}

fn release(state: &Path) {
    let released = Command::new(reaper_trace())
        .arg("--release-state")
        .arg(state)
        .output()
        .expect("run --release-state");
    assert!(released.status.success(), "{released:?}");
}

#[test]
fn bpffs_is_left_as_it_was_by_a_run_without_state_and_after_release_state() {
    let test = "bpffs_is_left_as_it_was_by_a_run_without_state_and_after_release_state";
    if !require_root(test) {
        return;
    }
    let _one_at_a_time = BPFFS.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch(test);
    let before = bpffs();
    let run = run_reaper(&["--", "sh", "-c", "true"]);
    assert!(run.status.success(), "{}", run.stderr);
    assert_eq!(bpffs(), before, "a run without --state-dir pins nothing");

    let state = dir.join("state");
    let mut sleeper = Command::new("sleep").arg("600").spawn().expect("sleep");
    let gw = u64::from(sleeper.id());
    let run = kept_run(
        &state,
        &dir.join("run.ndjson"),
        &["--gateway-pid", &gw.to_string()],
    );
    wait_until("the checkpoint", || checkpointed(&state).contains(&gw));
    // One run at a time: a second would take the probes over from under the first.
    let second = Command::new(reaper_trace())
        .args(["--quiet", "--gateway-pid", &gw.to_string(), "--state-dir"])
        .arg(&state)
        .output()
        .expect("run reaper-trace");
    let said = String::from_utf8_lossy(&second.stderr);
    assert!(
        !second.status.success() && said.contains("another reaper-trace uses it"),
        "{said}"
    );
    stop_once_checkpointed(run, &state, gw);
    let pins = pin_dir(&state);
    let kept: Vec<PathBuf> = bpffs()
        .into_iter()
        .filter(|p| p.starts_with(&pins))
        .collect();
    assert!(
        kept.iter().any(|p| p.ends_with("EVENTS")) && kept.iter().any(|p| p.ends_with("TRACKED")),
        "the ring and the tracked set pinned: {kept:?}"
    );
    release(&state);
    assert_eq!(bpffs(), before, "--release-state leaves bpffs as it was");
    let _ = sleeper.kill();
    let _ = sleeper.wait();
}

#[test]
fn a_state_of_another_record_layout_is_refused_naming_release_state() {
    let test = "a_state_of_another_record_layout_is_refused_naming_release_state";
    if !require_root(test) {
        return;
    }
    let _one_at_a_time = BPFFS.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch(test);
    let state = dir.join("state");
    let mut sleeper = Command::new("sleep").arg("600").spawn().expect("sleep");
    let gw = u64::from(sleeper.id());
    let run = kept_run(
        &state,
        &dir.join("run.ndjson"),
        &["--gateway-pid", &gw.to_string()],
    );
    stop_once_checkpointed(run, &state, gw);
    // What a build of another layout would have written.
    let file = state.join("lineage.json");
    let mut checkpoint = read_json(&file);
    checkpoint["kernel"]["layout"] = Value::from(99);
    std::fs::write(&file, checkpoint.to_string()).expect("rewrite the checkpoint");
    let refused = Command::new(reaper_trace())
        .args(["--quiet", "--gateway-pid", &gw.to_string(), "--state-dir"])
        .arg(&state)
        .output()
        .expect("run reaper-trace");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(
        stderr.contains("record layout 99") && stderr.contains("--release-state"),
        "{stderr}"
    );
    assert!(refused.stdout.is_empty(), "nothing traced");
    release(&state);
    let _ = sleeper.kill();
    let _ = sleeper.wait();
}

/// A gateway that, once `DIR/go` exists, runs `/bin/true` 400 times (far more records than a
/// 4 KiB ring holds), leaves a `sleep` behind (its pid in `DIR/left`), and exits once
/// `DIR/release` exists.
fn storming_gateway(dir: &Path) -> Child {
    let script = format!(
        "cd {dir}; while [ ! -e go ]; do sleep 0.05; done; \
         i=0; while [ $i -lt 400 ]; do /bin/true; i=$((i+1)); done; \
         sleep 600 & echo $! > left; \
         while [ ! -e release ]; do sleep 0.05; done; kill $!; wait",
        dir = dir.display()
    );
    Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .spawn()
        .expect("start the gateway")
}

/// The events of a run, from its output file.
fn stream(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

#[test]
fn a_gap_that_overflows_the_ring_is_counted_lost_and_repaired() {
    let test = "a_gap_that_overflows_the_ring_is_counted_lost_and_repaired";
    if !require_root(test) {
        return;
    }
    let _one_at_a_time = BPFFS.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch(test);
    let state = dir.join("state");
    let mut gateway = storming_gateway(&dir);
    let gw = u64::from(gateway.id());
    let args = ["--gateway-pid", &gw.to_string(), "--ring-size", "4KiB"];
    let run = kept_run(&state, &dir.join("first.ndjson"), &args);
    stop_once_checkpointed(run, &state, gw);
    // The storm, with no run reading the 4 KiB ring.
    std::fs::write(dir.join("go"), b"").expect("go");
    let left_pid = || -> Option<u64> {
        std::fs::read_to_string(dir.join("left"))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    wait_until("the storm to end", || left_pid().is_some());
    let left = left_pid().expect("the sleep's pid");

    let second = run_reaper_until(
        &[
            "--gateway-pid",
            &gw.to_string(),
            "--state-dir",
            state.to_str().unwrap(),
        ],
        &[],
        &dir.join("release"),
        ("the loss reported and the sleep repaired", Then::Release),
        |events| {
            let lost = events.iter().any(|e| e["event"] == "lost");
            let repaired = events.iter().any(|e| {
                ["snapshot", "fork"].contains(&e["event"].as_str().unwrap_or(""))
                    && pid(&e["pid"]) == left
            });
            lost && repaired
        },
    );
    let _ = gateway.wait();
    let lost: u64 = second
        .all("lost")
        .iter()
        .map(|e| e["count"].as_u64().unwrap())
        .sum();
    assert!(lost > 0, "the overflow counted: {:?}", second.all("lost"));
    let delivery = &second.summary()["delivery"];
    assert_eq!(delivery["consistent"], true, "over both runs: {delivery}");
    let dropped: u64 = delivery["dropped"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert!(dropped >= lost, "{delivery}");
    let first = stream(&dir.join("first.ndjson"));
    assert!(
        first.iter().all(|e| e["event"] != "lost"),
        "the first run lost nothing"
    );
    release(&state);
}

#[test]
fn past_state_keep_the_probes_stop_recording_and_the_next_run_repairs_the_gap() {
    let test = "past_state_keep_the_probes_stop_recording_and_the_next_run_repairs_the_gap";
    if !require_root(test) {
        return;
    }
    let _one_at_a_time = BPFFS.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch(test);
    let state = dir.join("state");
    let mut gateway = OrphanLater::start_late(&dir);
    let gw = gateway.gateway;
    let args = ["--gateway-pid", &gw.to_string(), "--state-keep", "1s"];
    let run = kept_run(&state, &dir.join("first.ndjson"), &args);
    stop_once_checkpointed(run, &state, gateway.a);
    // Past --state-keep (a second from the stop, in the kernel's clock): B is born and
    // orphaned unrecorded, though still tracked.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    gateway.orphan_b();
    let b = gateway.b;

    let second = run_reaper_until(
        &[
            "--gateway-pid",
            &gw.to_string(),
            "--state-dir",
            state.to_str().unwrap(),
        ],
        &[],
        gateway.release(),
        ("the gap reported lost and B repaired", Then::Release),
        |events| {
            events.iter().any(|e| e["event"] == "lost")
                && events
                    .iter()
                    .any(|e| e["event"] == "snapshot" && pid(&e["pid"]) == b)
        },
    );
    gateway.finish();
    assert!(
        second.all("fork").iter().all(|e| pid(&e["pid"]) != b),
        "B's fork was not recorded"
    );
    let delivery = &second.summary()["delivery"];
    assert_eq!(delivery["consistent"], true, "{delivery}");
    release(&state);
}

/// The events of kind `name` by pid, over both streams.
fn by_pid(streams: &[&[Value]], name: &str) -> std::collections::HashMap<u64, usize> {
    let mut count = std::collections::HashMap::new();
    for e in streams.iter().flat_map(|s| s.iter()) {
        if e["event"] == name {
            *count.entry(pid(&e["pid"])).or_insert(0) += 1;
        }
    }
    count
}

#[test]
fn a_restart_in_a_fork_storm_misses_no_event_and_repeats_none() {
    let test = "a_restart_in_a_fork_storm_misses_no_event_and_repeats_none";
    if !require_root(test) {
        return;
    }
    let _one_at_a_time = BPFFS.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch(test);
    let state = dir.join("state");
    // Forks and execs until `stop` (at most 5,000 times: no pid is reused).
    let script = format!(
        "cd {dir}; i=0; while [ ! -e stop ] && [ $i -lt 5000 ]; do /bin/true; i=$((i+1)); done",
        dir = dir.display()
    );
    let mut gateway = Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .spawn()
        .expect("start the gateway");
    let gw = u64::from(gateway.id());
    let first_out = dir.join("first.ndjson");
    let run = kept_run(&state, &first_out, &["--gateway-pid", &gw.to_string()]);
    stop_once_checkpointed(run, &state, gw);
    // At once, while the storm goes on: the new programs attach beside the kept ones.
    let second = run_reaper_until(
        &[
            "--gateway-pid",
            &gw.to_string(),
            "--state-dir",
            state.to_str().unwrap(),
        ],
        &[],
        &dir.join("stop"),
        ("forks after ready", Then::Release),
        |events| {
            let ready = events.iter().position(|e| e["event"] == "ready");
            ready.is_some_and(|r| events[r..].iter().filter(|e| e["event"] == "fork").count() > 20)
        },
    );
    let _ = gateway.wait();
    let first = stream(&first_out);
    let streams = [first.as_slice(), second.events.as_slice()];
    let forks = by_pid(&streams, "fork");
    let exits = by_pid(&streams, "exit");
    assert!(forks.len() > 20, "the storm went on: {} forks", forks.len());
    let twice: Vec<_> = forks.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "forks in both streams, or twice: {twice:?}"
    );
    // Every child of the storm forked in either run exited in either, once; none is missing
    // (the gateway's own exit is the second run's).
    for (child, _) in forks.iter() {
        assert_eq!(
            exits.get(child),
            Some(&1),
            "pid {child}: one exit over both streams"
        );
    }
    for run in [&first, &second.events] {
        let summary = run
            .iter()
            .find(|e| e["event"] == "summary")
            .expect("a summary");
        assert_eq!(
            summary["delivery"]["consistent"], true,
            "{}",
            summary["delivery"]
        );
        assert!(run.iter().all(|e| e["event"] != "lost"), "nothing lost");
    }
    release(&state);
}
