//! Leaks spawned from a named function (`--spawn-stacks`): the gateway's child A calls
//! setsid() and forks B from a named function, then exits; B waits on the read end of the
//! gateway's pipe and is orphaned. The function forks by:
//! - the raw syscall ([`start_stdio_server_by_syscall`]): the kernel's frame-pointer walk
//!   starts inside it whatever libc was built with;
//! - the C library's fork(), from C built with and without frame pointers (`spawner.c`):
//!   Debian's libc keeps none, so the walk stops in its `_Fork` and the stack is copied;
//! - `std::process::Command` ([`start_stdio_server_by_command`]), as a Rust host does:
//!   posix_spawn's clone, in Rust code without frame pointers.
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::sys::*;

/// Forks the stdin reader that stands for a stdio server, by the system call itself, no libc
/// wrapper. The call is written here, not in a helper: the innermost frame (the kernel's
/// walk starts at the syscall) is this function's, in a debug build too.
#[inline(never)]
fn start_stdio_server_by_syscall(rd: i32, close: &[i32]) -> u32 {
    let pid: i64;
    // SAFETY: x86_64's fork(2) takes no arguments; rcx and r11 are clobbered by `syscall`.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        std::arch::asm!(
            "syscall",
            inlateout("rax") libc::SYS_fork => pid,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    // SAFETY: aarch64 has no fork(2): clone(SIGCHLD, 0, 0, 0, 0) is one, on the same stack;
    // `svc` clobbers only x0.
    #[cfg(target_arch = "aarch64")]
    unsafe {
        std::arch::asm!(
            "svc 0",
            in("x8") libc::SYS_clone,
            inlateout("x0") libc::SIGCHLD as i64 => pid,
            in("x1") 0,
            in("x2") 0,
            in("x3") 0,
            in("x4") 0,
            options(nostack),
        );
    }
    match pid {
        0 => serve_stdin(rd, close),
        pid if pid < 0 => panic!("fork: {pid}"),
        pid => pid as u32,
    }
}

// `spawner.c`, with frame pointers and without (built by tests/build.rs).
#[link(name = "spawner_fp", kind = "static")]
unsafe extern "C" {
    fn spawn_leaky_helper_fp() -> i32;
}
#[link(name = "spawner_nofp", kind = "static")]
unsafe extern "C" {
    fn spawn_leaky_helper_nofp() -> i32;
    fn spawn_other_helper_nofp() -> i32;
}

/// What B does: reads the gateway's pipe (`rd`) as its stdin until EOF, then exits.
fn serve_stdin(rd: i32, close: &[i32]) -> ! {
    as_stdin(rd);
    for fd in close.iter().chain([&rd]) {
        // SAFETY: closing the child's copies.
        unsafe { libc::close(*fd) };
    }
    read_stdin_to_eof();
    // SAFETY: the child ends here, as fork_then's do.
    unsafe { libc::_exit(0) }
}

/// Forks B through the C spawner `spawn`.
fn start_stdio_server_by_c(spawn: unsafe extern "C" fn() -> i32, rd: i32, close: &[i32]) -> u32 {
    // SAFETY: fork() through the C library; the child only makes syscalls before it exits.
    match unsafe { spawn() } {
        0 => serve_stdin(rd, close),
        pid if pid < 0 => panic!("fork: {pid}"),
        pid => pid as u32,
    }
}

