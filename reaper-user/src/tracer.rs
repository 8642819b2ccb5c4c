//! The event path in user space: ring-buffer record → decode → lineage graph → output, plus
//! the loss accounting and /proc repairs that keep the graph exact.
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Result;
use hdrhistogram::Histogram;
use reaper_common::EventKind;
use rustc_hash::FxHashSet as HashSet;

use crate::capture::decode::{KernelEvent, What, decode};
use crate::capture::loader::{KernelCounters, LossCounts};
use crate::kill::{KillReport, Killer};
use crate::leaks::flags as leaks;
use crate::leaks::{InspectOptions, Inspector, Reason};
use crate::lineage::graph::{Applied, LineageGraph, Node, NodeId, Seed};
use crate::lineage::seed::TrackedMap;
use crate::output::Output;
use crate::output::events::{
    AliveProcess, Argv, Counts, Delivery, Event, Latency, LeakedProcess, ProcText, wait_status,
};
use crate::procfs::{self, boottime_now};

/// How long to wait for the kernel to reparent the children of an exited process.
const REPARENT_PATIENCE: Duration = Duration::from_secs(2);

/// CPU time this process used so far (user + system; its children excluded).
fn own_cpu_ns() -> u64 {
    // SAFETY: zeroed rusage is valid; getrusage fills it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let ns = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1000;
    ns(usage.ru_utime) + ns(usage.ru_stime)
}

/// `--check` exit status: descendants were left behind.
pub const EXIT_LEAKED: i32 = 3;
/// `--check` exit status: the command failed, and nothing was left behind.
pub const EXIT_GATEWAY_FAILED: i32 = 4;

/// How long the run waits, once nothing is alive, for the last zombies to be reaped.
const ZOMBIE_SETTLE: Duration = Duration::from_millis(500);
/// How long after an exit the kernel's free may take before a zombie gone from /proc is
/// recorded as reaped from /proc instead (normally the free comes within milliseconds).
pub const FREE_LAG: Duration = Duration::from_secs(1);

/// A child whose parent exited; its new parent is read from /proc once the kernel set it.
struct PendingReparent {
    node: NodeId,
    pid: u32,
    old_ppid: u32,
    since: Instant,
}

/// State of one tracing run.
pub struct Tracer {
    pub graph: LineageGraph,
    pub out: Output,
    counts: Counts,
    /// Kernel records received.
    received: u64,
    /// Loss counters as last reported.
    reported_losses: LossCounts,
    /// Pids to re-read from /proc (events about processes the graph did not know).
    resync_pids: HashSet<u32>,
    /// Children forked while the tracked map was full, not yet reported in a `lost` event.
    untracked_children: Vec<u32>,
    /// Live processes the kernel does not follow (forked while the tracked map was full):
    /// their end is learnt from /proc.
    unfollowed: HashSet<NodeId>,
    pending_reparents: Vec<PendingReparent>,
    /// When the last exit event arrived.
    last_exit: Instant,
    /// Pids that are gateways once their fork event arrives (the `-- CMD` gateway).
    pending_gateways: HashSet<u32>,
    /// Records that did not decode (a build mismatch; never expected).
    pub undecodable: u64,
    /// Kernel timestamps of the records of the batch being handled.
    batch_ts: Vec<u64>,
    /// Time from an event in the kernel to the end of the batch that applied it, in ns.
    latency: Histogram<u64>,
    started: u64,
    /// The leak rules.
    pub inspector: Inspector,
    /// `--kill`, when given.
    pub killer: Option<Killer>,
}

impl Tracer {
    pub fn new(graph: LineageGraph, out: Output, inspect: InspectOptions) -> Tracer {
        Tracer {
            graph,
            out,
            counts: Counts::default(),
            received: 0,
            reported_losses: LossCounts::default(),
            resync_pids: HashSet::default(),
            untracked_children: Vec::new(),
            unfollowed: HashSet::default(),
            pending_reparents: Vec::new(),
            last_exit: Instant::now(),
            pending_gateways: HashSet::default(),
            undecodable: 0,
            batch_ts: Vec::new(),
            latency: Histogram::new_with_bounds(1, 3_600_000_000_000, 2).expect("valid bounds"),
            started: boottime_now(),
            inspector: Inspector::new(inspect),
            killer: None,
        }
    }

    /// Adds processes found in /proc and reports each as a `snapshot`.
    pub fn add_seeds(&mut self, seeds: Vec<Seed>) -> Result<()> {
        for seed in seeds {
            let (id, new) = self.graph.add_seed(seed);
            if new {
                self.emit_snapshot(id)?;
            }
        }
        Ok(())
    }

