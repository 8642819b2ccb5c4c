//! `zombie`: it exited and its parent has not reaped it for `--zombie-after`. Judged on the
//! graph alone (a zombie has no files to look at), at every scan.
use super::{About, Reason};
use crate::lineage::graph::Node;

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
