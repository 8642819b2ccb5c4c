//! `cargo xtask bench`: reaper-trace's cost and completeness, measured side by side with no
//! tracer and with its peers, in one run. Pairs are interleaved (A B A B ...) because these
//! machines are noisy; medians and min/max are printed, absolute rates are shown, nothing is
//! asserted.
use std::{
    fs,
    path::{Path, PathBuf},
    thread,
};

use anyhow::{Context, Result, bail};

mod api;
mod arches;
mod footprint;
mod jit_stacks;
mod kernel;
mod loaded;
mod loops;
mod peers;
mod sessions;
mod stacks;
mod state;

pub(crate) use footprint::*;
pub(crate) use kernel::*;
pub(crate) use loops::*;
pub(crate) use peers::*;

/// Settings of one bench run.
pub struct BenchOptions {
    pub procs: usize,
    pub reps: usize,
    pub idle_secs: u64,
    pub sleepers: usize,
    /// The sections to run (all but `soak` when empty).
    pub only: Vec<String>,
    /// Minutes of churn for the soak section.
    pub soak_mins: u64,
    /// `--before REV`: this build's reader against REV's, side by side (bench_before.rs).
    pub before: Option<String>,
}

/// The bench's sections, in the order they run.
const SECTIONS: [&str; 14] = [
    "overhead", "reader", "hooks", "memory", "idle", "latency", "loaded", "sessions", "state",
    "report", "api", "arches", "before", "soak",
];

impl BenchOptions {
    /// Whether `section` was asked for: every section when none was named (`soak` aside:
    /// it runs only when named; `before` only with `--before`).
    pub fn wants(&self, section: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|s| s == section)
    }

    pub fn parse(args: &[String]) -> Result<BenchOptions> {
        let mut o = BenchOptions {
            procs: 20_000,
            reps: 5,
            idle_secs: 60,
            sleepers: 10_000,
            only: Vec::new(),
            soak_mins: 30,
            before: None,
        };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut num = |name: &str| -> Result<usize> {
                it.next()
                    .and_then(|v| v.parse().ok())
                    .with_context(|| format!("{name} takes a number"))
            };
            match a.as_str() {
                "--procs" => o.procs = num("--procs")?,
                "--reps" => o.reps = num("--reps")?.max(1),
                "--idle-secs" => o.idle_secs = num("--idle-secs")? as u64,
                "--sleepers" => o.sleepers = num("--sleepers")?,
                "--soak-mins" => o.soak_mins = num("--soak-mins")?.max(1) as u64,
                "--quick" => {
                    o = BenchOptions {
                        procs: 3000,
                        reps: 3,
                        idle_secs: 10,
                        sleepers: 2000,
                        only: std::mem::take(&mut o.only),
                        soak_mins: o.soak_mins,
                        before: o.before.take(),
                    };
                }
                "--before" => {
                    o.before = Some(it.next().context("--before takes a git revision")?.clone())
                }
                "--only" => {
                    let list = it.next().context("--only takes a list like memory,idle")?;
                    for name in list.split(',') {
                        if !SECTIONS.contains(&name) {
                            bail!(
                                "bench: unknown section {name} (one of {})",
                                SECTIONS.join(", ")
                            );
                        }
                        o.only.push(name.to_owned());
                    }
                }
                other => bail!(
                    "bench: unknown option {other} (--procs N --reps N --idle-secs N --sleepers N --soak-mins N --quick --only LIST --before REV)"
                ),
            }
        }
        Ok(o)
    }
}

#[derive(Clone)]
pub struct Bins {
    pub reaper: PathBuf,
    pub shapes: PathBuf,
    pub scratch: PathBuf,
}

pub fn run(root: &Path, opts: &BenchOptions) -> Result<()> {
    let bins = Bins {
        reaper: root.join("target/release/reaper-trace"),
        shapes: root.join("target/release/reaper-shapes"),
        scratch: root.join("target/bench"),
    };
    let _ = fs::remove_dir_all(&bins.scratch);
    fs::create_dir_all(&bins.scratch)?;
    let peers = install_peers();
    println!(
        "# reaper bench: {} processes a loop, {} interleaved runs of each, {} cores, kernel {}",
        opts.procs,
        opts.reps,
        thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
    );
    let wanted = |section: &str| opts.wants(section);
    if wanted("overhead") {
        overhead(&bins, opts, &peers)?;
    }
    if wanted("reader") {
        reader_cpu(&bins, opts)?;
    }
    if wanted("hooks") {
        hook_costs(&bins, opts)?;
        spawner_cost(&bins, opts)?;
        stacks::python_stacks(&bins, opts)?;
        jit_stacks::node_stacks(&bins, opts)?;
    }
    if wanted("memory") {
        memory(&bins, opts)?;
    }
    if wanted("idle") {
        idle(&bins, opts)?;
    }
    if wanted("latency") {
        lone_latency(&bins)?;
    }
    if wanted("loaded") {
        loaded::loaded(&bins, opts)?;
    }
    if wanted("sessions") {
        sessions::sessions(&bins, opts)?;
    }
    if wanted("state") {
        state::restarts(&bins, opts)?;
    }
    if wanted("report") {
        crate::report_bench::run(&bins.reaper, &bins.scratch)?;
    }
    if wanted("api") {
        api::api(&bins, opts)?;
    }
    if wanted("arches") {
        arches::arches(root, opts)?;
    }
    match (&opts.before, wanted("before")) {
        (Some(rev), true) => crate::bench_before::run(root, opts, rev)?,
        (None, true) if !opts.only.is_empty() => bail!("--only before needs --before REV"),
        _ => {}
    }
    // Half an hour at least: only when asked for by name.
    if opts.only.iter().any(|s| s == "soak") {
        crate::soak::run(&bins.reaper, opts.soak_mins)?;
    }
    Ok(())
}

pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() { 0.0 } else { v[v.len() / 2] }
}

pub fn ms(ns: u64) -> String {
    format!("{:.2} ms", ns as f64 / 1e6)
}
