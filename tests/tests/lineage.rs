//! reaper-trace against the real kernel: each test runs a process shape under it and compares
//! the NDJSON stream with what the shape recorded itself. Needs root (see `require_root`).
use std::{
    process::{Command, Stdio},
    time::Duration,
};

use base64::{Engine as _, engine::general_purpose::STANDARD};
use reaper_tests::{
    Run, Then, patience, pid, read_json, reaper_trace, require_root, run_reaper, run_reaper_until,
    run_shape, run_shape_until, scratch, shapes, wait_for_file,
};
use serde_json::{Value, json};

/// Waits until `pid` has exited and is not yet reaped (its state letter is Z).
fn wait_until_zombie(pid: u32) {
    let start = std::time::Instant::now();
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.chars().next());
        if state == Some('Z') {
            return;
        }
        assert!(
            start.elapsed() < patience(),
            "{pid} never became a zombie: {stat}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn forks_by(run: &Run, spawner: u64) -> Vec<&Value> {
    run.all("fork")
        .into_iter()
        .filter(|e| e["spawner"].as_u64() == Some(spawner))
        .collect()
}

#[test]
fn exit_codes_signals_and_exec_arguments() {
    if !require_root("exit_codes_signals_and_exec_arguments") {
        return;
    }
    let (run, truth) = run_shape("basic", &[]);
    let gw = pid(&truth["gateway"]);
    assert_eq!(run.all("ready")[0]["gateway"], serde_json::json!([gw]));
    assert_eq!(forks_by(&run, gw).len(), 3, "{:?}", run.all("fork"));
    for fork in forks_by(&run, gw) {
        assert!(
            fork.get("thread").is_none(),
            "forked by the main thread: {fork}"
        );
    }

    let exit3 = run.one("exit", pid(&truth["exits_3"]));
    assert_eq!(
        (exit3["exit_code"].as_i64(), exit3["signal"].is_null()),
        (Some(3), true)
    );
    let killed = run.one("exit", pid(&truth["killed"]));
    assert_eq!(
        (killed["exit_code"].is_null(), killed["signal"].as_str()),
        (true, Some("SIGKILL"))
    );
    assert_eq!(killed["core"], false);

    let exec = run.one("exec", pid(&truth["execs"]));
    assert_eq!(exec["filename"], "/bin/sh");
    assert_eq!(
        exec["argv"],
        serde_json::json!(["sh", "-c", "exit 0", "arg with space"])
    );
    assert_eq!(exec["truncated"], false);

    // The gateway itself: traced from its first instruction, so its own exec is seen.
    assert_eq!(run.one("exec", gw)["argv"][1], "basic");
    assert_eq!(run.one("exit", gw)["exit_code"], 0);
    for p in [
        gw,
        pid(&truth["exits_3"]),
        pid(&truth["killed"]),
        pid(&truth["execs"]),
    ] {
        run.one("reaped", p);
    }
    assert_eq!(
        run.status.code(),
        Some(0),
        "exit status follows the gateway's"
    );
    run.assert_lossless();
}

#[test]
fn forks_from_32_threads_belong_to_the_process() {
    if !require_root("forks_from_32_threads_belong_to_the_process") {
        return;
    }
    let (run, truth) = run_shape("threads", &[]);
    let gw = pid(&truth["gateway"]);
    let tids: Vec<u64> = truth["tids"].as_array().unwrap().iter().map(pid).collect();
    for fork in run.all("fork") {
        let p = pid(&fork["pid"]);
        assert!(!tids.contains(&p), "thread {p} reported as a process");
    }
    let children = truth["children"].as_array().unwrap();
    assert_eq!(children.len(), 32);
    for child in children {
        let p = pid(&child["pid"]);
        let fork = run.one("fork", p);
        assert_eq!(
            pid(&fork["spawner"]),
            gw,
            "fork from a thread is the tgid's"
        );
        let code = child["code"].as_u64().unwrap();
        assert_eq!(
            (&fork["thread"]["tid"], &fork["thread"]["comm"]),
            (
                &json!(tids[code as usize]),
                &json!(format!("spawner-{code}"))
            ),
            "the spawning thread is named: {fork}"
        );
        assert_eq!(run.one("exit", p)["exit_code"], child["code"]);
    }
    assert_eq!(forks_by(&run, gw).len(), 32);
    run.assert_lossless();
}

