//! Hostile processes: each does to what reaper-trace reads of it what a buggy or hostile
//! process can (as many fds as its limit allows, 60,000 mappings, a command line and
//! environment at the kernel's limits, thousands of holders of one pipe, a library it maps
//! truncated or swapped for a FIFO, a socket or a device), beside a fork loop that must
//! arrive whole. `tests/tests/hostile.rs` runs them.
use std::ffi::CString;
use std::time::Duration;

use serde_json::{Value, json};

use crate::*;

/// Forks of the loop beside each hostile process.
const LOOP: usize = 2000;

/// The fork loop: `n` children that exit at once; their pids.
pub(crate) fn fork_loop(n: usize) -> Vec<u32> {
    (0..n)
        .map(|_| {
            let pid = fork_then(|| 0);
            wait_for(pid);
            pid
        })
        .collect()
}

/// An orphan reading a pipe the gateway writes (its spawner exits; it calls setsid), which
/// runs `prepare` before it says it is ready, then holds until released. Returns its pid and
/// the pipe's write end.
fn orphan(prepare: fn() -> Value) -> (u32, i32, Value) {
    let (mut rd, mut wr) = (0, 0);
    pipe(&mut rd, &mut wr);
    let (mut prd, mut pwr) = (0, 0);
    pipe(&mut prd, &mut pwr);
    let spawner = fork_then(move || {
        // SAFETY: plain syscalls in the child.
        unsafe { libc::setsid() };
        fork_then(move || {
            // The orphan says its own pid first, then what `prepare` did: one writer, so the
            // gateway reads them in that order (the spawner sending the pid raced the orphan's
            // text, and the gateway once read "{}" and two bytes of the pid as the pid).
            // SAFETY: plain syscall.
            send_pid(pwr, unsafe { libc::getpid() } as u32);
            as_stdin(rd);
            // SAFETY: closing the orphan's copies of the pipes it does not use.
            unsafe {
                for fd in [rd, wr, prd] {
                    libc::close(fd);
                }
            }
            let done = prepare();
            let text = done.to_string();
            // SAFETY: writes the text, then its end; the gateway reads until EOF.
            unsafe {
                libc::write(pwr, text.as_ptr().cast(), text.len());
                libc::close(pwr);
            }
            Hold::leak().wait();
            0
        });
        0
    });
    // SAFETY: closing the gateway's copies of what it does not use.
    unsafe {
        libc::close(rd);
        libc::close(pwr);
    }
    wait_for(spawner);
    let h = recv_pid(prd);
    let mut said = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        // SAFETY: reads into a local buffer.
        let n = unsafe { libc::read(prd, buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            break;
        }
        said.extend_from_slice(&buf[..n as usize]);
    }
    // SAFETY: the gateway's end of the orphan's report.
    unsafe { libc::close(prd) };
    let prepared = serde_json::from_slice(&said).unwrap_or(Value::Null);
    (h, wr, prepared)
}

/// The common course: the orphan made hostile, the fork loop beside it, `ready` with both,
/// held until released, the orphan ended.
fn beside_a_fork_loop(truth: &str, prepare: fn() -> Value) -> Value {
    let (h, wr, prepared) = orphan(prepare);
    let children = fork_loop(LOOP);
    let done = json!({ "h": h, "children": children, "prepared": prepared });
    write_truth(&format!("{truth}.ready"), &done);
    Hold::leak().wait();
    // SAFETY: ends the orphan (not this process's child: its spawner exited) and the pipe.
    unsafe {
        libc::kill(h as i32, libc::SIGKILL);
        libc::close(wr);
    }
    done
}

/// `hostile-loop`: waits to be let go (`REAPER_SHAPES_GO`), runs the fork loop, says it is
/// ready, holds: the loop beside what a test does to reaper-trace itself.
pub(crate) fn fork_loop_when_let_go(truth: &str) -> Value {
    wait_for_go();
    let children = fork_loop(LOOP);
    let done = json!({ "children": children });
    write_truth(&format!("{truth}.ready"), &done);
    Hold::leak().wait();
    done
}

