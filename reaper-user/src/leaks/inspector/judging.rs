//! How a round judges what its looks found: the samples remembered, the servers found among
//! the watched processes (a process and the live spawner it shares a channel end with), the
//! live rules applied to each server sampled, the `accumulating` count, zombies, and the
//! spawners the killer found respawning.
//!
//! It is taken in steps ([`Inspector::judge_step`]), each of at most [`PER_STEP`] looks,
//! processes or servers, for its caller to let the reader's own work run between them: at
//! 10,000 looks, judging a round at once held the reader's thread some 9 ms. A step is
//! bounded by count, not by size: a process of thousands of fds, or one server of thousands
//! of processes, is still one piece of work, and the groups and the count are one step each.
//! The graph may change between steps, as it does between a look and its judging: each step
//! takes what it reads of it as it is then (a process gone before its sample is remembered is
//! not judged; one gone later is judged on its sample, its flag held until the round is
//! written, where it is withdrawn, as before).
use std::sync::Arc;

use rustc_hash::FxHashMap as HashMap;

use super::{Inspector, Look, Looked, PER_STEP, Round, Watch, nanos};
use crate::leaks::channels;
use crate::leaks::findings::{Change, Evidence, Flagged, Reason};
use crate::leaks::rules::accumulating::{Group, Grouping};
use crate::leaks::rules::{self, Observed, Rules, zombie};
use crate::leaks::sampler::Sample;
use crate::lineage::graph::{LineageGraph, NodeId};
use crate::procfs::placement::Placement;

/// A round's judging under way, from the looks' samples to the last step (see
/// [`Inspector::judge_step`]).
pub struct Judging(Step);

/// Where a round's judging is.
enum Step {
    /// The samples remembered, a slice at a time.
    Remember(std::vec::IntoIter<(Look, Option<Sample>)>),
    /// Each fresh sample's internal channels marked, once every sample's holders are in the
    /// index (`left`: the processes still to mark).
    Mark {
        left: Vec<NodeId>,
    },
    /// Each watched process's server found (`left`: those still to place).
    Servers {
        left: Vec<NodeId>,
        by_outermost: HashMap<NodeId, Vec<NodeId>>,
    },
    /// The live rules applied to each server sampled, from `next` on.
    Judge {
        servers: Vec<Vec<NodeId>>,
        next: usize,
    },
    /// The `accumulating` count's instances gathered and grouped, from server `next` on.
    Instances {
        servers: Vec<Vec<NodeId>>,
        next: usize,
        grouping: Grouping,
    },
    /// The instances' groups formed (each sorted, its pattern found), when the servers were
    /// judged.
    Groups {
        judged: Option<(Vec<Vec<NodeId>>, Grouping)>,
    },
    /// The count of the groups, when the servers were judged.
    Count {
        judged: Option<(Vec<Vec<NodeId>>, Vec<Group>)>,
    },
    /// Zombies, the spawners found respawning.
    Last,
    Done,
}

impl Judging {
    /// The judging of a round whose looks found `sampled` (each look and what it found,
    /// none for a process gone meanwhile).
    pub fn new(sampled: Vec<(Look, Option<Sample>)>) -> Judging {
        Judging(Step::Remember(sampled.into_iter()))
    }
}

impl Inspector {
    /// A round's second step, its looks taken (`sampled`), all its judging at once (see
    /// [`Inspector::judge_step`]).
    #[cfg(test)]
    pub fn judge_round(
        &mut self,
        graph: &LineageGraph,
        round: &mut Round,
        sampled: Vec<(Look, Option<Sample>)>,
    ) {
        let mut judging = Judging::new(sampled);
        while self.judge_step(graph, round, &mut judging) {}
    }

