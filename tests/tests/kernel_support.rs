//! What reaper-trace says about the kernel under it: on a supported one it runs; on one older
//! than 5.12 it refuses by name (the kernel matrix boots Debian's 5.10 for that); without
//! kernel BTF (here: /sys/kernel/btf hidden by an empty tmpfs in a private mount namespace) it
//! says what is missing and what provides it. Needs root (see `require_root`).
use std::process::Command;

use reaper_tests::{Run, reaper_trace, require_root, run_reaper};

/// The running kernel's (major, minor).
fn kernel_version() -> (u32, u32) {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut parts = release
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

#[test]
fn a_supported_kernel_runs_and_an_older_one_is_refused_by_name() {
    if !require_root("a_supported_kernel_runs_and_an_older_one_is_refused_by_name") {
        return;
    }
    let run = run_reaper(&["--", "true"]);
    if kernel_version() >= (5, 12) {
        assert!(run.status.success(), "{}", run.stderr);
        assert_eq!(run.all("ready").len(), 1);
        return;
    }
    assert_eq!(run.status.code(), Some(1), "{}", run.stderr);
    assert!(
        run.stderr.contains("needs Linux 5.12 or newer"),
        "the refusal names the oldest supported kernel: {}",
        run.stderr
    );
    assert!(run.events.is_empty(), "nothing traced: {:?}", run.events);
}

#[test]
fn without_kernel_btf_the_error_names_it() {
    if !require_root("without_kernel_btf_the_error_names_it") {
        return;
    }
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(reaper_trace());
    cmd.args(["--json", "--quiet", "--", "true"]);
    // SAFETY: only unshare and mount between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let check = |rc: libc::c_int| match rc {
                0 => Ok(()),
                _ => Err(std::io::Error::last_os_error()),
            };
            check(libc::unshare(libc::CLONE_NEWNS))?;
            check(libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ))?;
            check(libc::mount(
                c"none".as_ptr(),
                c"/sys/kernel/btf".as_ptr(),
                c"tmpfs".as_ptr(),
                0,
                std::ptr::null(),
            ))
        });
    }
    let out = cmd.output().unwrap();
    let run = Run::from_output(&out.stdout, &out.stderr, out.status);
    assert_eq!(run.status.code(), Some(1), "{}", run.stderr);
    assert!(
        run.stderr.contains("/sys/kernel/btf/vmlinux")
            && run.stderr.contains("CONFIG_DEBUG_INFO_BTF=y"),
        "{}",
        run.stderr
    );
    assert!(run.events.is_empty(), "nothing traced: {:?}", run.events);
}
