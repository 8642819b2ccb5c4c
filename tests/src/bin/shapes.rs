//! `reaper-shapes SHAPE TRUTH_FILE`: makes one process shape as a gateway would, and writes
//! what it did (pids, exit codes) to TRUTH_FILE as JSON, for the integration tests to compare
//! with what reaper-trace reported. Plain libc on purpose: each shape is the exact syscall
//! pattern it names.
use std::{
    ffi::CString,
    time::{Duration, Instant},
};

use serde_json::{Value, json};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).is_some_and(|a| a == "stdio-server") {
        // What the gateways of the accumulation shapes start: a stdio server with a command
        // line of its own (`stdio-server --session-key K1 --model m`), reading until EOF.
        read_stdin_to_eof();
        std::process::exit(0);
    }
    let (Some(shape), Some(truth)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: reaper-shapes SHAPE TRUTH_FILE");
        std::process::exit(2);
    };
    let result = match shape.as_str() {
        "basic" => basic(),
        "threads" => threads(),
        "exec-from-thread" => exec_from_thread(),
        "spawn" => spawn(),
        "setsid-double-fork" => setsid_double_fork(truth),
        "clone-parent" => clone_parent(),
        "storm" => storm(count_arg(&args, 5000), false),
        "storm-exec" => storm(count_arg(&args, 5000), true),
        "sleepers" => sleepers(
            truth,
            count_arg(&args, 1000),
            args.get(4).and_then(|s| s.parse().ok()).unwrap_or(1.0),
        ),
        "tree" => tree(truth),
        "leak-orphan" => leak_orphan(truth),
        "leak-idle" => leak_idle(truth),
        "leak-agent-kill" => leak_agent_kill(truth),
        "leak-deaf" => leak_deaf(truth),
        "leak-accumulate" => leak_accumulate(truth),
        "leak-crash" => leak_crash(truth),
        "leak-pty-held" => leak_pty(truth, false),
        "leak-tcp" => leak_tcp(truth),
        "leak-pty-hungup" => leak_pty(truth, true),
        "leak-zombies" => leak_zombies(truth),
        "leak-pidns" => leak_pidns(truth),
        "normal" => normal(),
        "respawner" => respawner(truth),
        "hostile" => hostile(),
        "into-cgroup" => into_cgroup(&args),
        other => {
            eprintln!("unknown shape {other}");
            std::process::exit(2);
        }
    };
    let mut truth_value = result;
    truth_value["gateway"] = json!(std::process::id());
    write_truth(truth, &truth_value);
}

fn count_arg(args: &[String], default: usize) -> usize {
    args.get(3).and_then(|n| n.parse().ok()).unwrap_or(default)
}

fn write_truth(path: &str, value: &Value) {
    let tmp = format!("{path}.tmp");
    std::fs::write(&tmp, value.to_string()).expect("write truth");
    std::fs::rename(&tmp, path).expect("publish truth");
}

/// fork(); the child runs `f` and exits with its return value.
fn fork_then(f: impl FnOnce() -> i32) -> u32 {
    // SAFETY: the child only runs async-signal-safe code or execs, then _exits.
    match unsafe { libc::fork() } {
        -1 => panic!("fork failed"),
        0 => unsafe { libc::_exit(f()) },
        pid => pid as u32,
    }
}

/// Waits for a specific child; returns its raw wait status.
fn wait_for(pid: u32) -> i32 {
    let mut status = 0;
    // SAFETY: plain waitpid.
    unsafe { libc::waitpid(pid as i32, &mut status, 0) };
    status
}

fn exec(path: &str, argv: &[&str]) -> ! {
    let path = CString::new(path).unwrap();
    let args: Vec<CString> = argv.iter().map(|a| CString::new(*a).unwrap()).collect();
    let mut ptrs: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    // SAFETY: NUL-terminated strings and a NULL-terminated array.
    unsafe { libc::execv(path.as_ptr(), ptrs.as_ptr()) };
    unsafe { libc::_exit(127) }
}

