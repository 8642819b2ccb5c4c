//! A round of the leak rules in steps (see [`crate::leaks::Round`]), each reading only what
//! the run holds: the looks and the new flags' evidence are read from /proc between them,
//! wherever the caller has them read (`daemon/rounds.rs`: a thread of the slow side).
//!
//! A round is judged in steps (`Pipeline::judging`), the reader's own work run between them
//! (an exit record meanwhile withdraws the flags of its process the steps raised, as below).
//! A judged round waits here (`Pipeline::judged`) for its evidence, then for its new flags'
//! spawn sites to be named (both read on the slow side), then for the event loop to write it
//! right after a drain of the ring (`Pipeline::commit_round`), so what it writes
//! is judged against the graph as the kernel left it: a flag whose process exited (or, a
//! zombie's, was reaped) meanwhile is withdrawn, never written; a `cleared` of a process
//! whose exit record came meanwhile is written there, after its `exit` as the flags its exit
//! clears are (one the upkeep found exited from /proc gets it at the commit, after).
//! The rules judged it before: only what is written is held to the graph as it is now.
use std::time::Instant;

use anyhow::Result;
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use super::{Pipeline, SpawnedAt, ToName};
use crate::leaks::{self, Change, Evidence, Look, Lookout, Near, Reason, Round, Sample, flags};
use crate::lineage::graph::NodeId;
use crate::procfs::boottime_now;
use crate::sites::NamedSites;

/// A round being planned, in steps (see [`Pipeline::plan_step`]).
pub struct Planning {
    steps: leaks::Planning,
    began: Instant,
}

/// A round planned, its looks to be sampled.
pub struct Planned {
    round: Round,
    began: Instant,
}

/// A round being judged, in steps.
pub(super) struct Judging {
    round: Round,
    began: Instant,
    steps: leaks::Judging,
    /// The flags the steps so far raised, and the pids of the `cleared` changes they made
    /// (a live process's, not a zombie's), from the changes before `indexed`: an exit record
    /// between two steps looks here, not through every change.
    flagged: HashSet<(NodeId, Reason)>,
    cleared: HashSet<u32>,
    indexed: usize,
}

impl Judging {
    /// Indexes the changes the last step made.
    fn index(&mut self) {
        for change in &self.round.changes[self.indexed..] {
            match change {
                Change::Flag(f) => {
                    self.flagged.insert((f.node, f.reason));
                }
                Change::Cleared { reason, .. } if *reason == Reason::Zombie => {}
                Change::Cleared { pid, .. } => {
                    self.cleared.insert(*pid);
                }
            }
        }
        self.indexed = self.round.changes.len();
    }

    /// The flag `reason` of process `id` that the steps so far raised, taken out; whether
    /// there was one.
    fn take_flag(&mut self, id: NodeId, reason: Reason) -> bool {
        if !self.flagged.remove(&(id, reason)) {
            return false;
        }
        let raised =
            |c: &Change| matches!(c, Change::Flag(f) if f.node == id && f.reason == reason);
        let at = self.round.changes.iter().position(raised);
        let taken = at.map(|at| self.round.changes.remove(at)).is_some();
        self.indexed -= usize::from(taken);
        taken
    }

    /// The `cleared` changes of live process `pid` (not a zombie's) the steps so far made,
    /// taken out.
    fn take_cleared(&mut self, pid: u32) -> Vec<Change> {
        if !self.cleared.remove(&pid) {
            return Vec::new();
        }
        let of_pid = |c: &Change| match c {
            Change::Cleared { reason, .. } if *reason == Reason::Zombie => false,
            Change::Cleared { pid: p, .. } => *p == pid,
            Change::Flag(_) => false,
        };
        let (taken, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.round.changes)
            .into_iter()
            .partition(of_pid);
        self.round.changes = kept;
        self.indexed -= taken.len();
        taken
    }
}

/// What a step of a round's planning left (see [`Pipeline::plan_step`]).
pub enum PlanStep {
    /// More steps to take.
    More(Planning),
    /// Its looks are to be taken.
    Planned(Planned),
}

