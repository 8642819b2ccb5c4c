//! `--kill` against real processes: the protocol, the refusals, and a recycled pid that must
//! never be signalled. Needs root (see `require_root`).
use std::time::Duration;

use reaper_tests::{Run, Then, pid, require_root, run_shape_until};
use reaper_user::testing::{
    Args, Comm, KillOptions, Killer, LineageGraph, Outcome, Reason, Seed, boottime_now,
    boottime_to_ticks, read_stat,
};
use serde_json::Value;

/// The `kill` events about `pid`, as (signal, result).
fn kills(run: &Run, pid: u64) -> Vec<(String, String)> {
    run.all("kill")
        .into_iter()
        .filter(|k| k["pid"].as_u64() == Some(pid))
        .map(|k| {
            (
                k["signal"].as_str().unwrap().to_owned(),
                k["result"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// Asserts the steps reported for `pid`, in order.
fn assert_steps(run: &Run, pid: u64, steps: &[(&str, &str)]) {
    let want: Vec<(String, String)> = steps
        .iter()
        .map(|(s, r)| (s.to_string(), r.to_string()))
        .collect();
    assert_eq!(kills(run, pid), want, "{:?}", run.all("kill"));
}

/// A kill sequence reached its outcome (anything but a signal merely sent).
fn kill_settled(events: &[Value]) -> bool {
    events
        .iter()
        .any(|e| e["event"] == "kill" && e["result"] != "sent")
}

/// Runs the orphan shape under `--kill OPTS`, holding the orphan's pipe until a kill sequence
/// reached its outcome; returns the run and the orphan's pid.
fn orphan_under_kill(opts: &[&str], env: &[(&str, &str)]) -> (Run, u64) {
    let mut args = vec!["--kill", "--scan-interval", "250ms"];
    args.extend_from_slice(opts);
    let (run, truth) = run_shape_until(
        &args,
        "leak-orphan",
        env,
        ("a kill outcome", Then::Release),
        kill_settled,
    );
    let b = pid(&truth["b"]);
    (run, b)
}

fn kill_pids(run: &Run) -> Vec<u64> {
    run.all("kill").iter().map(|k| pid(&k["pid"])).collect()
}

#[test]
fn an_orphan_ignoring_sigterm_is_killed_after_grace_and_term_timeout() {
    if !require_root("an_orphan_ignoring_sigterm_is_killed_after_grace_and_term_timeout") {
        return;
    }
    let (run, b) = orphan_under_kill(
        &["--grace", "1s", "--term-timeout", "1s"],
        &[("REAPER_SHAPES_IGNORE_TERM", "1")],
    );
    assert_steps(
        &run,
        b,
        &[
            ("SIGTERM", "sent"),
            ("SIGKILL", "sent"),
            ("SIGKILL", "exited"),
        ],
    );
    assert_eq!(run.one("exit", b)["signal"], "SIGKILL");
    let flagged = run
        .all("flag")
        .into_iter()
        .find(|f| f["pid"].as_u64() == Some(b))
        .unwrap();
    // Never early (a slow machine can only make the steps later, so no upper bound here).
    let at = |signal: &str| {
        run.all("kill")
            .into_iter()
            .find(|k| k["signal"] == signal && k["result"] == "sent")
            .map(|k| k["ts"].as_u64().unwrap())
            .unwrap()
    };
    let (flag_ts, term, kill) = (
        flagged["ts"].as_u64().unwrap(),
        at("SIGTERM"),
        at("SIGKILL"),
    );
    // (Less 50 ms: the stream stamps an event when it writes it, a moment after the fact.)
    let second = 1_000_000_000 - 50_000_000;
    assert!(term >= flag_ts + second, "SIGTERM after --grace");
    assert!(kill >= term + second, "SIGKILL after --term-timeout");
    // Only B: never the gateway, never A (already gone), nothing else.
    assert_eq!(kill_pids(&run), [b, b, b]);
    let kills = &run.summary()["kills"]["orphaned"];
    assert_eq!(
        (kills["sent"].as_u64(), kills["exited"].as_u64()),
        (Some(2), Some(1))
    );
}

#[test]
fn a_stopped_orphan_is_continued_then_terminated() {
    if !require_root("a_stopped_orphan_is_continued_then_terminated") {
        return;
    }
    let (run, b) = orphan_under_kill(
        &["--grace", "0s", "--term-timeout", "2s"],
        &[("REAPER_SHAPES_STOP_SELF", "1")],
    );
    assert_steps(
        &run,
        b,
        &[
            ("SIGCONT", "sent"),
            ("SIGTERM", "sent"),
            ("SIGTERM", "exited"),
        ],
    );
    assert_eq!(run.one("exit", b)["signal"], "SIGTERM");
}

#[test]
fn a_live_session_and_the_gateway_are_never_signalled() {
    if !require_root("a_live_session_and_the_gateway_are_never_signalled") {
        return;
    }
    let (run, truth) = run_shape_until(
        &[
            "--kill",
            "--kill-reasons",
            "orphaned,deaf,idle",
            "--grace",
            "0s",
            "--idle-after",
            "1s",
            "--scan-interval",
            "250ms",
        ],
        "normal",
        &[],
        ("the positive control's kill outcome", Then::Release),
        kill_settled,
    );
    // Only the shape's abandoned server, the positive control, is signalled.
    let control = pid(&truth["control"]);
    assert!(!kill_pids(&run).is_empty());
    assert!(
        kill_pids(&run).iter().all(|p| *p == control),
        "{:?}",
        run.all("kill")
    );
}

#[test]
fn dry_run_decides_and_sends_nothing() {
    if !require_root("dry_run_decides_and_sends_nothing") {
        return;
    }
    let (run, b) = orphan_under_kill(&["--dry-run", "--grace", "0s"], &[]);
    assert_steps(&run, b, &[("SIGTERM", "dry_run")]);
    let exit = run.one("exit", b);
    assert_eq!(
        (exit["exit_code"].as_i64(), exit["signal"].is_null()),
        (Some(0), true)
    );
}

#[test]
fn a_respawning_supervisor_is_flagged_and_its_worker_killed_once() {
    if !require_root("a_respawning_supervisor_is_flagged_and_its_worker_killed_once") {
        return;
    }
    let (run, truth) = run_shape_until(
        &[
            "--kill",
            "--grace",
            "0s",
            "--term-timeout",
            "1s",
            "--scan-interval",
            "250ms",
        ],
        "respawner",
        &[],
        ("a respawning flag", Then::Release),
        |events| {
            events
                .iter()
                .any(|e| e["event"] == "flag" && e["reason"] == "respawning")
        },
    );
    let supervisor = pid(&truth["supervisor"]);
    let terms = run
        .all("kill")
        .iter()
        .filter(|k| k["signal"] == "SIGTERM" && k["result"] == "sent")
        .count();
    assert_eq!(terms, 1, "one kill, then back off: {:?}", run.all("kill"));
    assert!(!kill_pids(&run).contains(&supervisor));
    let respawning: Vec<&Value> = run
        .all("flag")
        .into_iter()
        .filter(|f| f["reason"] == "respawning")
        .collect();
    assert_eq!(respawning.len(), 1, "{:?}", run.all("flag"));
    assert_eq!(respawning[0]["pid"].as_u64(), Some(supervisor));
}

/// Forks a child that sleeps until killed; returns its pid.
fn sleeper() -> i32 {
    // SAFETY: the child only waits for a signal (never a timer a slow machine could outlast).
    match unsafe { libc::fork() } {
        0 => unsafe {
            loop {
                libc::pause();
            }
        },
        pid => pid,
    }
}

/// A child that gets exactly `pid`, by setting the kernel's last handed-out pid just below it
/// (`/proc/sys/kernel/ns_last_pid`, root only). Another fork on the machine can take it
/// first: then `None`.
fn sleeper_with_pid(pid: i32) -> Option<i32> {
    std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string()).ok()?;
    let child = sleeper();
    if child == pid {
        return Some(child);
    }
    end(child);
    None
}

/// Our child `pid` was sent no signal: it is not reaped and none is pending. Exact at once,
/// with no window to wait out: a kill(2) of a process queues the signal in its shared pending
/// set (`ShdPnd`), and a fatal one stays there while the process dies, until it is reaped.
fn assert_never_signalled(pid: i32) {
    let mut status = 0;
    // SAFETY: polling our own child.
    let exited = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
    assert_eq!(exited, 0, "{pid} was not signalled, yet it exited");
    let proc_status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    for line in proc_status.lines() {
        if line.starts_with("SigPnd:") || line.starts_with("ShdPnd:") {
            let mask = line.split_whitespace().nth(1).unwrap();
            assert!(
                mask.bytes().all(|b| b == b'0'),
                "{pid} has a signal pending: {line}"
            );
        }
    }
}

fn end(pid: i32) -> i32 {
    let mut status = 0;
    // SAFETY: ending and reaping our own child.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        libc::waitpid(pid, &mut status, 0);
    }
    status
}

fn seed(graph: &mut LineageGraph, pid: i32, is_gateway: bool, uncertain: bool) -> u64 {
    let stat = read_stat(pid as u32).unwrap();
    graph
        .add_seed(Seed {
            pid: pid as u32,
            start_ticks: stat.start_ticks,
            ppid: stat.ppid,
            sid: stat.session,
            pgid: stat.pgrp,
            comm: Comm::from_c(b"sleeper"),
            argv: Args::from_list(["sleeper"]),
            is_gateway,
            uncertain,
        })
        .0
}

/// The graph still believes in a process whose pid an unrelated process now has (its exit
/// was not seen yet): the kill must be refused, in every trial; and the same decision for the
/// real process must kill it (so the refusal is the identity check, not a dead end).
#[test]
fn a_recycled_pid_is_never_signalled() {
    if !require_root("a_recycled_pid_is_never_signalled") {
        return;
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _guard = runtime.enter();
    let me = std::process::id() as i32;
    let mut trials = 0;
    for _ in 0..200 {
        if trials == 10 {
            break;
        }
        let mut graph = LineageGraph::new(100);
        seed(&mut graph, me, true, false);
        let victim = sleeper();
        let stale = seed(&mut graph, victim, false, false);
        let victim_ticks = read_stat(victim as u32).unwrap().start_ticks;
        end(victim);
        // The newcomer must start in a later clock tick (its start time is what tells it
        // apart): wait until the clock is there.
        while boottime_to_ticks(boottime_now()) <= victim_ticks {
            std::thread::sleep(Duration::from_millis(1));
        }
        let Some(newcomer) = sleeper_with_pid(victim) else {
            continue;
        };
        trials += 1;
        let (mut killer, mut reports) = Killer::new(KillOptions {
            auto: true,
            reasons: vec![Reason::Orphaned],
            grace: Duration::ZERO,
            term_timeout: Duration::from_secs(1),
            dry_run: false,
        });
        let decided = killer.decide(&graph, &[(stale, Reason::Orphaned, 0)], u64::MAX);
        let results: Vec<Outcome> = decided.reports.iter().map(|r| r.result).collect();
        assert_eq!(results, [Outcome::IdentityChanged], "trial {trials}");
        // Refused on the spot: nothing was sent (see below for a sequence started anyway).
        assert_never_signalled(newcomer);

        // The positive control: the newcomer itself, correctly identified, is killed; its
        // sequence, run to the exit, is the only one (a report for the refused decision
        // would be a sequence started for it).
        let real = seed(&mut graph, newcomer, false, false);
        let decided = killer.decide(&graph, &[(real, Reason::Orphaned, 0)], u64::MAX);
        assert!(decided.reports.is_empty(), "{:?}", decided.reports.len());
        let mut steps = Vec::new();
        loop {
            let step = runtime.block_on(async { reports.recv().await }).unwrap();
            assert_eq!(step.node, real, "a step for the refused decision: {step:?}");
            steps.push((step.signal, step.result));
            if step.result == Outcome::Exited {
                break;
            }
        }
        assert_eq!(steps[0], ("SIGTERM", Outcome::Sent));
        let mut status = 0;
        // SAFETY: reaping our own child.
        unsafe { libc::waitpid(newcomer, &mut status, 0) };
        assert!(libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGTERM);
    }
    assert_eq!(trials, 10, "could not recycle a pid in 200 attempts");
}

/// A process re-read from /proc after a loss has a guessed lineage: it is never killed.
#[test]
fn an_uncertain_process_is_never_signalled() {
    if !require_root("an_uncertain_process_is_never_signalled") {
        return;
    }
    let mut graph = LineageGraph::new(100);
    seed(&mut graph, std::process::id() as i32, true, false);
    let child = sleeper();
    let node = seed(&mut graph, child, false, true);
    let (mut killer, _reports) = Killer::new(KillOptions {
        auto: true,
        reasons: vec![Reason::Orphaned],
        grace: Duration::ZERO,
        term_timeout: Duration::from_secs(1),
        dry_run: false,
    });
    let decided = killer.decide(&graph, &[(node, Reason::Orphaned, 0)], u64::MAX);
    let results: Vec<Outcome> = decided.reports.iter().map(|r| r.result).collect();
    assert_eq!(results, [Outcome::Uncertain]);
    assert_never_signalled(child);
    end(child);
}