#[test]
fn exec_from_a_non_leader_thread_is_the_process() {
    if !require_root("exec_from_a_non_leader_thread_is_the_process") {
        return;
    }
    let (run, truth) = run_shape("exec-from-thread", &[]);
    let child = pid(&truth["child"]);
    let exec = run.one("exec", child);
    assert_eq!(
        pid(&exec["tid"]),
        pid(&truth["thread"]),
        "the exec'ing thread is recorded"
    );
    assert_eq!(exec["argv"], serde_json::json!(["sh", "-c", "exit 7"]));
    assert_eq!(run.one("exit", child)["exit_code"], 7);
    assert!(
        run.all("exec")
            .iter()
            .all(|e| pid(&e["pid"]) != pid(&truth["thread"]))
    );
    run.assert_lossless();
}

#[test]
fn posix_spawn_and_vfork_children_are_followed() {
    if !require_root("posix_spawn_and_vfork_children_are_followed") {
        return;
    }
    let (run, truth) = run_shape("spawn", &[]);
    let gw = pid(&truth["gateway"]);
    let spawned = pid(&truth["posix_spawn"]);
    assert_eq!(pid(&run.one("fork", spawned)["spawner"]), gw);
    assert_eq!(run.one("exec", spawned)["filename"], "/bin/true");
    assert_eq!(run.one("exit", spawned)["exit_code"], 0);
    let vforked = pid(&truth["vfork"]);
    assert_eq!(pid(&run.one("fork", vforked)["spawner"]), gw);
    assert_eq!(run.one("exit", vforked)["exit_code"], 4);
    run.assert_lossless();
}

#[test]
fn setsid_double_fork_grandchild_stays_in_the_lineage() {
    if !require_root("setsid_double_fork_grandchild_stays_in_the_lineage") {
        return;
    }
    // The grandchild is held until the stream shows the gateway's exit and the grandchild's
    // reparenting (the only one in this shape, read from /proc while it lives): that it
    // outlives its gateway rests on that proof, not on a clock.
    let dir = scratch("setsid-double-fork");
    let truth_path = dir.join("truth.json");
    let shapes = shapes();
    let args = [
        "--",
        shapes.to_str().unwrap(),
        "setsid-double-fork",
        truth_path.to_str().unwrap(),
    ];
    let run = run_reaper_until(
        &args,
        &[],
        &dir.join("release"),
        ("the gateway's exit and a reparent event", Then::Release),
        |events| {
            let gateway = events
                .iter()
                .find(|e| e["event"] == "ready")
                .map(|e| e["gateway"][0].clone());
            let reparented = events.iter().any(|e| e["event"] == "reparent");
            reparented
                && gateway.is_some_and(|gw| {
                    events
                        .iter()
                        .any(|e| e["event"] == "exit" && e["pid"] == gw)
                })
        },
    );
    let truth = read_json(&truth_path);
    let gw = pid(&truth["gateway"]);
    let leader = pid(&truth["session_leader"]);
    let grandchild = pid(&truth["grandchild"]);
    assert_eq!(run.one("setsid", leader)["sid"].as_u64(), Some(leader));
    let fork = run.one("fork", grandchild);
    assert_eq!(pid(&fork["spawner"]), leader);
    assert_eq!(
        fork["sid"].as_u64(),
        Some(leader),
        "born in the new session"
    );
    let reparent = run.one("reparent", grandchild);
    assert_eq!(pid(&reparent["old_ppid"]), leader);
    let b_truth = read_json(&dir.join("truth.json.grandchild"));
    assert_eq!(
        reparent["new_ppid"], b_truth["ppid_after"],
        "the new parent is read, not guessed"
    );
    // reaper-trace outlives the gateway while the escaped grandchild lives, then stops.
    assert!(run.one("exit", gw)["ts"].as_u64() < run.one("exit", grandchild)["ts"].as_u64());
    assert_eq!(run.one("exit", grandchild)["exit_code"], 0);
    assert!(run.summary()["alive"].as_array().unwrap().is_empty());
    run.assert_lossless();
}

