//! Where the graph's nodes live: a slab, so that a node is found by its id with one index and
//! one comparison instead of a hash lookup, and stays where it was put (no rehash moves a
//! 300-byte node). A [`NodeId`] is the node's creation number in its high 32 bits, so ids
//! still sort by age, and its slot in the low 32 bits; a freed slot is reused by a later node,
//! whose id differs, so an id held after its node was pruned finds nothing.
//!
//! Beside the nodes, two small tables say what a round asks of every node without reading
//! one: which id each slot holds (8 bytes a slot, where a node is some 300: whether the graph
//! still holds an id is one warm read, not a cold node's), and which slots hold a live
//! process (a bit each: the live processes are found without walking the ten thousand
//! retained dead ones a day-long audit keeps).
use bit_set::BitSet;

use super::{Node, NodeId};

const SLOT_BITS: u32 = 32;
const SLOT_MASK: u64 = (1 << SLOT_BITS) - 1;

fn slot_of(id: NodeId) -> usize {
    (id & SLOT_MASK) as usize
}

/// The nodes of the graph, by id.
pub struct Nodes {
    slots: Vec<Option<Node>>,
    /// The id of each slot's node; 0 (no id) for a free slot.
    ids: Vec<NodeId>,
    /// The slots whose node is alive (not exited; see [`Nodes::exited`]).
    live: BitSet,
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
            ids: Vec::new(),
            live: BitSet::new(),
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
        let (id, alive) = (node.id, node.alive());
        if self.free.last().is_some_and(|&f| f as usize == slot) {
            self.free.pop();
            self.slots[slot] = Some(node);
            self.ids[slot] = id;
        } else {
            self.slots.push(Some(node));
            self.ids.push(id);
        }
        // A free slot's bit was cleared when its node was removed, and a new slot has none.
        if alive {
            self.live.insert(slot);
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
        // 0 marks a free slot, and is no node's id.
        id != 0 && self.ids.get(slot_of(id)) == Some(&id)
    }

    /// Node `id` exited: no longer among the live ones (see [`Nodes::alive`]). The one way a
    /// node stops being alive (a node never comes back to life).
    pub fn exited(&mut self, id: NodeId) {
        if self.contains(id) {
            self.live.remove(slot_of(id));
        }
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
        let slot = slot_of(id);
        self.ids[slot] = 0;
        self.live.remove(slot);
        self.free.push(slot as u32);
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

    /// The live nodes, in slot order (as [`Nodes::values`] has them), without reading a dead
    /// one. Each is checked alive as well: an exit is told by [`Nodes::exited`].
    pub fn alive(&self) -> impl Iterator<Item = &Node> {
        self.live
            .iter()
            .filter_map(|slot| self.slots[slot].as_ref())
            .filter(|n| n.alive())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lineage::graph::{ExitInfo, LineageGraph};

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

    #[test]
    fn the_live_nodes_are_found_by_their_bits_as_a_walk_of_every_node_finds_them() {
        let mut graph = LineageGraph::new(0);
        let mut nodes = Nodes::default();
        let mut ids = Vec::new();
        // Three words of bits, the last one partly used.
        for pid in 0..150 {
            let id = nodes.next_id();
            nodes.insert(graph.blank_for_test(id, pid));
            ids.push(id);
        }
        let walked = |nodes: &Nodes| -> Vec<NodeId> {
            (nodes.values().filter(|n| n.alive()))
                .map(|n| n.id)
                .collect()
        };
        let found = |nodes: &Nodes| -> Vec<NodeId> { nodes.alive().map(|n| n.id).collect() };
        assert_eq!(found(&nodes), ids);
        // Some exit, some of those are pruned, and their slots go to new, live nodes.
        for &id in ids.iter().step_by(3) {
            nodes.get_mut(id).unwrap().exited = Some(ExitInfo {
                ts: 1,
                status: None,
            });
            nodes.exited(id);
        }
        for &id in ids.iter().step_by(6) {
            assert!(nodes.remove(id));
            assert!(!nodes.contains(id));
        }
        for pid in 200..210 {
            let id = nodes.next_id();
            nodes.insert(graph.blank_for_test(id, pid));
        }
        assert_eq!(found(&nodes), walked(&nodes));
        assert_eq!(found(&nodes).len(), 150 - 50 + 10);
        // An id the graph no longer holds is told no longer alive to no effect.
        nodes.exited(ids[0]);
        assert_eq!(found(&nodes), walked(&nodes));
        assert!(ids.iter().skip(1).step_by(3).all(|&id| nodes.contains(id)));
        assert!(
            !nodes.contains(0),
            "0 is no id, though a free slot holds it"
        );
        assert_eq!(Nodes::default().alive().count(), 0, "an empty slab");
        // Exactly one word of bits, its last slot live.
        let mut word = Nodes::default();
        for pid in 0..64 {
            let id = word.next_id();
            word.insert(graph.blank_for_test(id, pid));
        }
        assert_eq!(word.alive().count(), 64);
        assert_eq!(word.alive().last().map(|n| n.pid), Some(63));
    }
}