/// What a step of a round's judging left (see [`Pipeline::judge_step`]).
pub enum JudgeStep {
    /// More steps to take.
    More,
    /// The round is judged: its new flags' evidence to be read, none when there is none.
    Judged(Option<Unread>),
}

/// A judged round, waiting for its evidence and its commit.
pub(super) struct Judged {
    round: Round,
    began: Instant,
    /// What it waits for.
    stage: Stage,
    /// Its new flags' spawn sites, named.
    spawned: SpawnedAt,
    /// Each flag it raised, by process and reason: its index in the round's changes.
    flags: HashMap<(NodeId, Reason), usize>,
    /// The `cleared` changes of each pid (a live process's: not a zombie's): their indices.
    cleared: HashMap<u32, Vec<usize>>,
    /// The changes not to write at the commit: withdrawn, or written already.
    skip: HashSet<usize>,
}

/// What a judged round waits for before it is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// Its new flags' evidence, read on the slow side.
    Evidence,
    /// Its new flags' spawn sites, named on the slow side.
    Names,
    /// Nothing: the event loop is to write it.
    Ready,
}

/// The new flags' evidence, copied out of a judged round to be read elsewhere, each with its
/// change's index; put back by [`Pipeline::evidence_read`].
pub struct Unread {
    pub with_peers: Vec<(usize, Evidence)>,
    pub without: Vec<(usize, Evidence)>,
    /// Where the other ends of `with_peers`' channels are looked for.
    pub near: Near,
}

impl Unread {
    /// Reads it with `lookout` (see [`Lookout::read_evidence`]).
    pub fn read(&mut self, lookout: &mut Lookout) {
        fn each(slots: &mut [(usize, Evidence)]) -> Vec<&mut Evidence> {
            slots.iter_mut().map(|(_, e)| e).collect()
        }
        let (with_peers, without) = (each(&mut self.with_peers), each(&mut self.without));
        lookout.read_evidence(with_peers, without, &self.near);
    }
}

impl Planned {
    /// The looks due, to be sampled and given back to [`Pipeline::start_judging`].
    pub fn take_looks(&mut self) -> Vec<Look> {
        std::mem::take(&mut self.round.looks)
    }
}

impl Pipeline {
    /// A round's first step begun, to be taken in the steps of [`Pipeline::plan_step`].
    pub fn plan_round(&mut self) -> Planning {
        Planning {
            steps: self.inspector.plan(boottime_now()),
            began: Instant::now(),
        }
    }

    /// One step of a round's planning, bounded like the judging's (for the caller to let the
    /// reader's own work run between them): the flags of processes that exited cleared (written
    /// at once), then the looks due found. The round planned once it is done.
    pub fn plan_step(&mut self, mut planning: Planning) -> Result<PlanStep> {
        let more = self.inspector.plan_step(&self.graph, &mut planning.steps);
        let cleared = planning.steps.take_changes();
        // Written once a round at least (its notes, the sites of processes gone forgotten).
        if !more || !cleared.is_empty() {
            self.write_scan(&cleared, &SpawnedAt::default(), None)?;
        }
        if more {
            return Ok(PlanStep::More(planning));
        }
        let round = planning.steps.round();
        let began = planning.began;
        Ok(PlanStep::Planned(Planned { round, began }))
    }

    /// The next step, the looks sampled: the rules are to be applied, in the steps of
    /// [`Pipeline::judge_step`].
    pub fn start_judging(&mut self, planned: Planned, sampled: Vec<(Look, Option<Sample>)>) {
        debug_assert!(
            self.judged.is_none() && self.judging.is_none(),
            "one round judged at a time"
        );
        let Planned { round, began } = planned;
        let steps = leaks::Judging::new(sampled);
        self.judging = Some(Judging {
            round,
            began,
            steps,
            flagged: HashSet::default(),
            cleared: HashSet::default(),
            indexed: 0,
        });
    }

