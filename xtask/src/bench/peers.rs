//! Overhead side by side: each loop with no tracer, with reaper-trace and with its peers
//! (bpftrace, forkstat, perf), interleaved.
use std::{
    path::Path,
    process::{Child, Command, Stdio},
    thread,
    time::Duration,
};

use anyhow::Result;

use crate::prereqs;

use super::*;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Peer {
    Bpftrace,
    Forkstat,
    Perf,
}

impl Peer {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Peer::Bpftrace => "bpftrace (printing fork/exec/exit)",
            Peer::Forkstat => "forkstat (proc connector)",
            Peer::Perf => "perf record (sched tracepoints)",
        }
    }
    /// Its program (its package: [`crate::prereqs::TOOLS`]).
    pub(crate) fn program(self) -> &'static str {
        match self {
            Peer::Bpftrace => "bpftrace",
            Peer::Forkstat => "forkstat",
            Peer::Perf => "perf",
        }
    }
}

/// Loop overhead and completeness against no tracer and the peers.
pub(crate) fn overhead(bins: &Bins, opts: &BenchOptions, peers: &[Peer]) -> Result<()> {
    let mut report = Vec::new();
    for lp in [Loop::ForkExit, Loop::ForkExec] {
        let mut watchers = vec![Watcher::ReaperUntracked, Watcher::ReaperTracked];
        watchers.extend(peers.iter().map(|&p| Watcher::Peer(p)));
        report.extend(compare(bins, lp, opts, 1, &watchers)?);
        report.extend(compare(
            bins,
            lp,
            opts,
            2,
            &[Watcher::ReaperTracked, Watcher::ReaperStalled],
        )?);
    }
    println!("\n## Overhead and completeness (ratio = loop time with the watcher / without)\n");
    println!(
        "| loop | loops at once | watcher | ratio median | min | max | rate without (/s) | forks / execs / exits reported | lost | consistent | latency p50 / p99 (worst run) | reaper-trace CPU (median, start-up incl.) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for line in &report {
        println!("{line}");
    }
    Ok(())
}

/// Runs baseline and each watcher interleaved, `reps` times, and returns table rows.
pub(crate) fn compare(
    bins: &Bins,
    lp: Loop,
    opts: &BenchOptions,
    loops: usize,
    watchers: &[Watcher],
) -> Result<Vec<String>> {
    let mut base = Vec::new();
    let mut runs: Vec<Vec<LoopRun>> = vec![Vec::new(); watchers.len()];
    for rep in 0..opts.reps {
        eprintln!(
            "bench: {} x{loops}, round {}/{}",
            lp.label(),
            rep + 1,
            opts.reps
        );
        base.push(measure(bins, lp, opts.procs, loops, Watcher::Nobody)?);
        for (i, &w) in watchers.iter().enumerate() {
            runs[i].push(measure(bins, lp, opts.procs, loops, w)?);
        }
    }
    let base_secs: Vec<f64> = base.iter().map(|r| r.secs).collect();
    let base_median = median(&mut base_secs.clone());
    let mut rows = Vec::new();
    for (w, rs) in watchers.iter().zip(&runs) {
        let mut ratios: Vec<f64> = rs.iter().zip(&base_secs).map(|(r, b)| r.secs / b).collect();
        let mut secs: Vec<f64> = rs.iter().map(|r| r.secs).collect();
        let ratio = median(&mut secs) / base_median;
        let (min, max) = (
            ratios.iter().cloned().fold(f64::MAX, f64::min),
            ratios.iter().cloned().fold(0.0, f64::max),
        );
        let _ = median(&mut ratios);
        let traced = matches!(w, Watcher::ReaperTracked | Watcher::ReaperStalled);
        let worst = rs
            .iter()
            .min_by_key(|r| r.forks.min(r.exits))
            .cloned()
            .unwrap_or_default();
        let complete = if traced {
            let pct = |n: usize| 100.0 * n as f64 / worst.created.max(1) as f64;
            let execs = if lp == Loop::ForkExec {
                format!("{:.1}%", pct(worst.execs))
            } else {
                "—".into()
            };
            format!(
                "{:.1}% / {execs} / {:.1}% (worst run)",
                pct(worst.forks),
                pct(worst.exits)
            )
        } else {
            "—".into()
        };
        let (lost, consistent, latency, cpu) = if traced {
            let lost: u64 = rs.iter().map(|r| r.dropped + r.lost_events as u64).sum();
            let consistent = rs.iter().all(|r| r.consistent);
            let p99 = rs.iter().map(|r| r.latency_p99).max().unwrap_or(0);
            let p50 = rs.iter().map(|r| r.latency_p50).max().unwrap_or(0);
            let cpu = median(&mut rs.iter().map(|r| r.reader_cpu).collect::<Vec<_>>());
            (
                lost.to_string(),
                consistent.to_string(),
                format!("{} / {}", ms(p50), ms(p99)),
                format!("{cpu:.2} s"),
            )
        } else {
            ("—".into(), "—".into(), "—".into(), "—".into())
        };
        rows.push(format!(
            "| {} | {loops} | {} | {ratio:.3}x | {min:.3}x | {max:.3}x | {:.0} | {complete} | {lost} | {consistent} | {latency} | {cpu} |",
            lp.label(),
            watcher_name(*w),
            (opts.procs * loops) as f64 / base_median,
        ));
    }
    Ok(rows)
}

pub(crate) struct PeerRun {
    child: Child,
}

impl PeerRun {
    pub(crate) fn start(peer: Peer, scratch: &Path) -> Result<PeerRun> {
        let mut cmd = match peer {
            Peer::Bpftrace => {
                let mut c = Command::new("bpftrace");
                c.arg("-e").arg(
                    "tracepoint:sched:sched_process_fork { printf(\"fork %d %d\\n\", args->parent_pid, args->child_pid); } \
                     tracepoint:sched:sched_process_exec { printf(\"exec %d\\n\", pid); } \
                     tracepoint:sched:sched_process_exit { printf(\"exit %d\\n\", pid); }",
                );
                c
            }
            Peer::Forkstat => {
                let mut c = Command::new("forkstat");
                c.args(["-e", "fork,exec,exit"]);
                c
            }
            Peer::Perf => {
                let mut c = Command::new("perf");
                c.args(["record", "-a", "-q", "-o"])
                    .arg(scratch.join("perf.data"))
                    .args([
                        "-e",
                        "sched:sched_process_fork",
                        "-e",
                        "sched:sched_process_exec",
                        "-e",
                        "sched:sched_process_exit",
                    ]);
                c
            }
        };
        let child = cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn()?;
        // No reliable readiness line across the three: give them time to attach.
        thread::sleep(Duration::from_secs(2));
        Ok(PeerRun { child })
    }

    pub(crate) fn stop(mut self) -> Result<()> {
        // SAFETY: signals a process this bench started.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        self.child.wait()?;
        Ok(())
    }
}

/// Installs the peers from Debian when missing; returns those that are there.
pub(crate) fn install_peers() -> Vec<Peer> {
    // bpftool only names the programs in the hook-cost table.
    prereqs::ensure("bpftool");
    let mut have = Vec::new();
    for peer in [Peer::Perf, Peer::Forkstat, Peer::Bpftrace] {
        let bin = peer.program();
        if prereqs::ensure(bin) {
            have.push(peer);
        } else {
            println!("(peer {bin} unavailable: installing it failed)");
        }
    }
    have
}
