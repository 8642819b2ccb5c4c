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
    privileges_after_ready_in(args, |_| {}).0
}

/// [`privileges_after_ready`], with `setup` applied to the command first; also returns what
/// reaper-trace wrote on stderr.
fn privileges_after_ready_in(
    args: &[&str],
    setup: impl FnOnce(&mut Command),
) -> ((u64, u64, u64, u64, String), String) {
    let mut cmd = Command::new(reaper_trace());
    cmd.args(["--json", "--quiet"])
        .args(args)
        // The gateway lives until the test closes its stdin: no window to race.
        .args(["--", "sh", "-c", "read line || true"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    setup(&mut cmd);
    let mut child = cmd.spawn().unwrap();
    // Read to its end on a thread of its own: a full pipe never holds the run.
    let mut stderr = child.stderr.take().unwrap();
    let stderr = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut text);
        text
    });
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
    let status = child.wait().unwrap();
    let stderr = stderr.join().unwrap();
    assert!(status.success(), "{stderr}");
    ((sets.0, sets.1, sets.2, sets.3, nnp), stderr)
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

/// A bounding set the kernel refuses to narrow (here a seccomp filter refuses
/// `prctl(PR_CAPBSET_DROP)`, as an LSM may): it keeps what it holds, says so, and every other
/// capability is given up all the same: the effective and permitted sets are what inspection
/// and the API need, and no_new_privs is set.
#[test]
fn a_refused_bounding_set_drop_gives_up_the_rest() {
    if !require_root("a_refused_bounding_set_drop_gives_up_the_rest") {
        return;
    }
    use std::os::unix::process::CommandExt;
    let bounding_before = caps::read(None, caps::CapSet::Bounding).unwrap();
    let ((eff, prm, bnd, inh, nnp), stderr) = privileges_after_ready_in(&[], |cmd| {
        // SAFETY: one prctl installing a filter built on the child's stack, between fork
        // and exec.
        unsafe { cmd.pre_exec(refuse_bounding_drops) };
    });
    eprintln!("{stderr}");
    assert!(
        stderr.contains("from the bounding set")
            && stderr.contains("the bounding set keeps what it still holds"),
        "the refusal is said: {stderr}"
    );
    assert!(!stderr.contains("keeping full privileges"), "{stderr}");
    assert_eq!((eff, prm, inh), (INSPECT | KILL, INSPECT | KILL, 0));
    let bounding: u64 = bounding_before.iter().map(|c| 1 << c.index()).sum();
    assert_eq!(bnd, bounding, "the bounding set as it was given");
    assert_eq!(nnp, "1");
}

/// Installs a seccomp filter on this process that fails `prctl(PR_CAPBSET_DROP, ...)` with
/// EPERM and allows everything else (on this architecture's system calls; arguments read as
/// little-endian, as both supported architectures are).
fn refuse_bounding_drops() -> std::io::Result<()> {
    #[cfg(target_arch = "x86_64")]
    const AUDIT_ARCH: u32 = 0xc000_003e;
    #[cfg(target_arch = "aarch64")]
    const AUDIT_ARCH: u32 = 0xc000_00b7;
    const LOAD_WORD: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
    const JUMP_IF_EQUAL: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
    const RETURN: u16 = 0x06; // BPF_RET | BPF_K
    const ALLOW: u32 = 0x7fff_0000; // SECCOMP_RET_ALLOW
    const FAIL_EPERM: u32 = 0x0005_0000 | libc::EPERM as u32; // SECCOMP_RET_ERRNO
    let op = |code, jt, jf, k| libc::sock_filter { code, jt, jf, k };
    let mut filter = [
        op(LOAD_WORD, 0, 0, 4), // seccomp_data.arch
        op(JUMP_IF_EQUAL, 0, 5, AUDIT_ARCH),
        op(LOAD_WORD, 0, 0, 0), // seccomp_data.nr
        op(JUMP_IF_EQUAL, 0, 3, libc::SYS_prctl as u32),
        op(LOAD_WORD, 0, 0, 16), // seccomp_data.args[0], its low half
        op(JUMP_IF_EQUAL, 0, 1, libc::PR_CAPBSET_DROP as u32),
        op(RETURN, 0, 0, FAIL_EPERM),
        op(RETURN, 0, 0, ALLOW),
    ];
    let program = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_mut_ptr(),
    };
    // SAFETY: `program` points at `filter`, both alive for the call; the kernel copies it.
    let set = unsafe {
        libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER,
            &program as *const libc::sock_fprog,
        )
    };
    match set {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
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
