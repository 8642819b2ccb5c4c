//! The newest node of each pid, found by indexing instead of hashing.
//!
//! The kernel hands pids out in order, so the processes of a burst have neighbouring pids:
//! here their entries sit side by side, where a hash table scatters them over its whole
//! table (every event of a fork storm missed the cache twice in the lookup alone). The table
//! is paged so that a host whose pid_max is 4194304 (systemd's) pays for the pid ranges in
//! use, not for the range: a page of [`PAGE`] pids exists while one of its pids names a node.
//! Emptied pages are kept for the next ones (a few): as pids advance, the range in use moves
//! page by page, and the steady state allocates nothing.
//!
//! No process has a pid past the kernel's limit, but a file can say one (a damaged
//! checkpoint, an audit read back by `--from`): those few are kept in a hash map beside the
//! table, so that an odd number grows nothing but that map, by one entry.
use rustc_hash::FxHashMap;

use super::NodeId;
use crate::procfs::PID_MAX_LIMIT;

const PAGE_BITS: u32 = 6;
/// Pids per page: 64 ids are 512 bytes, eight cache lines.
const PAGE: usize = 1 << PAGE_BITS;

// Clone only so that `vec![None; n]` makes the table (zeroed memory, no page cloned).
#[derive(Clone)]
struct Page {
    /// The node of each pid of the page; 0 (no node's id) for none.
    ids: [NodeId; PAGE],
    used: u32,
}

/// How many emptied pages are kept for reuse.
const SPARE_PAGES: usize = 16;

/// Pid → the newest node with that pid.
pub struct PidIndex {
    /// A slot for each page of [`PAGE`] pids up to the kernel's limit, from the start:
    /// zeroed and untouched, so only the parts whose pids are in use become resident (4 KiB
    /// per 32768 pids), and it never grows.
    pages: Vec<Option<Box<Page>>>,
    /// Emptied pages (all zero), for the next pages needed.
    #[expect(
        clippy::vec_box,
        reason = "a page moves to and from the table without a copy"
    )]
    spare: Vec<Box<Page>>,
    /// The nodes of pids past the table (read from a file, never from the kernel).
    beyond: FxHashMap<u32, NodeId>,
}

impl Default for PidIndex {
    fn default() -> Self {
        PidIndex {
            pages: vec![None; (PID_MAX_LIMIT >> PAGE_BITS) as usize],
            spare: Vec::with_capacity(SPARE_PAGES),
            beyond: FxHashMap::default(),
        }
    }
}

fn split(pid: u32) -> (usize, usize) {
    ((pid >> PAGE_BITS) as usize, pid as usize & (PAGE - 1))
}

impl PidIndex {
    pub fn get(&self, pid: u32) -> Option<NodeId> {
        let (page, slot) = split(pid);
        let Some(page) = self.pages.get(page) else {
            return self.beyond.get(&pid).copied();
        };
        let id = page.as_ref()?.ids[slot];
        (id != 0).then_some(id)
    }

    /// Makes `id` the newest node of `pid`.
    pub fn insert(&mut self, pid: u32, id: NodeId) {
        debug_assert_ne!(id, 0, "no node's id is 0");
        let (page, slot) = split(pid);
        let Some(page) = self.pages.get_mut(page) else {
            self.beyond.insert(pid, id);
            return;
        };
        let spare = &mut self.spare;
        let page = page.get_or_insert_with(|| {
            spare.pop().unwrap_or_else(|| {
                Box::new(Page {
                    ids: [0; PAGE],
                    used: 0,
                })
            })
        });
        if page.ids[slot] == 0 {
            page.used += 1;
        }
        page.ids[slot] = id;
    }

    /// Forgets `pid`'s node; its page goes with its last pid.
    pub fn remove(&mut self, pid: u32) {
        let (index, slot) = split(pid);
        let Some(page) = self.pages.get_mut(index) else {
            self.beyond.remove(&pid);
            return;
        };
        let Some(page) = page else {
            return;
        };
        if page.ids[slot] == 0 {
            return;
        }
        page.ids[slot] = 0;
        page.used -= 1;
        if page.used == 0
            && let Some(empty) = self.pages[index].take()
            && self.spare.len() < SPARE_PAGES
        {
            self.spare.push(empty);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pid_names_its_newest_node_until_removed_and_an_emptied_page_leaves() {
        let mut index = PidIndex::default();
        assert_eq!(index.get(4_194_303), None, "a pid of no page: nothing");
        index.insert(100, 7);
        index.insert(101, 8);
        index.insert(100, 9);
        assert_eq!((index.get(100), index.get(101)), (Some(9), Some(8)));
        assert_eq!(index.get(102), None);
        index.remove(100);
        index.remove(100);
        assert_eq!((index.get(100), index.get(101)), (None, Some(8)));
        index.remove(101);
        assert!(
            index.pages.iter().all(Option::is_none),
            "the emptied page left the table"
        );
        index.insert(4_194_303, 1);
        assert_eq!(index.get(4_194_303), Some(1));
    }

    #[test]
    fn a_pid_past_the_kernels_limit_is_kept_beside_the_table_which_never_grows() {
        let mut index = PidIndex::default();
        let table = index.pages.len();
        for pid in [1 << 22, u32::MAX] {
            assert_eq!(index.get(pid), None);
            index.insert(pid, 5);
            index.insert(pid, 6);
            assert_eq!(index.get(pid), Some(6), "{pid}");
        }
        assert_eq!(index.pages.len(), table, "the table did not grow");
        index.insert(5, 7);
        index.insert((1 << 22) | 5, 8);
        assert_eq!((index.get(5), index.get((1 << 22) | 5)), (Some(7), Some(8)));
        index.remove((1 << 22) | 5);
        assert_eq!(
            index.get(5),
            Some(7),
            "5 and the pid past the limit with 5's low bits are two pids"
        );
        index.remove(5);
        assert!(index.pages.iter().all(Option::is_none));
        index.remove(u32::MAX);
        assert_eq!((index.get(u32::MAX), index.get(1 << 22)), (None, Some(6)));
        index.remove(1 << 22);
        assert!(index.beyond.is_empty());
    }
}
