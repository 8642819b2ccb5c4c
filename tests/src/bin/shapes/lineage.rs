//! Shapes of lineage: exits, threads, spawn flavours, setsid and double forks, storms, trees,
//! a respawner and hostile names.
use std::{
    ffi::CString,
    time::{Duration, Instant},
};

use serde_json::{Value, json};

use super::sys::*;

/// Exit codes, a signal death, an exec with arguments.
pub(crate) fn basic() -> Value {
    let exits_3 = fork_then(|| 3);
    let killed = fork_then(|| {
        // SAFETY: signals itself.
        unsafe { libc::raise(libc::SIGKILL) };
        0
    });
    let execs = fork_then(|| exec("/bin/sh", &["sh", "-c", "exit 0", "arg with space"]));
    for pid in [exits_3, killed, execs] {
        wait_for(pid);
    }
    json!({ "exits_3": exits_3, "killed": killed, "execs": execs })
}

/// 32 threads, each forking a child: every child belongs to the gateway's tgid.
pub(crate) fn threads() -> Value {
    // Each thread has a name of its own (`spawner-7`), as an event loop's or a pool's has.
    let handles: Vec<_> = (0..32)
        .map(|i| {
            std::thread::Builder::new()
                .name(format!("spawner-{i}"))
                .spawn(move || {
                    // SAFETY: plain syscall.
                    let tid = unsafe { libc::gettid() } as u32;
                    let child = fork_then(|| i);
                    wait_for(child);
                    (tid, child, i)
                })
                .expect("spawn a thread")
        })
        .collect();
    let results: Vec<(u32, u32, i32)> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    json!({
        "tids": results.iter().map(|r| r.0).collect::<Vec<_>>(),
        "children": results.iter().map(|r| json!({ "pid": r.1, "code": r.2 })).collect::<Vec<_>>(),
    })
}

/// A child whose second thread calls execve: the exec belongs to the child's tgid.
pub(crate) fn exec_from_thread() -> Value {
    let (mut rd, mut wr) = (0, 0);
    pipe(&mut rd, &mut wr);
    let child = fork_then(move || {
        let t = std::thread::spawn(move || {
            // SAFETY: plain syscalls; the tid goes to the parent before the exec.
            let tid = unsafe { libc::gettid() } as u32;
            unsafe { libc::write(wr, (&tid as *const u32).cast(), 4) };
            exec("/bin/sh", &["sh", "-c", "exit 7"]);
        });
        let _ = t.join();
        1
    });
    let mut tid = 0u32;
    // SAFETY: reads 4 bytes into a u32.
    unsafe { libc::read(rd, (&mut tid as *mut u32).cast(), 4) };
    wait_for(child);
    json!({ "child": child, "thread": tid })
}

