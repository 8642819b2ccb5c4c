//! Real Node hosts: a Node MCP host (`tests/node/host.js`) starts stdio servers with
//! `child_process.spawn`, so each server's stdio is a UNIX socket pair (libuv), directly or
//! through wrapper chains (`sh -c`, a launcher script, an `npm exec`-like node launcher). The
//! leak rules must name the host on the other end of each socket, judge a server with its
//! wrappers as one, flag it once, and never count node's internal pipes. Needs root and `node`.
use std::path::{Path, PathBuf};

use reaper_tests::{Run, Then, pid, pipe_fd, require_root, run_reaper_until, scratch};
use reaper_user::testing::{LeakDetail, flag_line};
use serde_json::Value;

/// The host script and its servers, in this package's `node/` directory.
fn host_js() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("node/host.js")
}

/// One server the host started: the process it spawned, and the `server.js` under it.
struct Server {
    spec: String,
    outer: u64,
    leaf: u64,
    active: bool,
}

/// Runs `reaper-trace OPTS -- node host.js TRUTH SPECS...` until `proof` holds over the stream,
/// then releases the host and its servers. Returns the run, the host's pid and its servers.
fn run_host(
    test: &str,
    opts: &[&str],
    specs: &[&str],
    env: &[(&str, &str)],
    what: &str,
    proof: impl FnMut(&[Value]) -> bool,
) -> Option<(Run, u64, Vec<Server>)> {
    if !require_root(test) {
        return None;
    }
    let dir = scratch(test);
    let truth = dir.join("truth.json");
    let host = host_js();
    let mut args = opts.to_vec();
    args.extend([
        "--",
        "node",
        host.to_str().unwrap(),
        truth.to_str().unwrap(),
    ]);
    args.extend_from_slice(specs);
    let run = run_reaper_until(
        &args,
        env,
        &dir.join("release"),
        (what, Then::Release),
        proof,
    );
    let truth = reaper_tests::read_json(&truth);
    let servers = truth["servers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| Server {
            spec: s["spec"].as_str().unwrap().to_owned(),
            outer: pid(&s["pid"]),
            leaf: pid(&s["leaf"]),
            active: s["active"] == true,
        })
        .collect();
    Some((run, pid(&truth["host"]), servers))
}

fn count(events: &[Value], reason: &str) -> usize {
    events
        .iter()
        .filter(|e| e["event"] == "flag" && e["reason"] == reason)
        .count()
}

/// Every channel a flag lists that is not marked internal connects to another process: its
/// other end is not the flagged process's own. And the internal ones are both ends of one
/// channel held by the flagged process.
fn assert_internal_channels_marked(flag: &Value) {
    let me = flag["pid"].as_u64().unwrap();
    let pipes = flag["pipes"].as_array().unwrap();
    for p in pipes {
        let peers = p["peers"].as_array().unwrap();
        assert!(
            !peers.iter().any(|h| h["pid"].as_u64() == Some(me)),
            "a process is never its own peer: {p}"
        );
        if p["internal"] == true {
            let other = match p["kind"].as_str() {
                Some("socket") => p["peer_inode"].as_u64(),
                _ => p["inode"].as_u64(),
            };
            let both_ends_here = pipes.iter().any(|q| {
                q["fd"] != p["fd"] && q["inode"].as_u64() == other && q["end"] != p["end"]
                    || q["kind"] == "socket" && q["inode"].as_u64() == other
            });
            assert!(
                both_ends_here,
                "internal, but the other end is elsewhere: {p}"
            );
        } else if p["kind"] == "pipe" {
            let same_inode_other_end = pipes
                .iter()
                .any(|q| q["inode"] == p["inode"] && q["end"] != p["end"]);
            assert!(
                !same_inode_other_end || !peers.is_empty(),
                "both ends of a pipe held only here, yet not marked internal: {flag}"
            );
        }
    }
}

/// The chain a flag lists: pids, outermost first.
fn chain(flag: &Value) -> Vec<u64> {
    flag["chain"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["pid"].as_u64().unwrap())
        .collect()
}