/// Exit codes, a signal death, an exec with arguments.
fn basic() -> Value {
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
fn threads() -> Value {
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
fn exec_from_thread() -> Value {
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

fn pipe(rd: &mut i32, wr: &mut i32) {
    let mut fds = [0; 2];
    // SAFETY: valid array of two ints.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    (*rd, *wr) = (fds[0], fds[1]);
}

/// posix_spawn (CLONE_VFORK under glibc) and a bare vfork + exec.
fn spawn() -> Value {
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
fn setsid_double_fork(truth: &str) -> Value {
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
fn clone_parent() -> Value {
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
fn storm(n: usize, exec_true: bool) -> Value {
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
fn cpu_us() -> u64 {
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
fn sleepers(truth: &str, n: usize, secs: f64) -> Value {
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
fn tree(truth: &str) -> Value {
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

/// How long a shape keeps its leak in place. A test names a file in `REAPER_SHAPES_RELEASE`
/// and creates it once it has seen the event that proves its point: the shape holds until then,
/// however slow the machine (capped at `REAPER_SHAPES_HOLD_CAP_SECS`, default 300, so that a
/// failing test still ends). Without it, as when a person runs a shape by hand, the hold is
/// `REAPER_SHAPES_LINGER_MS` (or the shape's default).
#[derive(Clone)]
struct Hold {
    release: Option<std::path::PathBuf>,
    deadline: Instant,
}

/// The most a shape waits for something that must happen (a release, its reparenting): the
/// tests' patience (`REAPER_SHAPES_HOLD_CAP_SECS`, 300 s by default), generous for a slow guest.
fn patience() -> Duration {
    let secs = std::env::var("REAPER_SHAPES_HOLD_CAP_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    Duration::from_secs(secs)
}

impl Hold {
    fn new(default_linger_ms: u64) -> Hold {
        let env_u64 = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
        let release = std::env::var_os("REAPER_SHAPES_RELEASE").map(std::path::PathBuf::from);
        let limit = match release {
            Some(_) => patience(),
            None => Duration::from_millis(
                env_u64("REAPER_SHAPES_LINGER_MS").unwrap_or(default_linger_ms),
            ),
        };
        Hold {
            release,
            deadline: Instant::now() + limit,
        }
    }

    /// The leak shapes' usual hold (4 s by hand).
    fn leak() -> Hold {
        Hold::new(4000)
    }

    fn released(&self) -> bool {
        self.release.as_ref().is_some_and(|p| p.exists()) || Instant::now() >= self.deadline
    }

    fn wait(&self) {
        while !self.released() {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// `reaper-shapes into-cgroup DIR SHAPE TRUTH`: starts `reaper-shapes SHAPE TRUTH` straight
/// into the cgroup DIR (`clone3` with `CLONE_INTO_CGROUP`, as service managers start a unit's
/// process), waits for it and exits with its status. Writes no truth of its own.
fn into_cgroup(args: &[String]) -> ! {
    let (Some(dir), Some(shape), Some(truth)) = (args.get(2), args.get(3), args.get(4)) else {
        eprintln!("usage: reaper-shapes into-cgroup DIR SHAPE TRUTH");
        std::process::exit(2);
    };
    let dir = CString::new(dir.as_str()).unwrap();
    // SAFETY: opening a directory.
    let cgroup = unsafe { libc::open(dir.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY) };
    assert!(
        cgroup >= 0,
        "open {dir:?}: {}",
        std::io::Error::last_os_error()
    );
    let me = std::env::current_exe().unwrap();
    let me = me.to_str().unwrap();
    // struct clone_args (include/uapi/linux/sched.h), up to `cgroup`.
    let mut clone_args = [0u64; 11];
    clone_args[0] = 0x2_0000_0000; // flags: CLONE_INTO_CGROUP
    clone_args[4] = libc::SIGCHLD as u64; // exit_signal
    clone_args[10] = cgroup as u64; // cgroup
    // SAFETY: clone3 with no new stack behaves as fork; the child only execs or _exits.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            clone_args.as_mut_ptr(),
            std::mem::size_of_val(&clone_args),
        )
    };
    match pid {
        -1 => panic!("clone3: {}", std::io::Error::last_os_error()),
        0 => exec(me, &[me, shape, truth]),
        pid => {
            let status = wait_for(pid as u32);
            std::process::exit(libc::WEXITSTATUS(status));
        }
    }
}

/// Makes `fd` the caller's stdin.
fn as_stdin(fd: i32) {
    // SAFETY: plain dup2 in a child.
    unsafe { libc::dup2(fd, 0) };
}

/// Reads stdin until EOF; returns the bytes read.
fn read_stdin_to_eof() -> usize {
    let mut total = 0;
    let mut buf = [0u8; 256];
    loop {
        // SAFETY: reads into a local buffer.
        let n = unsafe { libc::read(0, buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            return total;
        }
        total += n as usize;
    }
}

/// Forks a stdio server: `rd` becomes its stdin, the fds in `close` (and `rd` itself) are
/// closed, and it reads stdin until EOF.
///
/// For the kill tests: with `REAPER_SHAPES_IGNORE_TERM` set it ignores SIGTERM, and with
/// `REAPER_SHAPES_STOP_SELF` set it stops itself (SIGSTOP) before reading.
fn stdin_reader(rd: i32, close: &[i32]) -> u32 {
    let close = close.to_vec();
    let ignore_term = std::env::var_os("REAPER_SHAPES_IGNORE_TERM").is_some();
    let stop_self = std::env::var_os("REAPER_SHAPES_STOP_SELF").is_some();
    fork_then(move || {
        as_stdin(rd);
        for fd in close.iter().chain([&rd]) {
            // SAFETY: closing the child's copies.
            unsafe { libc::close(*fd) };
        }
        // SAFETY: plain signal calls in the child.
        unsafe {
            if ignore_term {
                libc::signal(libc::SIGTERM, libc::SIG_IGN);
            }
            if stop_self {
                libc::raise(libc::SIGSTOP);
            }
        }
        read_stdin_to_eof();
        0
    })
}

/// Sends one pid to the gateway through `wr`.
fn send_pid(wr: i32, pid: u32) {
    // SAFETY: writes 4 bytes from a u32.
    unsafe { libc::write(wr, (&pid as *const u32).cast(), 4) };
}

fn recv_pid(rd: i32) -> u32 {
    let mut pid = 0u32;
    // SAFETY: reads 4 bytes into a u32.
    unsafe { libc::read(rd, (&mut pid as *mut u32).cast(), 4) };
    pid
}

/// Orphaned: A calls setsid() and forks B with the read end of the gateway's pipe as stdin,
/// then exits. B waits on stdin; the gateway holds the write end until released, then
/// closes it (B reads EOF and exits) and exits.
fn leak_orphan(truth: &str) -> Value {
    wait_for_go();
    let (mut rd, mut wr) = (0, 0);
    pipe(&mut rd, &mut wr);
    let (mut prd, mut pwr) = (0, 0);
    pipe(&mut prd, &mut pwr);
    let a = fork_then(move || {
        // SAFETY: plain syscalls in the child.
        unsafe { libc::setsid() };
        let b = stdin_reader(rd, &[wr, prd, pwr]);
        send_pid(pwr, b);
        0
    });
    let b = recv_pid(prd);
    wait_for(a);
    hold_the_write_end(truth, (rd, wr), json!({ "a": a, "b": b }));
    json!({ "a": a, "b": b, "write_fd": wr })
}

/// With `REAPER_SHAPES_GO` set, waits until that file exists (capped like a hold): a test
/// starts the process, makes it a gateway, and only then lets it make its leak.
fn wait_for_go() {
    let Some(go) = std::env::var_os("REAPER_SHAPES_GO") else {
        return;
    };
    let cap = Hold::leak();
    while !std::path::Path::new(&go).exists() && Instant::now() < cap.deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The gateway's part once its leak is in place: it keeps only the write end of the pipe its
/// orphan reads, says it is ready with `ready`, holds until released, then closes the write end
/// (the orphan reads EOF and exits).
fn hold_the_write_end(truth: &str, (rd, wr): (i32, i32), ready: Value) {
    // SAFETY: closing the gateway's own copy of the read end.
    unsafe { libc::close(rd) };
    write_truth(&format!("{truth}.ready"), &ready);
    Hold::leak().wait();
    // SAFETY: closing the write end gives the reader its EOF.
    unsafe { libc::close(wr) };
}

/// Orphaned inside a pid namespace: A unshares a new pid namespace and forks B, its init (pid 1
/// there). B puts its stdio on /dev/null and forks C (pid 2 there) with the read end of the
/// gateway's pipe as stdin; C calls setsid() (its session is 2 inside, its host pid outside),
/// renames itself `ns-escapee` (prctl) and waits on stdin. A sends B's host pid and exits, which
/// breaks C's chain. Once released the gateway closes the write end: C reads EOF and exits, and
/// B, which waited for it, exits too.
fn leak_pidns(truth: &str) -> Value {
    let (mut rd, mut wr) = (0, 0);
    pipe(&mut rd, &mut wr);
    let (mut prd, mut pwr) = (0, 0);
    pipe(&mut prd, &mut pwr);
    let a = fork_then(move || {
        // SAFETY: plain syscall; the next child of A is the new namespace's init.
        if unsafe { libc::unshare(libc::CLONE_NEWPID) } != 0 {
            eprintln!("unshare(CLONE_NEWPID): {}", std::io::Error::last_os_error());
            return 1;
        }
        // B says when it holds nothing but /dev/null: only then does A exit, breaking the
        // chain (a look at B before that would find it holding the gateway's pipes).
        let (mut settled_rd, mut settled_wr) = (0, 0);
        pipe(&mut settled_rd, &mut settled_wr);
        let b = fork_then(move || {
            // SAFETY: plain syscalls in the namespace's init: stdio on /dev/null.
            unsafe {
                let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
                for fd in 0..3 {
                    libc::dup2(null, fd);
                }
            }
            let c = fork_then(move || {
                as_stdin(rd);
                // SAFETY: plain syscalls in C: only its stdin pipe kept, a session of its own,
                // a new name.
                unsafe {
                    libc::close_range(3, u32::MAX, 0);
                    libc::setsid();
                    libc::prctl(libc::PR_SET_NAME, c"ns-escapee".as_ptr());
                }
                read_stdin_to_eof();
                0
            });
            // SAFETY: B keeps nothing but its /dev/null stdio (and, for a moment, the end it
            // says so on).
            unsafe {
                libc::close_range(3, settled_wr as u32 - 1, 0);
                libc::close_range(settled_wr as u32 + 1, u32::MAX, 0);
                libc::write(settled_wr, b"s".as_ptr().cast(), 1);
                libc::close(settled_wr);
            }
            wait_for(c);
            0
        });
        let mut byte = [0u8; 1];
        // SAFETY: A's copy of the write end is closed so that B's death reads as EOF.
        unsafe {
            libc::close(settled_wr);
            libc::read(settled_rd, byte.as_mut_ptr().cast(), 1);
        }
        send_pid(pwr, b);
        0
    });
    let b = recv_pid(prd);
    wait_for(a);
    hold_the_write_end(truth, (rd, wr), json!({ "a": a, "b": b }));
    json!({ "a": a, "b": b })
}

/// Idle: three stdio servers, each in its own session reading its stdin pipe from the
/// gateway. The gateway writes a line to the first every 300 ms and never to the other two;
/// once released it closes every pipe (each server reads EOF and exits).
fn leak_idle(truth: &str) -> Value {
    let mut servers = Vec::new();
    let mut write_ends = Vec::new();
    for _ in 0..3 {
        let (mut rd, mut wr) = (0, 0);
        pipe(&mut rd, &mut wr);
        let earlier = write_ends.clone();
        let pid = fork_then(move || {
            // SAFETY: plain syscalls in the child: its own session, only its read end.
            unsafe {
                libc::setsid();
                for fd in earlier {
                    libc::close(fd);
                }
                libc::close(wr);
            }
            as_stdin(rd);
            read_stdin_to_eof();
            0
        });
        // SAFETY: the gateway keeps the write end only.
        unsafe { libc::close(rd) };
        servers.push(pid);
        write_ends.push(wr);
    }
    write_truth(
        &format!("{truth}.ready"),
        &json!({ "busy": servers[0], "abandoned": [servers[1], servers[2]] }),
    );
    let hold = Hold::leak();
    while !hold.released() {
        // SAFETY: writes a short line to the busy server.
        unsafe { libc::write(write_ends[0], b"ping\n".as_ptr().cast(), 5) };
        std::thread::sleep(Duration::from_millis(300));
    }
    for fd in &write_ends {
        // SAFETY: closing our write ends.
        unsafe { libc::close(*fd) };
    }
    for pid in &servers {
        wait_for(*pid);
    }
    json!({ "busy": servers[0], "abandoned": [servers[1], servers[2]] })
}

/// An agent spawns a worker reading a stdin pipe and a helper that inherited the pipe's write
/// end, then is SIGKILLed: worker and helper are orphaned, and the worker's pipe peer is the
/// helper. Once released the gateway ends the helper (the worker reads EOF).
fn leak_agent_kill(truth: &str) -> Value {
    let (mut prd, mut pwr) = (0, 0);
    pipe(&mut prd, &mut pwr);
    let agent = fork_then(move || {
        let (mut rd, mut wr) = (0, 0);
        pipe(&mut rd, &mut wr);
        let worker = stdin_reader(rd, &[wr, prd, pwr]);
        let helper = fork_then(move || {
            // SAFETY: the helper keeps only the write end, and sleeps until killed.
            unsafe {
                libc::close(rd);
                libc::close(prd);
                libc::close(pwr);
                libc::pause();
            }
            0
        });
        send_pid(pwr, worker);
        send_pid(pwr, helper);
        // SAFETY: waits to be killed.
        unsafe { libc::pause() };
        0
    });
    let worker = recv_pid(prd);
    let helper = recv_pid(prd);
    // SAFETY: the agent dies abruptly, as a SIGKILLed agent does.
    unsafe { libc::kill(agent as i32, libc::SIGKILL) };
    wait_for(agent);
    write_truth(
        &format!("{truth}.ready"),
        &json!({ "agent": agent, "worker": worker, "helper": helper }),
    );
    Hold::leak().wait();
    // SAFETY: ends the helper; the worker then reads EOF and exits.
    unsafe { libc::kill(helper as i32, libc::SIGTERM) };
    std::thread::sleep(Duration::from_millis(200));
    json!({ "agent": agent, "worker": worker, "helper": helper })
}

/// Starts `reaper-shapes stdio-server ARGS...` with a fresh pipe as its stdin; returns its pid
/// and the write end, which the caller keeps. `close` are fds the server must not inherit.
fn start_stdio_server(args: &[&str], close: &[i32]) -> (u32, i32) {
    let me = std::env::current_exe().unwrap();
    let me = me.to_str().unwrap().to_owned();
    let mut argv = vec![me.clone(), "stdio-server".to_owned()];
    argv.extend(args.iter().map(|a| a.to_string()));
    let (mut rd, mut wr) = (0, 0);
    pipe(&mut rd, &mut wr);
    let close = close.to_vec();
    let pid = fork_then(move || {
        as_stdin(rd);
        for fd in close.iter().chain([&rd, &wr]) {
            // SAFETY: closing the child's copies.
            unsafe { libc::close(*fd) };
        }
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        exec(&me, &argv)
    });
    // SAFETY: the gateway keeps the write end only.
    unsafe { libc::close(rd) };
    (pid, wr)
}

/// Accumulating, as in every leak report: the gateway starts a pool of 3 servers of one kind
/// (`stdio-server pool`); a rolling pool of 3 (`stdio-server rolling`) whose every worker it
/// replaces, 6 times, by starting the next and then closing the oldest's stdin (it exits on
/// EOF); then 6 servers of a third kind that differ only in an option value
/// (`stdio-server --session-key K<i> --model m`). It pings every live one every 300 ms until
/// released, so none is ever idle. With `--max-instances 3`, the 3 oldest session servers are
/// one instance too many each; the pool is at its limit, never over it; the rolling pool is
/// over it only while a replaced worker exits.
fn leak_accumulate(truth: &str) -> Value {
    let mut write_ends = Vec::new();
    let mut pool = Vec::new();
    for _ in 0..3 {
        let (pid, wr) = start_stdio_server(&["pool"], &write_ends);
        pool.push(pid);
        write_ends.push(wr);
    }
    let mut rolling = std::collections::VecDeque::new();
    let mut rolled = Vec::new();
    for n in 0..9 {
        // No worker may hold another's stdin, or that one would never read EOF.
        let held: Vec<i32> = write_ends
            .iter()
            .copied()
            .chain(rolling.iter().map(|(_, wr)| *wr))
            .collect();
        let (pid, wr) = start_stdio_server(&["rolling"], &held);
        rolling.push_back((pid, wr));
        rolled.push(pid);
        if n >= 3 {
            let (old, old_wr) = rolling.pop_front().unwrap();
            // SAFETY: closing the oldest worker's stdin: it reads EOF and exits.
            unsafe { libc::close(old_wr) };
            wait_for(old);
        }
    }
    write_ends.extend(rolling.iter().map(|(_, wr)| *wr));
    let mut sessions = Vec::new();
    for i in 1..=6 {
        let key = format!("K{i}");
        let args = ["--session-key", key.as_str(), "--model", "m"];
        let (pid, wr) = start_stdio_server(&args, &write_ends);
        sessions.push(pid);
        write_ends.push(wr);
    }
    let result = json!({ "pool": pool, "rolling": rolled, "sessions": sessions });
    write_truth(&format!("{truth}.ready"), &result);
    let hold = Hold::leak();
    while !hold.released() {
        for fd in &write_ends {
            // SAFETY: a short line to each server.
            unsafe { libc::write(*fd, b"ping\n".as_ptr().cast(), 5) };
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    for fd in &write_ends {
        // SAFETY: closing our write ends: each server reads EOF and exits.
        unsafe { libc::close(*fd) };
    }
    for pid in pool
        .iter()
        .chain(&sessions)
        .chain(rolling.iter().map(|(p, _)| p))
    {
        wait_for(*pid);
    }
    result
}

/// A crash: an agent starts three stdio servers and is SIGKILLed. Two servers read EOF and
/// exit half a second later, as real ones do; the third (the lingerer) also holds a pipe to the gateway
/// and keeps waiting on it until released. Only the lingerer is a leak.
fn leak_crash(truth: &str) -> Value {
    let (mut prd, mut pwr) = (0, 0);
    pipe(&mut prd, &mut pwr);
    // The gateway's own pipe to the lingerer.
    let (mut grd, mut gwr) = (0, 0);
    pipe(&mut grd, &mut gwr);
    let agent = fork_then(move || {
        let mut servers = Vec::new();
        // The agent's write ends: no server may inherit another's, or it would not read EOF.
        let mut held = vec![prd, pwr, grd, gwr];
        for _ in 0..2 {
            let (mut rd, mut wr) = (0, 0);
            pipe(&mut rd, &mut wr);
            held.push(wr);
            let close = held.clone();
            servers.push(fork_then(move || {
                as_stdin(rd);
                for fd in close.iter().chain([&rd]) {
                    // SAFETY: closing the child's copies.
                    unsafe { libc::close(*fd) };
                }
                read_stdin_to_eof();
                // A real server takes a moment to shut down (flush, close, interpreter
                // teardown): long enough for a scan to catch it still holding its channel.
                std::thread::sleep(Duration::from_millis(500));
                0
            }));
            // SAFETY: the agent keeps the write end only.
            unsafe { libc::close(rd) };
        }
        let (mut rd, mut wr) = (0, 0);
        pipe(&mut rd, &mut wr);
        held.push(wr);
        held.retain(|fd| *fd != grd);
        let lingerer = fork_then(move || {
            as_stdin(rd);
            // SAFETY: the lingerer keeps its stdin and the gateway's pipe (`grd`).
            unsafe {
                libc::close(rd);
                for fd in held {
                    libc::close(fd);
                }
            }
            read_stdin_to_eof();
            // Its agent is gone; it goes on waiting on the gateway's pipe.
            let mut byte = 0u8;
            // SAFETY: reads into a local byte; EOF once the gateway closes its end.
            unsafe { libc::read(grd, (&mut byte as *mut u8).cast(), 1) };
            0
        });
        for pid in servers.iter().chain([&lingerer]) {
            send_pid(pwr, *pid);
        }
        // SAFETY: waits to be killed.
        unsafe { libc::pause() };
        0
    });
    // SAFETY: the gateway keeps the write end of its pipe to the lingerer only.
    unsafe { libc::close(grd) };
    let servers = [recv_pid(prd), recv_pid(prd)];
    let lingerer = recv_pid(prd);
    // SAFETY: the agent dies abruptly, as a SIGKILLed agent does.
    unsafe { libc::kill(agent as i32, libc::SIGKILL) };
    wait_for(agent);
    let result = json!({ "agent": agent, "exit_on_eof": servers, "lingerer": lingerer });
    write_truth(&format!("{truth}.ready"), &result);
    Hold::leak().wait();
    // SAFETY: the lingerer reads EOF on the gateway's pipe and exits.
    unsafe { libc::close(gwr) };
    std::thread::sleep(Duration::from_millis(200));
    result
}

/// A background job left on a terminal: the gateway opens a pty master; its agent starts a
/// helper that makes the pty's slave its controlling terminal and its stdin, stdout and stderr
/// (nothing else), ignores SIGHUP as `nohup` does, and then the agent exits. With `hang_up`,
/// the gateway then closes the master: the helper holds a hung-up slave. Otherwise the gateway
/// keeps the master, as a dashboard's PTY bridge does.
fn leak_pty(truth: &str, hang_up: bool) -> Value {
    // SAFETY: plain pty calls on a fresh master.
    let master = unsafe { libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY) };
    assert!(
        master >= 0,
        "posix_openpt: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: `master` is a pty master; ptsname's static buffer is copied at once.
    let slave = unsafe {
        assert_eq!(libc::grantpt(master), 0);
        assert_eq!(libc::unlockpt(master), 0);
        std::ffi::CStr::from_ptr(libc::ptsname(master)).to_owned()
    };
    let index: u32 = slave
        .to_str()
        .unwrap()
        .trim_start_matches("/dev/pts/")
        .parse()
        .unwrap();
    let (mut prd, mut pwr) = (0, 0);
    pipe(&mut prd, &mut pwr);
    let agent = fork_then(move || {
        fork_then(move || {
            // SAFETY: plain syscalls in the helper: SIGHUP ignored, a session of its own, the
            // slave as its controlling terminal and its only fds; its pid goes to the gateway
            // once all that is in place.
            unsafe {
                libc::signal(libc::SIGHUP, libc::SIG_IGN);
                libc::setsid();
                let fd = libc::open(slave.as_ptr(), libc::O_RDWR);
                assert!(fd >= 0, "open the slave");
                for std_fd in 0..3 {
                    libc::dup2(fd, std_fd);
                }
                send_pid(pwr, libc::getpid() as u32);
                libc::close_range(3, u32::MAX, 0);
                libc::pause();
            }
            0
        });
        0
    });
    let helper = recv_pid(prd);
    wait_for(agent);
    if hang_up {
        // SAFETY: closing the gateway's master: the slave hangs up.
        unsafe { libc::close(master) };
    }
    let result = json!({ "agent": agent, "helper": helper, "index": index });
    write_truth(&format!("{truth}.ready"), &result);
    Hold::leak().wait();
    // SAFETY: ends the helper (it is init's child now, not ours).
    unsafe { libc::kill(helper as i32, libc::SIGTERM) };
    std::thread::sleep(Duration::from_millis(200));
    result
}

/// Loopback TCP as a channel: the gateway listens on 127.0.0.1; its agent starts two helpers
/// and exits. One holds nothing but a TCP connection to the gateway (an MCP server reached over
/// localhost); the other holds nothing but a UDP socket and a netlink socket, which tie it to
/// no process. Both have `/dev/null` as stdin, stdout and stderr.
fn leak_tcp(truth: &str) -> Value {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen on loopback");
    let addr = listener.local_addr().unwrap();
    // Each helper sends its pid on a pipe of its own.
    let (mut trd, mut twr, mut urd, mut uwr) = (0, 0, 0, 0);
    pipe(&mut trd, &mut twr);
    pipe(&mut urd, &mut uwr);
    // Only stdio on /dev/null and `keep` stay open in a helper.
    let isolate = |keep: &[i32]| {
        // SAFETY: plain syscalls in a helper before it waits.
        unsafe {
            let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
            for std_fd in 0..3 {
                libc::dup2(null, std_fd);
            }
            for fd in 3..1024 {
                if !keep.contains(&fd) {
                    libc::close(fd);
                }
            }
        }
    };
    let agent = fork_then(move || {
        let tcp = fork_then(move || {
            let stream = std::net::TcpStream::connect(addr).expect("connect to the gateway");
            use std::os::fd::AsRawFd;
            send_pid(twr, std::process::id());
            isolate(&[stream.as_raw_fd()]);
            // SAFETY: waits to be ended.
            unsafe { libc::pause() };
            0
        });
        let other = fork_then(move || {
            use std::os::fd::AsRawFd;
            let udp = std::net::UdpSocket::bind("127.0.0.1:0").expect("udp");
            // SAFETY: a netlink socket of its own.
            let netlink = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW, 0) };
            send_pid(uwr, std::process::id());
            isolate(&[udp.as_raw_fd(), netlink]);
            // SAFETY: waits to be ended.
            unsafe { libc::pause() };
            0
        });
        let _ = (tcp, other);
        0
    });
    let (connection, _) = listener.accept().expect("accept the helper");
    let tcp_helper = recv_pid(trd);
    let other = recv_pid(urd);
    wait_for(agent);
    let result = json!({ "agent": agent, "tcp": tcp_helper, "udp": other, "port": addr.port() });
    write_truth(&format!("{truth}.ready"), &result);
    Hold::leak().wait();
    for pid in [tcp_helper, other] {
        // SAFETY: ends the helpers (init's children now).
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    }
    drop(connection);
    std::thread::sleep(Duration::from_millis(200));
    result
}

/// Deaf: a reader of a pipe whose writers all closed keeps running without reading (EOF is
/// pending and ignored) until released.
fn leak_deaf(truth: &str) -> Value {
    let hold = Hold::leak();
    let (mut rd, mut wr) = (0, 0);
    pipe(&mut rd, &mut wr);
    let reader = fork_then(move || {
        as_stdin(rd);
        // SAFETY: keeps only the read end; then ignores it.
        unsafe {
            libc::close(rd);
            libc::close(wr);
        }
        hold.wait();
        0
    });
    // SAFETY: the gateway drops the only write end.
    unsafe {
        libc::close(rd);
        libc::close(wr);
    }
    write_truth(&format!("{truth}.ready"), &json!({ "reader": reader }));
    wait_for(reader);
    json!({ "reader": reader })
}

/// Zombies: five children exit at once and are reaped only once released.
fn leak_zombies(truth: &str) -> Value {
    let kids: Vec<u32> = (0..5).map(|_| fork_then(|| 0)).collect();
    write_truth(&format!("{truth}.ready"), &json!({ "zombies": kids }));
    Hold::leak().wait();
    for pid in &kids {
        wait_for(*pid);
    }
    json!({ "zombies": kids })
}

/// A normal session: a worker reading a pipe the gateway writes to every 300 ms, and a worker
/// sleeping; both end with the session. Nothing here is a leak, except the positive control: a
/// server reading a pipe the gateway holds and never writes to (idle), which tells a test that
/// the rules ran long enough to have flagged anything else.
fn normal() -> Value {
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
fn respawner(truth: &str) -> Value {
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
                fork_then(|| {
                    // It holds the read end of a pipe whose writer is gone, as a worker of a
                    // dead session does. (A pipe it held both ends of would be its own
                    // plumbing, which no rule counts.)
                    let (mut r, mut w) = (0, 0);
                    pipe(&mut r, &mut w);
                    // SAFETY: closing its own write end.
                    unsafe { libc::close(w) };
                    std::thread::sleep(Duration::from_secs(60));
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
const HOSTILE_ARGS: [&[u8]; 5] = [
    b"true",
    b"line\nbreak",
    b"\x1b[31mred\x07",
    b"\xff\xfe not utf-8",
    "\u{202e}txt.exe".as_bytes(),
];

/// Hostile names and arguments: a child renames itself (comm) to a newline and an escape
/// sequence and forks; another execs /bin/true with `HOSTILE_ARGS` and a 100 KB argument.
fn hostile() -> Value {
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
