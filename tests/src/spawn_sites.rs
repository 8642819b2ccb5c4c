//! Spawn-site tests' helpers: a host that warms up first, then spawns its server when told;
//! a Node host (`tests/node/spawning_host.js`) run until its server is flagged.
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::{Then, pid, run_reaper_until_in, scratch};

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

/// Whether `event` flags the server (`dd`, idle: it waits on the host, which never writes).
fn server_flag(event: &Value) -> bool {
    event["event"] == "flag" && event["reason"] == "idle" && event["comm"] == "dd"
}

/// The first frame in `frames` naming `function`.
pub fn frame<'a>(frames: &'a [Value], function: &str) -> &'a Value {
    frames
        .iter()
        .find(|f| f["function"] == function)
        .unwrap_or_else(|| panic!("no frame of {function}: {frames:#?}"))
}
