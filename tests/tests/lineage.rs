//! reaper-trace against the real kernel: each test runs a process shape under it and compares
//! the NDJSON stream with what the shape recorded itself. Needs root (see `require_root`).
use std::process::{Command, Stdio};

use reaper_tests::{
    Run, Then, patience, pid, read_json, reaper_trace, require_root, run_reaper, run_reaper_until,
    run_shape, run_shape_until, scratch, shapes, wait_for_file,
};
use serde_json::{Value, json};

#[test]
fn exit_codes_signals_and_exec_arguments() {
    if !require_root("exit_codes_signals_and_exec_arguments") {
        return;
    }
    let (run, truth) = run_shape("basic", &[]);
    let gw = pid(&truth["gateway"]);
    assert_eq!(run.all("ready")[0]["gateway"], serde_json::json!([gw]));
    assert_eq!(run.forks_by(gw).len(), 3, "{:?}", run.all("fork"));
    for fork in run.forks_by(gw) {
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
    assert_eq!(run.forks_by(gw).len(), 32);
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
        run.forks_by(gw).iter().map(|e| pid(&e["pid"])).collect();
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
