//! A Node host's spawn sites (`--spawn-stacks auto`): node keeps no frame pointers, so the
//! kernel copies the forking thread's stack at each of its tracked forks and reaper unwinds
//! it with the objects' call frame information; JavaScript frames are named from the host's
//! perf map (`NODE_OPTIONS=--perf-basic-prof --interpreted-frames-native-stack`). Needs root
//! and `node`; runs on every kernel of the matrix (the guests carry node).
use reaper_tests::{PERF_MAP, frame, node_spawned_at as spawned_at, require_root};

#[test]
fn a_node_hosts_flag_names_its_javascript_function_and_the_native_spawn_path() {
    let test = "a_node_hosts_flag_names_its_javascript_function_and_the_native_spawn_path";
    if !require_root(test) {
        return;
    }
    let (frames, interpreter) = spawned_at(test, "spawn", PERF_MAP);
    assert_eq!(interpreter, "node", "the exec event names the host");
    // JavaScript first, innermost first: node's own child_process, then the host's function.
    let own = frame(&frames, "startServer");
    assert_eq!(own["language"], "javascript", "{own}");
    assert!(
        own["file"].as_str().unwrap().ends_with("/spawning_host.js"),
        "{own}"
    );
    let first = &frames[0];
    assert!(
        first["file"]
            .as_str()
            .is_some_and(|f| f.contains("child_process")),
        "{first}"
    );
    frame(&frames, "main");
    // Then native frames, unwound through code with no frame pointers: libuv's spawn, in node.
    let js = frames
        .iter()
        .take_while(|f| f["language"] == "javascript")
        .count();
    let native = &frames[js..];
    assert!(
        native.iter().all(|f| f.get("language").is_none()),
        "{frames:#?}"
    );
    // libuv's spawn is node's own code where node links libuv in (the official builds), or
    // libuv's library where a distribution links it as one (Debian's node).
    let spawn = frame(native, "uv_spawn");
    let object = spawn["object"].as_str().unwrap();
    assert!(
        object.ends_with("node") || object.contains("/libuv.so"),
        "{spawn}"
    );
}

#[test]
fn without_a_perf_map_a_node_hosts_flag_still_names_its_native_frames() {
    let test = "without_a_perf_map_a_node_hosts_flag_still_names_its_native_frames";
    if !require_root(test) {
        return;
    }
    let (frames, _) = spawned_at(test, "spawn", "");
    frame(&frames, "uv_spawn");
    // Interpreted JavaScript runs in V8's trampoline, a native frame of node's; nothing is
    // named from a perf map that is not there.
    assert!(
        frames
            .iter()
            .all(|f| f["language"] != "javascript" || f.get("file").is_none()),
        "{frames:#?}"
    );
}

#[test]
fn a_spawn_near_the_top_of_the_stack_is_unwound_whole() {
    let test = "a_spawn_near_the_top_of_the_stack_is_unwound_whole";
    if !require_root(test) {
        return;
    }
    // The copy's last page ends at the stack's top: the frames up to node's `main` are in it.
    let (frames, _) = spawned_at(test, "shallow", PERF_MAP);
    let own = frame(&frames, "startServer");
    assert_eq!(own["language"], "javascript", "{own}");
    frame(&frames, "uv_spawn");
    frame(&frames, "main");
}

#[test]
fn a_node_hosts_spawn_unwound_before_a_restart_is_named_by_the_run_after_it() {
    let test = "a_node_hosts_spawn_unwound_before_a_restart_is_named_by_the_run_after_it";
    let start = |dir: &std::path::Path| reaper_tests::start_node_host(dir, "spawn");
    let Some(frames) = reaper_tests::spawned_at_across_a_restart(test, start, "dd") else {
        return;
    };
    let own = frame(&frames, "startServer");
    assert_eq!(own["language"], "javascript", "{own}");
    frame(&frames, "uv_spawn");
}
