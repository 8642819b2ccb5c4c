//! `cargo xtask bench --before REV`: this build's reader against REV's, side by side in one run
//! on the same machine. REV's reaper-trace is built from a git worktree (its own target
//! directory, kept between runs); the workload (`reaper-shapes`) is this build's for both.
//!
//! Each round runs, in an order that alternates between rounds: the loop alone, then each
//! build tracking the loop. reaper-trace's CPU is read around the loop alone (start-up and
//! stop left out; see `measure_tracked`). From those:
//! - the reader's CPU per traced process: that CPU over the processes the loop made; held to
//!   its target as the median of each round's ratio of the two builds (measured back to back),
//!   with the ratio of the two builds' medians beside it;
//! - the CPU cost of tracking: (the loop's and its children's CPU + reaper-trace's) / the
//!   loop's CPU alone, which is steadier here than wall-clock time;
//! - the latency p99 while records stream (the worst run), losses and the delivery check;
//!
//! and, once per build, the latency of lone records on a quiet system.
use std::{path::Path, process::Command};

use anyhow::{Context, Result, bail};

use crate::bench::{
    BenchOptions, Bins, Loop, LoopRun, Watcher, measure, median, ms, quiet_latency,
};

/// The targets the reader is held to: reader CPU per process at most this share of
/// [`SHARE_OF`]'s (issue 47; issue 22 had 0.4x), and the CPU cost of tracking at most these
/// ratios (issue 22).
const READER_SHARE: f64 = 0.35;
/// The build the reader's share is a target against: the last whose one thread did everything.
/// Against any other build the share is shown, not judged.
const SHARE_OF: &str = "bf79780";
const COST_FORK_EXIT: f64 = 1.02;
const COST_FORK_EXEC: f64 = 1.03;
/// The latency budget at p99: while records stream, and on a quiet system.
const STREAMING_P99_NS: u64 = 25_000_000;
const QUIET_P99_NS: u64 = 2_000_000;

/// One build's runs of one loop.
#[derive(Default)]
struct Build {
    reader_us: Vec<f64>,
    cost: Vec<f64>,
    p99: u64,
    lost: u64,
    consistent: bool,
}

impl Build {
    fn add(&mut self, run: &LoopRun, alone: &LoopRun) {
        let n = run.created.max(1) as f64;
        self.reader_us.push(run.storm_cpu / n * 1e6);
        self.cost
            .push((run.loop_cpu + run.storm_cpu) / alone.loop_cpu.max(1e-9));
        self.p99 = self.p99.max(run.latency_p99);
        self.lost += run.dropped + run.lost_events as u64;
        self.consistent &= run.consistent;
    }
}

