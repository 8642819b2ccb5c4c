//! Killing: of flagged processes (`--kill`), and of the processes a client asks for through
//! the API (`reaper-trace kill`, [`Killer::asked`]), built so that it can never hit the wrong
//! process.
//!
//! Every signal goes through a pidfd (`pidfd_send_signal`): a pidfd names one process, not a
//! pid number, so a recycled pid cannot receive it. The pidfd is opened first and the process
//! behind it checked second (its start time against the lineage graph's): if they match then,
//! the pidfd is that process for good. Nothing is ever sent to a process group (a stored pgid
//! may have been recycled onto an unrelated session), to the gateway, pid 1, reaper-trace or
//! its ancestors, or to a process outside the gateway's lineage.
//!
//! A sequence (SIGCONT if stopped, SIGTERM, wait, SIGKILL, confirm) runs as its own task, so
//! waiting never stalls the event loop; each step is reported back over a channel.
use std::{collections::BTreeMap, time::Duration};

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use tokio::sync::mpsc;

mod asked;
mod respawns;
mod sequence;

use respawns::{Judged, Respawns};
use sequence::{Target, run_sequence, verify};

use crate::leaks::Reason;
use crate::lineage::graph::{LineageGraph, Node, NodeId};
use crate::procfs::{self, boottime_now};
use crate::stream::Stamped;
use crate::stream::events::{AskedBy, Event, Kill, ProcText};
use crate::text::Comm;

/// `--kill` settings.
#[derive(Clone, Debug)]
pub struct KillOptions {
    /// `--kill`: flags lead to kills (without it, only the kills asked for through the API).
    pub auto: bool,
    /// Flags that lead to a kill.
    pub reasons: Vec<Reason>,
    /// How long a flag must hold before the first signal.
    pub grace: Duration,
    /// SIGTERM to SIGKILL.
    pub term_timeout: Duration,
    /// Decide and report, send nothing.
    pub dry_run: bool,
}

/// What a step did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Outcome {
    Sent,
    Exited,
    IdentityChanged,
    NotInLineage,
    PermissionDenied,
    DryRun,
    /// Its facts came from /proc after a loss (its lineage edge is a guess): never killed.
    Uncertain,
}

impl Outcome {
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Sent => "sent",
            Outcome::Exited => "exited",
            Outcome::IdentityChanged => "identity_changed",
            Outcome::NotInLineage => "not_in_lineage",
            Outcome::PermissionDenied => "permission_denied",
            Outcome::DryRun => "dry_run",
            Outcome::Uncertain => "uncertain",
        }
    }
}

/// One step of a kill sequence, for the stream.
#[derive(Clone, Debug)]
pub struct KillReport {
    pub node: NodeId,
    pub pid: u32,
    pub comm: Comm,
    /// The flag it is killed for (none: asked for, holding none).
    pub reason: Option<Reason>,
    /// Who asked for it through the API; none for `--kill`'s own.
    pub asked_by: Option<AskedBy>,
    pub signal: &'static str,
    pub result: Outcome,
    /// At the end of a sequence: seconds from the first signal to the exit.
    pub secs: Option<f64>,
    /// Boot-time ns of the step: when the signal was sent, the exit seen, or the refusal
    /// decided (the event's `ts`, whenever the stream gets to write it).
    pub at: u64,
}

impl KillReport {
    /// The step as the stream's `kill` event.
    pub fn event(&self) -> Stamped {
        let ev = Event::Kill(Kill {
            pid: self.pid,
            comm: ProcText::new("comm", self.comm),
            reason: self.reason,
            signal: self.signal.into(),
            result: self.result.name().into(),
            secs: self.secs,
            asked_by: self.asked_by,
        });
        Stamped::new(self.at, ev)
    }
}

/// Why a sequence runs: the flag it is for, and who asked for it.
#[derive(Clone, Copy, Debug)]
struct Cause {
    reason: Option<Reason>,
    asked_by: Option<AskedBy>,
}

impl Cause {
    /// A step for `n` that sends no signal (a refusal, a dry run): `result`, decided now.
    fn report(self, n: &Node, result: Outcome) -> KillReport {
        KillReport {
            node: n.id,
            pid: n.pid,
            comm: n.comm,
            reason: self.reason,
            asked_by: self.asked_by,
            signal: "SIGTERM",
            result,
            secs: None,
            at: boottime_now(),
        }
    }
}

