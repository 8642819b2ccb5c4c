//! The real MCP TypeScript SDK (`@modelcontextprotocol/sdk`, from npm; `cargo xtask test`
//! installs it and names it in `REAPER_MCP_SDK`): a Node MCP host whose stdio server never
//! answers `initialize` is flagged with the SDK's spawn function named; two sessions' hosts
//! run identical SDK stdio servers, one session ends badly, and only its server is flagged.
//! Host only.
use std::path::{Path, PathBuf};

use reaper_tests::{
    PERF_MAP, Then, frame, node_spawned_at as spawned_at, require_root, run_reaper_until, scratch,
    skip,
};
use serde_json::Value;

/// The SDK's install (`REAPER_MCP_SDK`); none (the test skipped, or failed in CI) without one.
fn sdk(test: &str) -> Option<PathBuf> {
    let sdk = std::env::var_os("REAPER_MCP_SDK").map(PathBuf::from);
    if sdk.is_none() {
        skip(
            test,
            "REAPER_MCP_SDK names no install of the MCP SDK (cargo xtask test makes one)",
        );
    }
    sdk
}

#[test]
fn a_node_mcp_hosts_flag_names_the_sdks_spawn_function() {
    let test = "a_node_mcp_hosts_flag_names_the_sdks_spawn_function";
    if !require_root(test) {
        return;
    }
    let Some(sdk) = sdk(test) else {
        return;
    };
    let how = format!("sdk:{}", sdk.to_str().unwrap());
    let (frames, _) = spawned_at(test, &how, PERF_MAP);
    // `StdioClientTransport.start` spawns through cross-spawn, from a promise's executor.
    let start = frame(&frames, "start");
    assert_eq!(start["language"], "javascript", "{start}");
    assert!(
        start["file"]
            .as_str()
            .unwrap()
            .ends_with("/@modelcontextprotocol/sdk/dist/cjs/client/stdio.js"),
        "{start}"
    );
    frame(&frames, "connectToServer");
    // The readable line names the SDK past node's and cross-spawn's own frames.
    let named: Vec<reaper_user::testing::Frame> =
        serde_json::from_value(serde_json::Value::Array(frames.clone())).unwrap();
    let text = reaper_user::testing::spawn_site_text(&named).unwrap();
    assert!(text.contains("start (stdio.js:"), "{text}");
    assert!(
        !text.contains("index.js:7"),
        "cross-spawn is skipped: {text}"
    );
}

/// `tests/node/NAME`.
fn node_script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("node")
        .join(name)
}

/// Whether `e` is the exec of an SDK stdio server (`node mcp_stdio_server.js SDK`).
fn server_exec(e: &Value) -> bool {
    e["event"] == "exec"
        && e["argv"][1]
            .as_str()
            .is_some_and(|a| a.ends_with("/mcp_stdio_server.js"))
}

/// The `orphaned` flags of the processes `pids`.
fn orphaned<'a>(events: &'a [Value], pids: &[u64]) -> Vec<&'a Value> {
    events
        .iter()
        .filter(|e| e["event"] == "flag" && e["reason"] == "orphaned")
        .filter(|e| e["pid"].as_u64().is_some_and(|p| pids.contains(&p)))
        .collect()
}

