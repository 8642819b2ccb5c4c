//! One tracing run's state and its event path: ring-buffer record → decode → lineage graph →
//! output event, with the leak scans, `--kill` decisions, the `--check` verdict and the closing
//! summary built from it. Keeping the graph exact off the event path is
//! [`crate::lineage::upkeep`]'s.
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Result;
use hdrhistogram::Histogram;
use reaper_common::EventKind;
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use crate::capture::decode::{KernelEvent, What, decode};
use crate::capture::loader::{KernelCounters, LossCounts};
use crate::exit_status;
use crate::gateways::Selectors;
use crate::kill::{KillReport, Killer};
use crate::leaks::flags as leaks;
use crate::leaks::{InspectOptions, Inspector, Reason};
use crate::lineage::graph::{Applied, LineageGraph, NodeId, Seed};
use crate::lineage::seed::TrackedMap;
use crate::lineage::upkeep::{Upkeep, emit_snapshot};
use crate::output::Output;
use crate::output::events::{
    AliveProcess, Argv, Delivery, Event, Latency, LeakedProcess, ProcText,
};
use crate::output::metrics::ScanState;
use crate::procfs::{self, boottime_now, placement};
use crate::text::Args;

/// CPU time this process used so far (user + system; its children excluded).
fn own_cpu_ns() -> u64 {
    // SAFETY: zeroed rusage is valid; getrusage fills it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let ns = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1000;
    ns(usage.ru_utime) + ns(usage.ru_stime)
}

/// How long the run waits, once nothing is alive, for the last zombies to be reaped.
const ZOMBIE_SETTLE: Duration = Duration::from_millis(500);
/// State of one tracing run.
pub struct Tracer {
    pub graph: LineageGraph,
    pub out: Output,
    /// Kernel records received.
    received: u64,
    /// Reparents, unfollowed processes, lagging frees and loss repairs.
    pub upkeep: Upkeep,
    /// When the last exit event arrived.
    last_exit: Instant,
    /// Pids that are gateways once their fork event arrives (the `-- CMD` gateway).
    pending_gateways: HashSet<u32>,
    /// The selectors' labels, by number (for the `gateway` event).
    selector_labels: Vec<String>,
    /// The `-- CMD` gateway's command line.
    command: Args,
    /// Gateways the stream has announced.
    announced: HashSet<NodeId>,
    /// Gateways matched at exec, announced after their exec event (with the new argv).
    announce_at_exec: HashMap<u32, usize>,
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
    /// The flagged processes' memory, for the gauge.
    flagged_rss: leaks::RssCache,
}

impl Tracer {
    pub fn new(graph: LineageGraph, out: Output, inspect: InspectOptions) -> Tracer {
        Tracer {
            graph,
            out,
            received: 0,
            upkeep: Upkeep::default(),
            last_exit: Instant::now(),
            pending_gateways: HashSet::default(),
            selector_labels: Vec::new(),
            command: Args::default(),
            announced: HashSet::default(),
            announce_at_exec: HashMap::default(),
            undecodable: 0,
            batch_ts: Vec::new(),
            latency: Histogram::new_with_bounds(1, 3_600_000_000_000, 2).expect("valid bounds"),
            started: boottime_now(),
            inspector: Inspector::new(inspect),
            killer: None,
            flagged_rss: leaks::RssCache::default(),
        }
    }

    /// Adds processes found in /proc and reports each as a `snapshot`.
    pub fn add_seeds(&mut self, seeds: Vec<Seed>) -> Result<()> {
        for seed in seeds {
            let (id, new) = self.graph.add_seed(seed);
            if new {
                emit_snapshot(&self.graph, &mut self.out, id)?;
            }
        }
        Ok(())
    }

    /// Names the selectors (see [`Selectors::label`]) for the `gateway` events.
    pub fn set_selectors(&mut self, labels: Vec<String>) {
        self.selector_labels = labels;
    }

    /// `pid` becomes a gateway when its fork event arrives; `argv` is its command line.
    pub fn expect_gateway(&mut self, pid: u32, argv: Args) {
        self.pending_gateways.insert(pid);
        self.command = argv;
    }

    /// Emits the `gateway` event for node `id`, found by selector number `selector`, once.
    pub fn announce(&mut self, id: NodeId, selector: usize, ts: u64) -> Result<()> {
        let Some(node) = self.graph.node(id) else {
            return Ok(());
        };
        if !self.announced.insert(id) {
            return Ok(());
        }
        // Its own program's arguments: from its exec or /proc; the command's as given, if it
        // has not executed it yet.
        let argv = match (selector, node.argv.is_empty()) {
            (_, false) => node.argv.clone(),
            (Selectors::COMMAND, true) => self.command.clone(),
            (_, true) => procfs::read_cmdline(node.pid, crate::capture::decode::MAX_ARGS)
                .map(|(a, _)| a)
                .unwrap_or_default(),
        };
        let ev = Event::Gateway {
            pid: node.pid,
            start: node.start.boottime_ns(),
            selector: self
                .selector_labels
                .get(selector)
                .map_or("unknown", String::as_str)
                .to_owned(),
            comm: ProcText::new("comm", node.comm),
            argv: Argv::new(argv),
        };
        self.out.event(ts, &ev)
    }