/// What one round of decisions produced.
#[derive(Default)]
pub struct Decisions {
    /// Reports that need no signal: refusals and dry runs.
    pub reports: Vec<KillReport>,
    /// Spawners just found respawning what was killed.
    pub respawning: Vec<NodeId>,
}

/// Decides which flagged processes to kill and starts their sequences.
pub struct Killer {
    opts: KillOptions,
    /// Nodes already decided on: `--kill` decides on a node once (a kill asked for through
    /// the API may be asked again).
    decided: HashSet<NodeId>,
    /// When each active flag was first offered (boot-time ns): the grace counts from there
    /// at the earliest, since a flag is offered only once the stream has it. A round's flag
    /// is written a moment after its look (its peers are read first), and `since` is the
    /// look's time or the condition's start; only the flags still active are kept.
    offered: HashMap<(NodeId, Reason), u64>,
    /// Kills that ended in an exit, and the spawners found respawning.
    respawns: Respawns,
    /// Never signalled: pid 1, reaper-trace and its ancestors.
    protected: HashSet<u32>,
    reports: mpsc::UnboundedSender<KillReport>,
    /// Steps taken so far, by reason and result.
    counts: BTreeMap<&'static str, BTreeMap<&'static str, u64>>,
}

impl Killer {
    /// The killer, and where its sequences report their steps.
    pub fn new(opts: KillOptions) -> (Killer, mpsc::UnboundedReceiver<KillReport>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let killer = Killer {
            opts,
            decided: HashSet::default(),
            offered: HashMap::default(),
            respawns: Respawns::default(),
            protected: self_and_ancestors(),
            reports: tx,
            counts: BTreeMap::new(),
        };
        (killer, rx)
    }

    /// Whether flags lead to kills (`--kill`).
    pub fn auto(&self) -> bool {
        self.opts.auto
    }

    /// Whether the run sends nothing (`--dry-run`).
    pub fn dry_run(&self) -> bool {
        self.opts.dry_run
    }

    /// Steps taken so far, by reason and result.
    pub fn counts(&self) -> &BTreeMap<&'static str, BTreeMap<&'static str, u64>> {
        &self.counts
    }

    /// Notes a step reported for the stream: counts it, and with `--kill` remembers a kill
    /// that ended in an exit (to recognise a respawn).
    pub fn note(&mut self, graph: &LineageGraph, r: &KillReport) {
        *self
            .counts
            .entry(r.reason.map_or("asked", Reason::name))
            .or_default()
            .entry(r.result.name())
            .or_default() += 1;
        // A sequence's exit has its duration; one found before any signal was no kill. Only
        // `--kill` judges respawns (see `decide`), and only it lets go of the kills kept.
        if self.opts.auto
            && r.result == Outcome::Exited
            && r.secs.is_some()
            && let Some(node) = graph.node(r.node)
        {
            // From the first signal (the exit's time less the sequence's): a respawn may be
            // forked before this report is read.
            let took = (r.secs.unwrap_or(0.0) * 1e9) as u64;
            let at = r.at.saturating_sub(took);
            self.respawns.killed(node, at);
        }
    }

