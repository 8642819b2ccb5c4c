//! Where the graph's nodes live: a slab, so that a node is found by its id with one index and
//! one comparison instead of a hash lookup, and stays where it was put (no rehash moves a
//! 300-byte node). A [`NodeId`] is the node's creation number in its high 32 bits, so ids
//! still sort by age, and its slot in the low 32 bits; a freed slot is reused by a later node,
//! whose id differs, so an id held after its node was pruned finds nothing.
use super::{Node, NodeId};

const SLOT_BITS: u32 = 32;
const SLOT_MASK: u64 = (1 << SLOT_BITS) - 1;

fn slot_of(id: NodeId) -> usize {
    (id & SLOT_MASK) as usize
}

/// The nodes of the graph, by id.
pub struct Nodes {
    slots: Vec<Option<Node>>,
    /// Slots freed by pruning, reused last-freed first.
    free: Vec<u32>,
    len: usize,
    /// The next node's creation number (from 1: no id is 0).
    created: u64,
}

impl Default for Nodes {
    fn default() -> Self {
        Nodes {
            slots: Vec::new(),
            // In a steady stream one slot is freed per node pruned and taken by the next
            // node: room for a few, so that the first prune allocates nothing.
            free: Vec::with_capacity(64),
            len: 0,
            created: 1,
        }
    }
}

impl Nodes {
    /// The id the next inserted node must carry.
    pub fn next_id(&self) -> NodeId {
        let slot = self.free.last().copied().unwrap_or(self.slots.len() as u32);
        (self.created << SLOT_BITS) | u64::from(slot)
    }

    /// Stores `node`, whose id is [`Nodes::next_id`].
    pub fn insert(&mut self, node: Node) {
        debug_assert_eq!(node.id, self.next_id(), "a node is made for the next id");
        let slot = slot_of(node.id);
        if self.free.last().is_some_and(|&f| f as usize == slot) {
            self.free.pop();
            self.slots[slot] = Some(node);
        } else {
            self.slots.push(Some(node));
        }
        self.created += 1;
        self.len += 1;
    }

    pub fn get(&self, id: NodeId) -> Option<&Node> {
        self.slots.get(slot_of(id))?.as_ref().filter(|n| n.id == id)
    }

    pub fn get_mut(&mut self, id: NodeId) -> Option<&mut Node> {
        self.slots
            .get_mut(slot_of(id))?
            .as_mut()
            .filter(|n| n.id == id)
    }

    pub fn contains(&self, id: NodeId) -> bool {
        self.get(id).is_some()
    }

    /// Drops node `id` where it lies (a node is not moved out only to be dropped); its slot
    /// goes to a later node. Returns whether it was there.
    pub fn remove(&mut self, id: NodeId) -> bool {
        let Some(slot) = self.slots.get_mut(slot_of(id)) else {
            return false;
        };
        if slot.as_ref().is_none_or(|n| n.id != id) {
            return false;
        }
        *slot = None;
        self.free.push(slot_of(id) as u32);
        self.len -= 1;
        true
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn values(&self) -> impl Iterator<Item = &Node> {
        self.slots.iter().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lineage::graph::LineageGraph;

    #[test]
    fn a_pruned_nodes_id_finds_nothing_once_its_slot_is_reused() {
        let mut graph = LineageGraph::new(0);
        let mut nodes = Nodes::default();
        let first = nodes.next_id();
        assert_ne!(first, 0, "no id is 0");
        nodes.insert(graph.blank_for_test(first, 10));
        let second = nodes.next_id();
        nodes.insert(graph.blank_for_test(second, 11));
        assert!(second > first, "ids sort by creation");
        assert!(nodes.remove(first));
        assert!(!nodes.remove(first), "removed once");
        let third = nodes.next_id();
        assert_eq!(slot_of(third), slot_of(first), "the freed slot is reused");
        nodes.insert(graph.blank_for_test(third, 12));
        assert!(nodes.get(first).is_none(), "the old id names nothing");
        assert_eq!(nodes.get(third).map(|n| n.pid), Some(12));
        assert_eq!(nodes.len(), 2);
        assert_eq!(nodes.values().count(), 2);
    }
}
