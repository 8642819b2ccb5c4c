//! The leak inspector: when to look at which descendant (what a look reads from /proc is read
//! wherever its owner runs it), and the flags held ([`super::held`]) as the rules
//! ([`super::rules`], each with its own state) answer.
//!
//! Cost model (it runs for days): a live descendant is sampled when it is first seen and then
//! every `max(scan interval, idle-after / 4)`; a sample is a few small /proc reads. Only what
//! must react at once is sampled every scan: a process whose spawn chain just broke (the
//! `orphaned` check), one flagged `idle` or `deaf` (to clear the flag when it moves data or
//! gets a writer), one that exec'd since its last look (the program it runs now, read once
//! per exec for the `accumulating` count's kinds), and a spawner the killer found
//! respawning (its flag's evidence). Zombies
//! come from the lineage graph alone. Pipe peers (who holds the
//! other end) are looked up only as evidence for a new flag.
//!
//! Whether the other end of a pipe or socket is still open is asked of the fd itself: the
//! inspector duplicates it through a pidfd (`pidfd_getfd`) and polls the duplicate with a zero
//! timeout, which reads nothing and tells EOF-pending (no writers left) exactly, with no scan of
//! the machine. A UNIX socket's peer is asked of the kernel once per socket (sock_diag).
//!
//! The rules judge a **server**, not a process: a process and the live spawner it shares a
//! channel end with are one server ([`super::channels`]), looked at together, judged on what
//! all of them do (a wrapper moves no data while the server under it answers requests) and
//! flagged once, on the outermost process. A process's internal channels count for nothing.
use std::sync::Arc;
use std::time::Duration;

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use super::channels::{self, Holders};
use super::findings::{Change, Crowd, Evidence, Reason};
use super::held::HeldFlags;
use super::peers::PeerIndex;
use super::rules::accumulating::{Crowds, Watched};
use super::rules::orphaned::Breaks;
use super::rules::respawning::Respawners;
use super::rules::zombie;
use super::sampler::{Sample, Sampler};
use crate::identity::ProcessId;

use crate::lineage::graph::{LineageGraph, Node, NodeId};

/// The inspector's settings.
#[derive(Clone, Copy, Debug)]
pub struct InspectOptions {
    pub scan_interval: Duration,
    pub idle_after: Duration,
    pub zombie_after: Duration,
    /// `--orphan-grace`: how long after its spawn chain broke a process must still hold a
    /// channel to be flagged `orphaned` (a server that exits on EOF takes milliseconds).
    pub orphan_grace: Duration,
    /// `--max-instances`: how many instances of one kind may live under one gateway instance
    /// before the older ones are flagged `accumulating`.
    pub max_instances: usize,
}