#[test]
fn a_node_hosts_two_abandoned_servers_are_idle_and_name_the_host() {
    let test = "a_node_hosts_two_abandoned_servers_are_idle_and_name_the_host";
    let Some((run, host, servers)) = run_host(
        test,
        &["--idle-after", "10s", "--scan-interval", "250ms"],
        &["active:direct", "abandoned:direct", "abandoned:direct"],
        &[],
        "2 idle flags",
        |events| count(events, "idle") >= 2,
    ) else {
        return;
    };
    // What came after is the host's teardown, which can orphan a wrapper's child for a moment.
    let run = run.until_proof();
    for s in &servers {
        if s.active {
            assert!(
                run.flags_of(s.outer).is_empty(),
                "the active server is never flagged: {:?}",
                run.all("flag")
            );
            continue;
        }
        assert_eq!(run.reasons_of(s.outer), ["idle"], "{}", s.spec);
        let f = run.flags_of(s.outer)[0];
        for stdio in [0, 1] {
            let sock = pipe_fd(f, stdio);
            assert_eq!(
                sock["kind"], "socket",
                "libuv's stdio is a socket pair: {sock}"
            );
            assert_eq!(sock["other_end"], "open", "{sock}");
            assert!(
                sock["peer_inode"].is_u64(),
                "the kernel named the peer: {sock}"
            );
            let peers = sock["peers"].as_array().unwrap();
            assert!(
                peers
                    .iter()
                    .any(|p| p["pid"].as_u64() == Some(host) && p["fd"].is_u64()),
                "the host holds the other end: {sock}"
            );
        }
        assert_eq!(chain(f), [s.outer], "a server of one process");
        assert_internal_channels_marked(f);
        assert!(
            f["pipes"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["internal"] == true),
            "node's own signal pipes are listed as internal: {f}"
        );
    }
    assert_eq!(run.all("flag").len(), 2, "{:?}", run.all("flag"));
    for line in leak_lines(&run) {
        assert!(
            line.contains(&format!("other end held by {host} (node) fd"))
                && line.contains("fds of its own internal channels")
                && !line.contains("pipe:["),
            "the human line names the host and folds node's plumbing: {line}"
        );
    }
}

/// The human `LEAK` lines of the run's flags, as reaper-trace writes them without `--json`.
fn leak_lines(run: &Run) -> Vec<String> {
    run.all("flag")
        .iter()
        .map(|f| {
            let detail: LeakDetail = serde_json::from_value((*f).clone()).unwrap();
            let line = flag_line(
                f["ts"].as_u64().unwrap(),
                pid(&f["pid"]) as u32,
                serde_json::from_value(f["reason"].clone()).unwrap(),
                f["since"].as_u64().unwrap(),
                &detail,
            );
            eprintln!("{line}");
            line
        })
        .collect()
}

