//! Least privilege: once attached, reaper-trace keeps only what /proc inspection (and killing:
//! --kill, or an API root may ask to kill) needs, and sets no_new_privs. Needs root (see
//! `require_root`).
use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
};

use reaper_tests::{reaper_trace, require_root};

/// CAP_DAC_READ_SEARCH (2) and CAP_SYS_PTRACE (19); CAP_KILL (5) with --kill or the API.
const INSPECT: u64 = 1 << 2 | 1 << 19;
const KILL: u64 = 1 << 5;

/// Starts reaper-trace with `args`, waits for `ready`, and returns its capability sets and
/// no_new_privs from /proc/PID/status.
fn privileges_after_ready(args: &[&str]) -> (u64, u64, u64, u64, String) {
    let mut child = Command::new(reaper_trace())
        .args(["--json", "--quiet"])
        .args(args)
        // The gateway lives until the test closes its stdin: no window to race.
        .args(["--", "sh", "-c", "read line || true"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let ready = lines
        .by_ref()
        .map_while(Result::ok)
        .find(|l| l.contains("\"event\":\"ready\""));
    assert!(ready.is_some(), "no ready event");
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap();
    let field = |name: &str| -> String {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or_else(|| panic!("{name} in {status}"))
            .trim()
            .to_owned()
    };
    let hex = |name: &str| u64::from_str_radix(&field(name), 16).unwrap();
    let sets = (
        hex("CapEff:"),
        hex("CapPrm:"),
        hex("CapBnd:"),
        hex("CapInh:"),
    );
    let nnp = field("NoNewPrivs:");
    drop(child.stdin.take()); // the gateway reads EOF and exits 0
    for _ in lines {}
    assert!(child.wait().unwrap().success());
    (sets.0, sets.1, sets.2, sets.3, nnp)
}

#[test]
fn after_attach_only_inspection_privileges_remain() {
    if !require_root("after_attach_only_inspection_privileges_remain") {
        return;
    }
    let (eff, prm, bnd, inh, nnp) = privileges_after_ready(&["--api", "off"]);
    assert_eq!((eff, prm, bnd, inh), (INSPECT, INSPECT, INSPECT, 0));
    assert_eq!(nnp, "1");

    for args in [&["--kill", "--api", "off"][..], &[]] {
        let (eff, prm, bnd, _, _) = privileges_after_ready(args);
        assert_eq!(
            (eff, prm, bnd),
            (INSPECT | KILL, INSPECT | KILL, INSPECT | KILL),
            "{args:?}: CAP_KILL kept (the API serves `reaper-trace kill`)"
        );
    }
}

/// Without CAP_BPF (root otherwise), the error says which capabilities are missing and how to
/// run it, and nothing is left behind.
#[test]
fn without_bpf_privileges_the_error_names_them() {
    if !require_root("without_bpf_privileges_the_error_names_them") {
        return;
    }
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(reaper_trace());
    cmd.args(["--json", "--quiet", "--", "true"]);
    // SAFETY: only capability syscalls between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            for cap in [
                caps::Capability::CAP_BPF,
                caps::Capability::CAP_SYS_ADMIN,
                caps::Capability::CAP_PERFMON,
            ] {
                caps::drop(None, caps::CapSet::Bounding, cap).map_err(std::io::Error::other)?;
                caps::drop(None, caps::CapSet::Effective, cap).map_err(std::io::Error::other)?;
                caps::drop(None, caps::CapSet::Permitted, cap).map_err(std::io::Error::other)?;
            }
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("CAP_BPF") && stderr.contains("sudo reaper-trace"),
        "{stderr}"
    );
    assert!(
        out.stdout.is_empty(),
        "no event before the probes are attached"
    );
}

/// The capabilities `contrib/reaper-trace.service` bounds the service to.
fn service_unit_capabilities() -> Vec<caps::Capability> {
    let unit = include_str!("../../contrib/reaper-trace.service");
    let line = unit
        .lines()
        .find_map(|l| l.strip_prefix("CapabilityBoundingSet="))
        .expect("the unit sets CapabilityBoundingSet");
    line.split_whitespace()
        .map(|c| {
            c.parse()
                .unwrap_or_else(|_| panic!("{c} is not a capability"))
        })
        .collect()
}

/// Run with nothing but the unit's bounding set (and no_new_privs, as the unit sets), a full
/// audit works: attach, trace, and the closing summary accounts for every record.
#[test]
fn the_service_units_capabilities_are_enough() {
    if !require_root("the_service_units_capabilities_are_enough") {
        return;
    }
    use std::os::unix::process::CommandExt;
    let keep: caps::CapsHashSet = service_unit_capabilities().into_iter().collect();
    assert!(
        !keep.contains(&caps::Capability::CAP_SYS_ADMIN),
        "least privilege: no SYS_ADMIN"
    );
    let mut cmd = Command::new(reaper_trace());
    cmd.args([
        "--json",
        "--quiet",
        "--",
        "sh",
        "-c",
        "sh -c 'sleep 0.2' & wait",
    ]);
    // SAFETY: only capability syscalls and prctl between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            for cap in caps::all().difference(&keep) {
                caps::drop(None, caps::CapSet::Bounding, *cap).map_err(std::io::Error::other)?;
            }
            for set in [
                caps::CapSet::Effective,
                caps::CapSet::Permitted,
                caps::CapSet::Inheritable,
            ] {
                caps::set(None, set, &keep).map_err(std::io::Error::other)?;
            }
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    let run = reaper_tests::Run::from_output(&out.stdout, &out.stderr, out.status);
    assert!(out.status.success(), "{}", run.stderr);
    // Without CAP_SETPCAP the bounding set stays the unit's; the rest is still given up.
    assert!(
        !run.stderr.contains("keeping full privileges"),
        "{}",
        run.stderr
    );
    run.assert_well_formed();
    run.assert_lossless();
    assert_eq!(run.all("fork").len(), 3, "{:?}", run.events);
}