    fn emit_snapshot(&mut self, id: NodeId) -> Result<()> {
        let Some(n) = self.graph.node(id) else {
            return Ok(());
        };
        let ev = Event::Snapshot {
            pid: n.pid,
            ppid: n.ppid,
            spawner: n.spawner_pid,
            comm: ProcText::new("comm", n.comm),
            argv: Argv::new(n.argv.clone()),
            sid: n.sid,
            pgid: n.pgid,
        };
        self.counts.snapshot += 1;
        self.out.event(boottime_now(), &ev)
    }

    /// `pid` becomes a gateway when its fork event arrives.
    pub fn expect_gateway(&mut self, pid: u32) {
        self.pending_gateways.insert(pid);
    }

    /// The gateway pids (for `ready`).
    pub fn gateway_pids(&self) -> Vec<u32> {
        let mut pids: Vec<u32> = self.graph.gateways().map(|n| n.pid).collect();
        pids.extend(self.pending_gateways.iter().copied());
        pids.sort_unstable();
        pids
    }

    /// Every gateway has exited (or none is known yet to be alive).
    pub fn gateways_exited(&self) -> bool {
        self.pending_gateways.is_empty() && self.graph.gateways().all(|n| !n.alive())
    }

    /// Nothing tracked is alive, and no zombie is left unless it has waited longer than a
    /// parent takes to reap (an unreaped zombie must not keep the run going forever). A zombie
    /// already gone from /proc was reaped: [`Tracer::check_released`] records it shortly.
    pub fn tree_finished(&self) -> bool {
        if self.graph.live_count() > 0 {
            return false;
        }
        if self.graph.zombie_count() == 0 {
            return true;
        }
        let release_pending = self.graph.zombies().any(|n| !self.still_in_proc(n));
        !release_pending && self.last_exit.elapsed() >= ZOMBIE_SETTLE
    }

    /// Records the release of zombies that are gone from /proc although their kernel free has
    /// not arrived: the kernel frees a reaped task only after an RCU grace period, which lags
    /// by seconds or more on some kernels (seen here: frees not fired 95 s after the reap, for
    /// a kernel tracepoint of its own as much as for reaper's). A late free is then ignored.
    ///
    /// `min_age`: how long ago the exit must be ([`FREE_LAG`] while tracing; zero once the
    /// probes are detached, since no free can come any more).
    pub fn check_released(&mut self, min_age: Duration) -> Result<()> {
        if self.graph.zombie_count() == 0 {
            return Ok(()); // the common case: no walk of the graph
        }
        let now = boottime_now();
        let lagging: Vec<NodeId> = self
            .graph
            .zombies()
            .filter(|n| {
                n.exited
                    .as_ref()
                    .is_some_and(|e| now.saturating_sub(e.ts) >= min_age.as_nanos() as u64)
            })
            .filter(|n| !self.still_in_proc(n))
            .map(|n| n.id)
            .collect();
        for id in lagging {
            self.report_gone(id)?;
        }
        Ok(())
    }

    /// Handles one ring-buffer record.
    pub fn record(&mut self, bytes: &[u8]) -> Result<()> {
        self.received += 1;
        match decode(bytes) {
            Ok(ev) => {
                self.batch_ts.push(ev.ts);
                self.apply(&ev)
            }
            Err(_) => {
                self.undecodable += 1;
                Ok(())
            }
        }
    }

    /// Ends a batch of records: each one's latency, from the kernel to now, is recorded.
    pub fn end_batch(&mut self) {
        if self.batch_ts.is_empty() {
            return;
        }
        let now = boottime_now();
        for ts in self.batch_ts.drain(..) {
            let _ = self.latency.record(now.saturating_sub(ts).max(1));
        }
    }

