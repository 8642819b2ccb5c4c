//! reaper-trace against the real kernel when records cannot all be delivered: a stalled reader
//! with a tiny ring, a full tracked map, a stop by SIGINT. Every loss is counted exactly and
//! repaired; nothing vanishes silently. Needs root (see `require_root`).
use std::process::{Command, Stdio};

use reaper_tests::{Run, pid, reaper_trace, require_root, run_reaper, scratch, shapes};
use serde_json::json;

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
    assert_eq!(run.forks_by(gw).len(), 31);
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