impl InspectOptions {
    fn sample_every(&self) -> u64 {
        nanos(self.scan_interval.max(self.idle_after / 4))
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// What the inspector remembers of one live descendant.
#[derive(Default)]
struct Watch {
    pid: u32,
    next_sample: u64,
    io: Option<[u64; 4]>,
    /// When the I/O counters last changed (or were first read).
    io_since: u64,
    /// Since when a pipe read end has had no writers.
    eof_since: Option<u64>,
    /// The last sample: shared with the next look (its `before`), not copied for it (10,000
    /// samples copied took 1.6 ms of a round's planning on the reader's thread).
    last: Option<Arc<Sample>>,
}

/// The watches and the flags as the `accumulating` count asks about them.
struct Looked<'a>(&'a HashMap<NodeId, Box<Watch>>, &'a HeldFlags);

impl Watched for Looked<'_> {
    fn looked_at(&self, id: NodeId) -> Option<bool> {
        self.0.get(&id).map(|w| w.last.is_some())
    }
    fn flagged(&self, id: NodeId) -> bool {
        self.1.holds(id, Reason::Accumulating)
    }
}

/// Runs the rules over the graph's live descendants and zombies.
pub struct Inspector {
    opts: InspectOptions,
    /// Boxed: a table of 10,000 watches is mostly slack at its load factor, and a slack
    /// bucket then costs a pointer, not a whole watch (two of the 25 MiB at 10,000 tracked).
    watches: HashMap<NodeId, Box<Watch>>,
    /// The flags held: a live rule's on a server's outermost process (which is watched), a
    /// zombie's on the zombie (which is not).
    held: HeldFlags,
    peers: PeerIndex,
    /// Who holds each channel end, from the last samples.
    holders: Holders,
    sampler: Sampler,
    /// Flags raised so far, by reason.
    raised: [u64; Reason::ALL.len()],
    /// `orphaned`'s breaks waited on.
    breaks: Breaks,
    /// `accumulating`'s count across looks.
    crowds: Crowds,
    /// `respawning`'s spawners, found by the killer, for the next round.
    respawners: Respawners,
    /// The servers of more than one process as the last round that judged them found them,
    /// each outermost process first. What shares a channel changes with a look, or as the
    /// graph changes (an exit splits a server; a process found in /proc at the start may be
    /// given its spawner later, and is judged with it from the round after): the next round
    /// extends its looks to whole servers by these instead of finding them again.
    wider_servers: Vec<Vec<NodeId>>,
}

/// One round of the rules, taken in steps so that its /proc reads can be made away from the
/// graph: [`Inspector::plan`] (what is due, in bounded steps), the looks (each a [`Look`],
/// sampled wherever its owner runs them), [`Inspector::judge_step`] (the rules, in bounded
/// steps), then who holds the other ends of the new flags' channels
/// ([`Round::evidence_slots`], read like the looks).
pub struct Round {
    /// Boot-time ns the round judges at.
    pub now: u64,
    /// The flags that started or stopped holding.
    pub changes: Vec<Change>,
    /// The looks due, until taken.
    pub looks: Vec<Look>,
    /// What was sampled.
    sampled: HashSet<NodeId>,
}

/// One process to sample, and its last sample (a socket's peer is taken from it when the
/// socket is the same).
pub struct Look {
    pub id: NodeId,
    pub process: ProcessId,
    pub before: Option<Arc<Sample>>,
    /// `Some(n)`: the program it runs is to be read too, its kind at its `n`th exec (as the
    /// graph counts them) not known yet (a readlink per process and exec, not per count: at
    /// 10,000 instances, reading them at the count held the reader's thread 55 ms).
    pub exe_for: Option<u32>,
    /// The program it runs as /proc names it, once the look read it (see `exe_for`).
    pub exe: Option<Box<[u8]>>,
}

impl Round {
    /// Where the new flags' evidence is to be read, by index in `changes`: those whose
    /// evidence is a channel, who holds the other ends to be looked up (every live tracked
    /// process, gateways included, may hold one); and the rest, whose evidence is their kind
    /// and count (`accumulating`: a thousand instances of a kind must not send a thousand
    /// processes' fds to be read every scan they trickle in), their memory and placement to
    /// be read.
    pub fn evidence_slots(&self) -> (Vec<usize>, Vec<usize>) {
        let flagged = self
            .changes
            .iter()
            .enumerate()
            .filter_map(|(at, c)| match c {
                Change::Flag(f) if f.evidence.is_some() => Some((at, f.reason)),
                _ => None,
            });
        let (with_peers, without): (Vec<_>, Vec<_>) =
            flagged.partition(|&(_, reason)| reason != Reason::Accumulating);
        let at = |each: Vec<(usize, Reason)>| each.into_iter().map(|(at, _)| at).collect();
        (at(with_peers), at(without))
    }