    /// Looks at the active flags (node, reason, since) at boot-time `now`, each already
    /// written, and starts a sequence for each one that has held for the grace time since it
    /// was first offered here (or since `since`, if later).
    pub fn decide(
        &mut self,
        graph: &LineageGraph,
        active: &[(NodeId, Reason, u64)],
        now: u64,
    ) -> Decisions {
        let mut out = Decisions::default();
        if !self.opts.auto {
            return out;
        }
        let grace = u64::try_from(self.opts.grace.as_nanos()).unwrap_or(u64::MAX);
        // What the graph no longer holds can be decided on (or respawn) no more: let go of it.
        self.respawns.forget_gone(graph, now);
        self.decided.retain(|&id| graph.holds(id));
        let still: HashSet<(NodeId, Reason)> = active.iter().map(|&(id, r, _)| (id, r)).collect();
        self.offered.retain(|key, _| still.contains(key));
        for &(id, reason, since) in active {
            let held_from = since.max(*self.offered.entry((id, reason)).or_insert(now));
            if !self.opts.reasons.contains(&reason)
                || now.saturating_sub(held_from) < grace
                || self.decided.contains(&id)
            {
                continue;
            }
            let Some(node) = graph.node(id).filter(|n| n.alive()) else {
                continue;
            };
            match self.respawns.judge(node) {
                Judged::LeftAlone => continue,
                Judged::Respawn(spawner) => {
                    out.respawning.push(spawner);
                    continue;
                }
                Judged::NotARespawn => {}
            }
            let cause = Cause {
                reason: Some(reason),
                asked_by: None,
            };
            let dry_run = self.opts.dry_run;
            let started = self.start(graph, node, cause, Decide::Once { dry_run });
            out.reports.extend(started.refused);
        }
        out
    }

    /// Verifies the process and its live descendants (leaves first) and starts the sequence;
    /// returns what was refused (or not sent, a dry run) and what is signalled.
    fn start(&mut self, graph: &LineageGraph, node: &Node, cause: Cause, how: Decide) -> Started {
        let mut order = Vec::new();
        leaves_first(graph, node, &mut order);
        let mut started = Started::default();
        let mut targets = Vec::new();
        let dry_run = match how {
            Decide::Once { dry_run } | Decide::Asked { dry_run } => dry_run,
        };
        for n in order {
            let fresh = match how {
                // `--kill` decides on a process once, a dry run's included (each round would
                // report it again).
                Decide::Once { .. } => self.decided.insert(n.id),
                // Asked for: each time, a dry run leaving no trace (the kill it previews
                // must still reach every process).
                Decide::Asked { dry_run } => {
                    if !dry_run {
                        self.decided.insert(n.id);
                    }
                    true
                }
            };
            if !fresh {
                continue;
            }
            let refuse = |result| cause.report(n, result);
            if let Some(outcome) = refusal(graph, n, &self.protected) {
                started.refused.push(refuse(outcome));
                continue;
            }
            match verify(n) {
                Ok(_) if dry_run => started.refused.push(refuse(Outcome::DryRun)),
                Ok((pidfd, stopped)) => {
                    started.signalled.push((n.pid, n.comm));
                    targets.push(Target {
                        node: n.id,
                        pid: n.pid,
                        comm: n.comm,
                        pidfd,
                        stopped,
                    })
                }
                Err(result) => started.refused.push(refuse(result)),
            }
        }
        if !targets.is_empty() {
            let tx = self.reports.clone();
            let term = self.opts.term_timeout;
            tokio::spawn(async move {
                for t in targets {
                    run_sequence(t, cause, term, &tx).await;
                }
            });
        }
        started
    }
}

/// How a kill is decided on.
#[derive(Clone, Copy)]
enum Decide {
    /// `--kill`'s, once a process.
    Once { dry_run: bool },
    /// One asked for through the API.
    Asked { dry_run: bool },
}

/// What a kill decided at once.
#[derive(Default)]
pub struct Started {
    /// Reports that need no signal: refusals and dry runs.
    pub refused: Vec<KillReport>,
    /// The processes whose sequence started (pid, name), leaves first.
    pub signalled: Vec<(u32, Comm)>,
}

/// Why `n` is never signalled, whatever it is flagged for: a gateway, one of `protected`, a
/// process outside a gateway's lineage (`NotInLineage`), or one whose lineage was guessed
/// after a loss (`Uncertain`). `None`: a kill may follow its flag.
pub fn refusal(graph: &LineageGraph, n: &Node, protected: &HashSet<u32>) -> Option<Outcome> {
    let chain = graph.chain(n.id);
    let in_lineage = chain
        .first()
        .is_some_and(|root| root.is_gateway && root.id != n.id);
    if n.is_gateway || protected.contains(&n.pid) || !in_lineage {
        return Some(Outcome::NotInLineage);
    }
    chain
        .iter()
        .any(|a| a.uncertain)
        .then_some(Outcome::Uncertain)
}

