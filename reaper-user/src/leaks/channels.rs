//! Channels between processes, as the leak rules need them: which fds are the two ends of one
//! pipe or socket pair, which channels are a process's own plumbing, and which processes share
//! one end (a server and the wrappers that started it).
//!
//! - A pipe is one inode with a read end and a write end; a connected UNIX socket pair is two
//!   inodes, each the other's peer (asked of the kernel, see [`crate::sockdiag`]).
//! - **Internal**: a channel whose ends are all held by one process alone (libuv's signal and
//!   async pipes in every Node process, asyncio's self-pipe, a self-pipe for signals). It
//!   connects the process to nobody, so it never makes a rule hold.
//! - **Shared end**: `npx` runs `npm exec` → `sh -c` → `node server.js`, each inheriting the
//!   host's socket as its stdin and stdout. Processes on one spawn chain holding the same end
//!   of a channel that is not internal are one server (see [`servers`]).
//!
//! Holders are looked for among the watched descendants, the processes that can inherit a
//! descendant's fds. (An unrelated process can get one only by `SCM_RIGHTS` or `pidfd_getfd`.)
use rustc_hash::FxHashMap as HashMap;

use super::FdFact;
use crate::lineage::graph::{LineageGraph, NodeId};
use crate::procfs::facts::{End, FdKind};
use crate::procfs::sockets::SocketKind;

/// One end of a channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EndKey {
    PipeRead(u64),
    PipeWrite(u64),
    /// One socket of a pair (its own inode).
    Socket(u64),
    /// A pty's master or slave side, by the pty's index.
    PtyMaster(u32),
    PtySlave(u32),
}

impl FdFact {
    /// The end of a channel this fd is (none for a terminal, or a FIFO opened for both).
    pub fn this_end(&self) -> Option<EndKey> {
        match (self.fd.kind, self.fd.end, self.fd.pty) {
            (FdKind::Pty, End::Master, Some(n)) => return Some(EndKey::PtyMaster(n)),
            (FdKind::Pty, End::Slave, Some(n)) => return Some(EndKey::PtySlave(n)),
            _ => {}
        }
        let inode = self.fd.inode?;
        match (self.fd.kind, self.fd.end) {
            (FdKind::Pipe, End::Read) => Some(EndKey::PipeRead(inode)),
            (FdKind::Pipe, End::Write) => Some(EndKey::PipeWrite(inode)),
            (FdKind::Socket, _) => Some(EndKey::Socket(inode)),
            _ => None,
        }
    }

    /// The end at the other side: the write end of a read end, a socket's peer.
    pub fn other_end(&self) -> Option<EndKey> {
        match self.this_end()? {
            EndKey::PipeRead(i) => Some(EndKey::PipeWrite(i)),
            EndKey::PipeWrite(i) => Some(EndKey::PipeRead(i)),
            EndKey::Socket(_) => self.peer_inode.map(EndKey::Socket),
            EndKey::PtyMaster(n) => Some(EndKey::PtySlave(n)),
            EndKey::PtySlave(n) => Some(EndKey::PtyMaster(n)),
        }
    }

    /// A pipe, socket or pty that connects this process to another one (or may: unknown
    /// counts).
    pub fn is_channel(&self) -> bool {
        let connects = match self.fd.kind {
            FdKind::Pipe | FdKind::Pty => true,
            // A connection to another host, UDP, raw and netlink sockets are listed in the
            // evidence but tie the process to no process here.
            FdKind::Socket => self.socket.is_none_or(SocketKind::can_be_channel),
            FdKind::Tty | FdKind::Other => false,
        };
        connects && !self.internal
    }
}

/// Which watched processes hold each channel end, kept as their samples change.
#[derive(Default)]
pub struct Holders {
    by_end: HashMap<EndKey, Vec<NodeId>>,
}

impl Holders {
    /// Records that `node` now holds the ends in `now` instead of those in `before`.
    pub fn replace(&mut self, node: NodeId, before: &[FdFact], now: &[FdFact]) {
        self.remove(node, before);
        for key in now.iter().filter_map(FdFact::this_end) {
            let list = self.by_end.entry(key).or_default();
            if !list.contains(&node) {
                list.push(node);
            }
        }
    }

    /// Forgets what `node` held.
    pub fn remove(&mut self, node: NodeId, held: &[FdFact]) {
        for key in held.iter().filter_map(FdFact::this_end) {
            if let Some(list) = self.by_end.get_mut(&key) {
                list.retain(|n| *n != node);
                if list.is_empty() {
                    self.by_end.remove(&key);
                }
            }
        }
    }

    /// The watched processes holding `key`, as their last samples had it.
    pub fn holding(&self, key: EndKey) -> &[NodeId] {
        self.by_end.get(&key).map_or(&[], Vec::as_slice)
    }

    fn held_only_by(&self, key: EndKey, node: NodeId) -> bool {
        self.by_end
            .get(&key)
            .is_none_or(|list| list.iter().all(|n| *n == node))
    }
}

