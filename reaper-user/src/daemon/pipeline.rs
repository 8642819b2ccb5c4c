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
use reaper_common::interpreter::Interpreter;
use rustc_hash::FxHashMap;

use crate::capture::decode::{CopiedStack, What};
use crate::capture::loader::{Accounting, LossCounts};
use crate::capture::reader::Reader;
use crate::closing::{Closing, RunFigures};
use crate::gateways::announce::Announcer;
use crate::kill::{KillReport, Killer};
use crate::leaks::{InspectOptions, Inspector, Reason, flags};
use crate::lineage::graph::{LineageGraph, NodeId, Seed, SpawnStack};
use crate::lineage::seed::TrackedMap;
use crate::lineage::upkeep::{self, Upkeep};
use crate::output::Output;
use crate::output::metrics::ScanState;
use crate::procfs::boottime_now;
use crate::sites::{self, Named, SpawnSites};
use crate::stream::Stamped;
use crate::stream::events::Event;
use crate::stream::evidence::Frame;
use crate::text::Args;

mod resume;
pub use resume::{KeptState, Resumed};

/// The spawn sites one round of flags named, by (spawner, Python stack, native stack).
type NamedThisRound = FxHashMap<(NodeId, Option<u64>, Option<u64>), (Arc<[Frame]>, bool)>;

/// How long the run waits, once nothing is alive, for the last zombies to be reaped.
const ZOMBIE_SETTLE: Duration = Duration::from_millis(500);

/// Every part of a tracing run.
pub struct Pipeline {
    reader: Reader,
    graph: LineageGraph,
    upkeep: Upkeep,
    gateways: Announcer,
    inspector: Inspector,
    /// `--kill`, when given.
    killer: Option<Killer>,
    out: Output,
    /// The flagged processes' memory, for the gauge.
    flagged_rss: flags::RssCache,
    /// `--spawn-stacks`: where each fork's stack was taken, named for flags.
    sites: Option<SpawnSites>,
    /// Boot-time ns of the last exit record (its kernel time: no clock read per exit).
    last_exit: u64,
    /// Boot-time ns the run started at.
    started: u64,
}

impl Pipeline {
    /// `selector_labels`: the selectors' names, by number, for the `gateway` events.
    pub fn new(
        graph: LineageGraph,
        out: Output,
        inspect: InspectOptions,
        killer: Option<Killer>,
        selector_labels: Vec<String>,
    ) -> Pipeline {
        Pipeline {
            reader: Reader::default(),
            graph,
            upkeep: Upkeep::default(),
            gateways: Announcer::new(selector_labels),
            inspector: Inspector::new(inspect),
            killer,
            out,
            flagged_rss: flags::RssCache::default(),
            sites: None,
            last_exit: boottime_now(),
            started: boottime_now(),
        }
    }

    /// Names the code that spawned each flagged process (`--spawn-stacks`).
    pub fn name_spawn_sites(&mut self, sites: SpawnSites) {
        self.sites = Some(sites);
    }

    /// Locates a fork's native stack (see [`SpawnSites::locate`]), once per spawner.
    fn locate_spawn_site(&mut self, stack: u64, spawner: NodeId) {
        let key = (stack, spawner);
        // A spawner forking the same way again: nothing to read, no lineage walk.
        if self.sites.as_ref().is_none_or(|s| s.knows(key)) {
            return;
        }
        let holders = self.code_holders(spawner);
        if let Some(sites) = self.sites.as_mut() {
            sites.locate(key, &holders);
        }
    }

    /// The live processes that run `spawner`'s code: itself, then each spawner up the lineage
    /// that it shares its code with (none of them exec'd since its fork).
    fn code_holders(&self, spawner: NodeId) -> Vec<u32> {
        let mut holders = Vec::new();
        let mut node = self.graph.node(spawner);
        while let Some(n) = node {
            if n.alive() {
                holders.push(n.pid);
            }
            if n.execs > 0 || n.seeded {
                break;
            }
            node = n.spawner.and_then(|s| self.graph.node(s));
        }
        holders
    }

    /// Looks at the program process `pid` runs (new, or just exec'd): a Python interpreter's
    /// layout goes to the kernel, a Node host is marked for copies of its stacks, and the
    /// interpreter's name (`python3.12`, `node`) goes to the exec event. `program`: the
    /// interpreter the program file is (see `reaper_common::interpreter`).
    fn look_for_interpreter(
        &mut self,
        pid: u32,
        start: u64,
        program: Option<Interpreter>,
    ) -> Option<String> {
        let sites = self.sites.as_mut()?;
        let node = self.graph.current(pid)?.id;
        match sites.exec(node, pid, start, program) {
            Ok(found) => found,
            Err(why) => {
                self.out.note(&why);
                None
            }
        }
    }

