//! Spawn-site tests' helpers: a host that warms up first, then spawns its server when told;
//! a Node host (`tests/node/spawning_host.js`) run until its server is flagged.
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::{
    Then, checkpointed, end_once_checkpointed, kept_run, parent_of, pid, release_state,
    run_reaper_until, run_reaper_until_in, scratch, state_test, wait_until,
};

/// Writes `trigger` once `events` hold the exec of a host's warm-up child (`true`): it is
/// written once reaper-trace looked at the host's own exec (an interpreter found, a Node host
/// marked), so the spawn the trigger starts is read as the host's.
pub fn trigger_after_warm_up(events: &[Value], warmed: &mut bool, trigger: &Path) {
    if !*warmed
        && events
            .iter()
            .any(|e| e["event"] == "exec" && e["argv"][0] == "true")
    {
        *warmed = true;
        std::fs::write(trigger, b"").unwrap();
    }
}

/// The host script (see its header).
fn spawning_host() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("node/spawning_host.js")
}

/// The perf map options a Node host is run with for its JavaScript frames to be named.
pub const PERF_MAP: &str = "--perf-basic-prof --interpreted-frames-native-stack";

/// Runs `tests/node/spawning_host.js` (`how` it spawns: see its header) under `node_options`
/// until its server is flagged idle; returns the flag's `spawned_at` and the interpreter its
/// exec event named.
pub fn node_spawned_at(test: &str, how: &str, node_options: &str) -> (Vec<Value>, Value) {
    let dir = scratch(test);
    let (trigger, release) = (dir.join("trigger"), dir.join("release"));
    let host = spawning_host();
    let args = [
        "--idle-after",
        "1s",
        "--scan-interval",
        "250ms",
        "--",
        "node",
        host.to_str().unwrap(),
        how,
        trigger.to_str().unwrap(),
        release.to_str().unwrap(),
    ];
    let mut warmed = false;
    let run = run_reaper_until_in(
        &args,
        &[("NODE_OPTIONS", node_options)],
        &release,
        ("the server flagged, with its spawn site", Then::Release),
        |events| {
            trigger_after_warm_up(events, &mut warmed, &trigger);
            events.iter().any(server_flag)
        },
        // Node 20 under --perf-basic-prof also writes V8's log (`isolate-*-v8.log`) where it
        // runs: in the scratch directory, not the checkout.
        |command| {
            command.current_dir(&dir);
        },
    );
    let proven = run.until_proof();
    let flag = proven.all("flag").into_iter().find(|f| server_flag(f));
    let flag = flag.unwrap_or_else(|| panic!("no server flag: {:?}\n{}", run.events, run.stderr));
    assert!(pid(&flag["pid"]) > 0);
    let host = proven
        .all("exec")
        .into_iter()
        .find(|e| e["argv"][0] == "node");
    let interpreter = host
        .and_then(|e| e.get("interpreter").cloned())
        .unwrap_or(Value::Null);
    // The perf map node leaves behind.
    if let Some(host) = host {
        let _ = std::fs::remove_file(format!("/tmp/perf-{}.map", pid(&host["pid"])));
    }
    let frames = flag["spawned_at"].as_array().cloned().unwrap_or_default();
    eprintln!("{test}: {interpreter}: {frames:#?}");
    (frames, interpreter)
}

/// Starts `tests/node/spawning_host.js` (`how`: see its header) on its own, under the perf map
/// options, in `dir` (where node writes its V8 log); it spawns its server once `dir/trigger`
/// exists and ends once `dir/release` does.
pub fn start_node_host(dir: &Path, how: &str) -> std::process::Child {
    std::process::Command::new("node")
        .arg(spawning_host())
        .arg(how)
        .arg(dir.join("trigger"))
        .arg(dir.join("release"))
        .env("NODE_OPTIONS", PERF_MAP)
        .current_dir(dir)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("start node")
}

/// Whether `event` flags the server (`dd`, idle: it waits on the host, which never writes).
fn server_flag(event: &Value) -> bool {
    idle_flag(event, "dd")
}

/// Whether `event` flags process `comm` idle.
fn idle_flag(event: &Value, comm: &str) -> bool {
    event["event"] == "flag" && event["reason"] == "idle" && event["comm"] == comm
}

