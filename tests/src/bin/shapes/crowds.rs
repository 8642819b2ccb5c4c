//! Leak shapes of many instances: servers that accumulate under one gateway, and a gateway
//! that crashes with its servers.
use std::time::Duration;

use serde_json::{Value, json};

use super::sys::*;

/// Accumulating, as in every leak report: the gateway starts a pool of 3 servers of one kind
/// (`stdio-server pool`); a rolling pool of 3 (`stdio-server rolling`) whose every worker it
/// replaces, 6 times, by starting the next and then closing the oldest's stdin (it exits on
/// EOF); then 6 servers of a third kind that differ only in an option value
/// (`stdio-server --session-key K<i> --model m`). It pings every live one every 300 ms until
/// released, so none is ever idle. With `--max-instances 3`, the 3 oldest session servers are
/// one instance too many each; the pool is at its limit, never over it; the rolling pool is
/// over it only while a replaced worker exits.
pub(crate) fn leak_accumulate(truth: &str) -> Value {
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
pub(crate) fn leak_crash(truth: &str) -> Value {
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
