//! The run's parts and the one path a record takes through them:
//!
//! ```text
//! capture (decode, account) → lineage (graph, upkeep) → gateways (announce)
//!                                                     → leaks (flags, on the scan's timer)
//!                                                     → kill (decisions on flags)
//!                           → output (the only writer)
//! ```
//!
//! Each step returns what it found; only [`Output`] writes. The daemon drives the steps, each
//! on its own timer, through the methods here and never reaches into a part.
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::capture::loader::{Accounting, LossCounts};
use crate::capture::reader::Reader;
use crate::closing::{Closing, RunFigures};
use crate::gateways::announce::Announcer;
use crate::identity::ProcessId;
use crate::kill::{KillReport, Killer};
use crate::leaks::{InspectOptions, Inspector, Reason, flags};
use crate::lineage::graph::NodeId;
use crate::lineage::graph::{Change, LineageGraph, Seed};
use crate::lineage::seed::TrackedMap;
use crate::lineage::sessions::Sessions;
use crate::lineage::upkeep::{self, Upkeep};
use crate::output::Output;
use crate::output::metrics::ScanState;
use crate::procfs::boottime_now;
use crate::sites::{self, Asked, Naming, SpawnSites};
use crate::stream::Stamped;
use crate::stream::events::{Delivery, Event};
use crate::stream::evidence::Frame;
use crate::text::Args;

use super::unwinds::Unwinds;

mod answers;
mod kill_asked;
mod resume;
mod scan;
mod sessions;
mod spawn_sites;
pub use resume::KeptState;
pub use scan::{JudgeStep, PlanStep};

/// The frames that spawned each process a round asked about, by pid, and whether they were
/// cut.
type SpawnedAt = rustc_hash::FxHashMap<u32, (Arc<[Frame]>, bool)>;

/// What naming a round's spawn sites needs (see `sites::naming`), read on the slow side, and
/// the pids it asks about.
pub struct ToName {
    pub naming: Naming,
    asked: Vec<(u32, Asked)>,
}

/// How long the run waits, once nothing is alive, for the last zombies to be reaped.
const ZOMBIE_SETTLE: Duration = Duration::from_millis(500);

/// Every part of a tracing run.
pub struct Pipeline {
    reader: Reader,
    graph: LineageGraph,
    upkeep: Upkeep,
    gateways: Announcer,
    inspector: Inspector,
    /// `--kill`'s, and the kills asked for through the API.
    killer: Killer,
    /// `--kill-reasons` (given or not): what `why` says `--kill` would follow.
    kill_reasons: Vec<Reason>,
    /// The kinds with the most live instances at the last count (the API's `/v1/kinds`).
    kinds: Vec<(String, u64)>,
    out: Output,
    /// The flagged processes' memory, for the gauge.
    flagged_rss: flags::RssCache,
    /// `--spawn-stacks`: where each fork's stack was taken, named for flags.
    sites: Option<SpawnSites>,
    /// The thread unwinding the sites' copies, once started (see [`Pipeline::unwind_on`]).
    unwinds: Option<Unwinds>,
    /// Whether the operator was told that copies go without unwinding.
    told_not_unwound: bool,
    /// `--session-env` or `--session-cgroup`: the processes whose session is to be read.
    sessions: Option<Sessions>,
    /// Boot-time ns of the last exit record (its kernel time: no clock read per exit).
    last_exit: u64,
    /// Boot-time ns the run started at.
    started: u64,
    /// A round of the rules being judged, in steps (see [`Pipeline::judge_step`]).
    judging: Option<scan::Judging>,
    /// A round of the rules judged, not yet written (see [`Pipeline::judge_step`]).
    judged: Option<scan::Judged>,
    /// When the `-- CMD` gateway was spawned (see [`Pipeline::awaits_command_gateway`]).
    command_gateway_spawned: Option<Instant>,
    /// The processes whose sessions a restart reads again, while any of them waits (see
    /// [`Pipeline::sessions_kept_as`]).
    sessions_rereading: Vec<NodeId>,
}

/// How long after the `-- CMD` gateway's spawn a question naming a process waits for the
/// record of its fork, at most: it comes within milliseconds; only one lost to a full ring
/// never comes.
const COMMAND_GATEWAY_WAIT: Duration = Duration::from_secs(2);