/// Whether `--kill` could act on `n` holding `flags` (the reasons a kill may follow:
/// `reasons`), and why (or why not), for `reaper-trace why`.
pub fn could_kill(
    graph: &LineageGraph,
    n: &Node,
    flags: &[Reason],
    reasons: &[Reason],
) -> (bool, String) {
    if !n.alive() {
        return (false, "it is not alive".into());
    }
    match refusal(graph, n, &self_and_ancestors()) {
        Some(Outcome::Uncertain) => {
            return (
                false,
                "its lineage was repaired from /proc after a loss (uncertain): never killed".into(),
            );
        }
        Some(_) => {
            let why = "a gateway, reaper-trace, an ancestor of it, pid 1 or outside a gateway's \
                       lineage: never killed";
            return (false, why.into());
        }
        None => {}
    }
    match flags.iter().find(|r| reasons.contains(r)) {
        Some(reason) => (
            true,
            format!(
                "its `{reason}` flag, once held for --grace: SIGTERM, then SIGKILL, its \
                 descendants first, each through a pidfd after its identity is checked"
            ),
        ),
        None if flags.is_empty() => (false, "it holds no flag".into()),
        None => (
            false,
            "none of its flags is one --kill-reasons names".into(),
        ),
    }
}

/// The live descendants of `node` along spawner edges, deepest first, then `node`; a
/// gateway spawned below it (a selector's later instance) is the root of its own lineage, not
/// a descendant to end with it.
fn leaves_first<'a>(graph: &'a LineageGraph, node: &'a Node, out: &mut Vec<&'a Node>) {
    for kid in graph.spawned_by(node.id) {
        if !kid.is_gateway {
            leaves_first(graph, kid, out);
        }
    }
    if node.alive() {
        out.push(node);
    }
}

