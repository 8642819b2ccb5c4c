//! The kernel side of `--state-dir`: what it leaves in bpffs (nothing without it, nothing after
//! `--release-state`), what a gap costs when it outgrows the ring or outlasts `--state-keep`
//! (counted as lost, the lineage repaired from /proc), and a state of another record layout
//! (refused, naming `--release-state`), one run at a time, and a restart in a fork storm (no
//! event missed or repeated). Needs root (see `state_test`).
use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::Mutex,
};

use reaper_tests::{
    OrphanLater, checkpointed, end_once_checkpointed, kept_run, pid, pin_dir, read_json,
    reaper_trace, release_state, run_kept_until, run_reaper, state_test, stream, wait_until,
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

#[test]
fn bpffs_is_left_as_it_was_by_a_run_without_state_and_after_release_state() {
    let test = "bpffs_is_left_as_it_was_by_a_run_without_state_and_after_release_state";
    let Some((dir, state)) = state_test(test) else {
        return;
    };
    let _one_at_a_time = BPFFS.lock().unwrap_or_else(|e| e.into_inner());
    let before = bpffs();
    let run = run_reaper(&["--", "sh", "-c", "true"]);
    assert!(run.status.success(), "{}", run.stderr);
    assert_eq!(bpffs(), before, "a run without --state-dir pins nothing");

    let mut sleeper = Command::new("sleep").arg("600").spawn().expect("sleep");
    let gw = u64::from(sleeper.id());
    let run = kept_run(&state, &dir.join("run.ndjson"), gw, &[]);
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
    end_once_checkpointed(run, &state, gw, libc::SIGTERM);
    let pins = pin_dir(&state);
    let kept: Vec<PathBuf> = bpffs()
        .into_iter()
        .filter(|p| p.starts_with(&pins))
        .collect();
    assert!(
        kept.iter().any(|p| p.ends_with("EVENTS")) && kept.iter().any(|p| p.ends_with("TRACKED")),
        "the ring and the tracked set pinned: {kept:?}"
    );
    release_state(&state);
    assert_eq!(bpffs(), before, "--release-state leaves bpffs as it was");
    let _ = sleeper.kill();
    let _ = sleeper.wait();
}

#[test]
fn a_state_of_another_record_layout_is_refused_naming_release_state() {
    let test = "a_state_of_another_record_layout_is_refused_naming_release_state";
    let Some((dir, state)) = state_test(test) else {
        return;
    };
    let _one_at_a_time = BPFFS.lock().unwrap_or_else(|e| e.into_inner());
    let mut sleeper = Command::new("sleep").arg("600").spawn().expect("sleep");
    let gw = u64::from(sleeper.id());
    let run = kept_run(&state, &dir.join("run.ndjson"), gw, &[]);
    end_once_checkpointed(run, &state, gw, libc::SIGTERM);
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
    release_state(&state);
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

#[test]
fn a_gap_that_overflows_the_ring_is_counted_lost_and_repaired() {
    let test = "a_gap_that_overflows_the_ring_is_counted_lost_and_repaired";
    let Some((dir, state)) = state_test(test) else {
        return;
    };
    let _one_at_a_time = BPFFS.lock().unwrap_or_else(|e| e.into_inner());
    let mut gateway = storming_gateway(&dir);
    let gw = u64::from(gateway.id());
    let run = kept_run(
        &state,
        &dir.join("first.ndjson"),
        gw,
        &["--ring-size", "4KiB"],
    );
    end_once_checkpointed(run, &state, gw, libc::SIGTERM);
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

    let second = run_kept_until(
        gw,
        &state,
        &dir.join("release"),
        "the loss reported and the sleep repaired",
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
    release_state(&state);
}

#[test]
fn past_state_keep_the_probes_stop_recording_and_the_next_run_repairs_the_gap() {
    let test = "past_state_keep_the_probes_stop_recording_and_the_next_run_repairs_the_gap";
    let Some((dir, state)) = state_test(test) else {
        return;
    };
    let _one_at_a_time = BPFFS.lock().unwrap_or_else(|e| e.into_inner());
    let mut gateway = OrphanLater::start_late(&dir);
    let gw = gateway.gateway;
    let run = kept_run(
        &state,
        &dir.join("first.ndjson"),
        gw,
        &["--state-keep", "1s"],
    );
    end_once_checkpointed(run, &state, gateway.a, libc::SIGTERM);
    // Past --state-keep (a second from the stop, in the kernel's clock): B is born and
    // orphaned unrecorded, though still tracked.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    gateway.orphan_b();
    let b = gateway.b;

    let second = run_kept_until(
        gw,
        &state,
        gateway.release(),
        "the gap reported lost and B repaired",
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
    release_state(&state);
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
    let Some((dir, state)) = state_test(test) else {
        return;
    };
    let _one_at_a_time = BPFFS.lock().unwrap_or_else(|e| e.into_inner());
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
    let run = kept_run(&state, &first_out, gw, &[]);
    end_once_checkpointed(run, &state, gw, libc::SIGTERM);
    // At once, while the storm goes on: the new programs attach beside the kept ones.
    let second = run_kept_until(
        gw,
        &state,
        &dir.join("stop"),
        "forks after ready",
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
    release_state(&state);
}

/// Two runs that start at once where bpffs is not mounted (a fresh machine) mount it once:
/// the look and the mount are one step under a lock on /sys/fs/bpf, and a run waiting on it
/// finds the other's bpffs when its turn comes (every mount of bpffs is a filesystem of its
/// own: a second mounted over the first would hide the first run's pins). In a mount
/// namespace of the test's own, where bpffs is unmounted: the test holds the lock (as a run
/// mounting would), starts `reaper-trace --mount-bpffs`, waits until the kernel lists it as
/// waiting on that lock (`/proc/locks`), mounts bpffs itself and lets go.
#[test]
fn a_run_that_finds_bpffs_being_mounted_mounts_no_second() {
    let test = "a_run_that_finds_bpffs_being_mounted_mounts_no_second";
    let Some((dir, _)) = state_test(test) else {
        return;
    };
    let out = dir.join("mount-bpffs.out");
    let script = format!(
        r#"while grep -q ' /sys/fs/bpf ' /proc/self/mountinfo; do umount /sys/fs/bpf || exit 9; done
exec 9</sys/fs/bpf
flock 9
{reaper} --mount-bpffs >{out} 2>&1 & run=$!
i=0
until grep -Eq -- "-> FLOCK +ADVISORY +WRITE +$run " /proc/locks; do
    kill -0 $run 2>/dev/null || {{ echo "it ended without waiting on the lock"; exit 9; }}
    i=$((i+1)); [ $i -lt 6000 ] || {{ echo "it never waited on the lock"; exit 9; }}
    sleep 0.05
done
mount -t bpf bpf /sys/fs/bpf
flock -u 9
wait $run; echo "exit $?"
echo "mounts $(grep -c ' /sys/fs/bpf ' /proc/self/mountinfo)""#,
        reaper = reaper_trace().display(),
        out = out.display(),
    );
    let ran = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .stdin(Stdio::null())
        .output()
        .expect("unshare");
    let said = String::from_utf8_lossy(&ran.stdout);
    let its = std::fs::read_to_string(&out).unwrap_or_default();
    eprintln!(
        "{test}: {said}{}\nreaper-trace: {its}",
        String::from_utf8_lossy(&ran.stderr)
    );
    assert!(ran.status.success(), "the script ended early");
    assert!(said.contains("exit 0"), "--mount-bpffs succeeded");
    assert!(
        said.contains("mounts 1"),
        "one bpffs at /sys/fs/bpf, not two"
    );
    assert!(
        !its.contains("mounted bpffs"),
        "it found bpffs mounted: {its}"
    );
}
