//! The leak rules against real processes: each rule positively and negatively, and the
//! `--check` gate. Needs root (see `require_root`).
use reaper_tests::{
    Then, cleared, flag, pid, pipe_fd, require_root, run_leak, run_shape_until, run_shape_with,
};
use serde_json::{Value, json};

#[test]
fn setsid_grandchild_holding_a_pipe_is_orphaned_with_exact_lineage() {
    let Some((run, truth)) = run_leak(
        "setsid_grandchild_holding_a_pipe_is_orphaned_with_exact_lineage",
        &["--scan-interval", "250ms"],
        "leak-orphan",
        (1, "orphaned"),
    ) else {
        return;
    };
    let (gw, a, b) = (pid(&truth["gateway"]), pid(&truth["a"]), pid(&truth["b"]));
    let f = flag(&run, b, "orphaned");
    assert_eq!(f["lineage"], json!([gw, a, b]));
    assert_eq!(
        f["escaped"], true,
        "A's setsid took B out of the gateway's session: {f}"
    );
    assert_ne!(
        f["ppid"].as_u64(),
        Some(a),
        "B was reparented when A exited: {f}"
    );
    let ancestors = f["ancestors"].as_array().unwrap();
    assert_eq!(ancestors[1]["pid"].as_u64(), Some(a));
    assert!(ancestors[1]["exited"].is_u64(), "A exited: {f}");
    assert!(
        ancestors[0]["exited"].is_null(),
        "the gateway is alive: {f}"
    );
    let stdin = pipe_fd(f, 0);
    assert_eq!(
        (stdin["kind"].as_str(), stdin["end"].as_str()),
        (Some("pipe"), Some("read"))
    );
    assert_eq!(stdin["other_end"], "open");
    let peers = stdin["peers"].as_array().unwrap();
    assert!(
        peers.iter().any(|p| p["pid"].as_u64() == Some(gw)
            && p["end"] == "write"
            && p["fd"] == truth["write_fd"]),
        "the gateway holds the write end: {stdin}"
    );
    assert_eq!(cleared(&run, b, "orphaned")["because"], "exited");
    assert_eq!(run.reasons_of(a), Vec::<String>::new());
    let leaks = &run.summary()["leaks"];
    assert_eq!(leaks["raised"]["orphaned"], 1, "{leaks}");
    assert_eq!(leaks["active"]["orphaned"], 0, "{leaks}");
}

#[test]
fn only_the_abandoned_stdio_servers_are_idle() {
    let Some((run, truth)) = run_leak(
        "only_the_abandoned_stdio_servers_are_idle",
        &["--idle-after", "2s", "--scan-interval", "250ms"],
        "leak-idle",
        (2, "idle"),
    ) else {
        return;
    };
    let busy = pid(&truth["busy"]);
    assert_eq!(
        run.reasons_of(busy),
        Vec::<String>::new(),
        "the busy server"
    );
    for s in truth["abandoned"].as_array().unwrap() {
        let s = pid(s);
        assert_eq!(run.reasons_of(s), vec!["idle"], "abandoned server {s}");
        let f = flag(&run, s, "idle");
        assert!(f["idle_secs"].as_f64().unwrap() >= 2.0, "{f}");
        let stdin = pipe_fd(f, 0);
        assert!(
            stdin["peers"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["pid"] == truth["gateway"]),
            "{stdin}"
        );
        // Released, the gateway closes its write ends and each server reads EOF and exits;
        // a scan can land between the two. Its stdout and stderr are this harness's pipe (a
        // live peer), so such a scan sees the EOF read as data moved.
        let because = &cleared(&run, s, "idle")["because"];
        assert!(
            ["exited", "no live peer on its channels now", "moved data"]
                .contains(&because.as_str().unwrap_or_default()),
            "{because}"
        );
    }
}

#[test]
fn a_sigkilled_agent_leaves_its_worker_and_helper_orphaned() {
    let Some((run, truth)) = run_leak(
        "a_sigkilled_agent_leaves_its_worker_and_helper_orphaned",
        &["--scan-interval", "250ms"],
        "leak-agent-kill",
        (2, "orphaned"),
    ) else {
        return;
    };
    let (gw, agent) = (pid(&truth["gateway"]), pid(&truth["agent"]));
    let (worker, helper) = (pid(&truth["worker"]), pid(&truth["helper"]));
    let w = flag(&run, worker, "orphaned");
    assert_eq!(w["lineage"], json!([gw, agent, worker]));
    let stdin = pipe_fd(w, 0);
    assert_eq!(stdin["end"], "read");
    let peers = stdin["peers"].as_array().unwrap();
    assert!(
        peers
            .iter()
            .any(|p| p["pid"].as_u64() == Some(helper) && p["end"] == "write"),
        "the helper holds the write end: {stdin}"
    );
    assert!(
        !peers.iter().any(|p| p["pid"].as_u64() == Some(agent)),
        "the dead agent holds nothing: {stdin}"
    );
    let h = flag(&run, helper, "orphaned");
    assert_eq!(h["lineage"], json!([gw, agent, helper]));
    assert_eq!(h["escaped"], false, "no setsid anywhere: {h}");
}