/// reaper-trace, its ancestors, and pid 1.
fn self_and_ancestors() -> HashSet<u32> {
    let mut set: HashSet<u32> = [1, std::process::id()].into_iter().collect();
    let mut at = std::process::id();
    while let Ok(stat) = procfs::read_stat(at) {
        if stat.ppid == 0 || !set.insert(stat.ppid) {
            break;
        }
        at = stat.ppid;
    }
    set
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--kill` of `orphaned` flags held for `grace`.
    fn orphans_killed(grace: Duration, dry_run: bool) -> KillOptions {
        KillOptions {
            auto: true,
            reasons: vec![Reason::Orphaned],
            grace,
            term_timeout: Duration::from_secs(5),
            dry_run,
        }
    }

    #[test]
    fn never_signals_itself_its_ancestors_or_init() {
        let p = self_and_ancestors();
        assert!(p.contains(&1) && p.contains(&std::process::id()));
        // SAFETY: plain syscall.
        let parent = unsafe { libc::getppid() } as u32;
        assert!(p.contains(&parent));
    }

    #[test]
    fn a_flagged_descendant_that_is_reaper_trace_itself_is_refused_not_signalled() {
        use crate::lineage::graph::Seed;
        use crate::text::{Args, Comm};
        let seed = |pid, ppid, is_gateway| Seed {
            pid,
            start_ticks: 1,
            ppid,
            sid: pid,
            pgid: pid,
            comm: Comm::from_c(b"x"),
            argv: Args::from_list(["x"]),
            is_gateway,
            uncertain: false,
        };
        // A lineage in which this very process is a flagged descendant (as reaper-trace can be
        // when a gateway starts it): protected, so refused before any pidfd is opened.
        let me = std::process::id();
        let mut graph = LineageGraph::new(16);
        graph.add_seed(seed(4_000_000, 1, true));
        let (flagged, _) = graph.add_seed(seed(me, 4_000_000, false));
        let (mut killer, _reports) = Killer::new(orphans_killed(Duration::ZERO, false));
        let decided = killer.decide(&graph, &[(flagged, Reason::Orphaned, 0)], u64::MAX / 2);
        let outcomes: Vec<(u32, &str)> = decided
            .reports
            .iter()
            .map(|r| (r.pid, r.result.name()))
            .collect();
        assert_eq!(outcomes, [(me, "not_in_lineage")]);
        assert!(decided.respawning.is_empty());
    }

    #[test]
    fn the_grace_counts_from_when_a_flag_is_first_offered_not_from_its_look() {
        use crate::lineage::graph::testing::{fork, gateway, record};
        const SEC: u64 = 1_000_000_000;
        // Pids above pid_max (32768 here): none is reaper-trace or one of its ancestors.
        let (gw, helper) = (40_000, 40_001);
        let mut graph = LineageGraph::new(16);
        graph.add_seed(gateway(gw));
        record(&mut graph, 1, (helper, 1), fork(gw));
        let node = graph.current(helper).unwrap().id;
        let (mut killer, _reports) = Killer::new(orphans_killed(Duration::from_secs(1), true));
        // Looked at (and `since`) at 10 s, written and offered at 10.5 s.
        let flag = [(node, Reason::Orphaned, 10 * SEC)];
        let decided = |killer: &mut Killer, now| killer.decide(&graph, &flag, now).reports.len();
        assert_eq!(decided(&mut killer, 10 * SEC + SEC / 2), 0);
        assert_eq!(
            decided(&mut killer, 11 * SEC + SEC / 4),
            0,
            "a second after the look"
        );
        assert_eq!(
            decided(&mut killer, 11 * SEC + SEC / 2),
            1,
            "a second after the offer"
        );
        // A flag no longer active is forgotten: raised again, its grace starts again.
        killer.decide(&graph, &[], 12 * SEC);
        assert!(killer.offered.is_empty());
    }

    #[test]
    fn a_respawn_is_known_by_its_forks_time_however_late_its_flag_holds() {
        const SEC: u64 = 1_000_000_000;
        // Pids above pid_max (32768 here): none is reaper-trace or one of its ancestors.
        let (supervisor, soon, late) = (40_001, 40_002, 40_003);
        let graph =
            crate::lineage::graph::testing::supervised(&[(soon, 12 * SEC), (late, 80 * SEC)]);
        let id = |pid| graph.current(pid).unwrap().id;
        let (mut killer, _reports) = Killer::new(orphans_killed(Duration::from_secs(120), true));
        // Its worker of the same argv was killed at 10 s.
        let worker = graph.node(id(soon)).unwrap();
        killer.respawns.killed(worker, 10 * SEC);
        // The later one first: once a spawner is found respawning, none of its children is
        // decided on.
        let flags = [
            (id(late), Reason::Orphaned, 100 * SEC),
            (id(soon), Reason::Orphaned, 100 * SEC),
        ];
        killer.decide(&graph, &flags, 100 * SEC);
        // Held for the grace long after the window: the one forked 2 s after the kill is a
        // respawn, the one forked 70 s after it a sibling that leaked later.
        let decided = killer.decide(&graph, &flags, 230 * SEC);
        assert_eq!(decided.respawning, [id(supervisor)]);
        let pids: Vec<u32> = decided.reports.iter().map(|r| r.pid).collect();
        assert!(!pids.contains(&soon), "{pids:?}");
        assert!(pids.contains(&late), "{pids:?}");
    }

    #[test]
    fn why_says_whether_a_kill_would_follow_a_flag_and_why_not() {
        use crate::lineage::graph::testing::{fork, gateway, record};
        // Pids above pid_max (32768 here): none is reaper-trace or one of its ancestors.
        let (gw, helper) = (40_000, 40_001);
        let mut graph = LineageGraph::new(16);
        let (gw_node, _) = graph.add_seed(gateway(gw));
        record(&mut graph, 1, (helper, 1), fork(gw));
        let node = graph.current(helper).unwrap();
        let reasons = [Reason::Orphaned, Reason::Deaf];
        let (could, why) = could_kill(&graph, node, &[Reason::Orphaned], &reasons);
        assert!(could && why.contains("`orphaned`"), "{why}");
        let (could, why) = could_kill(&graph, node, &[Reason::Idle], &reasons);
        assert!(!could && why.contains("--kill-reasons"), "{why}");
        let (could, why) = could_kill(&graph, node, &[], &reasons);
        assert!(!could && why.contains("no flag"), "{why}");
        let gateway = graph.node(gw_node).unwrap();
        let (could, why) = could_kill(&graph, gateway, &[Reason::Orphaned], &reasons);
        assert!(!could && why.contains("never killed"), "{why}");
    }
}
