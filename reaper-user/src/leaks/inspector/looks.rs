//! When the inspector looks at which descendant: first looks spread over a sample period, a
//! look at the end of an orphan grace, every scan for what is flagged `idle` or `deaf`, and a
//! server looked at whole; and what a look remembers of the process.
use rustc_hash::FxHashSet as HashSet;

use super::{EXIT_SETTLE_CAP, Inspector, Watch, nanos};
use crate::identity::ProcessId;
use crate::leaks::channels;
use crate::leaks::findings::Reason;
use crate::lineage::graph::{LineageGraph, Node, NodeId};

impl Inspector {
    /// Samples the live descendants that are due, with the rest of their servers (a server is
    /// judged on all its processes at one moment). Returns what was sampled.
    pub(super) fn sample_due(&mut self, graph: &LineageGraph, now: u64) -> HashSet<NodeId> {
        let every = self.opts.sample_every();
        let grace = nanos(self.opts.orphan_grace);
        let mut next_grace_end = None;
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
            // The chain counts as broken once the spawner's exit has let go of its files;
            // it is judged for `orphaned` at the first look after the grace.
            w.broken_since = match graph.exited_spawner(node.id) {
                None => None,
                Some(gone) => w
                    .broken_since
                    .or_else(|| exit_settled(gone, now).then(|| gone.exited.map_or(now, |e| e.ts))),
            };
            let grace_over = w.broken_since.map(|since| since.saturating_add(grace));
            let grace_look = match grace_over {
                Some(end) if !w.grace_looked && now >= end => {
                    w.grace_looked = true;
                    true
                }
                Some(end) if !w.grace_looked => {
                    next_grace_end = Some(next_grace_end.map_or(end, |t: u64| t.min(end)));
                    false
                }
                _ => false,
            };
            let urgent = grace_look || w.has(Reason::Idle) || w.has(Reason::Deaf);
            if urgent || now >= w.next_sample {
                due.insert(node.id);
            }
        }
        self.next_grace_end = next_grace_end;
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

/// Whether the exited spawner `gone` has let go of the channels it held, so that its orphans
/// are judged on what is left: until then the other ends it held still poll open.
fn exit_settled(gone: &Node, now: u64) -> bool {
    let exited = gone.exited.map_or(now, |e| e.ts);
    gone.process().exit_settled() || now.saturating_sub(exited) >= nanos(EXIT_SETTLE_CAP)
}

/// A fixed spread of `id` over `[0, period)` ns (Fibonacci hashing).
fn first_look_delay(id: NodeId, period: u64) -> u64 {
    let spread = id.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32;
    ((u128::from(spread) * u128::from(period)) >> 32) as u64
}