impl Pipeline {
    /// `kill_reasons`: the flags `--kill` follows (or would, without it: the API's answers say
    /// so). `selector_labels`: the selectors' names, by number, for the `gateway` events.
    pub fn new(
        graph: LineageGraph,
        out: Output,
        inspect: InspectOptions,
        killer: Killer,
        kill_reasons: Vec<Reason>,
        selector_labels: Vec<String>,
    ) -> Pipeline {
        Pipeline {
            reader: Reader::default(),
            graph,
            upkeep: Upkeep::default(),
            gateways: Announcer::new(selector_labels),
            inspector: Inspector::new(inspect),
            killer,
            kill_reasons,
            kinds: Vec::new(),
            out,
            flagged_rss: flags::RssCache::default(),
            sites: None,
            unwinds: None,
            told_not_unwound: false,
            sessions: None,
            last_exit: boottime_now(),
            started: boottime_now(),
            judging: None,
            judged: None,
            command_gateway_spawned: None,
            sessions_rereading: Vec::new(),
        }
    }

    /// Operator notes, written.
    pub fn tell(&mut self, notes: &[String]) -> Result<()> {
        for note in notes {
            self.out.note(note)?;
        }
        Ok(())
    }

    /// The one writer, for what only it does (the status line, the closing tree, flushes).
    pub fn output(&mut self) -> &mut Output {
        &mut self.out
    }

    /// Writes the events a step returned (a gateway found, the upkeep's findings, the ready
    /// event, the command's end).
    pub fn write(&mut self, found: impl IntoIterator<Item = Stamped>) -> Result<()> {
        for s in found {
            self.out.event(s.ts, *s.event)?;
        }
        Ok(())
    }

    /// Takes in one ring-buffer record: the graph applies it and says what changed; the
    /// record's events are built from that change, once, and written here (its own, then the
    /// flags its exit cleared, then the gateway it announced). They are written where they
    /// are built, not returned: a list handed back would move every event once more, a tenth
    /// of the record's cost in a fork storm.
    pub fn record(&mut self, bytes: &[u8]) -> Result<()> {
        let Some(mut ev) = self.reader.take(bytes) else {
            return Ok(());
        };
        let change = self.graph.apply(&ev);
        if let Some(sessions) = self.sessions.as_mut() {
            sessions.on_change(&mut self.graph, &change);
        }
        let interpreter = self.spawn_sites(&change, &mut ev)?;
        self.upkeep.on_change(&self.graph, &change, ev.pid);
        let gateway = self.gateways.on_change(&self.graph, &change, ev.ts);
        if gateway.is_some() {
            self.learn_gateway_code(ev.pid);
        }
        if let Some(event) = change.event(&self.graph, ev.pid, interpreter) {
            self.out.event(ev.ts, event)?;
        }
        if let Change::Exited { node, .. } = change {
            self.last_exit = ev.ts;
            for cleared in self.inspector.exited(node) {
                if let crate::leaks::Change::Cleared { reason, .. } = cleared
                    && self.never_written(node, reason)
                {
                    continue;
                }
                if let Some(event) = flags::change_event(&self.graph, &cleared, ev.ts) {
                    self.out.event(ev.ts, event)?;
                }
            }
            self.cleared_at_exit(ev.pid, ev.ts)?;
        }
        self.write(gateway)
    }

    /// Records that did not decode (see [`Reader::undecodable`]).
    pub fn undecodable(&self) -> u64 {
        self.reader.undecodable()
    }

    /// Ends a batch of records (see [`Reader::end_batch`]); interpreters whose library was
    /// not mapped at their exec are looked at again.
    pub fn end_batch(&mut self) -> Result<()> {
        self.reader.end_batch();
        self.take_unwound()?;
        self.look_again_for_interpreters()
    }

    /// Records taken from the ring so far (by every run of a kept state).
    pub fn received(&self) -> u64 {
        self.reader.received()
    }

    /// Adds processes found in /proc and reports each as a `snapshot`.
    pub fn add_seeds(&mut self, seeds: Vec<Seed>) -> Result<()> {
        for seed in seeds {
            let pid = seed.pid;
            let (id, new) = self.graph.add_seed(seed);
            if new {
                if let Some(sessions) = self.sessions.as_mut() {
                    sessions.note(&mut self.graph, id);
                }
                if let Some(sites) = self.sites.as_mut() {
                    let seen = sites.found(id, pid, sites::program_of(pid));
                    self.tell(&seen.notes)?;
                }
                let found = upkeep::snapshot(&self.graph, id);
                self.write(found)?;
            }
        }
        Ok(())
    }

    /// Announces the gateway `pid` found in /proc by selector number `selector`, if it is
    /// still the process of start time `start_ticks`. Returns whether it was.
    pub fn announce_found(&mut self, pid: u32, start_ticks: u64, selector: usize) -> Result<bool> {
        let node = self
            .graph
            .current(pid)
            .filter(|n| n.is_gateway && n.alive() && n.start.ticks() == start_ticks)
            .map(|n| n.id);
        let Some(id) = node else {
            return Ok(false);
        };
        let found = self
            .gateways
            .announce(&self.graph, id, selector, boottime_now());
        self.learn_gateway_code(pid);
        self.write(found)?;
        Ok(true)
    }

