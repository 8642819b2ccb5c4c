//! Faults: a SIGKILLed reaper-trace leaves no probe attached and disturbs nothing it traced,
//! and a restart seeds the same gateway again. Needs root (see `require_root`). One test in
//! this file, so no other reaper-trace of this binary loads programs meanwhile.
use std::{
    collections::BTreeSet,
    io::{BufRead, BufReader},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use reaper_tests::{patience, pid, reaper_trace, require_root, run_reaper};

/// Ids of the loaded BPF programs named like reaper's probes, from the kernel's own list.
fn probe_programs() -> BTreeSet<u32> {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter(|p| {
            p.name_as_str()
                .is_some_and(|n| n.starts_with("sched_process") || n.starts_with("sys_exit"))
        })
        .map(|p| p.id())
        .collect()
}

/// Ids of the loaded BPF maps named like reaper's, from the kernel's own list.
fn probe_maps() -> BTreeSet<u32> {
    const NAMES: [&str; 6] = [
        "TRACKED",
        "EVENTS",
        "SEQ",
        "READER_IDLE",
        "LOSSES",
        "EXEC_SCRATCH",
    ];
    aya::maps::loaded_maps()
        .filter_map(Result::ok)
        .filter(|m| m.name_as_str().is_some_and(|n| NAMES.contains(&n)))
        .map(|m| m.id())
        .collect()
}

#[test]
fn a_sigkilled_tracer_leaves_nothing_attached_and_a_restart_seeds_again() {
    if !require_root("a_sigkilled_tracer_leaves_nothing_attached_and_a_restart_seeds_again") {
        return;
    }
    let before = probe_programs();
    let maps_before = probe_maps();
    let mut gateway = Command::new("sleep").arg("30").spawn().unwrap();
    let gw = gateway.id().to_string();
    let mut tracer = Command::new(reaper_trace())
        // SIGKILLed below: no API socket to leave behind.
        .args(["--json", "--quiet", "--api", "off", "--gateway-pid", &gw])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let ready = BufReader::new(tracer.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok)
        .any(|l| l.contains("\"event\":\"ready\""));
    assert!(ready, "no ready event");
    let ours: BTreeSet<u32> = probe_programs().difference(&before).copied().collect();
    assert!(
        ours.len() >= 4,
        "the four lifecycle probes are loaded: {ours:?}"
    );

    let our_maps: BTreeSet<u32> = probe_maps().difference(&maps_before).copied().collect();
    assert!(our_maps.len() >= 5, "its maps are loaded: {our_maps:?}");
    tracer.kill().unwrap(); // SIGKILL: no clean-up code runs
    tracer.wait().unwrap();
    let start = Instant::now();
    while !probe_programs().is_disjoint(&ours) {
        assert!(
            start.elapsed() < patience(),
            "programs still loaded after the tracer died: {:?}",
            probe_programs().intersection(&ours).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    while !probe_maps().is_disjoint(&our_maps) {
        assert!(
            start.elapsed() < patience(),
            "maps still loaded (pinned or leaked) after the tracer died: {:?}",
            probe_maps().intersection(&our_maps).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        gateway.try_wait().unwrap().is_none(),
        "the gateway was disturbed"
    );

    let run = run_reaper(&["--duration", "1s", "--gateway-pid", &gw]);
    assert_eq!(run.status.code(), Some(0), "{}", run.stderr);
    let ready = &run.all("ready")[0];
    assert_eq!(pid(&ready["gateway"][0]), u64::from(gateway.id()));
    assert!(ready["tracked"].as_u64().unwrap() >= 1, "{ready}");
    gateway.kill().unwrap();
    gateway.wait().unwrap();
}
