//! The kernel side: each hook's cost per run (`kernel.bpf_stats_enabled`).
use std::{fs, path::Path, process::Command, thread, time::Duration};

use anyhow::{Context, Result};

use super::*;

/// Per-hook kernel cost from the kernel's own BPF run-time statistics.
pub(crate) fn hook_costs(bins: &Bins, opts: &BenchOptions) -> Result<()> {
    let sysctl = Path::new("/proc/sys/kernel/bpf_stats_enabled");
    let before = fs::read_to_string(sysctl).unwrap_or_else(|_| "0".into());
    fs::write(sysctl, "1").context("enabling kernel.bpf_stats_enabled")?;
    let result = (|| -> Result<()> {
        println!("\n## Kernel cost per hook (kernel.bpf_stats_enabled: run_time_ns / run_cnt)\n");
        println!("| storm | program | runs | ns per run |");
        println!("|---|---|---|---|");
        // Untracked: reaper-trace watches an idle gateway while a storm runs beside it.
        let bystander = Bystander::start(bins)?;
        let (script, truths) = loop_script(bins, Loop::ForkExec, opts.procs, 1, "stats");
        sh(&script)?;
        read_truths(&truths)?;
        for (name, runs, ns) in prog_stats(bystander.pid())? {
            println!(
                "| untracked fork+exec | {name} | {runs} | {:.0} |",
                ns as f64 / runs.max(1) as f64
            );
        }
        bystander.stop()?;
        // Tracked: the storm is the gateway; stats are read while it lingers at the end. With
        // the spawner's stack taken at each fork (the default) and without; the ring's bytes
        // per process from each run's summary (`delivery.received_bytes`).
        let mut ring = Vec::new();
        for (what, stacks) in [("", "auto"), (", --spawn-stacks off", "off")] {
            let (script, truths) = loop_script(bins, Loop::ForkExec, opts.procs, 1, "stats");
            let gateway = format!("{script}; sleep 3");
            let stream = bins.scratch.join(format!("stats-{stacks}.ndjson"));
            let mut tracer = Command::new(&bins.reaper)
                .args(["--json", "--quiet", "--spawn-stacks", stacks])
                .args(["--", "sh", "-c", &gateway])
                .stdout(fs::File::create(&stream)?)
                .spawn()?;
            while !truths[0].exists() {
                thread::sleep(Duration::from_millis(50));
            }
            thread::sleep(Duration::from_millis(500));
            for (name, runs, ns) in prog_stats(tracer.id())? {
                println!(
                    "| tracked fork+exec{what} | {name} | {runs} | {:.0} |",
                    ns as f64 / runs.max(1) as f64
                );
            }
            tracer.wait()?;
            let created = read_truths(&truths)?.created;
            ring.push((stacks, received_bytes(&stream)?, created));
        }
        println!("\n### The ring's bytes in the tracked fork+exec storm (one spawning site)\n");
        println!("| --spawn-stacks | bytes per process | against off |\n|---|---|---|");
        let per =
            |(_, bytes, created): &(&str, u64, usize)| *bytes as f64 / (*created).max(1) as f64;
        let off = ring.iter().find(|r| r.0 == "off").map(per).unwrap_or(0.0);
        for r in &ring {
            println!(
                "| {} | {:.1} | {:.3}x |",
                r.0,
                per(r),
                per(r) / off.max(1.0)
            );
        }
        Ok(())
    })();
    let _ = fs::write(sysctl, before.trim());
    result
}

/// `delivery.received_bytes` of the summary in the NDJSON stream `path`.
fn received_bytes(path: &Path) -> Result<u64> {
    let text = fs::read_to_string(path)?;
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["event"] == "summary")
        .and_then(|v| v["delivery"]["received_bytes"].as_u64())
        .with_context(|| format!("no summary with received_bytes in {}", path.display()))
}

