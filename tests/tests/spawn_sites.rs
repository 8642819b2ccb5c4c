//! The code that spawned a leak (`--spawn-stacks`): the spawner's stack taken at the fork in
//! the kernel, located while a process holding its mappings runs, and named when the leak is
//! flagged. Needs root (see `require_root`).
use reaper_tests::{flag, frame_holding, pid, run_leak};
use serde_json::Value;

/// Runs `shape` (B spawned from a named function: see reaper-shapes' `spawn_site`) until B is
/// flagged orphaned; returns the flag's frames, having checked that every frame names code
/// and that the frame of the spawning function (TRUTH's `function`) names its file (TRUTH's
/// `file`) and line, in reaper-shapes. None when skipped (see `require_root`).
fn spawning_function_named(test: &str, shape: &str) -> Option<(Vec<Value>, Value)> {
    let (run, truth) = run_leak(test, &["--scan-interval", "250ms"], shape, (1, "orphaned"))?;
    let f = flag(&run, pid(&truth["b"]), "orphaned");
    let frames = f["spawned_at"].as_array().expect("spawned_at").clone();
    eprintln!("{test}: {frames:#?}");
    let own = frame_holding(&frames, truth["function"].as_str().unwrap());
    let file = own["file"].as_str().unwrap_or("");
    assert!(
        file.ends_with(truth["file"].as_str().unwrap()),
        "the spawning function's frame names its file: {own}\nall: {frames:#?}"
    );
    assert!(own["line"].as_u64().is_some(), "and its line: {own}");
    assert!(
        own["object"]
            .as_str()
            .is_some_and(|o| o.ends_with("reaper-shapes")),
        "{own}"
    );
    Some((frames, truth))
}

#[test]
fn an_orphans_flag_names_the_function_and_file_that_spawned_it() {
    let test = "an_orphans_flag_names_the_function_and_file_that_spawned_it";
    let Some((frames, truth)) = spawning_function_named(test, "leak-spawn-site") else {
        return;
    };
    // The spawner (A) exited before the flag: the stack was located through the gateway,
    // whose code A ran (it never exec'd). The fork is the raw syscall: the walk starts in the
    // spawning function itself.
    let innermost = &frames[0];
    let function = innermost["function"].as_str().unwrap_or("");
    assert!(
        function.contains(truth["function"].as_str().unwrap()),
        "the innermost frame names the spawning function: {innermost}\nall: {frames:?}"
    );
    // Named by the kernel by build id: a frame holds what names it offline too.
    let build_id = reaper_user::testing::build_id_of(&reaper_tests::shapes());
    assert!(build_id.is_some(), "reaper-shapes has a build id");
    assert_eq!(
        innermost["build_id"].as_str(),
        build_id.as_deref(),
        "{innermost}"
    );
}

/// A C spawner forking through the C library's fork(), which keeps no frame pointers: the
/// walk stops there, the stack copied at the site's first fork is unwound by the objects'
/// call frame information, through the C library and up into the spawner's own code.
fn a_c_spawner_is_named(test: &str, shape: &str) {
    let Some((frames, _)) = spawning_function_named(test, shape) else {
        return;
    };
    frame_holding(&frames, "fork");
    // Past the C function: the Rust code that called it (inlined into its caller in a release
    // build, and named all the same), up to the program's main.
    frame_holding(&frames, "start_stdio_server_by_c");
    assert_reaches_main(&frames);
}

/// Fails unless the frames go down to reaper-shapes' `main` (the shape's own, or the C entry
/// point that calls it).
fn assert_reaches_main(frames: &[Value]) {
    let main = |f: &Value| {
        f["function"]
            .as_str()
            .is_some_and(|n| n == "main" || n == "reaper_shapes::main")
            && f["object"]
                .as_str()
                .is_some_and(|o| o.ends_with("reaper-shapes"))
    };
    assert!(frames.iter().any(main), "down to main: {frames:#?}");
}

#[test]
fn a_c_spawner_with_frame_pointers_forking_through_libc_is_named() {
    a_c_spawner_is_named(
        "a_c_spawner_with_frame_pointers_forking_through_libc_is_named",
        "leak-spawn-site-c-fp",
    );
}

#[test]
fn a_c_spawner_without_frame_pointers_forking_through_libc_is_named() {
    a_c_spawner_is_named(
        "a_c_spawner_without_frame_pointers_forking_through_libc_is_named",
        "leak-spawn-site-c-nofp",
    );
}

/// A C spawner in a program of its own that forks through glibc's `fork()` and exits at once
/// (as a shell does after `cmd &`): nothing left maps its objects when its stack copy is
/// unwound, and it is named all the same, from where the kernel found its executable and its
/// C library at the fork.
#[test]
fn a_c_spawner_gone_at_once_with_nothing_left_running_its_code_is_named() {
    a_c_spawner_is_named(
        "a_c_spawner_gone_at_once_with_nothing_left_running_its_code_is_named",
        "leak-spawn-site-c-exec",
    );
}

