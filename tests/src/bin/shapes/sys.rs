//! The syscalls the shapes are made of: fork, wait, exec, pipes, stdin servers, and the hold
//! that keeps a shape up until its test releases it.
use std::{
    ffi::CString,
    time::{Duration, Instant},
};

use serde_json::Value;

/// fork(); the child runs `f` and exits with its return value.
pub(crate) fn fork_then(f: impl FnOnce() -> i32) -> u32 {
    // SAFETY: the child only runs async-signal-safe code or execs, then _exits.
    match unsafe { libc::fork() } {
        -1 => panic!("fork failed"),
        0 => unsafe { libc::_exit(f()) },
        pid => pid as u32,
    }
}

/// Waits for a specific child; returns its raw wait status.
pub(crate) fn wait_for(pid: u32) -> i32 {
    let mut status = 0;
    // SAFETY: plain waitpid.
    unsafe { libc::waitpid(pid as i32, &mut status, 0) };
    status
}

pub(crate) fn exec(path: &str, argv: &[&str]) -> ! {
    let path = CString::new(path).unwrap();
    let args: Vec<CString> = argv.iter().map(|a| CString::new(*a).unwrap()).collect();
    let mut ptrs: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    // SAFETY: NUL-terminated strings and a NULL-terminated array.
    unsafe { libc::execv(path.as_ptr(), ptrs.as_ptr()) };
    unsafe { libc::_exit(127) }
}

pub(crate) fn pipe(rd: &mut i32, wr: &mut i32) {
    let mut fds = [0; 2];
    // SAFETY: valid array of two ints.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    (*rd, *wr) = (fds[0], fds[1]);
}

/// How long a shape keeps its leak in place. A test names a file in `REAPER_SHAPES_RELEASE`
/// and creates it once it has seen the event that proves its point: the shape holds until then,
/// however slow the machine (capped at `REAPER_SHAPES_HOLD_CAP_SECS`, default 300, so that a
/// failing test still ends). Without it, as when a person runs a shape by hand, the hold is
/// `REAPER_SHAPES_LINGER_MS` (or the shape's default).
#[derive(Clone)]
pub(crate) struct Hold {
    release: Option<std::path::PathBuf>,
    deadline: Instant,
}

/// The most a shape waits for something that must happen (a release, its reparenting): the
/// tests' patience (`REAPER_SHAPES_HOLD_CAP_SECS`, 300 s by default), generous for a slow guest.
pub(crate) fn patience() -> Duration {
    let secs = std::env::var("REAPER_SHAPES_HOLD_CAP_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    Duration::from_secs(secs)
}

impl Hold {
    pub(crate) fn new(default_linger_ms: u64) -> Hold {
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
    pub(crate) fn leak() -> Hold {
        Hold::new(4000)
    }

    pub(crate) fn released(&self) -> bool {
        self.release.as_ref().is_some_and(|p| p.exists()) || Instant::now() >= self.deadline
    }

    pub(crate) fn wait(&self) {
        while !self.released() {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// `reaper-shapes subreaper CMD ARGS...`: becomes a child subreaper (`PR_SET_CHILD_SUBREAPER`,
/// kept across exec) and execs CMD: the orphans of what CMD starts are reparented to it.
pub(crate) fn subreaper_exec(command: &[String]) -> ! {
    use std::os::unix::process::CommandExt;
    let Some((program, args)) = command.split_first() else {
        eprintln!("usage: reaper-shapes subreaper CMD [ARGS...]");
        std::process::exit(2);
    };
    // SAFETY: plain syscall on this process.
    let set = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    assert_eq!(set, 0, "prctl: {}", std::io::Error::last_os_error());
    let error = std::process::Command::new(program).args(args).exec();
    eprintln!("exec {program}: {error}");
    std::process::exit(127);
}

/// `reaper-shapes cgroup-exec DIR CMD ARGS...`: moves itself into the cgroup DIR and execs CMD
/// (as `systemd-run --scope` or a container's init does before its command).
pub(crate) fn cgroup_exec(args: &[String]) -> ! {
    use std::os::unix::process::CommandExt;
    let Some((dir, command)) = args.split_first() else {
        eprintln!("usage: reaper-shapes cgroup-exec DIR CMD [ARGS...]");
        std::process::exit(2);
    };
    let Some((program, args)) = command.split_first() else {
        eprintln!("usage: reaper-shapes cgroup-exec DIR CMD [ARGS...]");
        std::process::exit(2);
    };
    let procs = std::path::Path::new(dir).join("cgroup.procs");
    if let Err(e) = std::fs::write(&procs, b"0") {
        eprintln!("write {}: {e}", procs.display());
        std::process::exit(126);
    }
    let error = std::process::Command::new(program).args(args).exec();
    eprintln!("exec {program}: {error}");
    std::process::exit(127);
}

/// `reaper-shapes into-cgroup DIR SHAPE TRUTH`: starts `reaper-shapes SHAPE TRUTH` straight
/// into the cgroup DIR (`clone3` with `CLONE_INTO_CGROUP`, as service managers start a unit's
/// process), waits for it and exits with its status. Writes no truth of its own.
pub(crate) fn into_cgroup(args: &[String]) -> ! {
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
pub(crate) fn as_stdin(fd: i32) {
    // SAFETY: plain dup2 in a child.
    unsafe { libc::dup2(fd, 0) };
}

/// Reads stdin until EOF; returns the bytes read.
pub(crate) fn read_stdin_to_eof() -> usize {
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
pub(crate) fn stdin_reader(rd: i32, close: &[i32]) -> u32 {
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
pub(crate) fn send_pid(wr: i32, pid: u32) {
    // SAFETY: writes 4 bytes from a u32.
    unsafe { libc::write(wr, (&pid as *const u32).cast(), 4) };
}

pub(crate) fn recv_pid(rd: i32) -> u32 {
    let mut pid = 0u32;
    // SAFETY: reads 4 bytes into a u32.
    unsafe { libc::read(rd, (&mut pid as *mut u32).cast(), 4) };
    pid
}

/// With `REAPER_SHAPES_GO` set, waits until that file exists (capped like a hold): a test
/// starts the process, makes it a gateway, and only then lets it make its leak.
pub(crate) fn wait_for_go() {
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
pub(crate) fn hold_the_write_end(truth: &str, (rd, wr): (i32, i32), ready: Value) {
    // SAFETY: closing the gateway's own copy of the read end.
    unsafe { libc::close(rd) };
    write_truth(&format!("{truth}.ready"), &ready);
    Hold::leak().wait();
    // SAFETY: closing the write end gives the reader its EOF.
    unsafe { libc::close(wr) };
}

/// Starts `reaper-shapes stdio-server ARGS...` with a fresh pipe as its stdin; returns its pid
/// and the write end, which the caller keeps. `close` are fds the server must not inherit.
pub(crate) fn start_stdio_server(args: &[&str], close: &[i32]) -> (u32, i32) {
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

/// Writes a truth file whole: readers see it complete or not at all.
pub(crate) fn write_truth(path: &str, value: &Value) {
    let tmp = format!("{path}.tmp");
    std::fs::write(&tmp, value.to_string()).expect("write truth");
    std::fs::rename(&tmp, path).expect("publish truth");
}