/// The reader's CPU when every spawner is new (`--spawn-stacks`: each stack is located once per
/// spawner): a gateway that runs `sh -c '/bin/true & wait'` N/2 times, so half its processes
/// each fork once; reaper-trace's `cpu_ns` with the stacks taken and without, interleaved,
/// whole and net of its start-up (its `cpu_ns` tracing `true` with the same option: loading
/// and verifying the programs, which `auto` makes longer).
pub(crate) fn spawner_cost(bins: &Bins, opts: &BenchOptions) -> Result<()> {
    let n = opts.procs / 2;
    let script =
        format!("i=0; while [ $i -lt {n} ]; do /bin/sh -c '/bin/true & wait'; i=$((i+1)); done");
    let cpu_ns = |stacks: &str, command: &[&str]| -> Result<f64> {
        let out = Command::new(&bins.reaper)
            .args(["--json", "--quiet", "--spawn-stacks", stacks, "--"])
            .args(command)
            .output()?;
        let summary = String::from_utf8_lossy(&out.stdout)
            .lines()
            .find(|l| l.contains(r#""event":"summary""#))
            .map(str::to_owned)
            .context("no summary")?;
        let v: serde_json::Value = serde_json::from_str(&summary)?;
        v["cpu_ns"].as_f64().context("cpu_ns")
    };
    let mut whole: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    let mut net: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for _ in 0..opts.reps {
        for (i, stacks) in ["auto", "off"].iter().enumerate() {
            let start_up = cpu_ns(stacks, &["true"])?;
            let ns = cpu_ns(stacks, &["sh", "-c", &script])?;
            whole[i].push(ns / (2 * n) as f64 / 1e3);
            net[i].push((ns - start_up) / (2 * n) as f64 / 1e3);
        }
    }
    println!(
        "\n### The reader with a new spawner every other process ({} processes, median of {})\n",
        2 * n,
        opts.reps
    );
    println!("| --spawn-stacks | reaper-trace CPU per process | net of start-up |\n|---|---|---|");
    for (i, stacks) in ["auto", "off"].iter().enumerate() {
        println!(
            "| {stacks} | {:.1} µs | {:.1} µs |",
            median(&mut whole[i]),
            median(&mut net[i])
        );
    }
    Ok(())
}

/// The text of each of process `pid`'s `/proc/PID/fdinfo` files.
pub(crate) fn fdinfos(pid: u32) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for entry in fs::read_dir(format!("/proc/{pid}/fdinfo"))? {
        out.push(fs::read_to_string(entry?.path()).unwrap_or_default());
    }
    Ok(out)
}

/// The value of field `key` (`map_id:`) in an fdinfo text.
pub(crate) fn fdinfo_field(text: &str, key: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .map(|v| v.trim().to_owned())
}

/// (program name, run count, run time ns) of every BPF program reaper-trace holds.
pub(crate) fn prog_stats(pid: u32) -> Result<Vec<(String, u64, u64)>> {
    let mut out = Vec::new();
    for text in fdinfos(pid)? {
        let field = |k: &str| fdinfo_field(&text, k);
        let (Some(id), Some(runs), Some(ns)) =
            (field("prog_id:"), field("run_cnt:"), field("run_time_ns:"))
        else {
            continue;
        };
        let name = prog_name(&id);
        out.push((name, runs.parse().unwrap_or(0), ns.parse().unwrap_or(0)));
    }
    out.sort();
    Ok(out)
}

/// The program's name from the kernel's listing, via bpftool when present, else its id.
pub(crate) fn prog_name(id: &str) -> String {
    Command::new("bpftool")
        .args(["prog", "show", "id", id])
        .output()
        .ok()
        .and_then(|o| {
            let s = String::from_utf8_lossy(&o.stdout).into_owned();
            s.split_whitespace()
                .skip_while(|w| *w != "name")
                .nth(1)
                .map(str::to_owned)
        })
        .unwrap_or_else(|| format!("prog {id}"))
}