    /// Gateway instances alive now.
    pub fn gateways_alive(&self) -> usize {
        self.graph.gateways().filter(|n| n.alive()).count()
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
        let release_pending = self
            .graph
            .zombies()
            .any(|n| n.process().still_same().is_none());
        !release_pending && self.last_exit.elapsed() >= ZOMBIE_SETTLE
    }

    /// The graph's upkeep (see [`crate::lineage::upkeep`]): reparents read back, unfollowed
    /// processes looked for, and a loss repaired. `losses` must be read before the last drain.
    pub fn keep_exact(&mut self, losses: LossCounts, tracked: &TrackedMap) -> Result<()> {
        let (graph, out) = (&mut self.graph, &mut self.out);
        self.upkeep.check_reparents(graph, out)?;
        self.upkeep.check_unfollowed(graph, out)?;
        self.upkeep.check_losses(graph, out, losses, tracked)
    }

    /// Zombies gone from /proc whose kernel free lags, recorded as reaped (see
    /// [`Upkeep::check_released`]).
    pub fn release_lagging(&mut self, min_age: Duration) -> Result<()> {
        self.upkeep
            .check_released(&mut self.graph, &mut self.out, min_age)
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
                self.upkeep.resync_later(ev.pid);
                return Ok(());
            }
        };
        // What the event means for the run besides the graph change; a gateway found by it is
        // announced after it.
        let mut announce = None;
        match (&ev.what, applied) {
            (
                What::Gateway {
                    selector,
                    matched_at,
                    ..
                },
                _,
            ) => {
                let selector = *selector as usize;
                match matched_at {
                    reaper_common::MatchedAt::Exec => {
                        self.announce_at_exec.insert(ev.pid, selector);
                    }
                    _ => announce = Some(selector),
                }
            }
            (What::Exec { .. }, _) => announce = self.announce_at_exec.remove(&ev.pid),
            (What::Fork { untracked, .. }, _) => {
                if self.pending_gateways.remove(&ev.pid) {
                    // Announced at its exec, by the name and arguments it runs under (at
                    // the fork it is still a copy of reaper-trace).
                    self.graph.set_gateway(node);
                    self.announce_at_exec.insert(ev.pid, Selectors::COMMAND);
                }
                if *untracked {
                    self.upkeep.unfollowed_child(ev.pid, node);
                    self.graph.mark_uncertain(node);
                }
            }
            (What::Exit { .. }, applied) => {
                self.last_exit = Instant::now();
                if let Applied::Exit { orphans, .. } = applied {
                    self.upkeep.orphaned(&self.graph, orphans);
                }
            }
            _ => {}
        }
        if let Some(event) = Event::from_kernel(ev) {
            self.out.event(ev.ts, &event)?;
        }
        if matches!(ev.what, What::Exit { .. }) {
            for change in self.inspector.exited(node) {
                if let Some(event) = leaks::change_event(&self.graph, &change, ev.ts) {
                    self.out.event(ev.ts, &event)?;
                }
            }
        }
        match announce {
            Some(selector) => self.announce(node, selector, ev.ts),
            None => Ok(()),
        }
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
                placement: placement::read(n.pid),
                // Its name now: it may have renamed itself since its exec.
                comm: ProcText::new(
                    "comm",
                    n.process().still_same().map_or(n.comm, |stat| stat.comm),
                ),
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
            counts: self.out.counts.clone(),
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
        // Oldest flag first: the older instances of an accumulating kind go before newer ones.
        let mut active: Vec<_> = self.inspector.active().collect();
        active.sort_by_key(|&(id, _, since)| (since, id));
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
        let found: Vec<Event> = self
            .inspector
            .scan(&self.graph, now)
            .iter()
            .filter_map(|change| leaks::change_event(&self.graph, change, now))
            .collect();
        self.out.events(now, &found)?;
        let flagged = leaks::flagged_now(&self.graph, &self.inspector, &mut self.flagged_rss);
        self.out.metrics.set_state(&ScanState {
            alive: self.graph.live_count(),
            gateways: self.gateways_alive(),
            zombies: self.graph.zombie_count(),
            graph_nodes: self.graph.len(),
            flagged: flagged.active,
            flagged_rss_kib: flagged.rss_kib,
            kinds: self.inspector.take_census(),
            took: began.elapsed(),
        });
        Ok(())
    }

    /// `--check`'s verdict: every descendant still alive and every zombie, with evidence.
    /// Returns the event and the exit status it stands for.
    pub fn check_verdict(&mut self, gateway_exit_code: Option<i32>) -> (Event, i32) {
        // A zombie /proc no longer shows was reaped; only its `reaped` event is late.
        let left: Vec<NodeId> = self
            .graph
            .alive()
            .chain(
                self.graph
                    .zombies()
                    .filter(|n| n.process().still_same().is_some()),
            )
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
            (false, _) => ("leaked", exit_status::LEAKED),
            (true, Some(0)) => ("clean", 0),
            (true, _) => ("gateway_failed", exit_status::GATEWAY_FAILED),
        };
        let ev = Event::Check {
            verdict,
            gateway_exit_code,
            leaked,
        };
        (ev, code)
    }
}