/// Starts B as a Rust host starts a stdio server: `cat` with the gateway's pipe as its stdin.
/// Never waited for: A exits at once, and B, orphaned, is the leak.
#[inline(never)]
#[allow(clippy::zombie_processes)]
fn start_stdio_server_by_command(rd: i32, close: &[i32]) -> u32 {
    use std::os::fd::FromRawFd;
    for fd in close {
        // SAFETY: B must not hold the pipe's write end: Command closes nothing it is not told
        // to, so the ends are made close-on-exec.
        unsafe { libc::fcntl(*fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    }
    // SAFETY: `rd` is this process's to give; the Stdio owns it from here.
    let stdin = unsafe { std::process::Stdio::from_raw_fd(rd) };
    let child = std::process::Command::new("cat")
        .stdin(stdin)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("spawn cat");
    std::hint::black_box(child.id())
}

/// `leak-spawn-site-c-fp`, `leak-spawn-site-c-nofp`: B forked through the C library from C.
pub(crate) fn leak_spawn_site_c(truth: &str, frame_pointers: bool) -> Value {
    let (spawn_b, function): (fn(i32, &[i32]) -> u32, _) = match frame_pointers {
        true => (
            |rd, close| start_stdio_server_by_c(spawn_leaky_helper_fp, rd, close),
            "spawn_leaky_helper_fp",
        ),
        false => (
            |rd, close| start_stdio_server_by_c(spawn_leaky_helper_nofp, rd, close),
            "spawn_leaky_helper_nofp",
        ),
    };
    let mut found = super::leaks::orphan_spawned_by(truth, spawn_b);
    found["function"] = json!(function);
    found["file"] = json!("spawner.c");
    found
}

/// `leak-spawn-site-c-exec`: as `leak-spawn-site-c-fp`, from a program that no process left
/// runs: A execs `reaper-shapes fork-through-c-and-exit` ([`fork_through_c_and_exit`]), by a
/// symbolic link beside TRUTH (as `/bin/sh` is one), which forks B through the C library from
/// C with frame pointers and exits at once. A exec'd, so the gateway's code is another
/// program's; once A is gone, nothing maps what its stack needs unwinding in.
pub(crate) fn leak_spawn_site_c_exec(truth: &str) -> Value {
    let link = format!("{truth}.exe");
    let exe = std::fs::read_link("/proc/self/exe").expect("its own executable");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(exe, &link).expect("a link to reaper-shapes");
    let by_exec = |rd: i32, close: &[i32]| -> u32 {
        let fds: Vec<String> = [rd].iter().chain(close).map(i32::to_string).collect();
        let mut argv = vec!["reaper-shapes", "fork-through-c-and-exit"];
        argv.extend(fds.iter().map(String::as_str));
        exec(&link, &argv)
    };
    let mut found = super::leaks::orphans_spawned_by(truth, &[&by_exec]);
    found["function"] = json!("spawn_leaky_helper_fp");
    found["file"] = json!("spawner.c");
    found
}

/// `reaper-shapes fork-through-c-and-exit RD FD...`: forks B through the C library from C
/// with frame pointers, B reading `RD` and closing the `FD`s (the last of them: where B's pid
/// goes, as [`super::leaks::orphans_spawned_by`] reads it), sends B's pid and exits at once.
pub(crate) fn fork_through_c_and_exit(args: &[String]) -> ! {
    let fds: Vec<i32> = args.iter().map(|a| a.parse().expect("an fd")).collect();
    let (&rd, close) = fds.split_first().expect("RD FD...");
    let &pid_to = close.last().expect("the fd B's pid goes to");
    let b = start_stdio_server_by_c(spawn_leaky_helper_fp, rd, close);
    send_pid(pid_to, b);
    // SAFETY: ends the process at once, as a shell does after `cmd &`.
    unsafe { libc::_exit(0) }
}

/// `leak-spawn-site-c-two`: A forks B from `spawn_leaky_helper_nofp` and then C from
/// `spawn_other_helper_nofp`, two callers of the same C library `fork()` in C without frame
/// pointers (two sites the frame-pointer walk sees alike), and exits: both are orphaned.
pub(crate) fn leak_spawn_site_c_two(truth: &str) -> Value {
    let by = |spawn: unsafe extern "C" fn() -> i32| {
        move |rd: i32, close: &[i32]| start_stdio_server_by_c(spawn, rd, close)
    };
    let (b, c) = (by(spawn_leaky_helper_nofp), by(spawn_other_helper_nofp));
    let mut found = super::leaks::orphans_spawned_by(truth, &[&b, &c]);
    found["functions"] = json!(["spawn_leaky_helper_nofp", "spawn_other_helper_nofp"]);
    found["file"] = json!("spawner.c");
    found
}

/// `leak-spawn-site-command`: B started by `std::process::Command`.
pub(crate) fn leak_spawn_site_command(truth: &str) -> Value {
    let mut found = super::leaks::orphan_spawned_by(truth, start_stdio_server_by_command);
    found["function"] = json!("start_stdio_server_by_command");
    found["file"] = json!(file!());
    found
}

pub(crate) fn leak_spawn_site(truth: &str) -> Value {
    let mut found = super::leaks::orphan_spawned_by(truth, start_stdio_server_by_syscall);
    found["function"] = json!("start_stdio_server_by_syscall");
    found["file"] = json!(file!());
    found
}

/// The same leak made while no reaper-trace runs (a restart test), with nothing left that ran
/// the spawning code once it is made: when `REAPER_SHAPES_RELEASE` exists, A calls setsid()
/// and forks B from [`start_stdio_server_by_syscall`] on the gateway's stdin (a pipe the test
/// holds the write end of), writes B's pid to `TRUTH.b` and exits; then the gateway exits. B
/// reads until the test closes the pipe.
pub(crate) fn spawn_site_gap(truth: &str) -> Value {
    let release = std::env::var("REAPER_SHAPES_RELEASE").unwrap_or_default();
    let cap = Instant::now() + patience();
    while !std::path::Path::new(&release).exists() && Instant::now() < cap {
        std::thread::sleep(Duration::from_millis(10));
    }
    let b_truth = format!("{truth}.b");
    let a = fork_then(move || {
        // SAFETY: plain syscalls in the child; the copy of stdin becomes B's.
        let stdin = unsafe {
            libc::setsid();
            libc::dup(0)
        };
        let b = start_stdio_server_by_syscall(stdin, &[]);
        write_truth(&b_truth, &json!({ "b": b }));
        0
    });
    wait_for(a);
    json!({ "a": a })
}
