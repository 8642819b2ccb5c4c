//! `--only state`: what `--state-dir` costs. A gateway with `--sleepers` live children (on its
//! own, not under reaper-trace); the size of their lineage checkpoint; and the time from
//! reaper-trace's start to its `ready` event when it takes the checkpoint back, side by side
//! (interleaved) with a start that reads the same processes from /proc.
use std::{
    fs,
    io::{BufRead, BufReader},
    path::Path,
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};

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
    result
}