/// Two functions of one C spawner without frame pointers forking through the same C library
/// `fork()`: the frame-pointer walk stops in the wrapper for both, and each leak still names
/// its own function (two sites, each copied and unwound), never the other's.
#[test]
fn two_callers_of_the_same_fork_wrapper_are_two_sites() {
    let test = "two_callers_of_the_same_fork_wrapper_are_two_sites";
    let Some((run, truth)) = run_leak(
        test,
        &["--scan-interval", "250ms"],
        "leak-spawn-site-c-two",
        (2, "orphaned"),
    ) else {
        return;
    };
    let functions = truth["functions"].as_array().unwrap();
    for (i, reader) in truth["spawned"].as_array().unwrap().iter().enumerate() {
        let f = flag(&run, pid(reader), "orphaned");
        let frames = f["spawned_at"].as_array().expect("spawned_at");
        eprintln!("{test}: {reader}: {frames:#?}");
        let own = functions[i].as_str().unwrap();
        let other = functions[1 - i].as_str().unwrap();
        frame_holding(frames, own);
        assert!(
            !frames
                .iter()
                .any(|f| f["function"].as_str().is_some_and(|n| n.contains(other))),
            "reader {reader} was spawned by {own}, not {other}: {frames:#?}"
        );
    }
}

/// A Rust host's `std::process::Command`: posix_spawn's clone, from Rust code built without
/// frame pointers.
#[test]
fn a_rust_spawner_using_command_is_named() {
    let test = "a_rust_spawner_using_command_is_named";
    let Some((frames, _)) = spawning_function_named(test, "leak-spawn-site-command") else {
        return;
    };
    frame_holding(&frames, "Command>::spawn");
    assert_reaches_main(&frames);
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

/// The entries of the stack stores the reaper-trace whose command line names `gateway` holds:
/// (native stacks, Python stacks), read from its maps by id; none while it is not found.
fn stacks_kept(gateway: u32) -> Option<(usize, usize)> {
    use aya::maps::{HashMap, Map, MapData};
    use reaper_common::{native::NativeStack, python::PyStack};
    let needle = format!("\0{gateway}\0");
    let tracer = std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let text = String::from_utf8_lossy(&cmdline);
        (text.contains("reaper-trace") && text.contains(&needle)).then_some(pid)
    })?;
    let (mut native, mut python) = (None, None);
    for fd in std::fs::read_dir(format!("/proc/{tracer}/fdinfo"))
        .ok()?
        .flatten()
    {
        let info = std::fs::read_to_string(fd.path()).unwrap_or_default();
        let Some(id) = info.lines().find_map(|l| l.strip_prefix("map_id:")) else {
            continue;
        };
        let Ok(data) = MapData::from_id(id.trim().parse().ok()?) else {
            continue;
        };
        let name = data.info().ok()?.name_as_str().unwrap_or("").to_owned();
        match name.as_str() {
            "STACKS" => {
                let map = HashMap::<_, u64, NativeStack>::try_from(Map::HashMap(data)).ok()?;
                native = Some(map.keys().count());
            }
            "PY_STACKS" => {
                let map = HashMap::<_, u64, PyStack>::try_from(Map::HashMap(data)).ok()?;
                python = Some(map.keys().count());
            }
            _ => {}
        }
    }
    Some((native?, python?))
}