/// A host's spawn read by one run of reaper-trace and flagged by the next (`--state-dir`):
/// `start` starts the host in the scratch directory it is given, where it spawns its server
/// (`comm`, which waits on it) once `trigger` exists there and ends once `release` does. The
/// first run finds the host, reads the spawn, keeps it in its checkpoint and stops before the
/// server has been idle long enough to flag (`--idle-after 1h`); the second is run until it
/// flags the server idle. Returns that flag's `spawned_at`; none when skipped (see
/// `require_root`).
pub fn spawned_at_across_a_restart(
    test: &str,
    start: impl FnOnce(&Path) -> std::process::Child,
    comm: &str,
) -> Option<Vec<Value>> {
    let (dir, state) = state_test(test)?;
    let mut host = start(&dir);
    let gw = u64::from(host.id());
    let first = kept_run(
        &state,
        &dir.join("first.ndjson"),
        gw,
        &["--idle-after", "1h"],
    );
    wait_until("the checkpoint to hold the host", || {
        checkpointed(&state).contains(&gw)
    });
    std::fs::write(dir.join("trigger"), b"").expect("trigger the spawn");
    let mut server = None;
    wait_until("the host's server", || {
        server = std::fs::read_dir("/proc").ok().and_then(|d| {
            d.flatten().find_map(|e| {
                let p: u64 = e.file_name().to_str()?.parse().ok()?;
                let name = std::fs::read_to_string(format!("/proc/{p}/comm")).ok()?;
                (parent_of(p) == Some(gw) && name.trim() == comm).then_some(p)
            })
        });
        server.is_some()
    });
    end_once_checkpointed(first, &state, server.unwrap(), libc::SIGTERM);
    let args = [
        "--gateway-pid",
        &gw.to_string(),
        "--state-dir",
        state.to_str().unwrap(),
        "--idle-after",
        "1s",
        "--scan-interval",
        "250ms",
    ];
    let second = run_reaper_until(
        &args,
        &[],
        &dir.join("release"),
        (
            "the server flagged by the run after the restart",
            Then::Release,
        ),
        |events| events.iter().any(|e| idle_flag(e, comm)),
    );
    let _ = host.wait();
    let _ = std::fs::remove_file(format!("/tmp/perf-{gw}.map"));
    release_state(&state);
    let proven = second.until_proof();
    let flag = proven.all("flag").into_iter().find(|f| idle_flag(f, comm));
    let flag = flag.unwrap_or_else(|| panic!("no server flag: {:?}", second.events));
    let frames = flag["spawned_at"].as_array().cloned().unwrap_or_default();
    eprintln!("{test}: {frames:#?}");
    Some(frames)
}

/// Fails on a frame that names no code: every frame of a `spawned_at` names a function, a
/// file or an object (a walk that ran into data ends the stack instead, and the flag says so
/// with `spawned_at_truncated`). Every spawn-site test's frames pass through here.
pub fn assert_every_frame_names_code(frames: &[Value]) {
    for f in frames {
        assert!(
            ["function", "file", "object"]
                .iter()
                .any(|k| f[k].as_str().is_some_and(|s| !s.is_empty())),
            "a frame that names no code: {f}\nall: {frames:#?}"
        );
    }
}

/// The first frame in `frames` whose function's name holds `function` (a Rust function's
/// demangled name is its whole path).
pub fn frame_holding<'a>(frames: &'a [Value], function: &str) -> &'a Value {
    assert_every_frame_names_code(frames);
    frames
        .iter()
        .find(|f| f["function"].as_str().is_some_and(|n| n.contains(function)))
        .unwrap_or_else(|| panic!("no frame of {function}: {frames:#?}"))
}

/// The first frame in `frames` naming `function`.
pub fn frame<'a>(frames: &'a [Value], function: &str) -> &'a Value {
    assert_every_frame_names_code(frames);
    frames
        .iter()
        .find(|f| f["function"] == function)
        .unwrap_or_else(|| panic!("no frame of {function}: {frames:#?}"))
}

/// The line (from 1) of the source file `path` that holds `text`, as a frame names it.
pub fn line_of(path: &std::path::Path, text: &str) -> u64 {
    let source = std::fs::read_to_string(path).unwrap();
    let at = source.lines().position(|l| l.contains(text));
    at.unwrap_or_else(|| panic!("{text:?} is in {}", path.display())) as u64 + 1
}
