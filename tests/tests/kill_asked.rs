//! `reaper-trace kill`: a kill asked for through the running audit's API (`POST /v1/kill`),
//! against real processes: one agent session's leftovers end, another session's identical
//! processes, its per-session process and the gateway do not; `--dry-run` signals nothing;
//! an `--api-group` member may ask questions but never kill; pid 1, a gateway and reaper-trace
//! itself are refused by name. Needs root (see `require_root`).
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output};

use reaper_tests::{
    Then, exited, pid_in, reaper_trace, require_root, run_reaper_until, scratch, session_begun,
};
use serde_json::Value;

/// The gid `--api-group` is given and the client runs as (`nogroup`, and `nobody`'s uid).
const NOBODY: u32 = 65534;

/// A gateway with two running agent sessions, each a per-session process with a server (a
/// wrapper and the `sleep` it runs) and a double fork's grandchild (identical in both), their
/// pids written in `dir`.
fn gateway(dir: &Path) -> String {
    let d = dir.display();
    let session = |s: &str| {
        format!(
            "AGENT_SESSION_ID=sess-{s} sh -c 'sh -c \"sleep 611 & echo \\$! > {d}/{s}-inner; wait\" & \
             echo $! > {d}/{s}-server; \
             ( sleep 612 & echo $! > {d}/{s}-forked ); echo $$ > {d}/{s}-owner; \
             while [ ! -e \"$REAPER_SHAPES_RELEASE\" ]; do sleep 0.05; done' &"
        )
    };
    format!(
        "{}\n{}\nwhile [ ! -e \"$REAPER_SHAPES_RELEASE\" ]; do sleep 0.05; done\n\
         for s in a b; do kill $(cat {d}/$s-inner {d}/$s-server {d}/$s-forked) 2>/dev/null; done\n",
        session("a"),
        session("b"),
    )
}