pub fn run(root: &Path, opts: &BenchOptions, rev: &str) -> Result<()> {
    let now = Bins {
        reaper: root.join("target/release/reaper-trace"),
        shapes: root.join("target/release/reaper-shapes"),
        scratch: root.join("target/bench"),
    };
    let before = Bins {
        reaper: build(root, rev)?,
        ..now.clone()
    };
    // A clone without SHARE_OF's history judges nothing.
    let share_judged = Some(commit_of(root, rev)?) == commit_of(root, SHARE_OF).ok();
    println!(
        "\n## This build against {rev}, side by side ({} processes a loop, {} rounds)\n",
        opts.procs, opts.reps
    );
    println!(
        "| loop | build | reader CPU per process (median, min–max) | CPU cost of tracking (median, min–max) | latency p99 while streaming (worst) | lost | consistent |"
    );
    println!("|---|---|---|---|---|---|---|");
    let mut verdicts = Vec::new();
    for (lp, cost_target) in [
        (Loop::ForkExit, COST_FORK_EXIT),
        (Loop::ForkExec, COST_FORK_EXEC),
    ] {
        let mut builds = [
            Build {
                consistent: true,
                ..Build::default()
            },
            Build {
                consistent: true,
                ..Build::default()
            },
        ];
        for rep in 0..opts.reps {
            eprintln!(
                "bench: {} against {rev}, round {}/{}",
                lp.label(),
                rep + 1,
                opts.reps
            );
            let alone = measure(&now, lp, opts.procs, 1, Watcher::Nobody)?;
            // Alternate which build goes first, so neither always meets a warmer machine.
            let order: [usize; 2] = if rep % 2 == 0 { [0, 1] } else { [1, 0] };
            for i in order {
                let bins = if i == 0 { &before } else { &now };
                let run = measure(bins, lp, opts.procs, 1, Watcher::ReaperTracked)?;
                builds[i].add(&run, &alone);
            }
        }
        // Each round's ratio, its two builds measured minutes apart at most: the machine's
        // state drifts between rounds by more than the builds differ (one build before read
        // 7.3 and 4.1 µs in two runs of one day), and a ratio of two medians of different
        // rounds carries that drift.
        let mut paired: Vec<f64> = builds[1]
            .reader_us
            .iter()
            .zip(&builds[0].reader_us)
            .map(|(now, before)| now / before.max(1e-9))
            .collect();
        let mut medians = [0.0; 2];
        for (i, b) in builds.iter_mut().enumerate() {
            let spread = |v: &mut Vec<f64>| {
                let (min, max) = (
                    v.iter().cloned().fold(f64::MAX, f64::min),
                    v.iter().cloned().fold(0.0, f64::max),
                );
                (median(v), min, max)
            };
            let (reader, rmin, rmax) = spread(&mut b.reader_us);
            let (cost, cmin, cmax) = spread(&mut b.cost);
            medians[i] = reader;
            println!(
                "| {} | {} | {reader:.2} µs ({rmin:.2}–{rmax:.2}) | {cost:.3}x ({cmin:.3}–{cmax:.3}) | {} | {} | {} |",
                lp.label(),
                if i == 0 { rev } else { "this" },
                ms(b.p99),
                b.lost,
                b.consistent
            );
        }
        let of_medians = medians[1] / medians[0].max(1e-9);
        let (lowest, highest) = (
            paired.iter().cloned().fold(f64::MAX, f64::min),
            paired.iter().cloned().fold(0.0, f64::max),
        );
        let share = median(&mut paired);
        let share_target = match share_judged {
            true => format!("target ≤ {READER_SHARE}x: {}", met(share <= READER_SHARE)),
            false => format!("its target, ≤ {READER_SHARE}x, is against {SHARE_OF}"),
        };
        let cost = median(&mut builds[1].cost.clone());
        verdicts.push(format!(
            "{}: reader CPU {share:.2}x the build before's (the median of the rounds' ratios, {lowest:.2}–{highest:.2}; the medians' ratio {of_medians:.2}x; {share_target}); cost of tracking {cost:.3}x (target ≤ {cost_target}x: {}); streaming p99 {} (budget {}: {}); lost {}",
            lp.label(),
            met(cost <= cost_target),
            ms(builds[1].p99),
            ms(STREAMING_P99_NS),
            met(builds[1].p99 <= STREAMING_P99_NS),
            builds[1].lost,
        ));
    }
    for (label, bins) in [(rev, &before), ("this", &now)] {
        let l = quiet_latency(bins, 100, "0.05")?;
        let p99 = l["p99"].as_u64().unwrap_or(0);
        verdicts.push(format!(
            "quiet latency, {label}: {} lone records, p50 {}, p99 {} (budget {}: {})",
            l["count"],
            ms(l["p50"].as_u64().unwrap_or(0)),
            ms(p99),
            ms(QUIET_P99_NS),
            met(p99 <= QUIET_P99_NS)
        ));
    }
    println!();
    for v in verdicts {
        println!("- {v}");
    }
    Ok(())
}

/// The commit `rev` names.
fn commit_of(root: &Path, rev: &str) -> Result<String> {
    let out = Command::new("git")
        .current_dir(root)
        .args(["rev-parse", "--verify", "--quiet"])
        .arg(format!("{rev}^{{commit}}"))
        .output()
        .context("running git rev-parse")?;
    if !out.status.success() {
        bail!("{rev} names no commit of {}", root.display());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn met(yes: bool) -> &'static str {
    if yes { "met" } else { "NOT met" }
}

/// Builds REV's reaper-trace in a worktree of its own; returns the binary.
fn build(root: &Path, rev: &str) -> Result<std::path::PathBuf> {
    let dir = root.join("target/bench-before");
    let src = dir.join("src");
    let git = |args: &[&str]| -> Result<()> {
        let status = Command::new("git")
            .arg("-C")
            .arg(root)
            .args(args)
            .status()
            .context("running git")?;
        if !status.success() {
            bail!("git {} failed ({status})", args.join(" "));
        }
        Ok(())
    };
    let src_s = src.to_str().context("path")?;
    if src.exists() {
        git(&["worktree", "remove", "--force", src_s])?;
    }
    git(&["worktree", "add", "--detach", src_s, rev])
        .with_context(|| format!("checking out {rev} to build the build before"))?;
    eprintln!("bench: building {rev}'s reaper-trace in {}", src.display());
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["build", "--release", "--bin", "reaper-trace"])
        .env("CARGO_TARGET_DIR", dir.join("target"))
        .current_dir(&src)
        .status()
        .context("building the build before")?;
    git(&["worktree", "remove", "--force", src_s])?;
    if !status.success() {
        bail!("building {rev}'s reaper-trace failed ({status})");
    }
    Ok(dir.join("target/release/reaper-trace"))
}