#[test]
fn gateway_exit_leaves_a_descendant_alive_with_its_lineage() {
    if !require_root("gateway_exit_leaves_a_descendant_alive_with_its_lineage") {
        return;
    }
    // reaper-trace is stopped while the escaped grandchild still runs: once the gateway is
    // reaped (its exit status is then known), and the grandchild is held until after that.
    let (run, truth) = run_shape_until(
        &[],
        "setsid-double-fork",
        &[],
        ("the gateway's reaped event", Then::Interrupt),
        |events| {
            let gateway = events
                .iter()
                .find(|e| e["event"] == "ready")
                .map(|e| e["gateway"][0].clone());
            gateway.is_some_and(|gw| {
                events
                    .iter()
                    .any(|e| e["event"] == "reaped" && e["pid"] == gw)
            })
        },
    );
    let grandchild = pid(&truth["grandchild"]);
    let alive = run.summary()["alive"].as_array().unwrap().clone();
    assert_eq!(alive.len(), 1, "{alive:?}");
    let left = &alive[0];
    assert_eq!(pid(&left["pid"]), grandchild);
    let lineage: Vec<u64> = left["lineage"]
        .as_array()
        .unwrap()
        .iter()
        .map(pid)
        .collect();
    assert_eq!(
        lineage,
        vec![
            pid(&truth["gateway"]),
            pid(&truth["session_leader"]),
            grandchild
        ]
    );
    assert_eq!(
        left["called_setsid"], false,
        "the grandchild itself did not call setsid"
    );
    assert_eq!(
        left["escaped"], true,
        "out of the gateway's session, by its spawner's setsid (schema 2: as in a flag)"
    );
    assert_eq!(run.summary()["gateway_exit_code"], 0);
    run.assert_lossless();
}

#[test]
fn clone_parent_child_has_the_caller_as_spawner() {
    if !require_root("clone_parent_child_has_the_caller_as_spawner") {
        return;
    }
    let (run, truth) = run_shape("clone-parent", &[]);
    let child = pid(&truth["child"]);
    let fork = run.one("fork", child);
    assert_eq!(pid(&fork["spawner"]), pid(&truth["spawner"]));
    assert_eq!(
        pid(&fork["ppid"]),
        pid(&truth["gateway"]),
        "CLONE_PARENT: real parent is the gateway"
    );
    assert_eq!(run.one("exit", child)["exit_code"], 5);
    run.one("reaped", child);
    run.assert_lossless();
}