#[test]
fn a_reader_ignoring_eof_is_deaf_not_idle() {
    let Some((run, truth)) = run_leak(
        "a_reader_ignoring_eof_is_deaf_not_idle",
        &["--idle-after", "2s", "--scan-interval", "250ms"],
        "leak-deaf",
        (1, "deaf"),
    ) else {
        return;
    };
    let reader = pid(&truth["reader"]);
    assert_eq!(run.reasons_of(reader), vec!["deaf"]);
    let stdin = pipe_fd(flag(&run, reader, "deaf"), 0);
    assert_eq!(stdin["other_end"], "closed", "{stdin}");
    assert_eq!(stdin["peers"], json!([]));
}

#[test]
fn unreaped_children_are_zombies_until_reaped() {
    let Some((run, truth)) = run_leak(
        "unreaped_children_are_zombies_until_reaped",
        &["--zombie-after", "1s", "--scan-interval", "250ms"],
        "leak-zombies",
        (5, "zombie"),
    ) else {
        return;
    };
    let kids = truth["zombies"].as_array().unwrap();
    assert_eq!(kids.len(), 5);
    for k in kids {
        let k = pid(k);
        let f = flag(&run, k, "zombie");
        assert_eq!(f["state"], "Z (zombie)");
        assert_eq!(cleared(&run, k, "zombie")["because"], "reaped");
    }
    assert_eq!(run.summary()["leaks"]["raised"]["zombie"], 5);
}

#[test]
fn a_normal_session_is_never_flagged() {
    let Some((run, truth)) = run_leak(
        "a_normal_session_is_never_flagged",
        &[
            "--idle-after",
            "1s",
            "--zombie-after",
            "1s",
            "--scan-interval",
            "250ms",
        ],
        "normal",
        (1, "idle"),
    ) else {
        return;
    };
    // The positive control, abandoned on purpose, is the only process flagged.
    let control = pid(&truth["control"]);
    let others: Vec<&Value> = run
        .all("flag")
        .into_iter()
        .filter(|f| f["pid"].as_u64() != Some(control))
        .collect();
    assert!(others.is_empty(), "{others:?}");
    assert_eq!(run.reasons_of(control), vec!["idle"]);
}

#[test]
fn check_fails_with_a_leaked_descendant_and_passes_without() {
    if !require_root("check_fails_with_a_leaked_descendant_and_passes_without") {
        return;
    }
    // The escaped grandchild is held until the verdict is in.
    let (run, truth) = run_shape_until(
        &["--check", "--settle", "1s"],
        "setsid-double-fork",
        &[],
        ("the check verdict", Then::Release),
        |events| events.iter().any(|e| e["event"] == "check"),
    );
    assert_eq!(run.status.code(), Some(3), "{}", run.stderr);
    let check = &run.all("check")[0];
    assert_eq!(check["verdict"], "leaked");
    assert_eq!(check["gateway_exit_code"], 0);
    let grandchild = pid(&truth["grandchild"]);
    let leaked = check["leaked"].as_array().unwrap();
    assert_eq!(leaked.len(), 1, "{check}");
    assert_eq!(leaked[0]["pid"].as_u64(), Some(grandchild));
    assert_eq!(
        leaked[0]["lineage"],
        json!([
            pid(&truth["gateway"]),
            pid(&truth["session_leader"]),
            grandchild
        ])
    );

    let (run, _) = run_shape_with(&["--check"], "basic", &[], &[]);
    assert_eq!(run.status.code(), Some(0), "{}", run.stderr);
    assert_eq!(run.all("check")[0]["verdict"], "clean");

    let run = reaper_tests::run_reaper(&["--check", "--", "sh", "-c", "exit 5"]);
    assert_eq!(run.status.code(), Some(4), "{}", run.stderr);
    let check = &run.all("check")[0];
    assert_eq!(
        (
            check["verdict"].as_str(),
            check["gateway_exit_code"].as_i64()
        ),
        (Some("gateway_failed"), Some(5))
    );
}

/// `--check` in a CI log: the readable lines are the findings and the verdict, not the
/// command's every fork and exec (`--verbose` shows those); the NDJSON stream keeps them all.
#[test]
fn check_shows_people_the_verdict_not_every_event() {
    if !require_root("check_shows_people_the_verdict_not_every_event") {
        return;
    }
    let script = "sh -c true; sh -c true; sh -c true";
    let readable = |extra: &[&str]| -> String {
        let out = std::process::Command::new(reaper_tests::reaper_trace())
            .arg("--check")
            .args(extra)
            .args(["--settle", "100ms", "--", "sh", "-c", script])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let quiet = readable(&[]);
    assert!(quiet.contains("CHECK clean"), "{quiet}");
    assert!(quiet.contains("summary"), "{quiet}");
    assert!(
        !quiet.contains("] fork ") && !quiet.contains("] exec "),
        "no lifecycle lines by default: {quiet}"
    );
    let verbose = readable(&["--verbose"]);
    assert!(
        verbose.matches("] fork ").count() >= 3 && verbose.contains("CHECK clean"),
        "{verbose}"
    );
}
