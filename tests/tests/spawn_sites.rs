//! The code that spawned a leak (`--spawn-stacks`): the spawner's stack taken at the fork in
//! the kernel, located while a process holding its mappings runs, and named when the leak is
//! flagged. Needs root (see `require_root`).
use reaper_tests::{flag, pid, run_leak};

#[test]
fn an_orphans_flag_names_the_function_and_file_that_spawned_it() {
    let Some((run, truth)) = run_leak(
        "an_orphans_flag_names_the_function_and_file_that_spawned_it",
        &["--scan-interval", "250ms"],
        "leak-spawn-site",
        (1, "orphaned"),
    ) else {
        return;
    };
    let b = pid(&truth["b"]);
    let f = flag(&run, b, "orphaned");
    // The spawner (A) exited before the flag: the stack was located through the gateway,
    // whose code A ran (it never exec'd).
    let frames = f["spawned_at"].as_array().expect("spawned_at");
    let innermost = &frames[0];
    let function = innermost["function"].as_str().unwrap_or("");
    let file = innermost["file"].as_str().unwrap_or("");
    assert!(
        function.contains(truth["function"].as_str().unwrap()),
        "the innermost frame names the spawning function: {innermost}\nall: {frames:?}"
    );
    assert!(
        file.ends_with(truth["file"].as_str().unwrap()),
        "and its file: {innermost}"
    );
    assert!(innermost["line"].as_u64().is_some(), "{innermost}");
    assert!(
        innermost["object"]
            .as_str()
            .is_some_and(|o| o.ends_with("reaper-shapes")),
        "{innermost}"
    );
}

#[test]
fn without_spawn_stacks_a_flag_names_no_code() {
    let Some((run, truth)) = run_leak(
        "without_spawn_stacks_a_flag_names_no_code",
        &["--scan-interval", "250ms", "--spawn-stacks", "off"],
        "leak-spawn-site",
        (1, "orphaned"),
    ) else {
        return;
    };
    let f = flag(&run, pid(&truth["b"]), "orphaned");
    assert!(f.get("spawned_at").is_none(), "{f}");
}