    /// `pid` becomes a gateway when its fork event arrives; `argv` is its command line.
    pub fn expect_gateway(&mut self, pid: u32, argv: Args) {
        self.graph.expect_gateway(pid);
        self.command_gateway_spawned = Some(Instant::now());
        self.gateways.expect(argv);
    }

    /// Whether the `-- CMD` gateway was spawned and the record of its fork (in the ring
    /// before the spawn returned) not taken yet, for at most [`COMMAND_GATEWAY_WAIT`] after
    /// the spawn.
    pub fn awaits_command_gateway(&self) -> bool {
        let waiting =
            (self.command_gateway_spawned).is_some_and(|at| at.elapsed() < COMMAND_GATEWAY_WAIT);
        waiting && self.graph.expected_gateway().is_some()
    }

    /// Whether the graph holds `pid` as a live gateway.
    pub fn is_gateway(&self, pid: u32) -> bool {
        self.graph
            .current(pid)
            .is_some_and(|n| n.is_gateway && n.alive())
    }

    /// The gateway pids (for `ready`).
    pub fn gateway_pids(&self) -> Vec<u32> {
        self.gateways.pids(&self.graph)
    }

    /// Every gateway has exited and nothing tracked is alive; no zombie is left unless it has
    /// waited longer than a parent takes to reap (an unreaped zombie must not keep the run
    /// going forever). A zombie already gone from /proc was reaped:
    /// [`Pipeline::release_lagging`] records it shortly.
    pub fn finished(&self) -> bool {
        if !self.gateways.all_exited(&self.graph) || self.graph.live_count() > 0 {
            return false;
        }
        if self.graph.zombie_count() == 0 {
            return true;
        }
        let release_pending = self
            .graph
            .zombies()
            .any(|n| n.process().still_same().is_none());
        let since_exit = boottime_now().saturating_sub(self.last_exit);
        !release_pending && since_exit >= ZOMBIE_SETTLE.as_nanos() as u64
    }

    /// Children of an exited process wait to be read back (see [`Upkeep`]).
    pub fn has_pending_reparents(&self) -> bool {
        self.upkeep.has_pending_reparents()
    }

    /// The graph's upkeep (see [`crate::lineage::upkeep`]): reparents read back, unfollowed
    /// processes looked for, and a loss repaired. `losses` must be read before the last drain.
    pub fn keep_exact(&mut self, losses: LossCounts, tracked: &TrackedMap) -> Result<()> {
        let reparents = self.upkeep.check_reparents(&mut self.graph);
        let unfollowed = self.upkeep.check_unfollowed(&mut self.graph);
        let repaired = self.upkeep.check_losses(&mut self.graph, losses, tracked);
        self.write(reparents.into_iter().chain(unfollowed).chain(repaired))
    }

    /// Zombies gone from /proc whose kernel free lags, recorded as reaped (see
    /// [`Upkeep::check_released`]).
    pub fn release_lagging(&mut self, min_age: Duration) -> Result<()> {
        let found = self.upkeep.check_released(&mut self.graph, min_age);
        self.write(found)
    }

    /// The stop's last look: clears the flags of processes that ended since the last scan
    /// and raises none. What a stop leaves is a chain half torn down (its outer process gone,
    /// its leaf a few milliseconds from its own exit); judged, such a leaf is a new server
    /// "orphaned" for the time it takes to exit.
    pub fn clear_ended(&mut self) -> Result<()> {
        let began = Instant::now();
        let changes = self.inspector.clear_ended(&self.graph);
        self.write_scan(&changes, &SpawnedAt::default(), Some(began))
    }

    /// Writes a round's flags that started or stopped holding; with the time the round
    /// `began`, sets the gauges from what the round saw.
    fn write_scan(
        &mut self,
        changes: &[crate::leaks::Change],
        spawned: &SpawnedAt,
        began: Option<Instant>,
    ) -> Result<()> {
        let now = boottime_now();
        let mut found: Vec<Event> = changes
            .iter()
            .filter_map(|change| flags::change_event(&self.graph, change, now))
            .collect();
        let notes = self.inspector.take_notes();
        self.tell(&notes)?;
        for change in changes {
            if let crate::leaks::Change::Flag(f) = change
                && let Some(kib) = f.evidence.as_ref().and_then(|e| e.sample.rss_kib)
            {
                self.flagged_rss.flagged(f.node, kib);
            }
        }
        for event in &mut found {
            if let Event::Flag(flag) = event
                && let Some(site) = spawned.get(&flag.pid)
            {
                (flag.detail.spawned_at, flag.detail.spawned_at_truncated) = site.clone();
            }
        }
        if let Some(sites) = self.sites.as_mut() {
            sites.retain(|id| self.graph.holds(id));
        }
        self.gateways.retain(|id| self.graph.holds(id));
        self.out.events(now, found)?;
        if let Some(began) = began {
            self.set_gauges(began);
        }
        Ok(())
    }

