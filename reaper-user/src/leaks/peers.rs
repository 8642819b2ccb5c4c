//! Who holds the other end of a pipe or socket: an index from inodes to the processes and fds
//! that hold them. Both ends of a pipe are one inode (the holders of the opposite end are the
//! peers); the two ends of a UNIX socket pair are two inodes (the holders of the peer's inode,
//! which the kernel names, are the peers).
//!
//! The tracked processes and the gateways are indexed first (they are read anyway, and nearly
//! every peer is one of them). An inode still unresolved after that is looked up by a scan of
//! every process in /proc, at most once per `full_scan_every`: such a scan reads every fd of
//! the machine, which is cheap once in a while and costly every second.
use std::time::{Duration, Instant};

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use super::FdFact;
use crate::procfs;
use crate::procfs::facts::{End, FdKind, OpenFd, read_fds};
use crate::text::Comm;

/// One process's hold on an inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Holder {
    pub pid: u32,
    pub fd: u32,
    pub end: End,
    pub comm: Comm,
}

/// The holders of each inode.
#[derive(Default)]
pub struct PeerIndex {
    holders: HashMap<u64, Vec<Holder>>,
    /// When the last scan of every process ran.
    full_at: Option<Instant>,
}

impl PeerIndex {
    /// Starts a fresh round (facts from an earlier one may be stale).
    pub fn clear(&mut self) {
        self.holders.clear();
    }

    /// Adds the pipes and sockets of one process.
    pub fn add(&mut self, pid: u32, comm: Comm, fds: &[OpenFd]) {
        for f in fds {
            let Some(inode) = f.inode else { continue };
            if !matches!(f.kind, FdKind::Pipe | FdKind::Socket) {
                continue;
            }
            let list = self.holders.entry(inode).or_default();
            let holder = Holder {
                pid,
                fd: f.fd,
                end: f.end,
                comm,
            };
            if !list.contains(&holder) {
                list.push(holder);
            }
        }
    }

    /// The inode the other end of `fact` is: the pipe's own, a socket's peer's.
    pub fn other_inode(fact: &FdFact) -> Option<u64> {
        match fact.fd.kind {
            FdKind::Socket => fact.peer_inode,
            _ => fact.fd.inode,
        }
    }

    /// The holders of the other end of the pipe or socket `fact` of process `pid` (other
    /// processes only): the writers of a read end, the readers of a write end, the holders of
    /// a socket's peer.
    pub fn peers(&self, fact: &FdFact, pid: u32) -> Vec<Holder> {
        let Some(inode) = Self::other_inode(fact) else {
            return Vec::new();
        };
        let socket = fact.fd.kind == FdKind::Socket;
        let end = fact.fd.end;
        let other_end = |h: &&Holder| match end {
            _ if socket => true,
            End::Read => h.end.writes(),
            End::Write => h.end.reads(),
            End::Both => true,
        };
        self.holders
            .get(&inode)
            .map(|l| {
                l.iter()
                    .filter(|h| h.pid != pid)
                    .filter(other_end)
                    .copied()
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Scans every process in /proc for `wanted` inodes, unless a scan ran less than `every`
    /// ago. Returns whether it scanned. Processes already indexed (`known`) are skipped.
    pub fn full_scan(
        &mut self,
        wanted: &HashSet<u64>,
        known: &HashSet<u32>,
        every: Duration,
    ) -> bool {
        if wanted.is_empty() || self.full_at.is_some_and(|t| t.elapsed() < every) {
            return false;
        }
        self.full_at = Some(Instant::now());
        for pid in procfs::all_pids().unwrap_or_default() {
            if known.contains(&pid) {
                continue;
            }
            let Some(fds) = read_fds(pid) else { continue };
            if !fds
                .iter()
                .any(|f| f.inode.is_some_and(|i| wanted.contains(&i)))
            {
                continue;
            }
            let comm = procfs::read_stat(pid).map(|s| s.comm).unwrap_or_default();
            let relevant: Vec<OpenFd> = fds
                .into_iter()
                .filter(|f| f.inode.is_some_and(|i| wanted.contains(&i)))
                .collect();
            self.add(pid, comm, &relevant);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fd(fd: u32, inode: u64, end: End) -> OpenFd {
        OpenFd {
            fd,
            kind: FdKind::Pipe,
            inode: Some(inode),
            end,
        }
    }

    fn fact(f: OpenFd) -> FdFact {
        FdFact {
            fd: f,
            other_end_open: Some(true),
            peer_inode: None,
            internal: false,
        }
    }

    #[test]
    fn peers_are_the_other_holders() {
        let mut idx = PeerIndex::default();
        idx.add(10, Comm::from_c(b"server"), &[fd(0, 77, End::Read)]);
        idx.add(20, Comm::from_c(b"gateway"), &[fd(5, 77, End::Write)]);
        idx.add(20, Comm::from_c(b"gateway"), &[fd(5, 77, End::Write)]);
        idx.add(30, Comm::from_c(b"co-reader"), &[fd(3, 77, End::Read)]);
        let peers = idx.peers(&fact(fd(0, 77, End::Read)), 10);
        assert_eq!(
            peers.len(),
            1,
            "a co-reader is not the other end: {peers:?}"
        );
        assert_eq!(
            (peers[0].pid, peers[0].fd, peers[0].end),
            (20, 5, End::Write)
        );
        let readers: Vec<u32> = idx
            .peers(&fact(fd(5, 77, End::Write)), 20)
            .iter()
            .map(|h| h.pid)
            .collect();
        assert_eq!(readers, [10, 30]);
        assert!(idx.peers(&fact(fd(0, 99, End::Read)), 10).is_empty());
        // A socket's peers hold the peer's inode, whatever their end.
        let sock = |fd, inode| OpenFd {
            fd,
            kind: FdKind::Socket,
            inode: Some(inode),
            end: End::Both,
        };
        idx.add(40, Comm::from_c(b"host"), &[sock(41, 501)]);
        let mut server = fact(sock(0, 500));
        server.peer_inode = Some(501);
        let host: Vec<_> = idx
            .peers(&server, 10)
            .iter()
            .map(|h| (h.pid, h.fd))
            .collect();
        assert_eq!(host, [(40, 41)]);
    }

    #[test]
    fn full_scan_finds_an_untracked_holder_and_is_rate_limited() {
        let mut fds = [0; 2];
        // SAFETY: valid array for pipe(2).
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let me = std::process::id();
        let mine = read_fds(me).unwrap();
        let inode = mine
            .iter()
            .find(|f| f.fd == fds[0] as u32)
            .unwrap()
            .inode
            .unwrap();
        let mut idx = PeerIndex::default();
        let wanted: HashSet<u64> = [inode].into_iter().collect();
        assert!(idx.full_scan(&wanted, &HashSet::default(), Duration::from_secs(60)));
        let holders = idx.peers(&fact(fd(fds[0] as u32, inode, End::Read)), 0);
        assert!(
            holders.iter().any(|h| h.pid == me && h.end == End::Write),
            "{holders:?}"
        );
        assert!(!idx.full_scan(&wanted, &HashSet::default(), Duration::from_secs(60)));
        // SAFETY: closing our own fds.
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
    }
}