/// `reaper-trace kill ARGS --api SOCKET`, as root or as `nobody` in `nogroup`.
fn kill(socket: &Path, args: &[&str], as_nobody: bool) -> Output {
    let mut cmd = Command::new(reaper_trace());
    cmd.arg("kill").args(args).arg("--api").arg(socket);
    if as_nobody {
        // SAFETY: setgroups, setgid and setuid are async-signal-safe; the child only execs.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setgid(NOBODY) != 0
                    || libc::setuid(NOBODY) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    cmd.output().expect("run reaper-trace kill")
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

#[test]
fn kill_session_ends_what_one_session_left_and_nothing_else() {
    let test = "kill_session_ends_what_one_session_left_and_nothing_else";
    if !require_root(test) {
        return;
    }
    let dir = scratch(test);
    let socket = dir.join("api.sock");
    let script = gateway(&dir);
    let names = [
        "a-server", "a-inner", "a-forked", "a-owner", "b-server", "b-inner", "b-forked", "b-owner",
    ];
    let mut asked: Vec<(String, Output)> = Vec::new();
    let mut a_killed: Vec<u32> = Vec::new();
    let group = NOBODY.to_string();
    let run = run_reaper_until(
        &[
            "--api",
            socket.to_str().unwrap(),
            "--api-group",
            &group,
            "--term-timeout",
            "2s",
            "--",
            "sh",
            "-c",
            &script,
        ],
        &[],
        &dir.join("release"),
        ("session A's server and forked sleep killed", Then::Release),
        |events| {
            if a_killed.is_empty() {
                // Every process started, and both sessions known to the run.
                if !names.iter().all(|n| pid_in(&dir, n).is_some())
                    || !session_begun(events, "sess-a")
                    || !session_begun(events, "sess-b")
                {
                    return false;
                }
                let ready = events.iter().find(|e| e["event"] == "ready").unwrap();
                let gw = reaper_tests::pid(&ready["gateway"][0]).to_string();
                let me = std::process::id().to_string();
                asked.push((
                    "dry run".into(),
                    kill(&socket, &["--session", "sess-a", "--dry-run"], false),
                ));
                asked.push((
                    "a group member".into(),
                    kill(&socket, &["--session", "sess-a"], true),
                ));
                asked.push(("protected".into(), kill(&socket, &["1", &gw, &me], false)));
                asked.push((
                    "session A".into(),
                    kill(&socket, &["--session", "sess-a"], false),
                ));
                a_killed = vec![
                    pid_in(&dir, "a-server").unwrap(),
                    pid_in(&dir, "a-inner").unwrap(),
                    pid_in(&dir, "a-forked").unwrap(),
                ];
            }
            a_killed.iter().all(|&p| exited(events, p))
        },
    );
    // Every line: a kill's `sent` may be written after the exit it caused, which proved the
    // point. Before the release: the gateway ends B's processes at the release itself.
    let events = &run.events[..];
    let before = &run.events[..run.proven_after];
    let said = |what: &str| {
        &asked
            .iter()
            .find(|(w, _)| w == what)
            .unwrap_or_else(|| panic!("`{what}` was never asked: {}", run.stderr))
            .1
    };
    let pid = |name: &str| pid_in(&dir, name).unwrap();
    // A's leftovers: its server (the wrapper and the sleep it runs) and its forked sleep.
    let a_left = a_killed;
    assert_eq!(a_left.len(), 3, "{}", run.stderr);
    // --dry-run: each named, nothing sent (they lived on to the real kill).
    let dry = said("dry run");
    assert_eq!(dry.status.code(), Some(0), "{}", text(dry));
    let dry_out = String::from_utf8_lossy(&dry.stdout);
    for p in &a_left {
        let line = dry_out
            .lines()
            .find(|l| l.starts_with(&format!("pid {p} (")));
        assert!(
            line.is_some_and(|l| l.ends_with("would be signalled (--dry-run: nothing sent)")),
            "{p}: {}",
            text(dry)
        );
    }
    // An --api-group member asks, and is refused.
    let member = said("a group member");
    assert_ne!(member.status.code(), Some(0), "{}", text(member));
    assert!(
        String::from_utf8_lossy(&member.stderr).contains("only root may kill"),
        "{}",
        text(member)
    );
    // Protected: pid 1 and reaper-trace's caller are not tracked, the gateway is never killed.
    let protected = said("protected");
    assert_eq!(protected.status.code(), Some(1), "{}", text(protected));
    let out = String::from_utf8_lossy(&protected.stdout);
    assert!(
        out.contains("pid 1: refused: not tracked by this run"),
        "{}",
        text(protected)
    );
    assert!(
        out.contains("refused: a gateway, pid 1, reaper-trace"),
        "{}",
        text(protected)
    );
    // The kill: A's leftovers reached and gone, by the run, with who asked; the server's
    // sleep too, below it (the dry run before it left no trace). Leaves first: the sleeps
    // get SIGTERM; the wrapper may have exited on its own by its turn (its `wait` returned),
    // which its step says.
    let killed = said("session A");
    assert_eq!(killed.status.code(), Some(0), "{}", text(killed));
    for &p in &a_left {
        let (name, p) = (p, u64::from(p));
        let steps: Vec<&Value> = events
            .iter()
            .filter(|e| e["event"] == "kill" && e["pid"].as_u64() == Some(p))
            .collect();
        let reached = steps
            .iter()
            .any(|e| e["result"] == "sent" || e["result"] == "exited");
        assert!(reached, "{name}: {steps:?}");
        let inner_or_forked = p != u64::from(pid("a-server"));
        assert!(
            !inner_or_forked
                || steps
                    .iter()
                    .any(|e| e["signal"] == "SIGTERM" && e["result"] == "sent"),
            "{name}: {steps:?}"
        );
        assert!(steps.iter().all(|e| e["asked_by"]["uid"] == 0), "{steps:?}");
        assert!(
            steps.iter().all(|e| e.get("reason").is_none()),
            "no flag held: {steps:?}"
        );
    }
    // Nothing else: A's per-session process (its owner), B's identical processes and the
    // gateway were neither signalled nor ended.
    for name in ["a-owner", "b-server", "b-inner", "b-forked", "b-owner"] {
        let p = pid(name);
        let is_p = |e: &&Value| e["pid"].as_u64() == Some(u64::from(p));
        let signalled = events
            .iter()
            .filter(is_p)
            .filter(|e| e["event"] == "kill" && e["result"] != "dry_run");
        let exited = before.iter().filter(is_p).filter(|e| e["event"] == "exit");
        let touched: Vec<&Value> = signalled.chain(exited).collect();
        assert!(touched.is_empty(), "{name} ({p}) was touched: {touched:?}");
    }
    // The dry run's steps are in the stream too (with A's other live processes at that
    // moment: its per-session process's own `sleep 0.05`s).
    for &name in &a_left {
        let p = u64::from(name);
        let dry = (events.iter())
            .any(|e| e["event"] == "kill" && e["result"] == "dry_run" && e["pid"] == p);
        assert!(dry, "{name}: no dry_run step");
    }
    assert!(!alive(pid("a-server")));
    run.assert_well_formed();
}