#[test]
fn an_untracked_fork_takes_no_stack_and_a_tracked_one_does() {
    use reaper_tests::{Then, require_root, run_reaper_until, scratch};
    use std::io::Write;
    use std::process::{Command, Stdio};
    let test = "an_untracked_fork_takes_no_stack_and_a_tracked_one_does";
    if !require_root(test) {
        return;
    }
    // The gateway: a shell that forks once when it reads a line, then waits for another.
    let mut gateway = Command::new("sh")
        .args(["-c", "read go; /bin/true; read end"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    let gw = gateway.id();
    let mut stdin = gateway.stdin.take().unwrap();
    let dir = scratch(test);
    let (mut untracked, mut tracked) = (None, None);
    let run = run_reaper_until(
        &["--gateway-pid", &gw.to_string()],
        &[],
        &dir.join("release"),
        (
            "the stores read after untracked forks, then a tracked one",
            Then::Interrupt,
        ),
        |events| {
            if untracked.is_none() && events.iter().any(|e| e["event"] == "ready") {
                // Forks beside the gateway, by this test's own (untracked) process.
                for _ in 0..50 {
                    Command::new("/bin/true").status().unwrap();
                }
                untracked = stacks_kept(gw);
                writeln!(stdin).unwrap();
            }
            // The stack is kept at the fork itself, before its record is even read.
            let forked = events
                .iter()
                .any(|e| e["event"] == "fork" && e["spawner"] == gw);
            if untracked.is_some() && tracked.is_none() && forked {
                tracked = stacks_kept(gw);
            }
            tracked.is_some()
        },
    );
    drop(stdin);
    let _ = gateway.kill();
    let _ = gateway.wait();
    assert_eq!(
        untracked,
        Some((0, 0)),
        "50 untracked forks kept no stack\n{}",
        run.stderr
    );
    let (native, _) = tracked.expect("the stores read after the gateway's fork");
    assert_eq!(native, 1, "the gateway's fork kept its stack");
}

/// A spawn whose spawner, and every process that ran the spawner's code, is gone before the
/// flag, with a restart of reaper-trace in between (`--state-dir`): the gateway's child A forks
/// B from a named function and exits, then the gateway exits (`spawn-site-gap`). The fork is
/// read by the run after the restart (`in_gap`: it waits in the ring) or by the one before,
/// whose long `--orphan-grace` leaves the flag to the next run. Either way the next run, given
/// the same `--gateway-pid` (its gateway gone), names B's spawn site from the build ids and
/// files the first run learned.
fn spawn_site_across_a_restart(test: &str, in_gap: bool) {
    use reaper_tests::{
        Then, checkpointed, end_once_checkpointed, kept_run, read_json, release_state,
        run_reaper_until, shapes, state_test, wait_for_file, wait_until,
    };
    use std::process::{Command, Stdio};
    let Some((dir, state)) = state_test(test) else {
        return;
    };
    let (truth, release) = (dir.join("truth.json"), dir.join("release"));
    let mut gateway = Command::new(shapes())
        .arg("spawn-site-gap")
        .arg(&truth)
        .env("REAPER_SHAPES_RELEASE", &release)
        .env(reaper_tests::HOLD_CAP, reaper_tests::hold_cap())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("start the gateway");
    let gw = u64::from(gateway.id());
    let mut server_input = gateway.stdin.take();
    let first = kept_run(
        &state,
        &dir.join("first.ndjson"),
        gw,
        &["--orphan-grace", "1h"],
    );
    let b_truth = dir.join("truth.json.b");
    let mut spawn = || {
        std::fs::write(&release, b"").expect("release the gateway");
        wait_for_file(&b_truth, reaper_tests::patience());
        let _ = gateway.wait();
        pid(&read_json(&b_truth)["b"])
    };
    let b = match in_gap {
        // The first run learns the gateway's objects, and stops; the probes stay attached
        // and B's fork waits in the ring.
        true => {
            end_once_checkpointed(first, &state, gw, libc::SIGTERM);
            spawn()
        }
        // The first run reads B's fork, keeps it in its checkpoint, and stops.
        false => {
            wait_until("the checkpoint to hold the gateway", || {
                checkpointed(&state).contains(&gw)
            });
            let b = spawn();
            end_once_checkpointed(first, &state, b, libc::SIGTERM);
            b
        }
    };
    let args = [
        "--gateway-pid",
        &gw.to_string(),
        "--state-dir",
        state.to_str().unwrap(),
    ];
    let second = run_reaper_until(
        &args,
        &[],
        &dir.join("end"),
        ("B flagged orphaned", Then::Interrupt),
        |events| {
            let flagged = events
                .iter()
                .any(|e| e["event"] == "flag" && pid(&e["pid"]) == b && e["reason"] == "orphaned");
            if flagged {
                server_input.take();
            }
            flagged
        },
    );
    drop(server_input);
    release_state(&state);
    // The gateway's exit came in the gap (from the ring), or was seen by the first run.
    assert_eq!(
        second
            .all("exit")
            .iter()
            .filter(|e| pid(&e["pid"]) == gw)
            .count(),
        usize::from(in_gap),
        "{:?}",
        second.events
    );
    let f = flag(&second, b, "orphaned");
    let frames = f["spawned_at"].as_array().expect("spawned_at");
    let innermost = &frames[0];
    assert!(
        innermost["function"]
            .as_str()
            .is_some_and(|f| f.contains("start_stdio_server_by_syscall")),
        "named from the file its build id names, with no process left running it: \
         {innermost}\nall: {frames:?}"
    );
    assert_eq!(
        innermost["build_id"].as_str(),
        reaper_user::testing::build_id_of(&shapes()).as_deref(),
        "{innermost}"
    );
}

#[test]
fn a_spawn_read_once_its_spawner_and_gateway_are_gone_is_named_by_build_id() {
    spawn_site_across_a_restart(
        "a_spawn_read_once_its_spawner_and_gateway_are_gone_is_named_by_build_id",
        true,
    );
}

#[test]
fn a_spawn_read_before_a_restart_is_named_by_the_run_after_it() {
    spawn_site_across_a_restart(
        "a_spawn_read_before_a_restart_is_named_by_the_run_after_it",
        false,
    );
}
