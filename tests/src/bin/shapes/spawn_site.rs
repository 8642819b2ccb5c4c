//! A leak spawned from a named function (`--spawn-stacks`): the gateway's child A calls
//! setsid() and forks B from [`start_stdio_server_by_syscall`], then exits; B waits on the
//! read end of the gateway's pipe and is orphaned. The fork is the raw syscall, made in that
//! function itself: the kernel's frame-pointer walk then starts inside it whatever libc was
//! built with (Debian's libc keeps no frame pointers, so a fork() through it shows only its
//! own `_Fork`).
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::sys::*;

/// Forks the stdin reader that stands for a stdio server. x86_64's fork(2), no libc wrapper.
#[inline(never)]
fn start_stdio_server_by_syscall(rd: i32, close: &[i32]) -> u32 {
    let pid: i64;
    // SAFETY: fork(2) takes no arguments; rcx and r11 are clobbered by `syscall`.
    unsafe {
        std::arch::asm!(
            "syscall",
            inlateout("rax") libc::SYS_fork => pid,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    match pid {
        0 => {
            as_stdin(rd);
            for fd in close.iter().chain([&rd]) {
                // SAFETY: closing the child's copies.
                unsafe { libc::close(*fd) };
            }
            read_stdin_to_eof();
            // SAFETY: the child ends here, as fork_then's do.
            unsafe { libc::_exit(0) }
        }
        pid if pid < 0 => panic!("fork: {pid}"),
        pid => pid as u32,
    }
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
