//! What the API costs (`--only api`): the answer latency of `why` and `tree` with many live
//! tracked processes, the reader's CPU per traced process with the API off, idle, and with 1
//! and 10 followers of the event stream reading it all, and `top`'s own CPU at its refresh
//! rate.
use std::{
    io::{Read, Write},
    os::unix::net::UnixStream,
    path::Path,
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use super::footprint::{Spawner, cpu_ticks, start_sleepers_given};
use super::*;

/// Questions asked of each path.
const ASKED: usize = 40;

pub(crate) fn api(bins: &Bins, opts: &BenchOptions) -> Result<()> {
    latency(bins, opts)?;
    followers(bins, opts)?;
    Ok(())
}

/// `GET path` of the API at `socket`, the body whole.
pub(crate) fn get(socket: &Path, path: &str) -> Result<String> {
    let mut s = UnixStream::connect(socket).with_context(|| format!("{}", socket.display()))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    match text.split_once("\r\n\r\n") {
        Some((head, body)) if head.starts_with("HTTP/1.1 200") => Ok(body.to_owned()),
        _ => bail!("{path}: {}", text.lines().next().unwrap_or_default()),
    }
}

/// The p50 and p99 of `v`, in ms.
fn percentiles(v: &mut [f64]) -> (f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.99))
}

/// `why` (one process), `tree` and `sessions` (all of them) answered with `opts.sleepers` live
/// tracked processes each in an agent session of its own, and `top`'s CPU drawing them.
fn latency(bins: &Bins, opts: &BenchOptions) -> Result<()> {
    let socket = bins.scratch.join("api.sock");
    let api = socket.to_str().context("the scratch path")?;
    let mut tracer = start_sleepers_given(
        bins,
        "api-sleepers",
        opts.sleepers,
        60.0,
        &["--api", api],
        // Each in an agent session of its own (sessions are on by default): `sessions`
        // answers with one a process.
        Spawner::PythonSessions,
    )?;
    // The sleepers' pids, from the tree itself.
    let tree: Value = serde_json::from_str(&get(&socket, "/v1/tree")?)?;
    let mut pids = Vec::new();
    let mut stack: Vec<&Value> = tree.as_array().into_iter().flatten().collect();
    while let Some(b) = stack.pop() {
        if b["gateway"] == false {
            pids.extend(b["pid"].as_u64());
        }
        stack.extend(b["spawned"].as_array().into_iter().flatten());
    }
    if pids.len() < opts.sleepers {
        bail!(
            "the tree holds {} of {} sleepers",
            pids.len(),
            opts.sleepers
        );
    }
    println!(
        "\n## The API ({} live tracked processes, each in an agent session of its own)\n\n| question | answers | p50 | p99 | bytes |\n|---|---|---|---|---|",
        pids.len()
    );
    for (name, paths) in [
        (
            "why (`/v1/process/PID`)",
            (0..ASKED)
                .map(|i| format!("/v1/process/{}", pids[i * pids.len() / ASKED]))
                .collect::<Vec<_>>(),
        ),
        ("tree (`/v1/tree`)", vec!["/v1/tree".to_owned(); ASKED / 4]),
        (
            "sessions (`/v1/sessions`)",
            vec!["/v1/sessions".to_owned(); ASKED / 4],
        ),
    ] {
        let mut took = Vec::new();
        let mut bytes = 0;
        for path in &paths {
            let t = Instant::now();
            bytes = get(&socket, path)?.len();
            took.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let (p50, p99) = percentiles(&mut took);
        println!(
            "| {name} | {} | {p50:.1} ms | {p99:.1} ms | {bytes} |",
            paths.len()
        );
    }
    // `top` at its default refresh (1 s), in an 80x24 terminal: its CPU over 10 s.
    let session = "reaper-bench-top";
    let command = format!("{} top --api {api}", bins.reaper.display());
    let started = Command::new("tmux")
        .args([
            "new-session",
            "-d",
            "-s",
            session,
            "-x",
            "80",
            "-y",
            "24",
            &command,
        ])
        .status()?;
    if !started.success() {
        bail!("tmux could not start top");
    }
    thread::sleep(Duration::from_secs(2));
    let top = Command::new("tmux")
        .args(["list-panes", "-t", session, "-F", "#{pane_pid}"])
        .output()?;
    let top: u32 = String::from_utf8_lossy(&top.stdout).trim().parse()?;
    let before = cpu_ticks(top);
    thread::sleep(Duration::from_secs(10));
    let used = cpu_ticks(top).saturating_sub(before);
    let _ = Command::new("tmux")
        .args(["kill-session", "-t", session])
        .status();
    // SAFETY: a plain signal to the child this bench started.
    unsafe { libc::kill(tracer.id() as i32, libc::SIGINT) };
    tracer.wait()?;
    // Clock ticks (100 a second) over 10 s: percent of one CPU.
    println!(
        "\n`reaper-trace top` refreshing every second, drawing them: {} % of a CPU (10 s).",
        used
    );
    Ok(())
}

/// The reader's CPU per process in a storm of fork+exit with the API off, idle, and with `n`
/// followers of the whole stream (`reaper-trace events --follow > /dev/null`), side by side
/// in each round, in an order that turns from round to round.
fn followers(bins: &Bins, opts: &BenchOptions) -> Result<()> {
    let socket = bins.scratch.join("follow.sock");
    let api = socket.to_str().context("the scratch path")?.to_owned();
    // (label, whether the API is served, followers)
    let setups = [
        ("the API off", false, 0usize),
        ("the API idle", true, 0),
        ("1 follower", true, 1),
        ("10 followers", true, 10),
    ];
    let mut per_proc: Vec<Vec<f64>> = vec![Vec::new(); setups.len()];
    for round in 0..opts.reps {
        // Each round starts with the next setup, so that none always meets the machine as
        // the one before left it.
        for k in 0..setups.len() {
            let i = (k + round) % setups.len();
            let (_, served, n) = setups[i];
            let (script, truths) = loop_script(bins, Loop::ForkExit, opts.procs, 1, "follow");
            let args = match served {
                true => ["--api", api.as_str()],
                false => ["--api", "off"],
            };
            let mut followers: Vec<Child> = Vec::new();
            let run = measure_tracked_with(bins, &script, &truths, &args, |_| {
                if !served {
                    return Ok(());
                }
                for _ in 0..n {
                    followers.push(
                        Command::new(&bins.reaper)
                            .args(["events", "--follow", "--api", &api])
                            .stdout(Stdio::null())
                            .spawn()?,
                    );
                }
                // Each follows once the run took its question (at its next tick).
                let patience = Instant::now() + Duration::from_secs(30);
                loop {
                    let status: Value = serde_json::from_str(&get(&socket, "/v1/status")?)?;
                    if status["followers"].as_u64() == Some(n as u64) {
                        return Ok(());
                    }
                    if Instant::now() > patience {
                        bail!("{n} followers never followed: {status}");
                    }
                    thread::sleep(Duration::from_millis(20));
                }
            })?;
            for mut f in followers {
                f.wait()?;
            }
            per_proc[i].push(run.storm_cpu * 1e6 / run.created.max(1) as f64);
        }
    }
    println!(
        "\n| the run | reader CPU per process (median of {}) | against the API off |\n|---|---|---|",
        opts.reps
    );
    let off = median(&mut per_proc[0].clone());
    for (i, (label, _, _)) in setups.iter().enumerate() {
        let m = median(&mut per_proc[i]);
        println!("| {label} | {m:.2} µs | {:.2}x |", m / off.max(1e-9));
    }
    Ok(())
}