    /// One step of a round's judging; false once it is done. The samples remembered, the
    /// rules applied: the flags that start or stop holding are the round's changes; those
    /// raised are held from here (see [`Inspector::withdraw`] for one that is not to be
    /// written).
    pub fn judge_step(
        &mut self,
        graph: &LineageGraph,
        round: &mut Round,
        judging: &mut Judging,
    ) -> bool {
        let now = round.now;
        judging.0 = match std::mem::replace(&mut judging.0, Step::Done) {
            Step::Remember(mut sampled) => {
                let slice = sampled.by_ref().take(PER_STEP);
                self.remember(graph, slice, now, &mut round.sampled);
                match sampled.len() {
                    0 => Step::Mark {
                        left: round.sampled.iter().copied().collect(),
                    },
                    _ => Step::Remember(sampled),
                }
            }
            Step::Mark { mut left } => {
                let from = left.len().saturating_sub(PER_STEP);
                self.mark_internal(left.drain(from..));
                match left.is_empty() {
                    false => Step::Mark { left },
                    true if self.crowds.due(now) || !round.sampled.is_empty() => Step::Servers {
                        left: self.watches.keys().copied().collect(),
                        by_outermost: HashMap::default(),
                    },
                    true => Step::Groups { judged: None },
                }
            }
            Step::Servers {
                mut left,
                mut by_outermost,
            } => {
                let from = left.len().saturating_sub(PER_STEP);
                for id in left.drain(from..) {
                    let top = self.outermost(graph, id);
                    by_outermost.entry(top).or_default().push(id);
                }
                match left.is_empty() {
                    false => Step::Servers { left, by_outermost },
                    true => Step::Judge {
                        servers: servers(graph, by_outermost),
                        next: 0,
                    },
                }
            }
            Step::Judge { servers, next } => {
                let end = servers.len().min(next + PER_STEP);
                for server in &servers[next..end] {
                    if round.sampled.contains(&server[0]) {
                        self.judge(server, now, &mut round.changes);
                    }
                }
                match end == servers.len() {
                    false => Step::Judge { servers, next: end },
                    true => Step::Instances {
                        servers,
                        next: 0,
                        grouping: Grouping::default(),
                    },
                }
            }
            Step::Instances {
                servers,
                next,
                mut grouping,
            } => {
                let end = servers.len().min(next + PER_STEP);
                let watched = Looked(&self.watches, &self.held);
                let slice = &servers[next..end];
                grouping.add(self.crowds.instances(graph, slice, &watched));
                match end == servers.len() {
                    false => Step::Instances {
                        servers,
                        next: end,
                        grouping,
                    },
                    true => Step::Groups {
                        judged: Some((servers, grouping)),
                    },
                }
            }
            Step::Groups { judged } => Step::Count {
                judged: judged.map(|(servers, grouping)| (servers, grouping.groups())),
            },
            Step::Count { judged } => {
                if let Some((servers, groups)) = judged {
                    self.count(graph, servers, groups, &mut round.changes, now);
                }
                Step::Last
            }
            Step::Last => {
                let changes = &mut round.changes;
                let zombie_after = nanos(self.opts.zombie_after);
                zombie::judge(graph, &mut self.held, now, zombie_after, changes);
                self.raise_respawning(graph, now, changes);
                for c in changes.iter() {
                    if let Change::Flag(f) = c {
                        self.raised[f.reason as usize] += 1;
                    }
                }
                Step::Done
            }
            Step::Done => Step::Done,
        };
        !matches!(judging.0, Step::Done)
    }

    /// Marks the internal channels of the fresh samples of processes `ids` (every fresh
    /// sample's holders are in the index).
    fn mark_internal(&mut self, ids: impl Iterator<Item = NodeId>) {
        for id in ids {
            // The look that brought it is over: the sample is the watch's alone (else copied).
            if let Some(s) = self.watches.get_mut(&id).and_then(|w| w.last.as_mut()) {
                let s = Arc::make_mut(s);
                channels::mark_internal(id, &mut s.fds, &self.holders);
            }
        }
    }

    /// The `accumulating` count of the instances' `groups`, gathered from `servers`, applied
    /// to the flags; the servers of more than one process kept for the next round's looks.
    fn count(
        &mut self,
        graph: &LineageGraph,
        mut servers: Vec<Vec<NodeId>>,
        groups: Vec<Group>,
        changes: &mut Vec<Change>,
        now: u64,
    ) {
        let watched = Looked(&self.watches, &self.held);
        let max = self.opts.max_instances;
        let verdict = (self.crowds).judge(graph, &servers, groups, &watched, max, now);
        let last = |id: NodeId| {
            let w = self.watches.get(&id)?;
            Some((w.pid, w.last.as_deref()?.clone()))
        };
        verdict.apply(&mut self.held, last, &servers, changes);
        servers.retain(|s| s.len() > 1);
        self.wider_servers = servers;
    }

