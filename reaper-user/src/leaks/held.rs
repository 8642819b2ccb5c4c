//! The flags held now, by process: the one model of them. The inspector keeps a run's (a
//! rule's flag raised and cleared as its looks find), an audit read back keeps the flags its
//! lines raised and cleared (`replay`), and both answer "what is this process" from it
//! (`answer`). A flag is held on a server's outermost process (see `leaks::channels`), or on a
//! zombie, until its rule clears it or its process ends.
use std::collections::BTreeMap;

use rustc_hash::FxHashMap as HashMap;

use crate::lineage::graph::NodeId;
use crate::stream::answer::Held;
use crate::stream::reason::Reason;

/// The flags one process holds, and its pid (a flag's `cleared` names it after the graph let
/// the process go).
#[derive(Clone, Debug, Default)]
struct Holding {
    pid: u32,
    flags: Vec<Held>,
}

/// The flags held now, by process (see the module documentation).
#[derive(Clone, Debug, Default)]
pub struct HeldFlags {
    by_node: HashMap<NodeId, Holding>,
}

impl HeldFlags {
    /// Process `id` (pid `pid`) holds `reason` since `since`; false when it held it already
    /// (its `since` is kept).
    pub fn raise(&mut self, id: NodeId, pid: u32, reason: Reason, since: u64) -> bool {
        let holding = self.by_node.entry(id).or_insert_with(|| Holding {
            pid,
            flags: Vec::new(),
        });
        if holding.flags.iter().any(|h| h.reason == reason) {
            return false;
        }
        holding.flags.push(Held { reason, since });
        true
    }

    /// Process `id` holds `reason` no more: its pid, when it held it.
    pub fn clear(&mut self, id: NodeId, reason: Reason) -> Option<u32> {
        let holding = self.by_node.get_mut(&id)?;
        let before = holding.flags.len();
        holding.flags.retain(|h| h.reason != reason);
        let (pid, cleared) = (holding.pid, holding.flags.len() < before);
        if holding.flags.is_empty() {
            self.by_node.remove(&id);
        }
        cleared.then_some(pid)
    }

    /// Whether process `id` holds `reason`.
    pub fn holds(&self, id: NodeId, reason: Reason) -> bool {
        self.by_node
            .get(&id)
            .is_some_and(|h| h.flags.iter().any(|f| f.reason == reason))
    }

    /// The flags process `id` holds, in the order they were raised.
    pub fn of(&self, id: NodeId) -> &[Held] {
        self.by_node.get(&id).map_or(&[], |h| &h.flags)
    }

    /// Every flag held: process, reason, since.
    pub fn iter(&self) -> impl Iterator<Item = (NodeId, Reason, u64)> + '_ {
        self.by_node
            .iter()
            .flat_map(|(id, h)| h.flags.iter().map(move |f| (*id, f.reason, f.since)))
    }

    /// The reasons each process holds, sorted (the tree marks them).
    pub fn by_node(&self) -> BTreeMap<NodeId, Vec<Reason>> {
        self.by_node
            .iter()
            .map(|(id, h)| {
                let mut reasons: Vec<Reason> = h.flags.iter().map(|f| f.reason).collect();
                reasons.sort();
                (*id, reasons)
            })
            .collect()
    }

    /// Every flag let go (a run's flags end with it).
    pub fn clear_everything(&mut self) {
        self.by_node.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flag_is_held_once_and_a_process_with_none_is_let_go() {
        let (a, b): (NodeId, NodeId) = (1, 2);
        let mut held = HeldFlags::default();
        assert!(held.raise(a, 10, Reason::Idle, 5));
        assert!(!held.raise(a, 10, Reason::Idle, 9), "held already");
        assert!(held.raise(a, 10, Reason::Deaf, 7));
        assert!(held.raise(b, 11, Reason::Zombie, 8));
        assert_eq!(held.of(a)[0].since, 5, "the first since is kept");
        assert_eq!(held.clear(a, Reason::Idle), Some(10));
        assert_eq!(held.clear(a, Reason::Idle), None, "cleared once");
        assert!(held.holds(a, Reason::Deaf));
        assert_eq!(held.clear(a, Reason::Deaf), Some(10));
        assert_eq!(
            held.by_node().len(),
            1,
            "a process holding nothing is let go"
        );
        held.clear_everything();
        assert_eq!(held.iter().count(), 0);
    }
}
