//! When the inspector looks at which descendant: first looks spread over a sample period, a
//! look at the end of an orphan grace (see `rules::orphaned::Breaks`), every scan for what is
//! flagged `idle` or `deaf`, and a server looked at whole; and what a look remembers of the
//! process.
use std::sync::Arc;

use rustc_hash::FxHashSet as HashSet;

use super::{Inspector, Look, Watch, nanos};
use crate::leaks::findings::Reason;
use crate::leaks::sampler::Sample;
use crate::lineage::graph::{LineageGraph, NodeId};

impl Inspector {
    /// The live descendants whose looks are due, with the rest of their servers (a server is
    /// judged on all its processes at one moment); each is next due a sample period on.
    pub(super) fn due(&mut self, graph: &LineageGraph, now: u64) -> Vec<Look> {
        let every = self.opts.sample_every();
        let grace = nanos(self.opts.orphan_grace);
        self.breaks.begin_round();
        let mut due = HashSet::default();
        let mut sessions = graph.sessions_of();
        for node in graph.alive().filter(|n| !n.is_gateway) {
            let w = self.watches.entry(node.id).or_insert_with(|| {
                Box::new(Watch {
                    pid: node.pid,
                    // First looks are spread over a sample period, so that a thousand
                    // processes appearing at once are not read in one burst; a short-lived
                    // one is never read.
                    next_sample: now + first_look_delay(node.id, every),
                    io_since: now,
                    ..Watch::default()
                })
            });
            // A broken chain is judged for `orphaned` at the first look after its grace.
            let grace_look = self.breaks.due(graph, &mut sessions, node, now, grace);
            let urgent = grace_look
                || self.held.holds(node.id, Reason::Idle)
                || self.held.holds(node.id, Reason::Deaf);
            if urgent || now >= w.next_sample {
                due.insert(node.id);
            }
        }
        // The spawners the killer found respawning: looked at now (a gateway too), each look
        // its flag's evidence.
        for &id in self.respawners.waiting() {
            let Some(node) = graph.node(id).filter(|n| n.alive()) else {
                continue;
            };
            self.watches.entry(id).or_insert_with(|| {
                Box::new(Watch {
                    pid: node.pid,
                    next_sample: now,
                    io_since: now,
                    ..Watch::default()
                })
            });
            due.insert(id);
        }
        if due.is_empty() {
            return Vec::new();
        }
        // By the servers the last judged round found (a process new since is one by itself
        // until it is looked at); one that exited since is not looked at.
        for server in &self.wider_servers {
            if server.iter().any(|id| due.contains(id)) {
                let alive = |id: &&NodeId| graph.node(**id).is_some_and(|n| n.alive());
                due.extend(server.iter().filter(alive));
            }
        }
        let mut looks = Vec::with_capacity(due.len());
        for id in due {
            let (Some(node), Some(w)) = (graph.node(id), self.watches.get_mut(&id)) else {
                continue;
            };
            w.next_sample = now.saturating_add(every);
            looks.push(Look {
                id,
                process: node.process(),
                before: w.last.clone(),
            });
        }
        looks
    }

    /// Remembers what some looks found, at boot-time `now`; adds to `looked` the processes
    /// looked at that are still alive (one that exited meanwhile is its exit record's: its
    /// flags were cleared there). Their internal channels are marked once every look's
    /// samples are in (see `judging.rs`).
    pub(super) fn remember(
        &mut self,
        graph: &LineageGraph,
        sampled: impl Iterator<Item = (Look, Option<Sample>)>,
        now: u64,
        looked: &mut HashSet<NodeId>,
    ) {
        for (look, sample) in sampled {
            let alive = graph.node(look.id).filter(|n| n.alive());
            if alive.is_none_or(|n| n.process() != look.process) {
                continue;
            }
            looked.insert(look.id);
            if let Some(sample) = sample {
                self.refresh(look.id, sample, now);
            }
        }
    }

    /// Updates what the watch of process `id` remembers from a fresh sample `s`.
    fn refresh(&mut self, id: NodeId, s: Sample, now: u64) {
        let Some(w) = self.watches.get_mut(&id) else {
            return;
        };
        if s.io != w.io {
            let first = w.io.is_none();
            w.io = s.io;
            if !first {
                w.io_since = now;
            }
        }
        // (An internal channel never polls closed: its own process holds the other end.)
        w.eof_since = match s.eof_pending() {
            true => w.eof_since.or(Some(now)),
            false => None,
        };
        let before = w.last.as_ref().map_or(&[][..], |l| &l.fds[..]);
        self.holders.replace(id, before, &s.fds);
        w.last = Some(Arc::new(s));
    }
}

/// A fixed spread of `id` over `[0, period)` ns (Fibonacci hashing).
fn first_look_delay(id: NodeId, period: u64) -> u64 {
    let spread = id.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32;
    ((u128::from(spread) * u128::from(period)) >> 32) as u64
}
