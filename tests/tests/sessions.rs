//! Agent sessions against real processes (`--session-env`, docs/leaks.md#sessions): which
//! session each process is in, by its environment and by the lineage (across `env -i`, a
//! double fork, a reparent to a subreaper, a pid taken again by another session), `orphaned`
//! judged by a session's end where its owner is seen, and values no host should set. Needs
//! root (see `require_root`).
use std::path::Path;

use reaper_tests::{Run, Then, require_root, run_reaper_until, scratch};
use serde_json::Value;

/// The pid of the process that exec'd `sleep SECS` in the stream.
fn sleeper(events: &[Value], secs: &str) -> Option<u64> {
    events.iter().find_map(|e| {
        let argv = e["argv"].as_array()?;
        (e["event"] == "exec" && argv.len() == 2 && argv[1] == secs).then(|| e["pid"].as_u64())?
    })
}

/// The `orphaned` flags raised for `pid`.
fn orphaned(events: &[Value], pid: u64) -> Vec<&Value> {
    let flags = events.iter().filter(|e| e["event"] == "flag");
    flags
        .filter(|f| f["pid"].as_u64() == Some(pid) && f["reason"] == "orphaned")
        .collect()
}

/// A gateway that runs the ways hosts start sessions, each server a `sleep` of its own length
/// holding the run's stdout (a pipe whose other end is open: a channel), its pid written in
/// `dir`; at the release, once every server has started, all are killed. `tag(X)` is the
/// prefix that runs a command in session `sess-X`.
fn gateway(dir: &Path, tag: &dyn Fn(&str) -> String) -> String {
    let d = dir.display();
    let [a, b, c, dd, f] = ["a", "b", "c", "d", "f"].map(tag);
    format!(
        r#"
# B: a per-session process started in its session, whose servers inherit it; it stays (a
# running session). Inside it, a double fork: its middle process exits at once.
{b} sh -c 'sleep 602 & echo $! > {d}/b; ( sleep 603 & echo $! > {d}/b2 ); while [ ! -e "$REAPER_SHAPES_RELEASE" ]; do sleep 0.05; done' &
# B's break is a second older than the others: the chain rule would flag it first.
sleep 1
# A per-session process lives on a moment after starting its servers (its session is read
# after its exec, off the ring's reader: one gone within milliseconds names nothing).
# A: as B, but its per-session process ends (the session ended badly).
{a} sh -c 'sleep 601 & echo $! > {d}/a; sleep 1' &
# C: a per-session process outside any session starts its server in one, then ends.
sh -c '{c} sleep 604 & echo $! > {d}/c; sleep 1' &
# D: the gateway starts a server in a session of the server's alone.
{dd} sleep 605 & echo $! > {d}/d
# F: a per-session process starts its server with a scrubbed environment (env -i), then ends.
{f} sh -c 'env -i sleep 606 & echo $! > {d}/f; sleep 1' &
while [ ! -e "$REAPER_SHAPES_RELEASE" ]; do sleep 0.05; done
for x in a b b2 c d f; do while [ ! -s {d}/$x ]; do sleep 0.05; done; done
kill $(cat {d}/a {d}/b {d}/b2 {d}/c {d}/d {d}/f)
"#
    )
}

/// Session `sess-X` named by the environment, as the hosts do.
fn by_env(x: &str) -> String {
    format!("AGENT_SESSION_ID=sess-{x}")
}

/// reaper-trace, given `args` and the environment `env`, over the gateway of [`gateway`] run
/// by `launch` (a prefix: `env NAME=VALUE`) with its sessions made by `tag`, quick to look
/// and to confirm an orphan, until `proof` holds (`what`), then the release.
fn run_gateway(
    dir: &Path,
    args: &[&str],
    launch: &[&str],
    env: &[(&str, &str)],
    tag: &dyn Fn(&str) -> String,
    what: &str,
    proof: impl FnMut(&[Value]) -> bool,
) -> Run {
    let script = gateway(dir, tag);
    let mut all = vec!["--orphan-grace", "250ms", "--scan-interval", "250ms"];
    all.extend(args);
    all.push("--");
    all.extend(launch);
    all.extend(["sh", "-c", &script]);
    run_reaper_until(
        &all,
        env,
        &dir.join("release"),
        (what, Then::Release),
        proof,
    )
}

