//! A kill asked for through the API (`reaper-trace kill`, `POST /v1/kill`): the processes a
//! client picked, each ended at once through the protocol `--kill` follows.
use super::{Cause, Decide, Killer, Started, refusal};
use crate::leaks::Reason;
use crate::lineage::graph::{LineageGraph, NodeId};
use crate::stream::events::AskedBy;

impl Killer {
    /// A kill asked for through the API by `asked_by` (root: the server checked): each of
    /// `nodes` with its live descendants, leaves first, through the same protocol as
    /// `--kill`'s, refused as `--kill` refuses (a gateway, pid 1, reaper-trace, its
    /// ancestors, what is outside a gateway's lineage or uncertain); `reason_of` the flag
    /// each holds, if any. What was refused, or not sent for `dry_run` (or the run's
    /// `--dry-run`), is reported at once;
    /// the steps of the sequences started come as they are taken.
    pub fn asked(
        &mut self,
        graph: &LineageGraph,
        nodes: &[NodeId],
        reason_of: impl Fn(NodeId) -> Option<Reason>,
        asked_by: AskedBy,
        dry_run: bool,
    ) -> Started {
        let mut all = Started::default();
        // What the graph no longer holds can be decided on no more: let go of it.
        self.decided.retain(|&id| graph.holds(id));
        let dry_run = dry_run || self.opts.dry_run;
        for &id in nodes {
            let Some(node) = graph.node(id).filter(|n| n.alive()) else {
                continue;
            };
            let cause = Cause {
                reason: reason_of(id),
                asked_by: Some(asked_by),
            };
            // A process never killed is refused with what it spawned: asking to end a
            // gateway ends nothing under it either.
            if let Some(outcome) = refusal(graph, node, &self.protected) {
                all.refused.push(cause.report(node, outcome));
                continue;
            }
            let started = self.start(graph, node, cause, Decide::Asked { dry_run });
            all.refused.extend(started.refused);
            all.signalled.extend(started.signalled);
        }
        all
    }
}