    /// The evidence of the flag at index `at` of `changes`.
    pub fn evidence_at(&mut self, at: usize) -> Option<&mut Evidence> {
        match self.changes.get_mut(at)? {
            Change::Flag(f) => f.evidence.as_mut(),
            Change::Cleared { .. } => None,
        }
    }
}

/// How many watches, looks, processes or servers one step of a round's planning or judging
/// takes: a fraction of a millisecond of work here for processes of a few fds each.
const PER_STEP: usize = 1_000;

/// How often an unresolved pipe may send the peer lookup to every process in /proc.
const FULL_SCAN_EVERY: Duration = Duration::from_secs(10);

impl Inspector {
    pub fn new(opts: InspectOptions) -> Self {
        Inspector {
            opts,
            watches: HashMap::default(),
            held: HeldFlags::default(),
            peers: PeerIndex::default(),
            holders: Holders::default(),
            sampler: Sampler::default(),
            raised: [0; Reason::ALL.len()],
            breaks: Breaks::default(),
            crowds: Crowds::default(),
            respawners: Respawners::default(),
            wider_servers: Vec::new(),
        }
    }

    /// When the inspector next needs a look before its regular scan: the end of the earliest
    /// orphan grace still running (boot-time ns). A grace is a rule about time: the scan is
    /// moved to its end, so a confirmed orphan is flagged then, not a scan interval later.
    pub fn next_look(&self) -> Option<u64> {
        match (self.breaks.next_look(), self.crowds.next_look()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The kinds with the most live instances under one gateway instance, as counted since
    /// the last call (None when nothing was counted anew): at most `CENSUS_KINDS` patterns,
    /// the rest as `other`.
    pub fn take_census(&mut self) -> Option<Vec<(String, u64)>> {
        self.crowds.take_census()
    }

    /// What the operator is to be told about the scans (see [`Sampler::take_notes`]).
    pub fn take_notes(&mut self) -> Vec<String> {
        self.sampler.take_notes()
    }

    /// The flags of a process that just exited, cleared from its exit record (not at the
    /// next scan: a flag must not outlive the process's own `exit` event).
    pub fn exited(&mut self, id: NodeId) -> Vec<Change> {
        if !self.watches.contains_key(&id) {
            return Vec::new();
        }
        self.crowds.ended(id);
        let mut changes = Vec::new();
        clear_live_flags(&mut self.held, id, "exited", &mut changes);
        changes
    }

    /// Flags raised so far, by reason.
    pub fn raised(&self, reason: Reason) -> u64 {
        self.raised[reason as usize]
    }

    /// Active flags: node, reason, since.
    pub fn active(&self) -> impl Iterator<Item = (NodeId, Reason, u64)> + '_ {
        self.held.iter()
    }

    /// The flags held now.
    pub fn held(&self) -> &HeldFlags {
        &self.held
    }

    /// Process `id`'s memory as it was last looked at, KiB.
    pub fn rss_of(&self, id: NodeId) -> Option<u64> {
        self.watches.get(&id)?.last.as_ref()?.rss_kib
    }

    /// The outermost process of the server `id` is part of, as the last look saw their
    /// channels: `id` itself when it is a server by itself (or not looked at yet).
    pub fn outermost(&self, graph: &LineageGraph, id: NodeId) -> NodeId {
        let fds_of = |id: NodeId| {
            self.watches
                .get(&id)
                .and_then(|w| w.last.as_ref())
                .map(|s| &s.fds[..])
        };
        channels::outermost(graph, id, fds_of)
    }

    /// `id`'s kind and its live instances at the last count, as an `accumulating` flag would
    /// give them (the count is a round's: a `why` of one process does not count them all).
    pub fn crowd_of(&self, graph: &LineageGraph, id: NodeId) -> Option<Crowd> {
        self.crowds.crowd_of(self.outermost(graph, id))
    }

    /// One round at boot-time `now`, all its steps taken here (see [`Round`]): samples what
    /// is due, applies the rules, and returns the flags that started or stopped holding.
    #[cfg(test)]
    pub fn scan(&mut self, graph: &LineageGraph, now: u64) -> Vec<Change> {
        let mut planning = self.plan(now);
        while self.plan_step(graph, &mut planning) {}
        let mut round = planning.round();
        let sampled = std::mem::take(&mut round.looks)
            .into_iter()
            .map(|mut look| {
                let exe = look.exe_for.is_some().then_some(&mut look.exe);
                let sample = self
                    .sampler
                    .sample(look.process, look.before.as_deref(), exe);
                (look, sample)
            })
            .collect();
        self.judge_round(graph, &mut round, sampled);
        let (with_peers, without) = round.evidence_slots();
        let mut taken: Vec<Evidence> = (with_peers.iter())
            .filter_map(|&at| round.evidence_at(at).map(std::mem::take))
            .collect();
        let mut refs: Vec<&mut Evidence> = taken.iter_mut().collect();
        self.add_peers(graph, graph.alive(), &mut refs);
        for (at, e) in with_peers.into_iter().zip(taken) {
            if let Some(slot) = round.evidence_at(at) {
                *slot = e;
            }
        }
        for at in without {
            if let Some(e) = round.evidence_at(at) {
                evidence::add_process_facts(e);
            }
        }
        round.changes
    }

    /// A flag the rules raised that is not to be written: its process is no longer what it
    /// was flagged as by the time its round is written (it exited, a zombie was reaped). Held
    /// no more (its exit may have cleared it already) and not counted.
    pub fn withdraw(&mut self, id: NodeId, reason: Reason) {
        self.held.clear(id, reason);
        let raised = &mut self.raised[reason as usize];
        *raised = raised.saturating_sub(1);
    }

    /// The flags of processes that ended (exited, or were reaped) since the last scan,
    /// cleared; no rule is applied and no flag raised. The stop's last look: what a stop
    /// leaves is half torn down, not a state to judge.
    pub fn clear_ended(&mut self, graph: &LineageGraph) -> Vec<Change> {
        let mut changes = Vec::new();
        self.forget_the_dead(graph, &mut changes);
        zombie::forget_the_reaped(graph, &mut self.held, &mut changes);
        changes
    }

    /// Forgets the descendants that exited, their flags cleared.
    fn forget_the_dead(&mut self, graph: &LineageGraph, changes: &mut Vec<Change>) {
        let dead: Vec<NodeId> = (self.watches.keys())
            .filter(|id| !graph.node(**id).is_some_and(Node::alive))
            .copied()
            .collect();
        for id in dead {
            self.forget(id, changes);
        }
    }

    /// Forgets descendant `id`, which exited: its watch, its count and break, its flags
    /// (cleared), what its channels were held by.
    fn forget(&mut self, id: NodeId, changes: &mut Vec<Change>) {
        let Some(w) = self.watches.remove(&id) else {
            return;
        };
        self.crowds.ended(id);
        self.breaks.forget(id);
        clear_live_flags(&mut self.held, id, "exited", changes);
        if let Some(last) = &w.last {
            self.holders.remove(id, &last.fds);
        }
    }

    /// The killer found `spawners` respawning what it killed: the next round looks at each
    /// and flags it.
    pub fn respawning(&mut self, spawners: impl IntoIterator<Item = NodeId>) {
        self.respawners.found(spawners);
    }
}

/// Clears the flags of the live rules process `id` holds (a zombie's stays until it is
/// reaped), each a `cleared` saying `because`.
fn clear_live_flags(
    held: &mut HeldFlags,
    id: NodeId,
    because: &'static str,
    changes: &mut Vec<Change>,
) {
    let reasons: Vec<Reason> = (held.of(id).iter())
        .map(|h| h.reason)
        .filter(|&r| r != Reason::Zombie)
        .collect();
    for reason in reasons {
        if let Some(pid) = held.clear(id, reason) {
            changes.push(Change::Cleared {
                pid,
                reason,
                because,
            });
        }
    }
}

mod evidence;
pub use evidence::{Lookout, Near};
mod judging;
pub use judging::Judging;
mod looks;
mod planning;
pub use planning::Planning;

#[cfg(test)]
mod tests;
