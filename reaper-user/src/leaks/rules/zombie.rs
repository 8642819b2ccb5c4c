//! `zombie`: it exited and its parent has not reaped it for `--zombie-after`. Judged on the
//! graph alone (a zombie has no files to look at), at every round; its flag is held on the
//! zombie until it is reaped.
use super::{About, Reason};
use crate::leaks::findings::{Change, Flagged};
use crate::leaks::held::HeldFlags;
use crate::lineage::graph::{LineageGraph, Node, NodeId};

pub const ABOUT: About = About {
    reason: Reason::Zombie,
    killable: false,
    counts_a_kind: false,
    live: None,
    cleared: |_| REAPED,
    why: |w| {
        let (held, parent) = (w.held(), w.detail.ppid);
        format!("exited {held} ago, not reaped by its parent {parent}")
    },
};

/// The `cleared` event's `because` once its parent reaped it.
pub const REAPED: &str = "reaped";

/// `Some(exit time)` once it has been a zombie for `after` ns.
pub fn rule(node: &Node, now: u64, after: u64) -> Option<u64> {
    let exited = node.exited.map_or(now, |e| e.ts);
    (node.zombie() && now.saturating_sub(exited) >= after).then_some(exited)
}

/// A round's look at the zombies, at boot-time `now`: the flags of the reaped cleared, those
/// of the zombies unreaped for `after` ns raised (a gateway's aside: the run's own concern).
pub fn judge(
    graph: &LineageGraph,
    held: &mut HeldFlags,
    now: u64,
    after: u64,
    changes: &mut Vec<Change>,
) {
    forget_the_reaped(graph, held, changes);
    if graph.zombie_count() == 0 {
        return;
    }
    for node in graph.zombies().filter(|n| !n.is_gateway) {
        let Some(exited) = rule(node, now, after) else {
            continue;
        };
        if !held.raise(node.id, node.pid, Reason::Zombie, exited) {
            continue;
        }
        changes.push(Change::Flag(Box::new(Flagged {
            node: node.id,
            pid: node.pid,
            reason: Reason::Zombie,
            since: exited,
            evidence: None,
            crowd: None,
        })));
    }
}

/// Clears the `zombie` flags of processes no longer zombies (reaped, or pruned).
pub fn forget_the_reaped(graph: &LineageGraph, held: &mut HeldFlags, changes: &mut Vec<Change>) {
    let reaped: Vec<NodeId> = (held.iter())
        .filter(|&(id, reason, _)| {
            reason == Reason::Zombie && !graph.node(id).is_some_and(Node::zombie)
        })
        .map(|(id, _, _)| id)
        .collect();
    for id in reaped {
        if let Some(pid) = held.clear(id, Reason::Zombie) {
            changes.push(Change::Cleared {
                pid,
                reason: Reason::Zombie,
                because: REAPED,
            });
        }
    }
}
