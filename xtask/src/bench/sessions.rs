//! What reading agent sessions costs (`--session-env`, on by default) against not reading
//! them (`--session-env none`), side by side in one run: the reader's CPU per traced process
//! around a fork+exec loop whose processes are in a session (each exec's environment is read
//! on the slow side; the reader notes it), interleaved on, off, on, off; and the RSS tracking
//! N sleepers each in a session of its own (N values kept) against the same sleepers untold.
use std::{thread, time::Duration};

use anyhow::Result;

use super::*;

/// Issue 48's bounds: the reader's CPU with sessions at most this many times without.
const CPU_BOUND: f64 = 1.05;
/// And the RSS at most this much more (MiB).
const RSS_BOUND_MIB: f64 = 2.0;

pub(crate) fn sessions(bins: &Bins, opts: &BenchOptions) -> Result<()> {
    let (script, truths) = loop_script(bins, Loop::ForkExec, opts.procs, 1, "sessions");
    // The loop's processes inherit a session begun by the gateway's first child.
    let script = format!("export AGENT_SESSION_ID=bench-session; {script}");
    let (mut on, mut off, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for rep in 0..opts.reps {
        eprintln!(
            "bench: sessions on and off, round {}/{}",
            rep + 1,
            opts.reps
        );
        let per_proc = |args: &[&str]| -> Result<f64> {
            let run = measure_tracked_with(bins, &script, &truths, args, |_| Ok(()))?;
            Ok(run.storm_cpu / run.created.max(1) as f64 * 1e6)
        };
        let with = per_proc(&[])?;
        let without = per_proc(&["--session-env", "none"])?;
        on.push(with);
        off.push(without);
        ratios.push(with / without.max(f64::MIN_POSITIVE));
    }
    let spread = |v: &[f64]| {
        let min = v.iter().cloned().fold(f64::MAX, f64::min);
        let max = v.iter().cloned().fold(0.0, f64::max);
        (min, max)
    };
    let (rmin, rmax) = spread(&ratios);
    let ratio = median(&mut ratios);
    let (on_med, off_med) = (median(&mut on), median(&mut off));
    println!(
        "\n## Sessions on against off (fork+exec loop of {}, {} rounds interleaved)\n",
        opts.procs, opts.reps
    );
    println!("| measure | on | off | ratio (median, min, max) | bound | |");
    println!("|---|---|---|---|---|---|");
    println!(
        "| reader CPU per process | {on_med:.2} µs | {off_med:.2} µs | {ratio:.3}x ({rmin:.3}x, {rmax:.3}x) | ≤ {CPU_BOUND}x | {} |",
        met(ratio <= CPU_BOUND)
    );
    let rss = |args: &[&str]| -> Result<f64> {
        let mut tracer = start_sleepers_given(
            bins,
            "sessions-sleepers",
            opts.sleepers,
            3.0,
            args,
            Spawner::PythonSessions,
        )?;
        // Past a scan or two, and the environments read.
        thread::sleep(Duration::from_millis(2500));
        let kib = rss_kib(tracer.id(), "VmRSS:");
        tracer.wait()?;
        Ok(kib as f64 / 1024.0)
    };
    let (with, without) = (rss(&[])?, rss(&["--session-env", "none"])?);
    println!(
        "| RSS, {} sleepers each in a session of its own | {with:.1} MiB | {without:.1} MiB | +{:.1} MiB | ≤ +{RSS_BOUND_MIB} MiB | {} |",
        opts.sleepers,
        with - without,
        met(with - without <= RSS_BOUND_MIB)
    );
    Ok(())
}

fn met(ok: bool) -> &'static str {
    if ok { "met" } else { "not met" }
}
