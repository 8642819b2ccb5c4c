//! A round's first step, taken in steps ([`Inspector::plan_step`]) like its judging (see
//! `judging.rs`), each of at most [`PER_STEP`] watches, processes or looks: the watches of
//! processes that exited forgotten (their flags cleared), the live descendants asked whether
//! a look is due (see `looks.rs`), then the looks made. Two steps also copy what the next
//! ones go through: the ids of the live descendants, and the processes due widened by the
//! servers they are part of (a copy or a set insert each). At 10,000 live descendants,
//! planning a round at once held the reader's thread 1.1 to 3 ms.
//!
//! The graph may change between steps: each step takes what it reads of it as it is then. A
//! watch is checked against the graph as its step finds it (a process that exits after its
//! check is forgotten at the next round; its exit record cleared its flags already); the live
//! descendants are the ones alive when the last watch was checked (one born since is watched
//! from the next round, one gone since is skipped).
use rustc_hash::FxHashSet as HashSet;

use super::{Inspector, Look, PER_STEP, Round};
use crate::leaks::findings::Change;
use crate::lineage::graph::{LineageGraph, NodeId};

/// A round's planning under way, from [`Inspector::plan`] to [`Planning::round`].
pub struct Planning {
    /// Boot-time ns the round judges at.
    now: u64,
    step: Step,
    /// The flags the steps cleared, until taken to be written.
    changes: Vec<Change>,
}

/// Where a round's planning is.
enum Step {
    /// The watches still to be checked for an exit.
    Forget { left: Vec<NodeId> },
    /// The live descendants still to be asked whether a look is due, and those due so far.
    Due {
        left: Vec<NodeId>,
        due: HashSet<NodeId>,
    },
    /// The processes still to be looked at, and their looks so far.
    Looks { left: Vec<NodeId>, looks: Vec<Look> },
    /// Planned: the looks due.
    Done(Vec<Look>),
}

impl Planning {
    /// The flags the steps so far cleared (processes that exited), taken to be written.
    pub fn take_changes(&mut self) -> Vec<Change> {
        std::mem::take(&mut self.changes)
    }

    /// The round planned, its looks to be taken (see [`Round`]), once its steps are done (see
    /// [`Inspector::plan_step`]; a round not planned to its end looks at nothing).
    pub fn round(self) -> Round {
        let looks = match self.step {
            Step::Done(looks) => looks,
            _ => Vec::new(),
        };
        Round {
            now: self.now,
            changes: self.changes,
            looks,
            sampled: HashSet::default(),
        }
    }
}

impl Inspector {
    /// A round's first step begun, at boot-time `now`, to be taken in the steps of
    /// [`Inspector::plan_step`].
    pub fn plan(&mut self, now: u64) -> Planning {
        self.breaks.begin_round();
        Planning {
            now,
            step: Step::Forget {
                left: self.watches.keys().copied().collect(),
            },
            changes: Vec::new(),
        }
    }

    /// One step of a round's planning; false once it is done (see [`Planning::round`]).
    pub fn plan_step(&mut self, graph: &LineageGraph, planning: &mut Planning) -> bool {
        let now = planning.now;
        planning.step = match std::mem::replace(&mut planning.step, Step::Done(Vec::new())) {
            Step::Forget { mut left } => {
                let from = left.len().saturating_sub(PER_STEP);
                for id in left.drain(from..) {
                    if !graph.node(id).is_some_and(|n| n.alive()) {
                        self.forget(id, &mut planning.changes);
                    }
                }
                match left.is_empty() {
                    false => Step::Forget { left },
                    true => Step::Due {
                        left: (graph.alive())
                            .filter(|n| !n.is_gateway)
                            .map(|n| n.id)
                            .collect(),
                        due: HashSet::default(),
                    },
                }
            }
            Step::Due { mut left, mut due } => {
                let from = left.len().saturating_sub(PER_STEP);
                let mut sessions = graph.sessions_of();
                for id in left.drain(from..) {
                    let Some(node) = graph.node(id).filter(|n| n.alive()) else {
                        continue;
                    };
                    if self.due(graph, &mut sessions, node, now) {
                        due.insert(id);
                    }
                }
                match left.is_empty() {
                    false => Step::Due { left, due },
                    true => {
                        self.widen_due(graph, now, &mut due);
                        Step::Looks {
                            looks: Vec::with_capacity(due.len()),
                            left: due.into_iter().collect(),
                        }
                    }
                }
            }
            Step::Looks {
                mut left,
                mut looks,
            } => {
                let from = left.len().saturating_sub(PER_STEP);
                let each = left.drain(from..);
                looks.extend(each.filter_map(|id| self.look(graph, id, now)));
                match left.is_empty() {
                    false => Step::Looks { left, looks },
                    true => Step::Done(looks),
                }
            }
            Step::Done(looks) => Step::Done(looks),
        };
        !matches!(planning.step, Step::Done(_))
    }
}