/// `hostile-fds`: the orphan holds as many fds as its limit allows, each a copy of its pipe.
pub(crate) fn many_fds(truth: &str) -> Value {
    beside_a_fork_loop(truth, || {
        let limit = reaper_tests::raise_fd_limit();
        let mut held = 0u64;
        // SAFETY: dup of stdin until the limit refuses.
        while unsafe { libc::dup(0) } >= 0 {
            held += 1;
        }
        json!({ "limit": limit, "fds": held + 4 })
    })
}

/// `hostile-zombies`: the orphan leaves 2,000 children unreaped, each exited at once: as many
/// zombies that /proc shows for as long as it lives (killed at the end, they are reaped by
/// whoever takes them).
pub(crate) fn many_zombies(truth: &str) -> Value {
    beside_a_fork_loop(truth, || {
        let zombies: Vec<u32> = (0..2000).map(|_| fork_then(|| 0)).collect();
        json!({ "zombies": zombies })
    })
}

/// `hostile-maps`: the orphan holds 60,000 mappings (alternately read-only and writable, so
/// that none merge), then forks, so that its mappings are read for the site it forked from.
pub(crate) fn many_mappings(truth: &str) -> Value {
    beside_a_fork_loop(truth, || {
        let page = 4096;
        let mut mapped = 0;
        for i in 0..60_000 {
            let prot = match i % 2 {
                0 => libc::PROT_READ,
                _ => libc::PROT_READ | libc::PROT_WRITE,
            };
            // SAFETY: an anonymous private mapping, never touched.
            let at = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    page,
                    prot,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if at == libc::MAP_FAILED {
                break;
            }
            mapped += 1;
        }
        wait_for(fork_then(|| 0));
        json!({ "mappings": mapped })
    })
}

/// `hostile-peers`: 2,000 processes hold the write end of the pipe the orphan reads (each a
/// child of the gateway, asleep in a read of a pipe of the gateway's until it is released:
/// 2,000 processes polling for the release would take the machine).
pub(crate) fn many_peers(truth: &str) -> Value {
    let (h, wr, _) = orphan(|| json!({}));
    let (mut asleep, mut wake) = (0, 0);
    pipe(&mut asleep, &mut wake);
    let holders: Vec<u32> = (0..2000)
        .map(|_| {
            fork_then(|| {
                let mut byte = 0u8;
                // SAFETY: the holder's copy of the waking end goes; it reads until EOF.
                unsafe {
                    libc::close(wake);
                    libc::read(asleep, (&mut byte as *mut u8).cast(), 1);
                }
                0
            })
        })
        .collect();
    // SAFETY: the gateway keeps only the waking end.
    unsafe { libc::close(asleep) };
    write_truth(
        &format!("{truth}.holders"),
        &json!({ "h": h, "holders": holders.len() }),
    );
    // The storm goes on until released: the test asks its questions meanwhile.
    let hold = Hold::leak();
    let mut children = Vec::new();
    while !hold.released() {
        children.extend(fork_loop(100));
    }
    // SAFETY: closing the waking end wakes every holder (EOF).
    unsafe { libc::close(wake) };
    for pid in &holders {
        wait_for(*pid);
    }
    // SAFETY: ends the orphan and the pipe.
    unsafe {
        libc::kill(h as i32, libc::SIGKILL);
        libc::close(wr);
    }
    json!({ "h": h, "children": children, "holders": holders.len() })
}

/// Kernel limits on what an exec carries: each string (`MAX_ARG_STRLEN`), and all of them
/// (a quarter of the stack limit, at most three quarters of 8 MiB).
const ARG_MAX_STRLEN: usize = 128 * 1024;

