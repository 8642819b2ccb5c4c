//! When the inspector looks at which descendant: first looks spread over a sample period, a
//! look at the end of an orphan grace (see `rules::orphaned::Breaks`), every scan for what is flagged `idle` or `deaf`, and a
//! server looked at whole; and what a look remembers of the process.
use rustc_hash::FxHashSet as HashSet;

use super::{Inspector, Watch, nanos};
use crate::identity::ProcessId;
use crate::leaks::channels;
use crate::leaks::findings::Reason;
use crate::lineage::graph::{LineageGraph, NodeId};

impl Inspector {
    /// Samples the live descendants that are due, with the rest of their servers (a server is
    /// judged on all its processes at one moment). Returns what was sampled.
    pub(super) fn sample_due(&mut self, graph: &LineageGraph, now: u64) -> HashSet<NodeId> {
        let every = self.opts.sample_every();
        let grace = nanos(self.opts.orphan_grace);
        self.breaks.begin_round();
        let mut due = HashSet::default();
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
            let grace_look = self.breaks.due(graph, node, now, grace);
            let urgent = grace_look || w.has(Reason::Idle) || w.has(Reason::Deaf);
            if urgent || now >= w.next_sample {
                due.insert(node.id);
            }
        }
        if due.is_empty() {
            return due;
        }
        for server in self.servers(graph) {
            if server.iter().any(|id| due.contains(id)) {
                due.extend(server);
            }
        }
        for &id in &due {
            let Some(node) = graph.node(id) else { continue };
            self.refresh(node.process(), id, now, every);
        }
        // Internal channels need every fresh sample's holders in the index first.
        for &id in &due {
            if let Some(s) = self.watches.get_mut(&id).and_then(|w| w.last.as_mut()) {
                channels::mark_internal(id, &mut s.fds, &self.holders);
            }
        }
        due
    }

    /// Takes a fresh sample of one process and updates what its watch remembers.
    fn refresh(&mut self, process: ProcessId, id: NodeId, now: u64, every: u64) {
        let Some(w) = self.watches.get_mut(&id) else {
            return;
        };
        w.next_sample = now.saturating_add(every);
        let Some(s) = self.sampler.sample(process, w.last.as_ref()) else {
            return; // gone meanwhile: its exit event is on its way
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
        w.last = Some(s);
    }
}

/// A fixed spread of `id` over `[0, period)` ns (Fibonacci hashing).
fn first_look_delay(id: NodeId, period: u64) -> u64 {
    let spread = id.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32;
    ((u128::from(spread) * u128::from(period)) >> 32) as u64
}