    /// One step of the round's judging: each bounded, for the caller to let the reader's
    /// own work run between them. Once judged, the round waits here for its evidence
    /// (returned to be read) and its commit; the flags it raised are held from their step on.
    pub fn judge_step(&mut self) -> JudgeStep {
        let Some(judging) = self.judging.as_mut() else {
            return JudgeStep::Judged(None);
        };
        let (round, steps) = (&mut judging.round, &mut judging.steps);
        if self.inspector.judge_step(&self.graph, round, steps) {
            judging.index();
            return JudgeStep::More;
        }
        let Some(Judging { round, began, .. }) = self.judging.take() else {
            return JudgeStep::Judged(None);
        };
        JudgeStep::Judged(self.judged(round, began))
    }

    /// The round being judged, if any, judged to its end at once: what judged it is gone (it
    /// panicked, or the run stops). Its evidence stays unread.
    pub fn finish_judging(&mut self) {
        while let JudgeStep::More = self.judge_step() {}
    }

    /// The judged `round`, waiting for its evidence (returned to be read, none when there is
    /// none) and its commit.
    fn judged(&mut self, mut round: Round, began: Instant) -> Option<Unread> {
        let (mut flags, mut cleared) = (HashMap::default(), HashMap::<u32, Vec<usize>>::default());
        for (at, change) in round.changes.iter().enumerate() {
            match change {
                Change::Flag(f) => {
                    flags.insert((f.node, f.reason), at);
                }
                // A zombie's clearing (reaped) names a pid already gone, perhaps reused.
                Change::Cleared { reason, .. } if *reason == Reason::Zombie => {}
                Change::Cleared { pid, .. } => cleared.entry(*pid).or_default().push(at),
            }
        }
        let (with_peers, without) = round.evidence_slots();
        let copy = |slots: Vec<usize>, round: &mut Round| -> Vec<(usize, Evidence)> {
            let each = slots.into_iter();
            each.filter_map(|at| Some((at, round.evidence_at(at)?.clone())))
                .collect()
        };
        let unread = Unread {
            near: match with_peers.is_empty() {
                true => Near::default(),
                false => Near::every_live(&self.graph),
            },
            with_peers: copy(with_peers, &mut round),
            without: copy(without, &mut round),
        };
        let read = unread.with_peers.is_empty() && unread.without.is_empty();
        self.judged = Some(Judged {
            round,
            began,
            stage: match read {
                true => Stage::Names,
                false => Stage::Evidence,
            },
            spawned: SpawnedAt::default(),
            flags,
            cleared,
            skip: HashSet::default(),
        });
        (!read).then_some(unread)
    }

    /// The evidence of the judged round read (`read`, as [`Pipeline::judge_step`] returned
    /// it; none when it could not be: the samples stay its evidence): its spawn sites are to
    /// be named next.
    pub fn evidence_read(&mut self, read: Option<Unread>) {
        let Some(judged) = self.judged.as_mut() else {
            return;
        };
        judged.stage = Stage::Names;
        let Some(read) = read else {
            return;
        };
        for (at, e) in read.with_peers.into_iter().chain(read.without) {
            if let Some(slot) = judged.round.evidence_at(at) {
                *slot = e;
            }
        }
    }

    /// Whether a judged round waits to be written.
    pub fn has_judged_round(&self) -> bool {
        self.judged.is_some()
    }

    /// What naming the judged round's new flags' spawn sites needs, once its evidence is
    /// read; none when there is nothing to read (the round is then ready to be written).
    pub fn round_to_name(&mut self) -> Option<ToName> {
        let judged = self.judged.as_ref().filter(|j| j.stage == Stage::Names)?;
        let pids: Vec<u32> = (judged.round.changes.iter())
            .filter_map(|c| match c {
                Change::Flag(f) => Some(f.pid),
                Change::Cleared { .. } => None,
            })
            .collect();
        let to_name = self.spawns_to_name(pids).filter(|t| !t.naming.is_empty());
        if to_name.is_none() {
            self.round_named(None, None);
        }
        to_name
    }

