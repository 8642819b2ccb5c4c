//! How a round judges what its looks found: the samples remembered, the servers found among
//! the watched processes (a process and the live spawner it shares a channel end with), the
//! live rules applied to each server sampled, the `accumulating` count, zombies, and the
//! spawners the killer found respawning.
use rustc_hash::FxHashMap as HashMap;

use super::{Inspector, Look, Looked, Round, Watch, nanos};
use crate::leaks::findings::{Change, Evidence, Flagged, Reason};
use crate::leaks::rules::{self, Observed, Rules, zombie};
use crate::leaks::sampler::Sample;
use crate::lineage::graph::{LineageGraph, NodeId};
use crate::procfs::placement::Placement;

impl Inspector {
    /// A round's second step, its looks taken (`sampled`: each look and what it found, none
    /// for a process gone meanwhile): the samples remembered, the rules applied. The flags
    /// that start or stop holding are the round's changes; those raised are held from here
    /// (see [`Inspector::withdraw`] for one that is not to be written).
    pub fn judge_round(
        &mut self,
        graph: &LineageGraph,
        round: &mut Round,
        sampled: Vec<(Look, Option<Sample>)>,
    ) {
        let now = round.now;
        round.sampled = self.remember(graph, sampled, now);
        let count = self.crowds.due(now);
        let changes = &mut round.changes;
        if !round.sampled.is_empty() || count {
            let mut servers = self.servers(graph);
            for server in &servers {
                if round.sampled.contains(&server[0]) {
                    self.judge(server, now, changes);
                }
            }
            let watched = Looked(&self.watches, &self.held);
            let max = self.opts.max_instances;
            let verdict = self.crowds.judge(graph, &servers, &watched, max, now);
            let last = |id: NodeId| {
                let w = self.watches.get(&id)?;
                Some((w.pid, w.last.clone()?))
            };
            verdict.apply(&mut self.held, last, &servers, changes);
            servers.retain(|s| s.len() > 1);
            self.wider_servers = servers;
        }
        zombie::judge(
            graph,
            &mut self.held,
            now,
            nanos(self.opts.zombie_after),
            changes,
        );
        self.raise_respawning(graph, now, changes);
        for c in changes.iter() {
            if let Change::Flag(f) = c {
                self.raised[f.reason as usize] += 1;
            }
        }
    }

    /// The servers among the watched processes, each outermost process first.
    fn servers(&self, graph: &LineageGraph) -> Vec<Vec<NodeId>> {
        let mut by_outermost: HashMap<NodeId, Vec<NodeId>> = HashMap::default();
        for &id in self.watches.keys() {
            let top = self.outermost(graph, id);
            by_outermost.entry(top).or_default().push(id);
        }
        by_outermost
            .into_values()
            .map(|mut members| {
                // Outermost first, then down the chain. (Not by id: seeded processes get
                // theirs in /proc order, where a child can come before its parent.) Most
                // servers are one process: nothing to sort.
                if members.len() > 1 {
                    members.sort_by_cached_key(|id| (graph.chain(*id).len(), *id));
                }
                members
            })
            .collect()
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
        let samples: Vec<&Sample> = watches.iter().filter_map(|w| w.last.as_ref()).collect();
        let Some(top_sample) = self.watches.get(&top).and_then(|w| w.last.as_ref()) else {
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
            let sample = self.watches.get(&id).and_then(|w| w.last.clone());
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