/// `hostile-args`: this process execs itself as `hostile-args-run` with a command line and an
/// environment at the kernel's limits (its stack limit raised for the most the kernel takes),
/// for a test to take it as a gateway by pid.
pub(crate) fn huge_args(truth: &str) -> ! {
    let stack = libc::rlimit {
        rlim_cur: 64 << 20,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: a valid rlimit; a failure leaves the usual 2 MiB for the strings.
    unsafe { libc::setrlimit(libc::RLIMIT_STACK, &stack) };
    let me = std::env::current_exe().unwrap();
    let me = me.to_str().unwrap();
    let long = "x".repeat(ARG_MAX_STRLEN - 1);
    let mut args = vec![me.to_owned(), "hostile-args-run".into(), truth.into()];
    args.extend(std::iter::repeat_n(long.clone(), 22));
    let mut env: Vec<String> = std::env::vars().map(|(k, v)| format!("{k}={v}")).collect();
    env.extend((0..22).map(|i| format!("HOSTILE_{i}={}", &long[..ARG_MAX_STRLEN - 12])));
    let c = |v: &[String]| -> Vec<CString> {
        v.iter()
            .map(|s| CString::new(s.as_str()).unwrap())
            .collect()
    };
    let (args, env) = (c(&args), c(&env));
    let ptrs = |v: &[CString]| -> Vec<*const libc::c_char> {
        v.iter()
            .map(|s| s.as_ptr())
            .chain([std::ptr::null()])
            .collect()
    };
    let path = CString::new(me).unwrap();
    // SAFETY: NUL-terminated strings in NULL-terminated arrays.
    unsafe { libc::execve(path.as_ptr(), ptrs(&args).as_ptr(), ptrs(&env).as_ptr()) };
    eprintln!("hostile-args: exec: {}", std::io::Error::last_os_error());
    std::process::exit(127)
}

/// `hostile-args-run`: says it is ready (its pid and how long its command line and
/// environment are), waits to be let go (`REAPER_SHAPES_GO`), runs the fork loop, holds.
pub(crate) fn huge_args_run(truth: &str) -> Value {
    let size = |file: &str| std::fs::read(format!("/proc/self/{file}")).map_or(0, |b| b.len());
    let me = json!({
        "pid": std::process::id(),
        "cmdline": size("cmdline"),
        "environ": size("environ"),
    });
    write_truth(&format!("{truth}.started"), &me);
    wait_for_go();
    let children = fork_loop(LOOP);
    let done = json!({ "pid": std::process::id(), "children": children, "sizes": me });
    write_truth(&format!("{truth}.ready"), &done);
    Hold::leak().wait();
    done
}

/// What is done to the library a `python3.99` maps while it forks.
#[derive(Clone, Copy)]
enum ToTheLibrary {
    /// Cut to nothing and written back, again and again.
    Truncate,
    /// Its path renamed over by a FIFO, a socket, a device node and the file again.
    Swap,
}

/// Rounds of a `python3.99` run: each maps a fresh copy of its library (a new inode, read
/// afresh), while the gateway does its worst to it.
const ROUNDS: usize = 40;

/// Forks of each round's `python3.99`.
const ROUND_FORKS: usize = 50;

/// `hostile-library truncate|swap DIR`: each round the gateway writes `DIR/libpython3.99.so`
/// afresh (a copy of this program: an ELF object with its section headers at its end) and
/// starts `DIR/python3.99` (this program too) with it open, which maps it, never touches it,
/// says so and forks (`hostile-python`); from then on the gateway truncates and rewrites the
/// file, or renames a FIFO, a socket and a device node over its path, until that round's
/// forks are done.
pub(crate) fn library(truth: &str, how: &str, dir: &str) -> Value {
    let what = match how {
        "truncate" => ToTheLibrary::Truncate,
        "swap" => ToTheLibrary::Swap,
        other => panic!("hostile-library: truncate or swap, not {other}"),
    };
    let dir = std::path::Path::new(dir);
    let me = std::env::current_exe().unwrap();
    let body = std::fs::read(&me).unwrap();
    let python = dir.join("python3.99");
    std::fs::copy(&me, &python).unwrap();
    let lib = dir.join("libpython3.99.so");
    let mut children = Vec::new();
    for round in 0..ROUNDS {
        let _ = std::fs::remove_file(&lib);
        std::fs::write(&lib, &body).unwrap();
        let opened = std::fs::File::open(&lib).unwrap();
        let lib_fd = std::os::fd::AsRawFd::as_raw_fd(&opened);
        let (mut rd, mut wr) = (0, 0);
        pipe(&mut rd, &mut wr);
        let py = python.to_str().unwrap().to_owned();
        let p = fork_then(move || {
            // SAFETY: the child's copy of the read end goes (its forks report on the write end);
            // the library stays open across the exec.
            unsafe {
                libc::close(rd);
                libc::fcntl(lib_fd, libc::F_SETFD, 0);
            }
            let (lib_fd, fd) = (lib_fd.to_string(), wr.to_string());
            exec(&py, &["python3.99", "hostile-python", &lib_fd, &fd])
        });
        // SAFETY: the gateway reads the pids of the round's forks.
        unsafe { libc::close(wr) };
        drop(opened);
        // Its first word: the library is mapped.
        assert_eq!(recv_pid(rd), p, "python3.99 mapped its library");
        let done = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| match what {
                ToTheLibrary::Truncate => truncate_until(&lib, &body, &done),
                ToTheLibrary::Swap => swap_until(dir, &lib, round, &done),
            });
            loop {
                let pid = recv_pid(rd);
                if pid == 0 {
                    break;
                }
                children.push(pid);
            }
            done.store(true, std::sync::atomic::Ordering::Relaxed);
        });
        // SAFETY: the round's pipe is read to its end.
        unsafe { libc::close(rd) };
        wait_for(p);
    }
    let done = json!({ "children": children, "rounds": ROUNDS });
    write_truth(&format!("{truth}.ready"), &done);
    done
}