    /// The flagged processes whose memory the gauge is to be given again, to be read on the
    /// slow side (see [`flags::RssCache::read`]) and kept by [`Pipeline::rss_read`].
    pub fn rss_to_read(&self) -> Vec<(NodeId, ProcessId)> {
        self.flagged_rss.stale(&self.graph, &self.inspector)
    }

    /// Keeps the memory of flagged processes as the slow side read it.
    pub fn rss_read(&mut self, read: Vec<(NodeId, Option<u64>)>) {
        self.flagged_rss.fill(read);
    }

    /// The gauges, from what a round that `began` then saw.
    fn set_gauges(&mut self, began: Instant) {
        let flagged = flags::flagged_now(&self.graph, &self.inspector, &mut self.flagged_rss);
        self.out.metrics.set_state(&ScanState {
            alive: self.graph.live_count(),
            gateways: self.graph.live_gateways(),
            zombies: self.graph.zombie_count(),
            graph_nodes: self.graph.len(),
            flagged: flagged.active,
            flagged_rss_kib: flagged.rss_kib,
            kinds: self
                .inspector
                .take_census()
                .inspect(|k| self.kinds.clone_from(k)),
            took: began.elapsed(),
        });
    }

    /// When the rules next need a look sooner than the scan interval (an orphan grace ends),
    /// boot-time ns.
    pub fn next_look(&self) -> Option<u64> {
        self.inspector.next_look()
    }

    /// `--kill`: starts a sequence for each flag held past the grace time; the spawners found
    /// respawning what was killed are flagged by the next round of the rules.
    pub fn decide_kills(&mut self) -> Result<()> {
        if !self.killer.auto() {
            return Ok(());
        }
        let killer = &mut self.killer;
        // Oldest flag first: the older instances of an accumulating kind go before newer ones.
        let mut active: Vec<_> = self.inspector.active().collect();
        active.sort_by_key(|&(id, _, since)| (since, id));
        let now = boottime_now();
        let decided = killer.decide(&self.graph, &active, now);
        for r in decided.reports {
            self.report_kill(r)?;
        }
        self.inspector.respawning(decided.respawning);
        Ok(())
    }

    /// Writes one step of a kill sequence.
    pub fn report_kill(&mut self, r: KillReport) -> Result<()> {
        self.killer.note(&self.graph, &r);
        self.write([r.event()])
    }

    /// `--check`'s verdict (see [`Closing::check_verdict`]), written; returns the event and
    /// the exit status it stands for.
    pub fn check_verdict(&mut self, gateway_exit_code: Option<i32>) -> Result<(Event, i32)> {
        let mut closing = Closing {
            graph: &self.graph,
            inspector: &mut self.inspector,
        };
        let (mut verdict, code) = closing.check_verdict(gateway_exit_code);
        if let Event::Check(check) = &mut verdict {
            let spawned = self.spawned_at_the_end(check.leaked.iter().map(|l| l.pid));
            for leaked in &mut check.leaked {
                if let Some(site) = spawned.get(&leaked.pid) {
                    (leaked.detail.spawned_at, leaked.detail.spawned_at_truncated) = site.clone();
                }
            }
        }
        self.out.event(boottime_now(), verdict.clone())?;
        Ok((verdict, code))
    }

    /// Writes the closing summary, then the tree of what is left alive for people.
    pub fn close(&mut self, account: Accounting, gateway_exit_code: Option<i32>) -> Result<()> {
        // From here nothing is dropped for a slow outlet: the ring is read no more.
        self.out.end_stalls()?;
        let figures = RunFigures {
            counts: self.out.counts.clone(),
            delivery: Delivery {
                followers_dropped: self.out.followers_dropped(),
                ..self.reader.delivery(account)
            },
            latency: self.reader.latency(),
            kills: self.killer.counts().clone(),
            started: self.started,
            gateway_exit_code,
        };
        let closing = Closing {
            graph: &self.graph,
            inspector: &mut self.inspector,
        };
        let summary = closing.summary(figures);
        self.out.event(boottime_now(), summary)?;
        self.out.end_status();
        let active = self.inspector.held().by_node();
        let tree = crate::output::tree::render_alive_tree(&self.graph, &active);
        self.out.human_block(&tree)?;
        self.out.last_flush()?;
        Ok(())
    }
}