/// The servers of the sessions that ended (A, C, F) flagged.
fn ended_sessions_flagged(events: &[Value]) -> bool {
    ["601", "604", "606"]
        .iter()
        .all(|secs| sleeper(events, secs).is_some_and(|pid| !orphaned(events, pid).is_empty()))
}

/// What the gateway of [`gateway`] shows, whichever way its sessions are named: `is(value,
/// X)` says whether a session's value is `sess-X`'s.
fn sessions_ended_and_running(run: &Run, is: &dyn Fn(&Value, &str) -> bool) {
    let events = &run.events;
    let pid = |secs: &str| {
        sleeper(events, secs)
            .unwrap_or_else(|| panic!("no `sleep {secs}` in {:?}\n{}", run.all("exec"), run.stderr))
    };
    let flag = |secs: &str| {
        let flags = orphaned(events, pid(secs));
        assert_eq!(
            flags.len(),
            1,
            "one orphaned flag for sleep {secs}: {flags:?}"
        );
        flags[0].clone()
    };
    // A: its owner, the per-session process, exited: the flag names the session and its end.
    let a = flag("601");
    assert!(is(&a["session"]["id"], "a"), "{a}");
    assert!(a["session"]["ended"].is_u64(), "{a}");
    let owner = a["session"]["owner"].as_u64().unwrap();
    assert_eq!(
        a["lineage"][1].as_u64(),
        Some(owner),
        "the owner spawned it: {a}"
    );
    assert_eq!(a["session"]["begins"].as_u64(), Some(owner), "{a}");
    // C: the per-session process was in no session; it started its server in one, and its
    // exit ended it.
    let c = flag("604");
    assert!(is(&c["session"]["id"], "c"), "{c}");
    assert_eq!(c["session"]["begins"].as_u64(), Some(pid("604")), "{c}");
    assert_eq!(c["session"]["owner"], c["lineage"][1], "{c}");
    // F: env -i scrubbed its environment: it is in its spawner's session, by the lineage.
    let f = flag("606");
    assert!(is(&f["session"]["id"], "f"), "{f}");
    assert_ne!(f["session"]["begins"].as_u64(), Some(pid("606")), "{f}");
    // B: its session runs; its server and the double fork's grandchild, a second longer
    // past their break than A's, are not flagged (while it runs: until the release ends it).
    let running = &events[..run.proven_after];
    for secs in ["602", "603"] {
        let flags = orphaned(running, pid(secs));
        assert!(
            flags.is_empty(),
            "sleep {secs} of the running session: {flags:?}"
        );
    }
    // D: the gateway started the server in a session of its own: the session begins there,
    // and the gateway lives: nothing.
    let d = pid("605");
    assert!(orphaned(events, d).is_empty());
    let begins = |x: &str| {
        events
            .iter()
            .filter(|e| e["event"] == "session" && is(&e["session"], x))
            .filter_map(|e| e["pid"].as_u64())
            .collect::<Vec<_>>()
    };
    assert_eq!(begins("d"), [d], "{:?}", run.all("session"));
    assert_eq!(begins("c"), [pid("604")]);
    assert_eq!(
        begins("b").len(),
        1,
        "begins once, at its per-session process"
    );
    run.assert_well_formed();
}

#[test]
fn a_sessions_end_flags_what_it_left_and_a_break_inside_a_running_session_flags_nothing() {
    let test =
        "a_sessions_end_flags_what_it_left_and_a_break_inside_a_running_session_flags_nothing";
    if !require_root(test) {
        return;
    }
    let dir = scratch(test);
    let what = "the servers of the sessions that ended flagged";
    let run = run_gateway(&dir, &[], &[], &[], &by_env, what, ended_sessions_flagged);
    sessions_ended_and_running(&run, &|value, x| *value == format!("sess-{x}"));
}