    /// A fork's stacks: the native one located in its spawner's mappings (a JIT host's
    /// copy unwound there), each noted as having spawned the child (a stack is kept while a
    /// process it spawned is); and interpreters not mapped at their exec looked at again, for
    /// the spawner's next forks.
    fn note_spawn_stacks(
        &mut self,
        spawner: u32,
        child: u32,
        stack: SpawnStack,
        copy: Option<&CopiedStack>,
    ) {
        let spawner = self.graph.current(spawner).map(|n| (n.id, n.pid));
        if let (Some(native), Some((node, _))) = (stack.native, spawner) {
            self.locate_spawn_site(native, node);
            // A native site's stack copied at its first fork: unwound too, as deep as it goes.
            if let Some(copy) = copy {
                let holders = self.code_holders(node);
                if let Some(sites) = self.sites.as_mut() {
                    sites.unwind_site((native, node), &holders, copy);
                }
            }
        }
        let (Some(sites), Some(child)) = (self.sites.as_mut(), self.graph.current(child)) else {
            return;
        };
        // A JIT host's stack, copied at each fork.
        if let (Some(copy), Some(host), None) = (copy, spawner, stack.native) {
            sites.unwind(copy, host.0, host.1, child.id);
        }
        if let Some(native) = stack.native {
            sites.spawned(native, child.id);
        }
        if let (Some(key), Some(python), Some(spawner)) =
            (stack.python, sites.python.as_mut(), spawner)
        {
            python.spawned(key, child.id);
            python.name_at_fork(key, spawner);
        }
        self.look_again_for_interpreters();
    }

    /// The frames that spawned process `pid`, when its fork's stacks were taken: its
    /// spawner's Python frames (named at the fork), then its native ones; and whether they were
    /// cut. `named` holds what this round named already, by spawner and stacks: the instances
    /// of one site share one list (a scan can flag thousands of them).
    fn spawned_at(&mut self, pid: u32, named: &mut NamedThisRound) -> (Arc<[Frame]>, bool) {
        let Some(node) = self.graph.current(pid) else {
            return Default::default();
        };
        let Some(spawner) = node.spawner.and_then(|s| self.graph.node(s)) else {
            return Default::default();
        };
        let holders = self.code_holders(spawner.id);
        let Some(sites) = self.sites.as_mut() else {
            return Default::default();
        };
        // A JIT host's stack is copied and unwound for each fork: its own.
        if let Some(frames) = sites.unwound_frames(node.id, spawner.pid, spawner.alive()) {
            return (frames.into(), false);
        }
        let stack = node.spawn_stack;
        let key = (spawner.id, stack.python, stack.native);
        if let Some(known) = named.get(&key) {
            return known.clone();
        }
        let mut frames = Vec::new();
        if let (Some(key), Some(python)) = (stack.python, sites.python.as_mut()) {
            frames = python.frames(key, spawner.id, spawner.pid, spawner.alive());
        }
        let mut native = match stack.native {
            Some(native) => sites.frames((native, spawner.id), &holders),
            None => Named::default(),
        };
        frames.append(&mut native.frames);
        let found = (Arc::from(frames), native.truncated);
        named.insert(key, found.clone());
        found
    }

    /// The one writer, for what only it does (the status line, the closing tree, flushes).
    pub fn output(&mut self) -> &mut Output {
        &mut self.out
    }

    /// Writes the events a step returned (a gateway found, the upkeep's findings, the ready
    /// event, the command's end).
    pub fn write(&mut self, found: impl IntoIterator<Item = Stamped>) -> Result<()> {
        for s in found {
            self.out.event(s.ts, &s.event)?;
        }
        Ok(())
    }

    /// Handles one ring-buffer record.
    pub fn record(&mut self, bytes: &[u8]) -> Result<()> {
        let Some(ev) = self.reader.take(bytes) else {
            return Ok(());
        };
        let applied = self.graph.apply(&ev);
        let mut interpreter = None;
        match ev.what {
            What::Fork {
                spawner,
                stack,
                ref copy,
                ..
            } => self.note_spawn_stacks(spawner, ev.pid, stack, copy.as_deref()),
            What::Exec {
                interpreter: program,
                ..
            } => interpreter = self.look_for_interpreter(ev.pid, ev.start, program),
            _ => {}
        }
        let Some(node) = self.upkeep.on_record(&mut self.graph, &ev, applied) else {
            return Ok(());
        };
        let gateway = self.gateways.on_record(&mut self.graph, &ev, node);
        if gateway.is_some() {
            self.learn_gateway_code(ev.pid);
        }
        if let Some(mut event) = Event::from_kernel(&ev) {
            if let Event::Exec(exec) = &mut event {
                exec.interpreter = interpreter;
            }
            self.out.event(ev.ts, &event)?;
        }
        if matches!(ev.what, What::Exit { .. }) {
            self.last_exit = ev.ts;
            let cleared = self.inspector.exited(node);
            let found = cleared
                .iter()
                .filter_map(|c| flags::change_event(&self.graph, c, ev.ts));
            for event in found {
                self.out.event(ev.ts, &event)?;
            }
        }
        self.write(gateway)
    }

    /// Records that did not decode (see [`Reader::undecodable`]).
    pub fn undecodable(&self) -> u64 {
        self.reader.undecodable()
    }

    /// Ends a batch of records (see [`Reader::end_batch`]); interpreters whose library was
    /// not mapped at their exec are looked at again.
    pub fn end_batch(&mut self) {
        self.reader.end_batch();
        self.look_again_for_interpreters();
    }

