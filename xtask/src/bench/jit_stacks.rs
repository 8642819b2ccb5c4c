//! `--spawn-stacks` for a Node host: the fork probe's kernel cost with its stack copied
//! (`auto`), the native stack only, and nothing; the copy's bytes in the ring; and the CPU per
//! fork (over the run less the start-up's, over the forks): reaper-trace's, its reader's
//! thread's and its unwinding thread's (`reaper-unwind`, where the copies are unwound).
use std::{
    fs,
    process::{Command, Stdio},
    thread,
    time::Duration,
};

use anyhow::{Context, Result};

use super::footprint::{cpu_ticks, thread_ticks};
use super::*;

/// A Node host that spawns N children from one function, writes DONE, then lingers for the
/// stats to be read.
const HOST: &str = r#"
const { spawnSync } = require('child_process');
const fs = require('fs');
const [n, done] = [Number(process.argv[2]), process.argv[3]];
function startServer() { spawnSync('true'); }
for (let i = 0; i < n; i++) startServer();
fs.writeFileSync(done, '');
setTimeout(() => {}, 5000);
"#;

/// The kernel and reader cost of a tracked Node host's forks with each `--spawn-stacks`.
pub(crate) fn node_stacks(bins: &Bins, opts: &BenchOptions) -> Result<()> {
    let n = opts.procs;
    println!("\n### A Node host's forks (node, {n} spawns from one function)\n");
    println!(
        "| --spawn-stacks | sched_process_fork ns per run | CPU per fork | its reader's thread | its unwinding thread |\n|---|---|---|---|---|"
    );
    let dir = std::env::temp_dir().join(format!("reaper-bench-node-{}", std::process::id()));
    fs::create_dir_all(&dir)?;
    let script = dir.join("host.js");
    fs::write(&script, HOST)?;
    let sysctl = "/proc/sys/kernel/bpf_stats_enabled";
    let before = fs::read_to_string(sysctl).unwrap_or_else(|_| "0".into());
    fs::write(sysctl, "1").context("enabling kernel.bpf_stats_enabled")?;
    let result = (|| -> Result<()> {
        for stacks in ["auto", "native", "off"] {
            let done = dir.join(format!("done-{stacks}"));
            let _ = fs::remove_file(&done);
            let mut tracer = Command::new(&bins.reaper)
                .args(["--json", "--quiet", "--spawn-stacks", stacks, "--", "node"])
                .arg(&script)
                .arg(n.to_string())
                .arg(&done)
                .stdout(Stdio::null())
                .spawn()?;
            while !done.exists() {
                thread::sleep(Duration::from_millis(50));
            }
            // The reader has the last records within its wake-up interval.
            thread::sleep(Duration::from_millis(500));
            let fork = prog_stats(tracer.id())?
                .into_iter()
                .find(|(name, _, _)| name.contains("fork"));
            let (all, reader) = start_up_ticks(bins, stacks)?;
            let all = cpu_ticks(tracer.id()).saturating_sub(all);
            let reader = thread_ticks(tracer.id(), "reaper-trace").saturating_sub(reader);
            let unwinding = thread_ticks(tracer.id(), "reaper-unwind");
            // USER_HZ: 100 ticks a second.
            let per_fork_us = |ticks: u64| ticks as f64 * 10_000.0 / n as f64;
            if let Some((_, runs, ns)) = fork {
                println!(
                    "| {stacks} | {:.0} | {:.0} µs | {:.0} µs | {:.0} µs |",
                    ns as f64 / runs.max(1) as f64,
                    per_fork_us(all),
                    per_fork_us(reader),
                    per_fork_us(unwinding),
                );
            }
            tracer.wait()?;
        }
        Ok(())
    })();
    let _ = fs::write(sysctl, before.trim());
    result?;
    println!(
        "\nA fork record with a copy is {} bytes plus the copy (at most {} bytes).",
        reaper_common::copy::FORK_COPY_FIXED_LEN,
        reaper_common::copy::COPY_MAX,
    );
    Ok(())
}

/// reaper-trace's CPU ticks to start with `--spawn-stacks stacks` (its programs loaded and
/// verified) and trace a command that does nothing, and its reader's thread's.
fn start_up_ticks(bins: &Bins, stacks: &str) -> Result<(u64, u64)> {
    let mut tracer = Command::new(&bins.reaper)
        .args(["--quiet", "--spawn-stacks", stacks, "--", "sleep", "2"])
        .stdout(Stdio::null())
        .spawn()?;
    thread::sleep(Duration::from_millis(1500));
    let ticks = (
        cpu_ticks(tracer.id()),
        thread_ticks(tracer.id(), "reaper-trace"),
    );
    tracer.wait()?;
    Ok(ticks)
}