/// Truncates `lib` to nothing and writes `body` back, until `done`.
fn truncate_until(lib: &std::path::Path, body: &[u8], done: &std::sync::atomic::AtomicBool) {
    use std::io::Write;
    let Ok(mut file) = std::fs::OpenOptions::new().write(true).open(lib) else {
        return;
    };
    while !done.load(std::sync::atomic::Ordering::Relaxed) {
        let _ = file.set_len(0);
        let _ = std::io::Seek::rewind(&mut file);
        let _ = file.write_all(body);
    }
}

/// Renames a FIFO, a UNIX socket, a device node (`/dev/null`'s numbers) and `lib` itself
/// (through a hard link made first) over `lib`'s path in turn, until `done`.
fn swap_until(
    dir: &std::path::Path,
    lib: &std::path::Path,
    round: usize,
    done: &std::sync::atomic::AtomicBool,
) {
    let keep = dir.join(format!("kept-{round}.so"));
    if std::fs::hard_link(lib, &keep).is_err() {
        return;
    }
    let mut n = 0u64;
    let mut listeners = Vec::new();
    while !done.load(std::sync::atomic::Ordering::Relaxed) {
        let next = dir.join(format!("next-{round}-{n}"));
        let c = CString::new(next.to_str().unwrap()).unwrap();
        let made = match n % 4 {
            // SAFETY: mkfifo and mknod with a NUL-terminated path.
            0 => unsafe { libc::mkfifo(c.as_ptr(), 0o644) == 0 },
            1 => match std::os::unix::net::UnixListener::bind(&next) {
                Ok(listener) => {
                    listeners.push(listener);
                    true
                }
                Err(_) => false,
            },
            2 => unsafe {
                libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o644, libc::makedev(1, 3)) == 0
            },
            _ => std::fs::hard_link(&keep, &next).is_ok(),
        };
        if made {
            let _ = std::fs::rename(&next, lib);
        }
        n += 1;
        // Sockets bound are closed a few at a time: their files are gone once renamed over.
        if listeners.len() > 64 {
            listeners.clear();
        }
    }
    let _ = std::fs::remove_file(&keep);
}

/// `python3.99 hostile-python LIBFD FD`: maps the library open at LIBFD (read-only, never
/// touched: a truncation of it would fault this process, not reaper-trace), says so (its own
/// pid on FD), then forks [`ROUND_FORKS`] children that exit at once, each pid sent on FD, a
/// pause between them so that the round lasts.
pub(crate) fn python(args: &[String]) -> ! {
    let (lib, fd) = (
        args[2].parse::<i32>().unwrap(),
        args[3].parse::<i32>().unwrap(),
    );
    // SAFETY: the descriptor the gateway left open for this process, now this value's.
    let file = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(lib) };
    let len = file.metadata().unwrap().len() as usize;
    // SAFETY: a read-only private mapping of an open file, never read.
    let at = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_PRIVATE,
            std::os::fd::AsRawFd::as_raw_fd(&file),
            0,
        )
    };
    assert_ne!(at, libc::MAP_FAILED, "mapping the library");
    drop(file);
    send_pid(fd, std::process::id());
    for _ in 0..ROUND_FORKS {
        let pid = fork_then(|| 0);
        wait_for(pid);
        send_pid(fd, pid);
        std::thread::sleep(Duration::from_micros(500));
    }
    send_pid(fd, 0);
    std::process::exit(0)
}
