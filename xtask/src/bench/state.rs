//! `--only state`: what `--state-dir` costs. A gateway with `--sleepers` live children (on its
//! own, not under reaper-trace); the size of their lineage checkpoint; and the time from
//! reaper-trace's start to its `ready` event when it takes the checkpoint back, side by side
//! (interleaved) with a start that reads the same processes from /proc. Then what the kept
//! probes cost while no reader runs: a tracked fork+exit storm's CPU with no probes, with a
//! reader, with the state kept and no reader, and past `--state-keep`, interleaved.
use std::{
    fs,
    io::{BufRead, BufReader},
    path::Path,
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use super::*;

/// Starts reaper-trace on `gateway` (with `--state-dir state`, when given) and returns the
/// time to its `ready` event; then stops it (SIGTERM), which writes the checkpoint.
fn start_to_ready(bins: &Bins, gateway: u32, state: Option<&Path>) -> Result<Duration> {
    let start = Instant::now();
    let mut command = Command::new(&bins.reaper);
    command.args(["--json", "--quiet", "--gateway-pid", &gateway.to_string()]);
    if let Some(state) = state {
        command.arg("--state-dir").arg(state);
    }
    let mut tracer = command.stdout(Stdio::piped()).spawn()?;
    let mut lines = BufReader::new(tracer.stdout.take().context("stdout")?).lines();
    let mut took = None;
    for line in lines.by_ref() {
        if line?.contains("\"event\":\"ready\"") {
            took = Some(start.elapsed());
            break;
        }
    }
    // SAFETY: a plain signal to the child this bench started.
    unsafe { libc::kill(tracer.id() as i32, libc::SIGTERM) };
    // The rest of the stream (the summary) is read to its end: a closed pipe would fail the
    // stop, and with it the checkpoint.
    lines.for_each(drop);
    tracer.wait()?;
    took.context("reaper-trace ended before `ready`")
}

pub(crate) fn restarts(bins: &Bins, opts: &BenchOptions) -> Result<()> {
    let n = opts.sleepers;
    let truth = bins.scratch.join("state-gateway.json");
    let ready = bins.scratch.join("state-gateway.json.ready");
    let mut gateway = Command::new(&bins.shapes)
        .arg("sleepers")
        .arg(&truth)
        .args([n.to_string(), "3600".into()])
        .stdout(Stdio::null())
        .spawn()?;
    while !ready.exists() {
        thread::sleep(Duration::from_millis(50));
    }
    let state = bins.scratch.join("state");
    let result = (|| -> Result<()> {
        // The first run makes the checkpoint (written at its stop).
        start_to_ready(bins, gateway.id(), Some(&state))?;
        let size = fs::metadata(state.join("lineage.json"))
            .context("no checkpoint after the first run")?
            .len();
        let (mut plain, mut resumed) = (Vec::new(), Vec::new());
        for _ in 0..opts.reps {
            plain.push(start_to_ready(bins, gateway.id(), None)?.as_secs_f64());
            resumed.push(start_to_ready(bins, gateway.id(), Some(&state))?.as_secs_f64());
        }
        println!("\n## Restarts (`--state-dir`)\n");
        println!(
            "checkpoint of {} live processes: {:.1} MB ({:.0} bytes a process)\n",
            n + 1,
            size as f64 / 1e6,
            size as f64 / (n + 1) as f64
        );
        println!("| start to `ready` | median | min | max |\n|---|---|---|---|");
        for (what, times) in [
            ("from /proc (no state)", &mut plain),
            ("taking the checkpoint back", &mut resumed),
        ] {
            let min = times.iter().copied().fold(f64::INFINITY, f64::min);
            let max = times.iter().copied().fold(0.0, f64::max);
            println!(
                "| {what} | {:.2} s | {min:.2} s | {max:.2} s |",
                median(times)
            );
        }
        Ok(())
    })();
    // Its children read EOF once it is gone, and exit.
    let _ = gateway.kill();
    let _ = gateway.wait();
    release(bins, &state)?;
    result?;
    unread(bins, opts)
}

/// `reaper-trace --release-state DIR`.
fn release(bins: &Bins, state: &Path) -> Result<()> {
    let status = Command::new(&bins.reaper)
        .arg("--release-state")
        .arg(state)
        .stdout(Stdio::null())
        .status()?;
    if !status.success() {
        bail!("--release-state {} failed ({status})", state.display());
    }
    Ok(())
}

/// Who watches the storm in [`unread`].
#[derive(Clone, Copy, PartialEq)]
enum Watch {
    /// No probes at all.
    Nobody,
    /// reaper-trace reads (a kept state, as a service runs it).
    Reader,
    /// The state kept and no reader: the probes record into the ring until it is full.
    Kept,
    /// The same, past `--state-keep`: the probes only keep the tracked set.
    Expired,
}

/// The storm's own CPU (its processes' and their children's, the probes' time included: they
/// run in the forking and exiting tasks) under `watch`, in seconds.
fn storm_cpu(bins: &Bins, opts: &BenchOptions, watch: Watch) -> Result<f64> {
    let (script, truths) = loop_script(bins, Loop::ForkExit, opts.procs, 1, "unread");
    let go = bins.scratch.join("unread-go");
    let _ = fs::remove_file(&go);
    // The gateway waits for `go` before it storms, so the tracer can start, and go, first.
    let gateway = format!(
        "while [ ! -e {go} ]; do sleep 0.01; done; {script}",
        go = go.display()
    );
    let mut shell = Command::new("sh").args(["-c", &gateway]).spawn()?;
    let state = bins.scratch.join("unread-state");
    let mut reader = None;
    if watch != Watch::Nobody {
        let mut command = Command::new(&bins.reaper);
        command
            .args([
                "--json",
                "--quiet",
                "--gateway-pid",
                &shell.id().to_string(),
            ])
            .arg("--state-dir")
            .arg(&state);
        if watch == Watch::Expired {
            command.args(["--state-keep", "1s"]);
        }
        let mut tracer = command.stdout(Stdio::piped()).spawn()?;
        let mut lines = BufReader::new(tracer.stdout.take().context("stdout")?).lines();
        while !lines
            .next()
            .context("no ready")??
            .contains(r#""event":"ready""#)
        {}
        thread::spawn(move || lines.for_each(drop));
        match watch {
            Watch::Reader => reader = Some(tracer),
            _ => {
                // SAFETY: a plain signal to the child this bench started.
                unsafe { libc::kill(tracer.id() as i32, libc::SIGTERM) };
                tracer.wait()?;
            }
        }
        if watch == Watch::Expired {
            thread::sleep(Duration::from_millis(1500));
        }
    }
    fs::write(&go, b"")?;
    shell.wait()?;
    let cpu = read_truths(&truths)?.cpu;
    if let Some(mut tracer) = reader {
        // SAFETY: as above.
        unsafe { libc::kill(tracer.id() as i32, libc::SIGTERM) };
        tracer.wait()?;
    }
    if watch != Watch::Nobody {
        release(bins, &state)?;
    }
    Ok(cpu)
}

/// What the probes of a kept state cost with no reader, against no probes and a reader.
fn unread(bins: &Bins, opts: &BenchOptions) -> Result<()> {
    let watches = [
        (Watch::Nobody, "no probes"),
        (Watch::Reader, "a reader (--state-dir)"),
        (Watch::Kept, "kept, no reader"),
        (Watch::Expired, "kept, no reader, past --state-keep"),
    ];
    let mut cpu: Vec<Vec<f64>> = vec![Vec::new(); watches.len()];
    for _ in 0..opts.reps {
        for (i, (watch, _)) in watches.iter().enumerate() {
            cpu[i].push(storm_cpu(bins, opts, *watch)?);
        }
    }
    println!(
        "\n### The probes while no reader runs ({} tracked fork+exit, median of {})\n",
        opts.procs, opts.reps
    );
    println!("| storm watched by | storm CPU | vs no probes |\n|---|---|---|");
    let base = median(&mut cpu[0].clone());
    for ((_, what), times) in watches.iter().zip(cpu.iter_mut()) {
        let m = median(times);
        println!("| {what} | {m:.3} s | {:.3}x |", m / base);
    }
    Ok(())
}