    fn apply(&mut self, ev: &KernelEvent) -> Result<()> {
        let applied = self.graph.apply(ev);
        let node = match &applied {
            Applied::Node(id) | Applied::Exit { node: id, .. } => *id,
            Applied::Duplicate => return Ok(()),
            // A free of a process the graph no longer holds: gone, nothing to repair.
            Applied::Unknown if ev.what == What::Free => return Ok(()),
            Applied::Unknown => {
                self.resync_pids.insert(ev.pid);
                return Ok(());
            }
        };
        let out = match &ev.what {
            What::Fork {
                spawner,
                ppid,
                sid,
                pgid,
                uid,
                cgroup_id,
                comm,
                untracked,
            } => {
                self.counts.fork += 1;
                if self.pending_gateways.remove(&ev.pid) {
                    self.graph.set_gateway(node);
                }
                if *untracked {
                    self.untracked_children.push(ev.pid);
                    self.unfollowed.insert(node);
                    self.graph.mark_uncertain(node);
                }
                Event::Fork {
                    pid: ev.pid,
                    ppid: *ppid,
                    spawner: *spawner,
                    comm: ProcText::new("comm", *comm),
                    start: ev.start,
                    sid: *sid,
                    pgid: *pgid,
                    uid: *uid,
                    cgroup_id: *cgroup_id,
                    untracked: *untracked,
                }
            }
            What::Exec {
                old_tid,
                filename,
                argv,
                truncated,
                ..
            } => {
                self.counts.exec += 1;
                Event::Exec {
                    pid: ev.pid,
                    filename: ProcText::new("filename", filename.clone()),
                    argv: Argv::new(argv.clone()),
                    truncated: *truncated,
                    tid: *old_tid,
                }
            }
            What::Exit { status } => {
                self.counts.exit += 1;
                self.last_exit = Instant::now();
                if let Applied::Exit { orphans, .. } = applied {
                    let since = Instant::now();
                    for orphan in orphans {
                        if let Some(n) = self.graph.node(orphan) {
                            let (pid, old_ppid) = (n.pid, n.ppid);
                            self.pending_reparents.push(PendingReparent {
                                node: orphan,
                                pid,
                                old_ppid,
                                since,
                            });
                        }
                    }
                }
                let (exit_code, signal, core) = wait_status(*status);
                Event::Exit {
                    pid: ev.pid,
                    exit_code,
                    signal,
                    core,
                }
            }
            What::Free => {
                self.counts.reaped += 1;
                Event::Reaped {
                    pid: ev.pid,
                    from_proc: false,
                }
            }
            What::Setsid { sid } => {
                self.counts.setsid += 1;
                Event::Setsid {
                    pid: ev.pid,
                    sid: *sid,
                }
            }
        };
        self.out.event(ev.ts, &out)
    }

    /// Reads the new parents of children whose parent exited. The kernel reparents them a
    /// little after the exit event, so a child still showing its old parent is retried.
    pub fn check_reparents(&mut self) -> Result<()> {
        let pending = std::mem::take(&mut self.pending_reparents);
        for p in pending {
            let Some(node) = self.graph.node(p.node) else {
                continue;
            };
            if !node.alive() {
                continue;
            }
            let Some(stat) = node.process().still_same() else {
                continue; // gone: its own exit event tells the rest
            };
            if stat.ppid == p.old_ppid {
                if p.since.elapsed() < REPARENT_PATIENCE {
                    self.pending_reparents.push(p);
                }
                continue;
            }
            self.graph.reparent(p.node, stat.ppid);
            self.counts.reparent += 1;
            let ev = Event::Reparent {
                pid: p.pid,
                old_ppid: p.old_ppid,
                new_ppid: stat.ppid,
            };
            self.out.event(boottime_now(), &ev)?;
        }
        Ok(())
    }

    /// Looks in /proc for the processes the kernel does not follow; reports those that are
    /// gone as exited and reaped (status unknown).
    pub fn check_unfollowed(&mut self) -> Result<()> {
        let watched: Vec<NodeId> = self.unfollowed.iter().copied().collect();
        for id in watched {
            let Some(node) = self.graph.node(id) else {
                self.unfollowed.remove(&id);
                continue;
            };
            if node.process().still_same().is_none() {
                self.unfollowed.remove(&id);
                self.report_gone(id)?;
            }
        }
        Ok(())
    }

    /// Marks a process that vanished from /proc unseen as reaped (and, if it was thought alive,
    /// exited, status unknown), and says so.
    fn report_gone(&mut self, id: NodeId) -> Result<()> {
        let Some((pid, was_alive)) = self.graph.node(id).map(|n| (n.pid, n.alive())) else {
            return Ok(());
        };
        let now = boottime_now();
        self.graph.mark_gone(id, now);
        if was_alive {
            self.counts.exit += 1;
            let exit = Event::Exit {
                pid,
                exit_code: None,
                signal: None,
                core: false,
            };
            self.out.event(now, &exit)?;
        }
        self.counts.reaped += 1;
        let reaped = Event::Reaped {
            pid,
            from_proc: true,
        };
        self.out.event(now, &reaped)
    }

    pub fn has_pending_reparents(&self) -> bool {
        !self.pending_reparents.is_empty()
    }