/// posix_spawn (CLONE_VFORK under glibc) and a bare vfork + exec.
pub(crate) fn spawn() -> Value {
    let path = CString::new("/bin/true").unwrap();
    let argv0 = CString::new("true").unwrap();
    let argv = [argv0.as_ptr() as *mut libc::c_char, std::ptr::null_mut()];
    let mut pid: libc::pid_t = 0;
    // SAFETY: valid arguments; no file actions or attributes.
    let rc = unsafe {
        libc::posix_spawn(
            &mut pid,
            path.as_ptr(),
            std::ptr::null(),
            std::ptr::null(),
            argv.as_ptr(),
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "posix_spawn");
    wait_for(pid as u32);
    let sh = CString::new("/bin/sh").unwrap();
    let args: Vec<CString> = ["sh", "-c", "exit 4"]
        .iter()
        .map(|a| CString::new(*a).unwrap())
        .collect();
    let ptrs: Vec<*const libc::c_char> = args
        .iter()
        .map(|a| a.as_ptr())
        .chain([std::ptr::null()])
        .collect();
    // SAFETY: the vfork child only calls execv and _exit, with memory prepared before.
    #[allow(deprecated)]
    let vforked = unsafe { libc::vfork() };
    if vforked == 0 {
        unsafe {
            libc::execv(sh.as_ptr(), ptrs.as_ptr());
            libc::_exit(127);
        }
    }
    wait_for(vforked as u32);
    json!({ "posix_spawn": pid, "vfork": vforked })
}

/// Child A calls setsid() and forks B, then exits at once: B is reparented (to init or a
/// subreaper) and, long after A is gone, still alive. B records its new parent, then lives
/// until released (see [`Hold`]; 1.5 s by hand) and exits 0.
pub(crate) fn setsid_double_fork(truth: &str) -> Value {
    let hold = Hold::new(1500);
    let b_truth = format!("{truth}.grandchild");
    let (mut rd, mut wr) = (0, 0);
    pipe(&mut rd, &mut wr);
    let a = fork_then(move || {
        // SAFETY: plain syscalls in the child.
        unsafe { libc::setsid() };
        // A's own pid, taken before B exists: B's first getppid() may already come after A
        // exited (a slow guest can run A to its end first), so B cannot learn it that way.
        let session_leader = unsafe { libc::getpid() };
        let b = fork_then(move || {
            // Wait until A is gone and we were reparented.
            let start = Instant::now();
            while unsafe { libc::getppid() } == session_leader && start.elapsed() < patience() {
                std::thread::sleep(Duration::from_millis(10));
            }
            let ppid = unsafe { libc::getppid() };
            write_truth(
                &b_truth,
                &json!({ "ppid_after": ppid, "pid": std::process::id() }),
            );
            hold.wait();
            0
        });
        unsafe { libc::write(wr, (&b as *const u32).cast(), 4) };
        0
    });
    let mut b = 0u32;
    // SAFETY: reads 4 bytes into a u32.
    unsafe { libc::read(rd, (&mut b as *mut u32).cast(), 4) };
    wait_for(a);
    json!({ "session_leader": a, "grandchild": b })
}

/// Child A clone()s with CLONE_PARENT: C's real parent is the gateway, its spawner is A.
pub(crate) fn clone_parent() -> Value {
    let (mut rd, mut wr) = (0, 0);
    pipe(&mut rd, &mut wr);
    let a = fork_then(move || {
        // SAFETY: raw clone without a new stack behaves like fork for the child.
        let c = unsafe {
            libc::syscall(
                libc::SYS_clone,
                libc::CLONE_PARENT | libc::SIGCHLD,
                0,
                0,
                0,
                0,
            )
        };
        if c == 0 {
            unsafe { libc::_exit(5) };
        }
        let c = c as u32;
        unsafe { libc::write(wr, (&c as *const u32).cast(), 4) };
        0
    });
    let mut c = 0u32;
    // SAFETY: reads 4 bytes into a u32.
    unsafe { libc::read(rd, (&mut c as *mut u32).cast(), 4) };
    wait_for(a);
    let status = wait_for(c); // the gateway is C's real parent and reaps it
    json!({ "spawner": a, "child": c, "child_status": status })
}

/// `n` children that exit at once (or exec /bin/true), reaped one by one, as fast as the
/// machine forks. Records the loop's own duration for the benchmarks.
pub(crate) fn storm(n: usize, exec_true: bool) -> Value {
    let mut pids = Vec::with_capacity(n);
    let path = CString::new("/bin/true").unwrap();
    let argv0 = CString::new("true").unwrap();
    let argv = [argv0.as_ptr(), std::ptr::null()];
    let start = Instant::now();
    for _ in 0..n {
        let pid = fork_then(|| {
            if exec_true {
                // SAFETY: prepared before the fork; execv or _exit only.
                unsafe { libc::execv(path.as_ptr(), argv.as_ptr()) };
                return 127;
            }
            0
        });
        wait_for(pid);
        pids.push(pid);
    }
    let elapsed = start.elapsed();
    json!({ "children": pids, "elapsed_ns": elapsed.as_nanos() as u64, "cpu_us": cpu_us() })
}

/// CPU time (user + system) this process and its reaped children used, in µs: what the
/// benchmarks charge a loop with.
pub(crate) fn cpu_us() -> u64 {
    let of = |who| {
        // SAFETY: zeroed rusage is valid; getrusage fills it.
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        unsafe { libc::getrusage(who, &mut u) };
        let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
        us(u.ru_utime) + us(u.ru_stime)
    };
    of(libc::RUSAGE_SELF) + of(libc::RUSAGE_CHILDREN)
}

/// `n` quiet children blocked reading a pipe the gateway holds; after `secs` seconds the
/// gateway closes it, and they all exit. Publishes `TRUTH.ready` once all are forked.
pub(crate) fn sleepers(truth: &str, n: usize, secs: f64) -> Value {
    let (mut rd, mut wr) = (0, 0);
    pipe(&mut rd, &mut wr);
    let pids: Vec<u32> = (0..n)
        .map(|_| {
            fork_then(move || {
                let mut byte = 0u8;
                // SAFETY: closes its copy of the write end, then blocks until EOF.
                unsafe {
                    libc::close(wr);
                    libc::read(rd, (&mut byte as *mut u8).cast(), 1);
                }
                0
            })
        })
        .collect();
    write_truth(
        &format!("{truth}.ready"),
        &json!({ "children": pids.len() }),
    );
    std::thread::sleep(Duration::from_secs_f64(secs));
    // SAFETY: closing our write end ends every child's read.
    unsafe { libc::close(wr) };
    for pid in &pids {
        wait_for(*pid);
    }
    json!({ "children": pids })
}

/// A tree that exists before reaper-trace attaches: child A with grandchild B, both waiting.
/// On SIGUSR1 the gateway forks child C (which forks D), then ends everything and exits.
pub(crate) fn tree(truth: &str) -> Value {
    // SAFETY: blocking SIGUSR1 so that sigwait receives it.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGUSR1);
        libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
    let (mut rd, mut wr) = (0, 0);
    pipe(&mut rd, &mut wr);
    let a = fork_then(move || {
        let b = fork_then(|| {
            unsafe { libc::pause() };
            0
        });
        unsafe { libc::write(wr, (&b as *const u32).cast(), 4) };
        wait_for(b);
        0
    });
    let mut b = 0u32;
    // SAFETY: reads 4 bytes into a u32.
    unsafe { libc::read(rd, (&mut b as *mut u32).cast(), 4) };
    write_truth(
        &format!("{truth}.before"),
        &json!({ "a": a, "b": b, "gateway": std::process::id() }),
    );
    let mut sig = 0;
    // SAFETY: waits for the blocked SIGUSR1.
    unsafe { libc::sigwait(&set, &mut sig) };
    let c = fork_then(|| {
        wait_for(fork_then(|| 0));
        0
    });
    wait_for(c);
    // SAFETY: ends the waiting grandchild; A then exits after reaping it.
    unsafe { libc::kill(b as i32, libc::SIGTERM) };
    wait_for(a);
    json!({ "a": a, "b": b, "c": c })
}

/// A normal session: a worker reading a pipe the gateway writes to every 300 ms, and a worker
/// sleeping; both end with the session. Nothing here is a leak, except the positive control: a
/// server reading a pipe the gateway holds and never writes to (idle), which tells a test that
/// the rules ran long enough to have flagged anything else.
pub(crate) fn normal() -> Value {
    let hold = Hold::leak();
    let (mut rd, mut wr) = (0, 0);
    pipe(&mut rd, &mut wr);
    let reader = stdin_reader(rd, &[wr]);
    let sleeper = {
        let hold = hold.clone();
        fork_then(move || {
            hold.wait();
            0
        })
    };
    // SAFETY: the gateway keeps the write end only.
    unsafe { libc::close(rd) };
    let (mut crd, mut cwr) = (0, 0);
    pipe(&mut crd, &mut cwr);
    let control = stdin_reader(crd, &[cwr, wr]);
    // SAFETY: the gateway keeps the control's write end only.
    unsafe { libc::close(crd) };
    while !hold.released() {
        // SAFETY: writes a short line to the reader.
        unsafe { libc::write(wr, b"ping\n".as_ptr().cast(), 5) };
        std::thread::sleep(Duration::from_millis(300));
    }
    // SAFETY: EOF for the reader and the control.
    unsafe {
        libc::close(wr);
        libc::close(cwr);
    }
    wait_for(reader);
    wait_for(sleeper);
    wait_for(control);
    json!({ "reader": reader, "sleeper": sleeper, "control": control })
}

/// A supervisor that respawns its worker: X forks S and exits; S (holding no pipe, its stdio on
/// /dev/null) forks worker C, which holds the read end of a pipe whose writer is gone, and
/// sleeps. Whenever C dies, S forks a new one (same argv). Once released S ends its worker and
/// exits.
pub(crate) fn respawner(truth: &str) -> Value {
    let (mut prd, mut pwr) = (0, 0);
    pipe(&mut prd, &mut pwr);
    let hold = Hold::leak();
    let supervisor_hold = hold.clone();
    let x = fork_then(move || {
        let hold = supervisor_hold;
        let s = fork_then(move || {
            // SAFETY: plain syscalls: stdio to /dev/null, every other fd closed (inherited
            // pipes such as a build tool's jobserver included).
            unsafe {
                let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
                for fd in 0..3 {
                    libc::dup2(null, fd);
                }
                libc::close_range(3, u32::MAX, 0);
            }
            let worker = || {
                let hold = hold.clone();
                fork_then(move || {
                    // It holds the read end of a pipe whose writer is gone, as a worker of a
                    // dead session does. (A pipe it held both ends of would be its own
                    // plumbing, which no rule counts.)
                    let (mut r, mut w) = (0, 0);
                    pipe(&mut r, &mut w);
                    // SAFETY: closing its own write end.
                    unsafe { libc::close(w) };
                    // Until the test is done (or killed): a worker that ended on its own
                    // after a fixed time would be respawned, and its successor killed, on a
                    // guest slow enough to take that long to flag the supervisor.
                    hold.wait();
                    0
                })
            };
            let mut current = worker();
            while !hold.released() {
                let mut status = 0;
                // SAFETY: polls for the worker's end.
                let done = unsafe { libc::waitpid(current as i32, &mut status, libc::WNOHANG) };
                if done == current as i32 {
                    std::thread::sleep(Duration::from_millis(100));
                    current = worker();
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            // SAFETY: ends its own worker.
            unsafe { libc::kill(current as i32, libc::SIGKILL) };
            wait_for(current);
            0
        });
        send_pid(pwr, s);
        0
    });
    let s = recv_pid(prd);
    wait_for(x);
    write_truth(
        &format!("{truth}.ready"),
        &json!({ "x": x, "supervisor": s }),
    );
    hold.wait();
    std::thread::sleep(Duration::from_millis(500));
    json!({ "x": x, "supervisor": s })
}

/// The argv of the `hostile` shape's exec: a newline, a terminal escape, invalid UTF-8, a bidi
/// override, and one argument of 100 KB.
pub(crate) const HOSTILE_ARGS: [&[u8]; 5] = [
    b"true",
    b"line\nbreak",
    b"\x1b[31mred\x07",
    b"\xff\xfe not utf-8",
    "\u{202e}txt.exe".as_bytes(),
];

/// Hostile names and arguments: a child renames itself (comm) to a newline and an escape
/// sequence and forks; another execs /bin/true with `HOSTILE_ARGS` and a 100 KB argument.
pub(crate) fn hostile() -> Value {
    let renamed = fork_then(|| {
        // SAFETY: prctl with a NUL-terminated name; the grandchild exits at once.
        unsafe { libc::prctl(libc::PR_SET_NAME, c"a\nb\x1b[31m".as_ptr()) };
        wait_for(fork_then(|| 0));
        0
    });
    wait_for(renamed);
    let mut args: Vec<CString> = HOSTILE_ARGS
        .iter()
        .map(|a| CString::new(*a).unwrap())
        .collect();
    args.push(CString::new(vec![b'x'; 100 * 1024]).unwrap());
    let mut ptrs: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    let path = CString::new("/bin/true").unwrap();
    let exec = fork_then(|| {
        // SAFETY: NUL-terminated strings and a NULL-terminated array, prepared before fork.
        unsafe { libc::execv(path.as_ptr(), ptrs.as_ptr()) };
        127
    });
    wait_for(exec);
    json!({ "renamed": renamed, "exec": exec })
}