    /// The judged round's spawn sites named (`named`, for what `to_name` asked; none when
    /// they could not be: its flags then name no spawn site): it is ready to be written.
    pub fn round_named(&mut self, to_name: Option<ToName>, named: Option<NamedSites>) {
        let spawned = match to_name {
            Some(to_name) => self.spawns_named(to_name.asked, named),
            None => SpawnedAt::default(),
        };
        if let Some(judged) = self.judged.as_mut() {
            judged.spawned = spawned;
            judged.stage = Stage::Ready;
        }
    }

    /// A judged round waiting for reads that will not come (what read them is gone): it is
    /// written as it is.
    pub fn round_unread(&mut self) {
        if let Some(judged) = self.judged.as_mut() {
            judged.stage = Stage::Ready;
        }
    }

    /// Whether a judged round's reads are done: the event loop is to drain the ring, then
    /// write it.
    pub fn round_ready(&self) -> bool {
        self.judged
            .as_ref()
            .is_some_and(|j| j.stage == Stage::Ready)
    }

    /// Writes the judged round, its evidence read or not, right after a drain: the flags
    /// that started or stopped holding, but for a flag whose process no longer is what it was
    /// flagged as (exited, or a zombie reaped), which is withdrawn; the gauges; with `kill`,
    /// `--kill`'s decisions; the status line.
    pub fn commit_round(&mut self, kill: bool) -> Result<()> {
        let Some(mut judged) = self.judged.take() else {
            return Ok(());
        };
        for (&(id, reason), &at) in &judged.flags {
            let node = self.graph.node(id);
            let still = match reason {
                Reason::Zombie => node.is_some_and(|n| n.zombie()),
                _ => node.is_some_and(|n| n.alive()),
            };
            if !still && !judged.skip.contains(&at) {
                self.inspector.withdraw(id, reason);
                judged.skip.insert(at);
            }
        }
        let mut changes = std::mem::take(&mut judged.round.changes);
        let mut at = 0;
        changes.retain(|_| {
            at += 1;
            !judged.skip.contains(&(at - 1))
        });
        self.write_scan(&changes, &judged.spawned, Some(judged.began))?;
        if kill {
            self.decide_kills()?;
        }
        self.out.draw_status()?;
        Ok(self.out.flush()?)
    }

    /// At the exit record of process `id` (`pid`): the flag `reason` its exit cleared, if the
    /// judged round raised it, is withdrawn (neither it nor its clearing is written; returns
    /// true).
    pub(super) fn never_written(&mut self, id: NodeId, reason: Reason) -> bool {
        // Raised by a step of the round being judged: not counted yet, and its hold is
        // what the exit cleared.
        if let Some(judging) = self.judging.as_mut() {
            return judging.take_flag(id, reason);
        }
        let Some(judged) = self.judged.as_mut() else {
            return false;
        };
        let Some(&at) = judged.flags.get(&(id, reason)) else {
            return false;
        };
        judged.skip.insert(at);
        self.inspector.withdraw(id, reason);
        true
    }

    /// At the exit record of `pid`: the `cleared` changes the judged round holds for it,
    /// written now (after its `exit`, as the flags its exit clears are), not at the commit.
    pub(super) fn cleared_at_exit(&mut self, pid: u32, ts: u64) -> Result<()> {
        if let Some(judging) = self.judging.as_mut() {
            for change in judging.take_cleared(pid) {
                if let Some(event) = flags::change_event(&self.graph, &change, ts) {
                    self.out.event(ts, event)?;
                }
            }
            return Ok(());
        }
        let Some(judged) = self.judged.as_mut() else {
            return Ok(());
        };
        let Some(ats) = judged.cleared.remove(&pid) else {
            return Ok(());
        };
        for at in ats {
            judged.skip.insert(at);
            let change = &judged.round.changes[at];
            if let Some(event) = flags::change_event(&self.graph, change, ts) {
                self.out.event(ts, event)?;
            }
        }
        Ok(())
    }
}