/// A gateway runs two sessions, each a per-session host of the real SDK (its session in
/// `AGENT_SESSION_ID`) that starts an identical SDK stdio server and connects, then a helper
/// holding the server's stdin behind a double fork. Session A's host is killed (the session
/// ends badly): its server, blocked on a pipe its helper still holds, is flagged `orphaned`
/// with session A and its end; B's identical server is not, nor B's helper, whose double
/// fork's middle process exited while B runs.
#[test]
fn of_two_sessions_identical_sdk_servers_only_the_ended_ones_is_flagged() {
    let test = "of_two_sessions_identical_sdk_servers_only_the_ended_ones_is_flagged";
    if !require_root(test) {
        return;
    }
    let Some(sdk) = sdk(test) else {
        return;
    };
    let dir = scratch("mcp-sessions");
    let d = dir.display();
    let (host, server, sdk) = (
        node_script("session_host.js"),
        node_script("mcp_stdio_server.js"),
        sdk.display(),
    );
    let (host, server) = (host.display(), server.display());
    let script = format!(
        r#"
AGENT_SESSION_ID=sess-a node {host} {sdk} {server} {d}/a.pids &
AGENT_SESSION_ID=sess-b node {host} {sdk} {server} {d}/b.pids &
while [ ! -e "$REAPER_SHAPES_RELEASE" ]; do sleep 0.05; done
kill $(cat {d}/a.pids {d}/b.pids 2>/dev/null) 2>/dev/null
"#
    );
    let pids = |name: &str| -> Option<Vec<u32>> {
        let text = std::fs::read_to_string(dir.join(format!("{name}.pids"))).ok()?;
        text.split_whitespace().map(|p| p.parse().ok()).collect()
    };
    let mut killed_at = None;
    let run = run_reaper_until(
        &[
            "--orphan-grace",
            "250ms",
            "--scan-interval",
            "250ms",
            "--",
            "sh",
            "-c",
            &script,
        ],
        &[],
        &dir.join("release"),
        ("session A's server flagged", Then::Release),
        |events| {
            let servers: Vec<u64> = events
                .iter()
                .filter(|e| server_exec(e))
                .map(|e| e["pid"].as_u64().unwrap())
                .collect();
            if killed_at.is_none() {
                // Both sessions connected (their servers answered `initialize`): A ends.
                let (Some(a), Some(_)) = (pids("a"), pids("b")) else {
                    return false;
                };
                if servers.len() < 2 {
                    return false;
                }
                // SAFETY: a plain signal to the host this test's gateway started.
                unsafe { libc::kill(a[0] as i32, libc::SIGKILL) };
                killed_at = Some(events.len());
                return false;
            }
            orphaned(events, &servers)
                .iter()
                .any(|f| f["session"]["id"] == "sess-a")
        },
    );
    let events = &run.events;
    let execs: Vec<&Value> = events.iter().filter(|e| server_exec(e)).collect();
    assert_eq!(execs.len(), 2, "two servers: {execs:?}\n{}", run.stderr);
    assert_eq!(
        execs[0]["argv"], execs[1]["argv"],
        "identical command lines"
    );
    let servers: Vec<u64> = execs.iter().map(|e| e["pid"].as_u64().unwrap()).collect();
    let running = &events[..run.proven_after];
    let flags = orphaned(running, &servers);
    assert_eq!(flags.len(), 1, "one server flagged, A's: {flags:?}");
    let a = flags[0];
    let [_, helper_b] = pids("b").unwrap()[..] else {
        panic!("b.pids: a host and a helper");
    };
    let flags = orphaned(running, &[u64::from(helper_b)]);
    assert!(
        flags.is_empty(),
        "B's helper, in a running session: {flags:?}"
    );
    assert_eq!(a["session"]["id"], "sess-a", "{a}");
    assert!(a["session"]["ended"].is_u64(), "A's session ended: {a}");
    let [host_a, helper_a] = pids("a").unwrap()[..] else {
        panic!("a.pids: a host and a helper");
    };
    assert_eq!(
        a["session"]["owner"].as_u64(),
        Some(u64::from(host_a)),
        "its host owned the session: {a}"
    );
    // Blocked on its stdin (Node's child stdio is a UNIX socket pair), whose other end A's
    // helper still holds.
    let stdin = reaper_tests::pipe_fd(a, 0);
    assert_eq!(stdin["protocol"], "unix", "{a}");
    assert_eq!(stdin["other_end"], "open", "{a}");
    let held_by: Vec<u64> = (stdin["peers"].as_array().unwrap().iter())
        .filter_map(|p| p["pid"].as_u64())
        .collect();
    assert!(
        held_by.contains(&u64::from(helper_a)),
        "its helper {helper_a} holds the other end: {a}"
    );
    run.assert_well_formed();
}
