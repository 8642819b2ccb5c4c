//! When the inspector looks at which descendant (asked in the steps of `planning.rs`): first
//! looks spread over a sample period, a look at the end of an orphan grace (see
//! `rules::orphaned::Breaks`), every scan for what is flagged `idle` or `deaf` and for what
//! exec'd since its last look, and a server looked at whole; and what a look remembers of the
//! process.
use std::sync::Arc;

use rustc_hash::FxHashSet as HashSet;

use super::{Inspector, Look, Watch, nanos};
use crate::leaks::findings::Reason;
use crate::leaks::sampler::Sample;
use crate::lineage::graph::session::SessionsOf;
use crate::lineage::graph::{LineageGraph, Node, NodeId};

impl Inspector {
    /// Whether live descendant `node` is due a look at `now` (its watch made at the first
    /// call); `sessions` are `graph`'s, shared by the calls of one step.
    pub(super) fn due<'g>(
        &mut self,
        graph: &'g LineageGraph,
        sessions: &mut SessionsOf<'g>,
        node: &Node,
        now: u64,
    ) -> bool {
        let every = self.opts.sample_every();
        let w = self.watches.entry(node.id).or_insert_with(|| {
            Box::new(Watch {
                pid: node.pid,
                // First looks are spread over a sample period, so that a thousand processes
                // appearing at once are not read in one burst; a short-lived one is never read.
                next_sample: now + first_look_delay(node.id, every),
                io_since: now,
                ..Watch::default()
            })
        });
        // A broken chain is judged for `orphaned` at the first look after its grace.
        let grace = nanos(self.opts.orphan_grace);
        let grace_look = self.breaks.due(graph, sessions, node, now, grace);
        // One that exec'd since its last look is counted as what it runs now once looked at
        // again (see `Crowds::looked_at`).
        let exec_since = w.last.is_some() && !self.crowds.knows_kind(node);
        let urgent = grace_look
            || exec_since
            || self.held.holds(node.id, Reason::Idle)
            || self.held.holds(node.id, Reason::Deaf);
        urgent || now >= w.next_sample
    }

    /// Widens `due` (the live descendants due a look) by the spawners the killer found
    /// respawning: looked at now (a gateway too), each look its flag's evidence. Then, if
    /// anything is due, by the rest of each server the last judged round found (a server is
    /// judged on all its processes at one moment; a process new since is one by itself until
    /// it is looked at, one that exited since is not looked at).
    pub(super) fn widen_due(&mut self, graph: &LineageGraph, now: u64, due: &mut HashSet<NodeId>) {
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
            return;
        }
        for server in &self.wider_servers {
            if server.iter().any(|id| due.contains(id)) {
                let alive = |id: &&NodeId| graph.node(**id).is_some_and(|n| n.alive());
                due.extend(server.iter().filter(alive));
            }
        }
    }

    /// The look at process `id`, due at `now`: it is next due a sample period on. None for
    /// one that exited, or not watched.
    pub(super) fn look(&mut self, graph: &LineageGraph, id: NodeId, now: u64) -> Option<Look> {
        let every = self.opts.sample_every();
        let node = graph.node(id).filter(|n| n.alive())?;
        let w = self.watches.get_mut(&id)?;
        w.next_sample = now.saturating_add(every);
        Some(Look {
            id,
            process: node.process(),
            before: w.last.clone(),
            exe_for: (!self.crowds.knows_kind(node)).then_some(node.execs),
            exe: None,
        })
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
        for (mut look, sample) in sampled {
            let alive = graph.node(look.id).filter(|n| n.alive());
            let Some(node) = alive.filter(|n| n.process() == look.process) else {
                continue;
            };
            looked.insert(look.id);
            // Its kind, unless it exec'd since the look read its program (formed from the
            // exec's path when the look could read nothing: else it would be due every round).
            if look.exe_for == Some(node.execs) {
                self.crowds.looked_at(node, look.exe.take());
            }
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