    /// Applies the rules to one server (`server[0]` its outermost process) as sampled now.
    fn judge(&mut self, server: &[NodeId], now: u64, changes: &mut Vec<Change>) {
        let top = server[0];
        // A process that became part of a server upwards is no longer judged by itself.
        for &inner in &server[1..] {
            for (reason, _) in rules::live() {
                if let Some(pid) = self.held.clear(inner, reason) {
                    changes.push(Change::Cleared {
                        pid,
                        reason,
                        because: "part of its spawner's server now",
                    });
                }
            }
        }
        let watches: Vec<&Watch> = server
            .iter()
            .filter_map(|id| self.watches.get(id).map(|w| &**w))
            .collect();
        let samples: Vec<&Sample> = watches.iter().filter_map(|w| w.last.as_deref()).collect();
        let Some(top_sample) = self.watches.get(&top).and_then(|w| w.last.as_deref()) else {
            return;
        };
        let seen = Observed {
            holds_channel: samples.iter().any(|s| s.holds_channel()),
            waits_for_input: samples.iter().all(|s| s.state != b'R')
                && samples.iter().any(|s| s.waits_for_input()),
            has_live_peer: samples.iter().any(|s| s.has_live_peer()),
            idle_held: self.held.holds(top, Reason::Idle),
            broken_since: self.breaks.since(top),
            orphan_grace: nanos(self.opts.orphan_grace),
            io_since: watches.iter().map(|w| w.io_since).max().unwrap_or(now),
            eof_since: watches.iter().filter_map(|w| w.eof_since).min(),
            now,
            idle_after: nanos(self.opts.idle_after),
        };
        let Some(pid) = self.watches.get(&top).map(|w| w.pid) else {
            return;
        };
        for (reason, rule) in rules::live() {
            match (rule(&seen), self.held.holds(top, reason)) {
                (Some(since), false) => {
                    self.held.raise(top, pid, reason, since);
                    changes.push(Change::Flag(Box::new(Flagged {
                        node: top,
                        pid,
                        reason,
                        since,
                        evidence: Some(Evidence {
                            // Cloned for a flag raised alone: most judgements raise none.
                            sample: top_sample.clone(),
                            peers: Vec::new(),
                            server: server.to_vec(),
                            placement: Placement::default(),
                        }),
                        crowd: None,
                    })));
                }
                (None, true) => {
                    self.held.clear(top, reason);
                    changes.push(Change::Cleared {
                        pid,
                        reason,
                        because: reason.cleared_because(&seen),
                    });
                }
                _ => {}
            }
        }
    }

    /// Raises the `respawning` flags of the spawners the killer found, each on what this
    /// round's look at it found; held until it exits.
    fn raise_respawning(&mut self, graph: &LineageGraph, now: u64, changes: &mut Vec<Change>) {
        for id in self.respawners.take() {
            let Some(node) = graph.node(id).filter(|n| n.alive()) else {
                continue;
            };
            if !self.held.raise(id, node.pid, Reason::Respawning, now) {
                continue;
            }
            let sample = self
                .watches
                .get(&id)
                .and_then(|w| w.last.as_deref().cloned());
            changes.push(Change::Flag(Box::new(Flagged {
                node: id,
                pid: node.pid,
                reason: Reason::Respawning,
                since: now,
                evidence: sample.map(|sample| Evidence {
                    sample,
                    peers: Vec::new(),
                    server: vec![id],
                    placement: Placement::default(),
                }),
                crowd: None,
            })));
        }
    }
}

/// The servers of the watched processes, grouped by their outermost process: each outermost
/// process first.
fn servers(graph: &LineageGraph, by_outermost: HashMap<NodeId, Vec<NodeId>>) -> Vec<Vec<NodeId>> {
    by_outermost
        .into_values()
        .map(|mut members| {
            // Outermost first, then down the chain. (Not by id: seeded processes get theirs
            // in /proc order, where a child can come before its parent.) Most servers are one
            // process: nothing to sort.
            if members.len() > 1 {
                members.sort_by_cached_key(|id| (graph.chain(*id).len(), *id));
            }
            members
        })
        .collect()
}
