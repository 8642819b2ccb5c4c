//! Which processes each stack the kernel keeps spawned, so a stack no process of the graph
//! names any more is freed in the kernel: a day-long audit's stores hold what its flags can
//! still name, not every stack since the start.
use rustc_hash::FxHashMap as HashMap;
use std::hash::Hash;

use crate::lineage::graph::NodeId;

/// The processes spawned by each kept stack, by the stack's key in its kernel map.
pub struct Referrers<K> {
    /// A list, not a set: noting is a push on every fork from a site (a set's insert into
    /// thousands of retained children was a cold hash table's, per fork); the lists are
    /// filtered on the scan's timer, and a process noted twice is held or dropped twice.
    by_stack: HashMap<K, Vec<NodeId>>,
}

impl<K> Default for Referrers<K> {
    fn default() -> Self {
        Referrers {
            by_stack: HashMap::default(),
        }
    }
}

impl<K: Hash + Eq + Copy> Referrers<K> {
    /// Notes that stack `key` spawned process `child`.
    pub fn note(&mut self, key: K, child: NodeId) {
        self.by_stack.entry(key).or_default().push(child);
    }

    /// Forgets the processes the graph no longer holds; returns the stacks that spawned none
    /// of those it does (to free).
    pub fn retain(&mut self, holds: impl Fn(NodeId) -> bool) -> Vec<K> {
        let mut unnamed = Vec::new();
        self.by_stack.retain(|&key, children| {
            children.retain(|&c| holds(c));
            if children.is_empty() {
                unnamed.push(key);
            }
            !children.is_empty()
        });
        unnamed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stack_is_freed_once_no_process_it_spawned_is_held() {
        let mut r = Referrers::<u32>::default();
        let (a, b): (NodeId, NodeId) = (1, 2);
        r.note(7, a);
        r.note(7, b);
        r.note(9, b);
        assert!(r.retain(|n| n == a || n == b).is_empty());
        let mut freed = r.retain(|n| n == a);
        freed.sort();
        assert_eq!(freed, vec![9]);
        assert_eq!(r.retain(|_| false), vec![7]);
        assert!(r.retain(|_| false).is_empty(), "freed once");
    }
}