    /// Compares the kernel's loss counters with what was reported; on a new loss, reports it
    /// and repairs the graph from /proc and the kernel's tracked map.
    ///
    /// `now` must be read *before* the ring was last drained: the kernel counts a child it
    /// could not track after submitting the record that names it, so every record a count
    /// stands for has been taken in by then.
    pub fn check_losses(&mut self, now: LossCounts, tracked: &TrackedMap) -> Result<()> {
        let new_drops = now.dropped() - self.reported_losses.dropped();
        let new_full = now.tracked_full - self.reported_losses.tracked_full;
        if new_drops == 0 && new_full == 0 && self.resync_pids.is_empty() {
            return Ok(());
        }
        let mut kinds = BTreeMap::new();
        for kind in EventKind::ALL {
            let i = kind.loss_slot() as usize;
            let n = now.kinds[i] - self.reported_losses.kinds[i];
            if n > 0 {
                kinds.insert(kind.name(), n);
            }
        }
        if new_full > 0 {
            kinds.insert("tracked_full", new_full);
        }
        self.reported_losses = now;
        let mut affected = if new_drops > 0 || !self.resync_pids.is_empty() {
            self.resync(tracked)?
        } else {
            Vec::new()
        };
        affected.append(&mut self.untracked_children);
        affected.sort_unstable();
        affected.dedup();
        if new_drops == 0 && new_full == 0 {
            return Ok(()); // a late event for a process already repaired: nothing was lost
        }
        let ev = Event::Lost {
            count: new_drops + new_full,
            kinds,
            affected,
        };
        self.out.event(boottime_now(), &ev)
    }

    /// Re-reads from /proc every process the kernel tracks or the graph thinks alive, and
    /// fixes the graph: processes it missed are added (as `snapshot`s, marked uncertain: their
    /// lineage edge is only their parent at that moment), processes that are gone are marked
    /// exited and reaped. Returns the pids it touched.
    fn resync(&mut self, tracked: &TrackedMap) -> Result<Vec<u32>> {
        let mut affected = Vec::new();
        let kernel_pids: Vec<u32> = tracked.keys().filter_map(|k| k.ok()).collect();
        let mut seeds = Vec::new();
        let asked: Vec<u32> = self.resync_pids.drain().collect();
        for pid in kernel_pids.into_iter().chain(asked) {
            let Ok(stat) = procfs::read_stat(pid) else {
                continue;
            };
            let known = self
                .graph
                .current(pid)
                .is_some_and(|n| n.alive() && n.process().matches(&stat));
            if !known && stat.state != b'Z' {
                let argv = procfs::read_cmdline(pid, crate::capture::decode::MAX_ARGS)
                    .map(|(a, _)| a)
                    .unwrap_or_default();
                seeds.push(Seed {
                    pid,
                    start_ticks: stat.start_ticks,
                    ppid: stat.ppid,
                    sid: stat.session,
                    pgid: stat.pgrp,
                    comm: stat.comm,
                    argv,
                    is_gateway: false,
                    uncertain: true,
                });
            }
        }
        // Parents first, so that lineage edges find their parent node.
        seeds.sort_by_key(|s| s.start_ticks);
        for seed in seeds {
            let pid = seed.pid;
            let (id, new) = self.graph.add_seed(seed);
            if new {
                self.emit_snapshot(id)?;
            }
            affected.push(pid);
        }
        // Processes the graph holds alive that are gone (their exit was lost).
        let stale: Vec<(NodeId, u32)> = self
            .graph
            .alive()
            .filter(|n| n.process().still_same().is_none())
            .map(|n| (n.id, n.pid))
            .collect();
        for (id, pid) in stale {
            self.report_gone(id)?;
            affected.push(pid);
        }
        Ok(affected)
    }