/// `--session-cgroup`: a gateway that runs each session in a cgroup of its own below its own
/// (as `systemd-run --scope` or a container per session does); the same sessions, ended and
/// running, as by the environment.
#[test]
fn with_session_cgroup_a_session_is_the_cgroup_below_the_gateways() {
    let test = "with_session_cgroup_a_session_is_the_cgroup_below_the_gateways";
    if !require_root(test) {
        return;
    }
    let dir = scratch("sessions-cgroup");
    let name = format!("reaper-test-sessions-{}", std::process::id());
    let cgroup = reaper_tests::TestCgroup::make(&name);
    let gateway = cgroup.path();
    for x in ["a", "b", "c", "d", "f"] {
        std::fs::create_dir(gateway.join(format!("sess-{x}"))).expect("make a session's cgroup");
    }
    let shapes = reaper_tests::shapes();
    let shapes = shapes.to_str().unwrap();
    let tag = |x: &str| format!("{shapes} cgroup-exec {}/sess-{x}", gateway.display());
    // Every process that names a session in its environment too: the cgroup is what counts.
    let run = run_gateway(
        &dir,
        &["--session-cgroup"],
        &[shapes, "cgroup-exec", gateway.to_str().unwrap()],
        &[],
        &|x| format!("AGENT_SESSION_ID=not-this-{x} {}", tag(x)),
        "the servers of the sessions that ended flagged",
        ended_sessions_flagged,
    );
    drop(cgroup);
    // Its path as the process's /proc/PID/cgroup shows it (below the cgroup namespace's root).
    let suffix = |x: &str| format!("/{name}/sess-{x}");
    sessions_ended_and_running(&run, &|value, x| {
        value.as_str().is_some_and(|v| v.ends_with(&suffix(x)))
    });
    let gateway_pid = reaper_tests::pid(&run.all("ready")[0]["gateway"][0]);
    for e in run.all("session") {
        assert_ne!(
            e["pid"].as_u64(),
            Some(gateway_pid),
            "the gateway's own cgroup is none: {e}"
        );
    }
}

#[test]
fn without_sessions_the_chain_rule_flags_the_double_fork_as_before() {
    let test = "without_sessions_the_chain_rule_flags_the_double_fork_as_before";
    if !require_root(test) {
        return;
    }
    let dir = scratch(test);
    let run = run_gateway(
        &dir,
        &["--session-env", "none"],
        &[],
        &[],
        &by_env,
        "the double fork's grandchild flagged",
        |events| sleeper(events, "603").is_some_and(|pid| !orphaned(events, pid).is_empty()),
    );
    let events = &run.events;
    assert!(events.iter().all(|e| e["event"] != "session"));
    let pid = sleeper(events, "603").unwrap();
    let flag = orphaned(events, pid)[0];
    assert!(flag.get("session").is_none(), "{flag}");
    run.assert_well_formed();
}

#[test]
fn the_runs_own_and_the_gateways_own_values_are_their_environment_not_a_session() {
    let test = "the_runs_own_and_the_gateways_own_values_are_their_environment_not_a_session";
    if !require_root(test) {
        return;
    }
    let dir = scratch(test);
    // reaper-trace runs in a CI job (RUNNER_TRACKING_ID), and the gateway in an agent's shell
    // (CLAUDE_CODE_SESSION_ID): both reach every process, and neither is a session of theirs.
    let run = run_gateway(
        &dir,
        &[],
        &["env", "CLAUDE_CODE_SESSION_ID=agent-shell"],
        &[("RUNNER_TRACKING_ID", "ci-job")],
        &by_env,
        "the servers of the sessions that ended flagged",
        |events| {
            ["601", "606"].iter().all(|secs| {
                sleeper(events, secs).is_some_and(|pid| !orphaned(events, pid).is_empty())
            })
        },
    );
    let events = &run.events;
    // The gateway's own value is written for it (a replay keeps it as ambient too); below
    // it, only the hosts' sessions begin, and the run's own value is never one.
    let gateway = reaper_tests::pid(&run.all("ready")[0]["gateway"][0]);
    let (own, below): (Vec<&Value>, Vec<&Value>) = run
        .all("session")
        .into_iter()
        .partition(|e| e["pid"].as_u64() == Some(gateway));
    assert!(
        !own.is_empty() && own.iter().all(|e| e["session"] == "agent-shell"),
        "the gateway's own value, written for it: {own:?}"
    );
    assert!(
        below.iter().all(|e| e["session"]
            .as_str()
            .is_some_and(|v| v.starts_with("sess-"))),
        "only the hosts' sessions begin: {below:?}"
    );
    // The first of the names in their order: AGENT_SESSION_ID before the agent shell's.
    for (secs, session) in [("601", "sess-a"), ("606", "sess-f")] {
        let pid = sleeper(events, secs).unwrap();
        let flag = orphaned(events, pid)[0];
        assert_eq!(flag["session"]["id"], session, "{flag}");
    }
    run.assert_well_formed();
}