/// Marks each fd of `node` whose channel it alone holds both ends of.
pub fn mark_internal(node: NodeId, fds: &mut [FdFact], holders: &Holders) {
    let held: Vec<EndKey> = fds.iter().filter_map(FdFact::this_end).collect();
    for f in fds.iter_mut() {
        f.internal = match (f.this_end(), f.other_end()) {
            (Some(this), Some(other)) => {
                held.contains(&other)
                    && holders.held_only_by(this, node)
                    && holders.held_only_by(other, node)
            }
            _ => false,
        };
    }
}

/// Whether two processes hold the same end of a channel that is not internal.
pub fn share_an_end(a: &[FdFact], b: &[FdFact]) -> bool {
    a.iter()
        .filter(|f| f.is_channel())
        .filter_map(FdFact::this_end)
        .any(|key| {
            b.iter()
                .filter(|f| f.is_channel())
                .any(|g| g.this_end() == Some(key))
        })
}

/// The server `id` belongs to, as its outermost process: walks up the spawn chain while the
/// spawner is alive, watched (`fds_of` answers) and holds an end `id`'s side holds too. A
/// gateway is never part of a server (it is the other end).
pub fn outermost<'a>(
    graph: &LineageGraph,
    id: NodeId,
    fds_of: impl Fn(NodeId) -> Option<&'a [FdFact]>,
) -> NodeId {
    let mut at = id;
    // Bounded like the graph's own chain walk: a malformed cycle must not hang a scan.
    for _ in 0..4096 {
        let Some(node) = graph.node(at) else { break };
        let Some(up) = node.spawner.and_then(|s| graph.node(s)) else {
            break;
        };
        if !up.alive() || up.is_gateway {
            break;
        }
        let shares = match (fds_of(at), fds_of(up.id)) {
            (Some(mine), Some(theirs)) => share_an_end(mine, theirs),
            _ => false, // one of them not looked at yet
        };
        if !shares {
            break;
        }
        at = up.id;
    }
    at
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::procfs::facts::OpenFd;

    fn fact(fd: u32, kind: FdKind, inode: u64, end: End, peer: Option<u64>) -> FdFact {
        FdFact {
            fd: OpenFd {
                fd,
                kind,
                inode: Some(inode),
                end,
                pty: None,
            },
            other_end_open: Some(true),
            peer_inode: peer,
            socket: None,
            internal: false,
        }
    }

    /// Node's own plumbing: a signal pipe and an async socket pair, both ends in one process.
    fn node_process() -> Vec<FdFact> {
        vec![
            fact(0, FdKind::Socket, 100, End::Both, Some(101)), // stdin from the host
            fact(4, FdKind::Pipe, 7, End::Read, None),
            fact(5, FdKind::Pipe, 7, End::Write, None),
            fact(6, FdKind::Socket, 8, End::Both, Some(9)),
            fact(7, FdKind::Socket, 9, End::Both, Some(8)),
        ]
    }

    #[test]
    fn a_process_holding_both_ends_alone_has_an_internal_channel() {
        let mut fds = node_process();
        let mut holders = Holders::default();
        holders.replace(1, &[], &fds);
        mark_internal(1, &mut fds, &holders);
        let internal: Vec<u32> = fds.iter().filter(|f| f.internal).map(|f| f.fd.fd).collect();
        assert_eq!(internal, [4, 5, 6, 7], "stdin goes to the host");
    }

    #[test]
    fn a_child_sharing_the_pipe_makes_it_a_channel_again() {
        let mut fds = node_process();
        let child = vec![fact(4, FdKind::Pipe, 7, End::Read, None)];
        let mut holders = Holders::default();
        holders.replace(1, &[], &fds);
        holders.replace(2, &[], &child);
        mark_internal(1, &mut fds, &holders);
        assert!(!fds[1].internal && !fds[2].internal, "the child reads it");
        assert!(fds[3].internal && fds[4].internal);
        holders.remove(2, &child);
        mark_internal(1, &mut fds, &holders);
        assert!(fds[1].internal, "the child is gone");
    }

    #[test]
    fn wrappers_share_the_hosts_socket_but_not_their_plumbing() {
        let mut wrapper = node_process();
        let mut server = vec![fact(0, FdKind::Socket, 100, End::Both, Some(101))];
        server.push(fact(4, FdKind::Pipe, 70, End::Read, None));
        server.push(fact(5, FdKind::Pipe, 70, End::Write, None));
        let mut holders = Holders::default();
        holders.replace(1, &[], &wrapper);
        holders.replace(2, &[], &server);
        mark_internal(1, &mut wrapper, &holders);
        mark_internal(2, &mut server, &holders);
        assert!(share_an_end(&wrapper, &server));
        let plumbing_only = |fds: &[FdFact]| {
            fds.iter()
                .filter(|f| f.internal)
                .cloned()
                .collect::<Vec<_>>()
        };
        assert!(!share_an_end(
            &plumbing_only(&wrapper),
            &plumbing_only(&server)
        ));
        // The host holds the other end (socket 101), not the same one.
        let host = vec![fact(40, FdKind::Socket, 101, End::Both, Some(100))];
        assert!(!share_an_end(&host, &server));
        // A pipe's read end and write end are not the same end.
        let reader = vec![fact(0, FdKind::Pipe, 55, End::Read, None)];
        let writer = vec![fact(9, FdKind::Pipe, 55, End::Write, None)];
        assert!(!share_an_end(&reader, &writer));
    }
}