/// `reaper-trace why LEAF --json` and readable, LEAF the `server.js` of the host's server
/// `spec` (from the host's truth file, written once its servers started).
fn why_leaf_of(test: &str, spec: &str) -> (Value, String) {
    let truth = reaper_tests::read_json(&reaper_tests::scratch_path(test).join("truth.json"));
    let servers = truth["servers"].as_array().expect("the host's servers");
    let server = servers
        .iter()
        .find(|s| s["spec"] == spec)
        .expect("the server");
    let leaf = pid(&server["leaf"]).to_string();
    let why = |json: bool| {
        let mut why = std::process::Command::new(reaper_tests::reaper_trace());
        why.args(["why", &leaf]);
        if json {
            why.arg("--json");
        }
        let out = why.output().expect("run reaper-trace why");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    (
        serde_json::from_str(&why(true)).expect("one JSON object"),
        why(false),
    )
}

#[test]
fn wrapper_chains_are_one_server_flagged_once_on_the_outermost() {
    let test = "wrapper_chains_are_one_server_flagged_once_on_the_outermost";
    let mut asked = None;
    let Some((run, host, servers)) = run_host(
        test,
        &["--idle-after", "10s", "--scan-interval", "250ms"],
        &[
            "active:sh",
            "active:script",
            "active:npx",
            "abandoned:npx",
            "abandoned:sh",
        ],
        &[],
        "2 idle flags, and why asked of the abandoned npx server",
        |events| {
            if count(events, "idle") >= 2 && asked.is_none() {
                asked = Some(why_leaf_of(test, "abandoned:npx"));
            }
            asked.is_some()
        },
    ) else {
        return;
    };
    // What came after is the host's teardown, which can orphan a wrapper's child for a moment.
    let run = run.until_proof();
    assert_eq!(run.all("flag").len(), 2, "{:?}", run.all("flag"));
    // `why` of the server inside the abandoned `npx` chain: its lineage from the host down
    // through the wrappers, and the chain's flag on its outermost process.
    let (json, text) = asked.expect("asked");
    let npx = servers.iter().find(|s| s.spec == "abandoned:npx").unwrap();
    eprintln!("{text}");
    let lineage: Vec<u64> = json["lineage"]
        .as_array()
        .unwrap()
        .iter()
        .map(pid)
        .collect();
    assert_eq!(lineage.first(), Some(&host), "{json:#}");
    assert_eq!(lineage.last(), Some(&npx.leaf), "{json:#}");
    assert!(
        lineage.contains(&npx.outer),
        "through the npx wrapper: {json:#}"
    );
    assert!(
        json["flags"].as_array().unwrap().is_empty(),
        "flagged once, on the outermost"
    );
    assert_eq!(pid(&json["server"]["pid"]), npx.outer, "{json:#}");
    let theirs = json["server"]["flags"].as_array().unwrap();
    assert!(theirs.iter().any(|f| f["reason"] == "idle"), "{json:#}");
    assert_eq!(
        chain(&json).first(),
        Some(&npx.outer),
        "the server from its outermost"
    );
    assert_eq!(chain(&json).last(), Some(&npx.leaf), "down to this one");
    let kill = json["kill"]["why"].as_str().unwrap();
    assert!(
        kill.starts_with(&format!("its server's outermost process {}: ", npx.outer)),
        "judged by its server's flags: {json:#}"
    );
    let server = format!(
        "an inner process of the server from {}, which is flagged idle",
        npx.outer
    );
    assert!(text.contains(&server), "{text}");
    for s in &servers {
        if s.active {
            let members: Vec<u64> = run
                .all("exec")
                .iter()
                .map(|e| pid(&e["pid"]))
                .filter(|p| *p == s.outer || *p == s.leaf)
                .collect();
            assert!(!members.is_empty(), "{} ran", s.spec);
            assert!(
                run.flags_of(s.outer).is_empty() && run.flags_of(s.leaf).is_empty(),
                "{}: an active server's wrappers are never flagged: {:?}",
                s.spec,
                run.all("flag")
            );
            continue;
        }
        assert_eq!(run.reasons_of(s.outer), ["idle"], "{}", s.spec);
        assert!(run.flags_of(s.leaf).is_empty(), "{}: flagged once", s.spec);
        let f = run.flags_of(s.outer)[0];
        let members = chain(f);
        assert_eq!(members.first(), Some(&s.outer), "{f}");
        assert_eq!(members.last(), Some(&s.leaf), "down to server.js: {f}");
        let expected = if s.spec.ends_with("npx") { 3 } else { 2 };
        assert_eq!(members.len(), expected, "{}: {f}", s.spec);
        let sock = pipe_fd(f, 0);
        assert!(
            sock["peers"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["pid"].as_u64() == Some(host)),
            "{sock}"
        );
        assert_internal_channels_marked(f);
    }
    let lines = leak_lines(&run);
    assert_eq!(lines.len(), 2, "one line a leaked server: {lines:?}");
    assert!(
        lines
            .iter()
            .all(|l| l.contains("server ") && l.contains(" > ")),
        "the chain reads as one server: {lines:?}"
    );
}

#[test]
fn a_sigkilled_node_host_leaves_each_chain_orphaned_once_then_deaf() {
    let test = "a_sigkilled_node_host_leaves_each_chain_orphaned_once_then_deaf";
    let Some((run, host, servers)) = run_host(
        test,
        &["--idle-after", "3s", "--scan-interval", "250ms"],
        &[
            "active:direct",
            "active:sh",
            "active:npx",
            "abandoned:ignore",
        ],
        &[("HOST_DIE", "1"), ("SERVER_IGNORE_EOF", "1")],
        "3 orphaned and 3 deaf flags",
        |events| count(events, "orphaned") >= 3 && count(events, "deaf") >= 3,
    ) else {
        return;
    };
    let host_exit = run.one("exit", host);
    assert_eq!(host_exit["signal"], "SIGKILL", "{host_exit}");
    for s in &servers {
        if s.spec.ends_with("ignore") {
            assert!(
                run.flags_of(s.outer).is_empty(),
                "a node with only its internal pipes is not orphaned: {:?}",
                run.all("flag")
            );
            continue;
        }
        let mut reasons = run.reasons_of(s.outer);
        reasons.sort();
        assert_eq!(
            reasons,
            ["deaf", "orphaned"],
            "{}: {:?}",
            s.spec,
            run.all("flag")
        );
        if s.leaf != s.outer {
            assert!(
                run.flags_of(s.leaf).is_empty(),
                "{}: once (outer {}, leaf {}); flags: {:?}; cleared: {:?}",
                s.spec,
                s.outer,
                s.leaf,
                run.all("flag"),
                run.all("cleared")
            );
        }
        for f in run.flags_of(s.outer) {
            let stdin = pipe_fd(f, 0);
            assert_eq!(stdin["kind"], "socket", "{stdin}");
            assert_eq!(stdin["other_end"], "closed", "the host is gone: {stdin}");
            assert_eq!(chain(f).last(), Some(&s.leaf), "{f}");
            assert_internal_channels_marked(f);
        }
    }
    assert_eq!(run.all("flag").len(), 6, "{:?}", run.all("flag"));
}

#[test]
fn killing_a_leaked_npx_chain_ends_all_of_it_leaves_first() {
    let test = "killing_a_leaked_npx_chain_ends_all_of_it_leaves_first";
    let exited = |events: &[Value]| {
        events
            .iter()
            .filter(|e| e["event"] == "kill" && e["result"] == "exited")
            .count()
    };
    let Some((run, _host, servers)) = run_host(
        test,
        &[
            "--kill",
            "--kill-reasons",
            "orphaned",
            "--grace",
            "0s",
            "--term-timeout",
            "5s",
            "--scan-interval",
            "250ms",
        ],
        &["active:npx"],
        &[("HOST_DIE", "1"), ("SERVER_IGNORE_EOF", "1")],
        "the chain's 3 processes killed",
        |events| exited(events) >= 3,
    ) else {
        return;
    };
    let s = &servers[0];
    let flags = run.all("flag");
    assert_eq!(flags.len(), 1, "{flags:?}");
    assert_eq!(pid(&flags[0]["pid"]), s.outer);
    let members = chain(flags[0]);
    assert_eq!(
        members.len(),
        3,
        "node wrapper > sh > node server: {members:?}"
    );
    // Each member's first kill step, in order: the server first, the outermost last. (A
    // wrapper may exit by itself once its child is gone: its step is then `exited`.)
    let mut first_steps: Vec<u64> = Vec::new();
    for k in run.all("kill") {
        if !first_steps.contains(&pid(&k["pid"])) {
            first_steps.push(pid(&k["pid"]));
        }
    }
    let leaves_first: Vec<u64> = members.iter().rev().copied().collect();
    assert_eq!(first_steps, leaves_first, "{:?}", run.all("kill"));
    let server_term = run
        .all("kill")
        .into_iter()
        .find(|k| pid(&k["pid"]) == s.leaf)
        .unwrap();
    assert_eq!(
        (&server_term["signal"], &server_term["result"]),
        (&Value::from("SIGTERM"), &Value::from("sent"))
    );
    for m in &members {
        assert!(
            run.all("exit").iter().any(|e| pid(&e["pid"]) == *m),
            "{m} exited"
        );
    }
}