#[test]
fn storm_of_5000_processes_loses_nothing() {
    if !require_root("storm_of_5000_processes_loses_nothing") {
        return;
    }
    let (run, truth) = run_shape("storm", &["5000"]);
    let gw = pid(&truth["gateway"]);
    let children: std::collections::HashSet<u64> = truth["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(pid)
        .collect();
    assert_eq!(children.len(), 5000);
    let forked: std::collections::HashSet<u64> =
        forks_by(&run, gw).iter().map(|e| pid(&e["pid"])).collect();
    assert_eq!(forked, children, "every fork reported, nothing else");
    let exited = run
        .all("exit")
        .iter()
        .filter(|e| children.contains(&pid(&e["pid"])))
        .count();
    let reaped = run
        .all("reaped")
        .iter()
        .filter(|e| children.contains(&pid(&e["pid"])))
        .count();
    assert_eq!((exited, reaped), (5000, 5000));
    run.assert_lossless();
    let d = &run.summary()["delivery"];
    assert!(
        d["dropped"].as_object().unwrap().values().all(|v| v == 0),
        "{d}"
    );
}

#[test]
fn tree_that_existed_before_attach_and_forks_after() {
    if !require_root("tree_that_existed_before_attach_and_forks_after") {
        return;
    }
    let dir = scratch("tree");
    let truth_path = dir.join("truth.json");
    let mut gateway = Command::new(shapes())
        .args(["tree", truth_path.to_str().unwrap()])
        .spawn()
        .unwrap();
    let before_path = dir.join("truth.json.before");
    wait_for_file(&before_path, patience());
    let before = read_json(&before_path);
    let gw = gateway.id() as u64;

    let mut tracer = Command::new(reaper_trace())
        .args(["--json", "--quiet", "--gateway-pid", &gw.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait for `ready` (the first line once snapshots are out), then let the tree go on.
    let mut stdout = std::io::BufReader::new(tracer.stdout.take().unwrap());
    let mut head = Vec::new();
    loop {
        let mut line = String::new();
        let n = std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
        assert!(n > 0, "reaper-trace ended before ready");
        let done = line.contains("\"event\":\"ready\"");
        head.push(line);
        if done {
            break;
        }
    }
    // SAFETY: signals the gateway this test started.
    unsafe { libc::kill(gw as i32, libc::SIGUSR1) };
    let status = gateway.wait().unwrap();
    assert!(status.success());
    let mut rest = Vec::new();
    std::io::Read::read_to_end(&mut stdout, &mut rest).unwrap();
    let mut stderr = Vec::new();
    std::io::Read::read_to_end(&mut tracer.stderr.take().unwrap(), &mut stderr).unwrap();
    let tracer_status = tracer.wait().unwrap();
    let mut all = head.concat().into_bytes();
    all.extend(rest);
    let run = Run::from_output(&all, &stderr, tracer_status);
    run.assert_well_formed();
    let truth = read_json(&truth_path);

    // Found by seeding: the gateway, A and B, as snapshots before `ready`.
    let (a, b) = (pid(&before["a"]), pid(&before["b"]));
    let snap_pids: Vec<u64> = run.all("snapshot").iter().map(|e| pid(&e["pid"])).collect();
    assert_eq!(snap_pids, vec![gw, a, b]);
    assert_eq!(pid(&run.one("snapshot", b)["ppid"]), a);
    // Forked after attach: C by the gateway and D by C.
    let c = pid(&truth["c"]);
    assert_eq!(pid(&run.one("fork", c)["spawner"]), gw);
    let d: Vec<&Value> = run
        .all("fork")
        .into_iter()
        .filter(|e| pid(&e["spawner"]) == c)
        .collect();
    assert_eq!(d.len(), 1);
    // All of them end, the pre-existing ones included, and the run stops by itself.
    for p in [gw, a, b, c, pid(&d[0]["pid"])] {
        run.one("exit", p);
    }
    assert_eq!(run.one("exit", b)["signal"], "SIGTERM");
    assert!(tracer_status.success(), "{}", run.stderr);
    run.assert_lossless();
}

#[test]
fn bad_input_is_a_clear_error() {
    if !require_root("bad_input_is_a_clear_error") {
        return;
    }
    let run = run_reaper(&["--gateway-pid", "4194304"]);
    assert_eq!(run.status.code(), Some(1));
    assert!(
        run.stderr
            .contains("--gateway-pid 4194304: no such process"),
        "{}",
        run.stderr
    );
    assert!(run.events.is_empty());

    // Kernel threads, init (without --allow-init) and zombies are refused before any load.
    let run = run_reaper(&["--gateway-pid", "2"]);
    assert_eq!(run.status.code(), Some(1));
    assert!(run.stderr.contains("kernel thread"), "{}", run.stderr);
    let run = run_reaper(&["--gateway-pid", "1"]);
    assert_eq!(run.status.code(), Some(1));
    assert!(run.stderr.contains("--allow-init"), "{}", run.stderr);
    let zombie = Command::new("true").spawn().unwrap();
    wait_until_zombie(zombie.id());
    let run = run_reaper(&["--gateway-pid", &zombie.id().to_string()]);
    assert_eq!(run.status.code(), Some(1));
    assert!(run.stderr.contains("zombie"), "{}", run.stderr);
    drop(zombie);

    let run = run_reaper(&["--", "/nonexistent/gateway"]);
    assert_eq!(run.status.code(), Some(1));
    assert!(
        run.stderr.contains("cannot start \"/nonexistent/gateway\""),
        "{}",
        run.stderr
    );

    let out = Command::new(reaper_trace())
        .args(["--ring-size", "3MiB", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("power of two"));
}

#[test]
fn a_stalled_reader_with_a_tiny_ring_loses_records_counted_exactly_and_repairs() {
    if !require_root("a_stalled_reader_with_a_tiny_ring_loses_records_counted_exactly_and_repairs")
    {
        return;
    }
    let dir = scratch("stall");
    let truth = dir.join("truth.json");
    // The gateway stops its own tracer (its parent), forks a storm into a 4 KiB ring that
    // nobody drains, then lets the tracer go on: records must be lost, and every one counted.
    let script = format!(
        "kill -STOP $PPID; {} storm {} 2000; kill -CONT $PPID",
        shapes().display(),
        truth.display()
    );
    let run = run_reaper(&["--ring-size", "4KiB", "--", "sh", "-c", &script]);
    let lost = run.all("lost");
    assert!(
        !lost.is_empty(),
        "a 4 KiB ring behind a stopped reader must overflow"
    );
    let d = &run.summary()["delivery"];
    let dropped: u64 = d["dropped"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    let reported: u64 = lost.iter().map(|l| l["count"].as_u64().unwrap()).sum();
    assert!(dropped > 0, "{d}");
    assert_eq!(reported, dropped, "every dropped record is in a lost event");
    assert_eq!(
        d["consistent"], true,
        "kernel_events == received + dropped: {d}"
    );
    assert_eq!(
        d["kernel_events"].as_u64().unwrap(),
        d["received"].as_u64().unwrap() + dropped
    );
    // Repaired from /proc: nothing the storm made is left "alive" for lack of its exit record.
    assert!(
        run.summary()["alive"].as_array().unwrap().is_empty(),
        "{}",
        run.summary()
    );
    assert_eq!(run.status.code(), Some(0));
}

#[test]
fn a_full_tracked_map_is_a_reported_loss_never_silent() {
    if !require_root("a_full_tracked_map_is_a_reported_loss_never_silent") {
        return;
    }
    let run = run_reaper(&[
        "--max-tracked",
        "16",
        "--",
        "sh",
        "-c",
        // All 30 alive at once however slow the machine: they end only once all are forked.
        "for i in $(seq 30); do sleep 3600 & pids=\"$pids $!\"; done; kill $pids; wait",
    ]);
    let untracked: Vec<u64> = run
        .all("fork")
        .iter()
        .filter(|f| f["untracked"] == true)
        .map(|f| pid(&f["pid"]))
        .collect();
    assert!(
        !untracked.is_empty(),
        "30 live children cannot fit in 16 entries"
    );
    let full: u64 = run
        .all("lost")
        .iter()
        .map(|l| l["kinds"]["tracked_full"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(full as usize, untracked.len());
    let affected: Vec<u64> = run
        .all("lost")
        .iter()
        .flat_map(|l| l["affected"].as_array().unwrap().iter().map(pid))
        .collect();
    for p in &untracked {
        assert!(
            affected.contains(p),
            "untracked child {p} named in a lost event"
        );
    }
    assert_eq!(
        run.summary()["delivery"]["tracked_full"].as_u64(),
        Some(full)
    );
    // Every child is still reported forking: `$(seq 30)` and the 30 sleeps.
    let gw = pid(&run.all("ready")[0]["gateway"][0]);
    assert_eq!(forks_by(&run, gw).len(), 31);
    // The kernel could not follow them, so their ends were learnt from /proc.
    for p in &untracked {
        let exit = run.one("exit", *p);
        assert!(
            exit["exit_code"].is_null() && exit["signal"].is_null(),
            "{exit}"
        );
    }
    assert!(run.summary()["alive"].as_array().unwrap().is_empty());
}

#[test]
fn sigint_stops_cleanly_with_a_summary_of_what_is_alive() {
    if !require_root("sigint_stops_cleanly_with_a_summary_of_what_is_alive") {
        return;
    }
    // The gateway leaves a child running in the background and then runs on itself.
    let mut tracer = Command::new(reaper_trace())
        .args([
            "--json",
            "--quiet",
            "--",
            "/bin/sh",
            "-c",
            "sleep 3600 & exec sleep 3601",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = std::io::BufReader::new(tracer.stdout.take().unwrap());
    let mut lines = String::new();
    while lines.matches("\"event\":\"exec\"").count() < 3 {
        let n = std::io::BufRead::read_line(&mut stdout, &mut lines).unwrap();
        assert!(n > 0, "reaper-trace ended early: {lines}");
    }
    // SAFETY: signals the tracer this test started.
    unsafe { libc::kill(tracer.id() as i32, libc::SIGINT) };
    std::io::Read::read_to_string(&mut stdout, &mut lines).unwrap();
    let status = tracer.wait().unwrap();
    let run = Run::from_output(lines.as_bytes(), b"", status);
    let gateway = pid(&run.all("ready")[0]["gateway"][0]);
    let background = run
        .all("exec")
        .into_iter()
        .find(|e| e["argv"] == serde_json::json!(["sleep", "3600"]))
        .map(|e| pid(&e["pid"]))
        .unwrap();
    // SAFETY: ends the background child this test's gateway left.
    unsafe { libc::kill(background as i32, libc::SIGKILL) };
    assert_eq!(
        status.code(),
        Some(0),
        "stopped by a signal while the gateway still ran"
    );
    // The run ended the gateway command as timeout(1) would; what it left is the summary's.
    let stop = run.one("stop_command", gateway);
    assert_eq!(
        (&stop["signal"], &stop["because"]),
        (&json!("SIGTERM"), &json!("SIGINT"))
    );
    assert_eq!(run.one("exit", gateway)["signal"], "SIGTERM");
    let alive = run.summary()["alive"].as_array().unwrap().clone();
    assert_eq!(alive.len(), 1, "{alive:?}");
    assert_eq!(pid(&alive[0]["pid"]), background);
    assert_eq!(alive[0]["lineage"], json!([gateway, background]));
    assert!(run.summary()["gateway_exit_code"].is_null());
    run.assert_lossless();
}

#[test]
fn setsid_through_the_raw_sys_exit_fallback() {
    if !require_root("setsid_through_the_raw_sys_exit_fallback") {
        return;
    }
    let dir = scratch("raw-setsid");
    let truth = dir.join("truth.json");
    let run = run_reaper(&[
        "--setsid-hook",
        "raw-syscalls",
        "--",
        shapes().to_str().unwrap(),
        "setsid-double-fork",
        truth.to_str().unwrap(),
    ]);
    assert_eq!(run.all("ready")[0]["setsid_hook"], "raw_syscalls");
    let leader = pid(&read_json(&truth)["session_leader"]);
    assert_eq!(run.one("setsid", leader)["sid"].as_u64(), Some(leader));
    run.assert_lossless();
}

/// Hostile names and arguments: the stream stays one valid JSON object per line and lossless
/// (exact bytes in `*_b64`), and the readable lines carry no raw control byte or bidi override.
#[test]
fn hostile_names_and_arguments_stay_lossless_and_inert() {
    if !require_root("hostile_names_and_arguments_stay_lossless_and_inert") {
        return;
    }
    let dir = scratch("hostile");
    let truth = dir.join("truth.json");
    let out = Command::new(reaper_trace())
        .args(["--json", "--"])
        .arg(shapes())
        .arg("hostile")
        .arg(&truth)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let run = Run::from_output(&out.stdout, &out.stderr, out.status);
    run.assert_well_formed();
    run.assert_lossless();
    let truth = read_json(&truth);

    let exec = run.one("exec", pid(&truth["exec"]));
    assert_eq!(exec["truncated"], true, "a 100 KB argument is cut: {exec}");
    let exact: Vec<Vec<u8>> = exec["argv_b64"]
        .as_array()
        .expect("argv_b64: an argument is not UTF-8")
        .iter()
        .map(|a| STANDARD.decode(a.as_str().unwrap()).unwrap())
        .collect();
    let want: [&[u8]; 5] = [
        b"true",
        b"line\nbreak",
        b"\x1b[31mred\x07",
        b"\xff\xfe not utf-8",
        "\u{202e}txt.exe".as_bytes(),
    ];
    assert_eq!(&exact[..5], &want.map(|a| a.to_vec())[..]);
    assert!(
        exact[5].iter().all(|&b| b == b'x'),
        "the long argument, cut"
    );

    let renamed = pid(&truth["renamed"]);
    let fork = run
        .all("fork")
        .into_iter()
        .find(|f| f["spawner"].as_u64() == Some(renamed))
        .expect("the renamed child's fork");
    assert_eq!(fork["comm"], "a\nb\u{1b}[31m");

    // People's lines: every control byte and bidi override escaped.
    let human = String::from_utf8(out.stderr).unwrap();
    assert!(human.contains("exec"), "{human}");
    for c in human.chars() {
        assert!(
            c == '\n' || !(c.is_control() || ('\u{202a}'..='\u{202e}').contains(&c)),
            "raw {c:?} in the readable output"
        );
    }
}