    /// Interpreters whose library was not mapped at their exec, looked at again.
    pub fn look_again_for_interpreters(&mut self) {
        let Some(python) = self.sites.as_mut().and_then(|s| s.python.as_mut()) else {
            return;
        };
        if python.has_pending() {
            for note in python.look_again() {
                self.out.note(&note);
            }
        }
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
                // Its start is known to the clock tick only: 0 tells the probe to take the
                // entry for whatever process has the pid (its free removes it).
                let program = self.sites.as_ref().and_then(|_| sites::program_of(pid));
                self.look_for_interpreter(pid, 0, program);
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

    /// Learns the objects gateway `pid` runs, so the code of its spawns is named after it
    /// (and every process sharing its code) is gone.
    fn learn_gateway_code(&mut self, pid: u32) {
        if let Some(sites) = self.sites.as_mut() {
            sites.gateway_found(pid);
        }
    }

    /// `pid` becomes a gateway when its fork event arrives; `argv` is its command line.
    pub fn expect_gateway(&mut self, pid: u32, argv: Args) {
        self.gateways.expect(pid, argv);
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

    /// Interpreters wait to be looked at again (their libpython not mapped at their exec).
    pub fn has_pending_interpreters(&self) -> bool {
        self.sites
            .as_ref()
            .and_then(|s| s.python.as_ref())
            .is_some_and(|p| p.has_pending())
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

    /// One round of the leak rules: writes the flags that started or stopped holding, and
    /// sets the gauges from what the scan saw.
    pub fn scan_leaks(&mut self) -> Result<()> {
        let began = Instant::now();
        let now = boottime_now();
        let mut found: Vec<Event> = self
            .inspector
            .scan(&self.graph, now)
            .iter()
            .filter_map(|change| flags::change_event(&self.graph, change, now))
            .collect();
        let mut named = NamedThisRound::default();
        for event in &mut found {
            if let Event::Flag(flag) = event {
                (flag.detail.spawned_at, flag.detail.spawned_at_truncated) =
                    self.spawned_at(flag.pid, &mut named);
            }
        }
        let mut symbolized = false;
        if let Some(sites) = self.sites.as_mut() {
            symbolized = sites.named_all();
            sites.retain(|id| self.graph.node(id).is_some());
        }
        self.out.events(now, &found)?;
        let flagged = flags::flagged_now(&self.graph, &self.inspector, &mut self.flagged_rss);
        self.out.metrics.set_state(&ScanState {
            alive: self.graph.live_count(),
            gateways: self.graph.gateways().filter(|n| n.alive()).count(),
            zombies: self.graph.zombie_count(),
            graph_nodes: self.graph.len(),
            flagged: flagged.active,
            flagged_rss_kib: flagged.rss_kib,
            kinds: self.inspector.take_census(),
            took: began.elapsed(),
        });
        // Naming read objects' symbols and line tables, megabytes freed at once: their pages
        // go back (see `resident`; the round's other blocks are small, or mapped apart).
        if symbolized {
            crate::resident::give_back_freed();
        }
        Ok(())
    }

    /// When the rules next need a look sooner than the scan interval (an orphan grace ends),
    /// boot-time ns.
    pub fn next_look(&self) -> Option<u64> {
        self.inspector.next_look()
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
            if let Some(ev) = raised.and_then(|c| flags::change_event(&self.graph, &c, now)) {
                self.out.event(now, &ev)?;
            }
        }
        Ok(())
    }

    /// Writes one step of a kill sequence.
    pub fn report_kill(&mut self, r: KillReport) -> Result<()> {
        if let Some(k) = self.killer.as_mut() {
            k.note(&self.graph, &r);
        }
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
            let mut named = NamedThisRound::default();
            for leaked in &mut check.leaked {
                (leaked.detail.spawned_at, leaked.detail.spawned_at_truncated) =
                    self.spawned_at(leaked.pid, &mut named);
            }
        }
        if let Some(sites) = self.sites.as_mut() {
            sites.named_all();
        }
        self.out.event(boottime_now(), &verdict)?;
        Ok((verdict, code))
    }

    /// Writes the closing summary, then the tree of what is left alive for people.
    pub fn close(&mut self, account: Accounting, gateway_exit_code: Option<i32>) -> Result<()> {
        let figures = RunFigures {
            counts: self.out.counts.clone(),
            delivery: self.reader.delivery(account),
            latency: self.reader.latency(),
            kills: self
                .killer
                .as_ref()
                .map(|k| k.counts().clone())
                .unwrap_or_default(),
            started: self.started,
            gateway_exit_code,
        };
        let closing = Closing {
            graph: &self.graph,
            inspector: &mut self.inspector,
        };
        let summary = closing.summary(figures);
        self.out.event(boottime_now(), &summary)?;
        self.out.end_status();
        let active = flags::active_by_node(&self.inspector);
        let tree = crate::output::tree::render_alive_tree(&self.graph, &active);
        self.out.human_block(&tree)?;
        self.out.flush()?;
        Ok(())
    }
}
