//! Leak shapes, one per rule: orphaned, in a pid namespace, idle, killed by an agent, deaf,
//! zombies.
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::sys::*;

/// Orphaned: A calls setsid() and forks B with the read end of the gateway's pipe as stdin,
/// then exits. B waits on stdin; the gateway holds the write end until released, then
/// closes it (B reads EOF and exits) and exits.
pub(crate) fn leak_orphan(truth: &str) -> Value {
    orphan_spawned_by(truth, stdin_reader)
}

/// [`leak_orphan`], A forking B with `spawn(read end, fds B must close)`.
pub(crate) fn orphan_spawned_by(truth: &str, spawn: fn(i32, &[i32]) -> u32) -> Value {
    orphans_spawned_by(truth, &[&spawn])
}

/// Forks a reader of the gateway's pipe: `spawn(read end, fds it must close)` → its pid.
pub(crate) type SpawnReader<'a> = &'a dyn Fn(i32, &[i32]) -> u32;

/// [`leak_orphan`], A forking one reader with each of `spawns` in turn (`spawned` in TRUTH,
/// in that order; `b` the first).
pub(crate) fn orphans_spawned_by(truth: &str, spawns: &[SpawnReader]) -> Value {
    wait_for_go();
    let (mut rd, mut wr) = (0, 0);
    pipe(&mut rd, &mut wr);
    let (mut prd, mut pwr) = (0, 0);
    pipe(&mut prd, &mut pwr);
    let a = fork_then(move || {
        // SAFETY: plain syscalls in the child.
        unsafe { libc::setsid() };
        for spawn in spawns {
            let reader = spawn(rd, &[wr, prd, pwr]);
            send_pid(pwr, reader);
        }
        0
    });
    let spawned: Vec<u32> = spawns.iter().map(|_| recv_pid(prd)).collect();
    wait_for(a);
    let b = spawned[0];
    hold_the_write_end(
        truth,
        (rd, wr),
        json!({ "a": a, "b": b, "spawned": spawned }),
    );
    json!({ "a": a, "b": b, "spawned": spawned, "write_fd": wr })
}

/// Orphaned while no reaper-trace runs (the restart tests): A forks B, which calls setsid()
/// and reads the read end of the gateway's pipe; A exits only once `RELEASE.a` exists (the
/// test makes it between two runs), which reparents B. The gateway holds the write end until
/// released, then closes it (B reads EOF and exits).
///
/// `late` (`spawn-later`): A forks B only once released, writes its pid to `TRUTH.b` and
/// exits: B's whole life is in the gap between the two runs (`b` is 0 in TRUTH).
pub(crate) fn orphan_later(truth: &str, late: bool) -> Value {
    let (mut rd, mut wr) = (0, 0);
    pipe(&mut rd, &mut wr);
    let (mut prd, mut pwr) = (0, 0);
    pipe(&mut prd, &mut pwr);
    let a_release = format!(
        "{}.a",
        std::env::var("REAPER_SHAPES_RELEASE").unwrap_or_default()
    );
    let b_truth = format!("{truth}.b");
    let a = fork_then(move || {
        let fork_b = move || {
            fork_then(move || {
                // SAFETY: plain syscalls in the child.
                unsafe { libc::setsid() };
                as_stdin(rd);
                for fd in [rd, wr, prd, pwr] {
                    // SAFETY: closing the child's copies.
                    unsafe { libc::close(fd) };
                }
                read_stdin_to_eof();
                0
            })
        };
        let b = if late { 0 } else { fork_b() };
        send_pid(pwr, b);
        let cap = Instant::now() + patience();
        while !std::path::Path::new(&a_release).exists() && Instant::now() < cap {
            std::thread::sleep(Duration::from_millis(10));
        }
        if late {
            write_truth(&b_truth, &json!({ "b": fork_b() }));
        }
        0
    });
    let b = recv_pid(prd);
    let found = json!({ "a": a, "b": b });
    write_truth(truth, &found);
    hold_the_write_end(truth, (rd, wr), found.clone());
    wait_for(a);
    found
}

/// Orphaned inside a pid namespace: A unshares a new pid namespace and forks B, its init (pid 1
/// there). B puts its stdio on /dev/null and forks C (pid 2 there) with the read end of the
/// gateway's pipe as stdin; C calls setsid() (its session is 2 inside, its host pid outside),
/// renames itself `ns-escapee` (prctl) and waits on stdin. A sends B's host pid and exits, which
/// breaks C's chain. Once released the gateway closes the write end: C reads EOF and exits, and
/// B, which waited for it, exits too.
pub(crate) fn leak_pidns(truth: &str) -> Value {
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
pub(crate) fn leak_idle(truth: &str) -> Value {
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
pub(crate) fn leak_agent_kill(truth: &str) -> Value {
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

/// Deaf: a reader of a pipe whose writers all closed keeps running without reading (EOF is
/// pending and ignored) until released.
pub(crate) fn leak_deaf(truth: &str) -> Value {
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
pub(crate) fn leak_zombies(truth: &str) -> Value {
    let kids: Vec<u32> = (0..5).map(|_| fork_then(|| 0)).collect();
    write_truth(&format!("{truth}.ready"), &json!({ "zombies": kids }));
    Hold::leak().wait();
    for pid in &kids {
        wait_for(*pid);
    }
    json!({ "zombies": kids })
}