    /// The closing summary, after the probes were detached and the ring drained.
    pub fn summary(
        &mut self,
        counters: &KernelCounters,
        gateway_exit_code: Option<i32>,
    ) -> Result<Event> {
        let kernel_events = counters.kernel_events()?;
        let losses = counters.losses()?;
        let mut dropped = BTreeMap::new();
        for kind in EventKind::ALL {
            dropped.insert(kind.name(), losses.kinds[kind.loss_slot() as usize]);
        }
        let delivery = Delivery {
            kernel_events,
            received: self.received,
            dropped,
            tracked_full: losses.tracked_full,
            consistent: kernel_events == self.received + losses.dropped() && self.undecodable == 0,
        };
        let mut alive: Vec<AliveProcess> = self
            .graph
            .alive()
            .map(|n| AliveProcess {
                pid: n.pid,
                lineage: self.graph.lineage(n.id),
                comm: ProcText::new("comm", n.comm),
                argv: Argv::new(n.argv.clone()),
                ppid: n.ppid,
                escaped: n.escaped,
                uncertain: n.uncertain,
            })
            .collect();
        alive.sort_by_key(|a| a.pid);
        let mut zombies: Vec<u32> = self.graph.zombies().map(|n| n.pid).collect();
        zombies.sort_unstable();
        Ok(Event::Summary {
            counts: self.counts.clone(),
            delivery,
            alive,
            zombies,
            gateway_exit_code,
            duration_ns: boottime_now().saturating_sub(self.started),
            latency_ns: Latency {
                count: self.latency.len(),
                p50: self.latency.value_at_quantile(0.5),
                p99: self.latency.value_at_quantile(0.99),
                max: self.latency.max(),
            },
            cpu_ns: own_cpu_ns(),
            leaks: Box::new(leaks::summary(&self.graph, &self.inspector)),
            kills: self
                .killer
                .as_ref()
                .map(|k| k.counts().clone())
                .unwrap_or_default(),
        })
    }

    /// `--kill`: starts a sequence for each flag held past the grace time, and flags the
    /// spawners found respawning what was killed.
    pub fn decide_kills(&mut self) -> Result<()> {
        let Some(killer) = self.killer.as_mut() else {
            return Ok(());
        };
        let active: Vec<_> = self.inspector.active().collect();
        let now = boottime_now();
        let decided = killer.decide(&self.graph, &active, now);
        for r in decided.reports {
            self.report_kill(r)?;
        }
        for spawner in decided.respawning {
            let raised = self
                .inspector
                .raise(&self.graph, spawner, Reason::Respawning, now);
            if let Some(ev) = raised.and_then(|c| leaks::change_event(&self.graph, &c, now)) {
                self.out.event(now, &ev)?;
            }
        }
        Ok(())
    }

    /// Emits one step of a kill sequence.
    pub fn report_kill(&mut self, r: KillReport) -> Result<()> {
        if let Some(k) = self.killer.as_mut() {
            k.note(&self.graph, &r);
        }
        let ev = Event::Kill {
            pid: r.pid,
            comm: ProcText::new("comm", r.comm),
            reason: r.reason.name(),
            signal: r.signal,
            result: r.result.name(),
            secs: r.secs,
        };
        self.out.event(r.at, &ev)
    }

    /// One round of the leak inspector; emits the flags that started or stopped holding.
    pub fn scan_leaks(&mut self) -> Result<()> {
        let began = Instant::now();
        let now = boottime_now();
        for change in self.inspector.scan(&self.graph, now) {
            if let Some(ev) = leaks::change_event(&self.graph, &change, now) {
                self.out.event(now, &ev)?;
            }
        }
        self.out
            .metrics
            .set_state(&self.graph, &self.inspector, began.elapsed());
        Ok(())
    }

    /// Whether `node`'s process is still in /proc (alive or a zombie not yet reaped).
    fn still_in_proc(&self, node: &Node) -> bool {
        node.process().still_same().is_some()
    }

    /// `--check`'s verdict: every descendant still alive and every zombie, with evidence.
    /// Returns the event and the exit status it stands for.
    pub fn check_verdict(&mut self, gateway_exit_code: Option<i32>) -> (Event, i32) {
        // A zombie /proc no longer shows was reaped; only its `reaped` event is late.
        let left: Vec<NodeId> = self
            .graph
            .alive()
            .chain(self.graph.zombies().filter(|n| self.still_in_proc(n)))
            .filter(|n| !n.is_gateway)
            .map(|n| n.id)
            .collect();
        let mut leaked: Vec<LeakedProcess> = left
            .into_iter()
            .filter_map(|id| {
                let node = self.graph.node(id)?;
                let evidence = match node.alive() {
                    true => self.inspector.evidence(&self.graph, node),
                    false => None,
                };
                Some(LeakedProcess {
                    pid: node.pid,
                    detail: leaks::detail(&self.graph, node, evidence.as_ref()),
                })
            })
            .collect();
        leaked.sort_by_key(|p| p.pid);
        let (verdict, code) = match (leaked.is_empty(), gateway_exit_code) {
            (false, _) => ("leaked", EXIT_LEAKED),
            (true, Some(0)) => ("clean", 0),
            (true, _) => ("gateway_failed", EXIT_GATEWAY_FAILED),
        };
        let ev = Event::Check {
            verdict,
            gateway_exit_code,
            leaked,
        };
        (ev, code)
    }
}