/// `reaper-trace ARGS --api SOCKET` (`sessions`, `why`, `kill`, `tree`): its stdout, once it succeeded; an
/// answer that does not come within a quarter of the tests' patience fails the test (a
/// slow guest's run would otherwise be stopped without a word).
fn ask<A: AsRef<std::ffi::OsStr> + std::fmt::Debug>(args: &[A], socket: &Path) -> String {
    use std::process::Stdio;
    let mut child = std::process::Command::new(reaper_tests::reaper_trace())
        .args(args)
        .arg("--api")
        .arg(socket)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run reaper-trace");
    // The answers are small enough for the pipes' buffers but one (`sessions` of hundreds):
    // read on threads of their own while the cap runs.
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let read = |pipe: &mut dyn std::io::Read| {
        let mut text = Vec::new();
        let _ = pipe.read_to_end(&mut text);
        text
    };
    let (out, err) = std::thread::scope(|scope| {
        let out = scope.spawn(|| read(&mut stdout));
        let err = scope.spawn(|| read(&mut stderr));
        let cap = std::time::Instant::now() + reaper_tests::patience() / 4;
        while child.try_wait().unwrap().is_none() {
            if std::time::Instant::now() > cap {
                let _ = child.kill();
                let _ = child.wait();
                panic!("`reaper-trace {args:?}` never answered");
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        (out.join().unwrap(), err.join().unwrap())
    });
    let status = child.wait().unwrap();
    let out = std::process::Output {
        status,
        stdout: out,
        stderr: err,
    };
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn hostile_session_values_are_cut_escaped_and_kept_exact() {
    let test = "hostile_session_values_are_cut_escaped_and_kept_exact";
    if !require_root(test) {
        return;
    }
    // A short name: the socket's path must fit a UNIX socket's 108 bytes.
    let dir = scratch("sessions-hostile");
    let d = dir.display();
    let socket = dir.join("api.sock");
    // Values no host should set, and many sessions at once: 100 KiB, a newline and ANSI
    // colour, bytes that are not UTF-8, and 200 sessions of one process each (10,000
    // sessions: `cargo xtask bench --only sessions`). Each a `sleep` holding no channel (the
    // bytes' under a `sh` that owns the session: a kill by session spares its owner), and no
    // kind counted as accumulating: what is under test is the values, not the rules.
    const MANY: usize = 200;
    let script = format!(
        r#"
# 100 KiB of x, by the shell alone (a guest has no head or tr).
k=x; i=0; while [ $i -lt 10 ]; do k=$k$k; i=$((i + 1)); done
big=; i=0; while [ $i -lt 100 ]; do big=$big$k; i=$((i + 1)); done
[ ${{#big}} -eq 102400 ] || echo "the value is ${{#big}} bytes, not 102400" > {d}/failed
exec </dev/null >/dev/null 2>&1
AGENT_SESSION_ID="$big" sleep 621 & echo $! > {d}/big
AGENT_SESSION_ID="$(printf 'evil\n\033[31mred\033[0m')" sleep 622 & echo $! > {d}/ansi
AGENT_SESSION_ID="$(printf 'bad\377\376end')" sh -c 'sleep 623 & echo $! > {d}/bytes-child; wait' & echo $! > {d}/bytes
i=0
while [ $i -lt {MANY} ]; do AGENT_SESSION_ID=many-$i sleep 624 & echo $! >> {d}/many; i=$((i+1)); done
while [ ! -e "$REAPER_SHAPES_RELEASE" ]; do sleep 0.05; done
kill $(cat {d}/big {d}/ansi {d}/bytes {d}/bytes-child {d}/many)
"#
    );
    let began = |events: &[Value], pid: u64| {
        events
            .iter()
            .find(|e| e["event"] == "session" && e["pid"].as_u64() == Some(pid))
            .cloned()
    };
    let pid_in = |name: &str| reaper_tests::pid_in(&dir, name).map(u64::from);
    let mut asked: Option<(String, String, String)> = None;
    let mut by_bytes: Option<(String, String)> = None;
    let mut scraped: Option<Vec<u8>> = None;
    let mut refused: Option<[String; 2]> = None;
    let port = reaper_tests::free_port();
    let metrics = format!("127.0.0.1:{port}");
    let run = run_reaper_until(
        &[
            "--metrics",
            &metrics,
            "--max-instances",
            "100000",
            "--api",
            socket.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            &script,
        ],
        &[],
        &dir.join("release"),
        ("every session begun", Then::Release),
        |events| {
            if let Ok(why) = std::fs::read_to_string(dir.join("failed")) {
                panic!("{why}");
            }
            let many = std::fs::read_to_string(dir.join("many")).unwrap_or_default();
            let named = ["big", "ansi", "bytes", "bytes-child"].map(pid_in);
            if many.lines().count() < MANY || named.iter().any(Option::is_none) {
                return false;
            }
            let sessions = events.iter().filter(|e| e["event"] == "session").count();
            if sessions < MANY + 3 {
                return false;
            }
            // The run took the bytes' sleep's exec (its name is `sleep` by then).
            let child = named[3].unwrap();
            let execed = |e: &Value| e["event"] == "exec" && e["pid"].as_u64() == Some(child);
            if !events.iter().any(execed) {
                return false;
            }
            let ansi = named[1].unwrap().to_string();
            asked = Some((
                ask(&["sessions"], &socket),
                ask(&["sessions", "--json"], &socket),
                ask(&["why", &ansi], &socket),
            ));
            // The value that is not UTF-8, named as its bytes.
            use std::os::unix::ffi::OsStrExt;
            let value = std::ffi::OsStr::from_bytes(b"bad\xff\xfeend");
            let args = |verb: &'static str, more: &'static str| {
                [verb, "--session"]
                    .map(std::ffi::OsStr::new)
                    .into_iter()
                    .chain([value, std::ffi::OsStr::new(more)])
                    .collect::<Vec<_>>()
            };
            by_bytes = Some((
                ask(&args("kill", "--dry-run"), &socket),
                ask(&args("tree", "--json"), &socket),
            ));
            scraped = Some(scrape(port));
            // A session named twice, or in base64 that is not: refused, nothing done.
            refused = Some(
                [
                    (
                        "POST",
                        "/v1/kill?session=a&session_b64=YQ%3D%3D&dry_run=true",
                    ),
                    ("GET", "/v1/tree?session_b64=%25%25"),
                ]
                .map(|(method, path)| reaper_tests::api_call(&socket, method, path)),
            );
            true
        },
    );
    let events = &run.events;
    let pid = |name: &str| pid_in(name).unwrap();
    // The stream: each value exact up to 256 bytes, a value not UTF-8 in base64.
    let big = began(events, pid("big")).expect("big's session");
    assert_eq!(big["session"], "x".repeat(256), "cut at 256 bytes");
    let ansi = began(events, pid("ansi")).expect("ansi's session");
    assert_eq!(ansi["session"], "evil\n\u{1b}[31mred\u{1b}[0m");
    let bytes = began(events, pid("bytes")).expect("bytes' session");
    let raw = bytes["session_b64"]
        .as_str()
        .expect("session_b64: not UTF-8");
    use base64::Engine;
    let raw = base64::engine::general_purpose::STANDARD
        .decode(raw)
        .unwrap();
    assert_eq!(raw, b"bad\xff\xfeend");
    // What people read: no control character reaches the terminal, one line a session.
    let (text, json, why) = asked.expect("the run was asked");
    for said in [&text, &why] {
        assert!(
            !said.contains('\u{1b}'),
            "an escape sequence reached the terminal: {said:?}"
        );
    }
    let session_lines = text.lines().filter(|l| l.starts_with("session ")).count();
    assert!(session_lines > MANY, "a line a session: {text}");
    for line in [
        "session evil\\x0a\\x1b[31mred\\x1b[0m:",
        "session bad\\xff\\xfeend:",
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(line)),
            "the value escaped on its line ({line}): {text}"
        );
    }
    assert!(
        why.contains("evil\\x0a\\x1b[31mred"),
        "why names the session, escaped: {why}"
    );
    // A session whose value is not UTF-8 is named by its bytes (`session_b64` on the wire):
    // `kill --dry-run` picks its process (its owner apart) and `tree` draws it.
    let (killed, tree) = by_bytes.expect("the run was asked by the bytes");
    let bytes_pid = pid("bytes-child");
    assert_eq!(
        killed.lines().collect::<Vec<_>>(),
        [format!(
            "pid {bytes_pid} (sleep): would be signalled (--dry-run: nothing sent)"
        )],
        "kill --session by bytes: {killed}"
    );
    assert!(
        tree.contains(&format!("\"pid\":{bytes_pid},")),
        "tree --session by bytes: {tree}"
    );
    assert!(
        !tree.contains(&format!("\"pid\":{},", pid("ansi"))),
        "tree --session picks that session alone: {tree}"
    );
    for answer in refused.expect("the bad requests were made") {
        assert!(
            answer.starts_with("HTTP/1.1 400") && answer.contains("session"),
            "a bad session in a request: {answer}"
        );
    }
    // The metrics: no session value is a label (a value per session would be a series per
    // session, and a hostile value a line of its own).
    let scraped = scraped.expect("the metrics were scraped");
    let text = String::from_utf8_lossy(&scraped);
    assert!(text.contains("reaper_"), "a scrape: {text}");
    for value in [&b"many-"[..], b"evil", b"bad\xff", b"xxxxxxxxxxxxxxxx"] {
        assert!(
            !scraped.windows(value.len()).any(|w| w == value),
            "a session value ({}) in the metrics: {text}",
            String::from_utf8_lossy(value)
        );
    }
    // The API: every session, the long one cut, the other exact.
    let answer: Value = serde_json::from_str(&json).unwrap();
    let rows: Vec<&Value> = (answer.as_object().unwrap().values())
        .flat_map(|a| a["sessions"].as_array().unwrap())
        .collect();
    assert!(rows.len() > MANY, "{json}");
    assert!(rows.iter().any(|r| r["id"] == "x".repeat(256)), "{json}");
    assert!(rows.iter().any(|r| r["id_b64"].is_string()), "{json}");
    run.assert_well_formed();
}

/// GET /metrics on 127.0.0.1:`port`, its bytes as they came; an answer that is not 200, or
/// does not come within a quarter of the tests' patience, fails the test.
fn scrape(port: u16) -> Vec<u8> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("the metrics serve");
    s.set_read_timeout(Some(reaper_tests::patience() / 4))
        .unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut bytes = Vec::new();
    s.read_to_end(&mut bytes).expect("the metrics answered");
    assert!(
        bytes.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&bytes)
    );
    bytes
}

#[test]
fn a_session_is_kept_across_a_subreaper_and_a_reused_pid_is_in_its_own_session() {
    let test = "a_session_is_kept_across_a_subreaper_and_a_reused_pid_is_in_its_own_session";
    if !require_root(test) {
        return;
    }
    // A short name: the socket's path must fit a UNIX socket's 108 bytes.
    let dir = scratch("sessions-subreaper");
    let d = dir.display();
    let socket = dir.join("api.sock");
    let shapes = reaper_tests::shapes();
    let shapes = shapes.display();
    let script = format!(
        r#"
# R: a per-session process that is a child subreaper (it stays: a running session); its
# double fork, with a scrubbed environment, leaves the grandchild reparented to it.
AGENT_SESSION_ID=sess-r {shapes} subreaper sh -c '( env -i sleep 631 & echo $! > {d}/r ); echo $$ > {d}/r-owner; while [ ! -e "$REAPER_SHAPES_RELEASE" ]; do sleep 0.05; done' &
# P: a process of session sess-p1 ends; its pid is taken again by one of sess-p2 (the
# kernel's next pid set to it: ns_last_pid), retried while another process takes it first.
# When a process that lives on (another test's) holds the pid, no try can take it: then a
# new sess-p1 process gives another pid.
p=
n=0
while [ $n -lt 400 ] && [ ! -e {d}/p2 ]; do
    if [ -z "$p" ] || kill -0 $p 2>/dev/null; then
        AGENT_SESSION_ID=sess-p1 sh -c 'echo $$ > {d}/p; sleep 0.5'
        p=$(cat {d}/p)
    fi
    echo $((p - 1)) > /proc/sys/kernel/ns_last_pid
    AGENT_SESSION_ID=sess-p2 sleep 632 &
    if [ $! = $p ]; then echo $! > {d}/p2; else kill $!; wait $! 2>/dev/null; fi
    n=$((n + 1))
done
[ -e {d}/p2 ] || echo "no sess-p1 pid taken again in $n tries (the last: $p)" > {d}/p2-failed
while [ ! -e "$REAPER_SHAPES_RELEASE" ]; do sleep 0.05; done
kill $(cat {d}/r {d}/r-owner {d}/p2 2>/dev/null)
"#
    );
    let pid_in = |name: &str| reaper_tests::pid_in(&dir, name).map(u64::from);
    let session_of = |pid: u64| -> Value {
        let out = std::process::Command::new(reaper_tests::reaper_trace())
            .args(["why", &pid.to_string(), "--json", "--api"])
            .arg(&socket)
            .output()
            .expect("run reaper-trace why");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
        answer["session"].clone()
    };
    let mut asked: Option<(Value, Value)> = None;
    let run = run_reaper_until(
        &["--api", socket.to_str().unwrap(), "--", "sh", "-c", &script],
        &[],
        &dir.join("release"),
        (
            "the grandchild reparented and the pid taken again",
            Then::Release,
        ),
        |events| {
            if let Ok(why) = std::fs::read_to_string(dir.join("p2-failed")) {
                panic!("{why}");
            }
            let (Some(r), Some(owner), Some(p)) = (pid_in("r"), pid_in("r-owner"), pid_in("p2"))
            else {
                return false;
            };
            let reparented = events.iter().any(|e| {
                e["event"] == "reparent"
                    && e["pid"].as_u64() == Some(r)
                    && e["new_ppid"].as_u64() == Some(owner)
            });
            let began = |session: &str| {
                events.iter().any(|e| {
                    e["event"] == "session"
                        && e["pid"].as_u64() == Some(p)
                        && e["session"] == session
                })
            };
            if !reparented || !began("sess-p1") || !began("sess-p2") {
                return false;
            }
            asked = Some((session_of(r), session_of(p)));
            true
        },
    );
    let (r, p) = asked.expect("the run was asked");
    // The grandchild: no value of its own, reparented to the subreaper, in its session still.
    assert_eq!(r["id"], "sess-r", "{r}");
    assert_eq!(r["begins"].as_u64(), pid_in("r-owner"), "{r}");
    // The pid taken again: the new process is in its own session, not the one that ended.
    assert_eq!(p["id"], "sess-p2", "{p}");
    let p = pid_in("p2").unwrap();
    // (Another test's processes may have had the pid too, between the two.)
    let starts: Vec<(&Value, &Value)> = (run.all("session").into_iter())
        .filter(|e| e["pid"].as_u64() == Some(p))
        .filter(|e| e["session"] == "sess-p1" || e["session"] == "sess-p2")
        .map(|e| (&e["session"], &e["start"]))
        .collect();
    assert!(
        starts.len() == 2 && starts[0].1 != starts[1].1,
        "one session event each process that had the pid: {starts:?}"
    );
    run.assert_well_formed();
}
