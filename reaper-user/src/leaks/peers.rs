//! Who holds the other end of a pipe, socket or pty: an index from channels to the processes
//! and fds that hold them. Both ends of a pipe are one inode (the holders of the opposite end
//! are the peers); the two ends of a UNIX socket pair are two inodes (the holders of the peer's
//! inode, which the kernel names, are the peers); a pty is one index (the holders of the
//! master are a slave's peers, and the other way round).
//!
//! The tracked processes and the gateways are indexed first (they are read anyway, and nearly
//! every peer is one of them). An inode still unresolved after that is looked up by a scan of
//! every process in /proc, at most once per `full_scan_every`: such a scan reads every fd of
//! the machine, which is cheap once in a while and costly every second.
use std::time::{Duration, Instant};

use bit_set::BitSet;
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use super::FdFact;
use crate::procfs;
use crate::procfs::facts::{End, FdKind, OpenFd, read_fds};
use crate::text::Comm;

/// Pids, a bit each (pids are below `pid_max`: 4 KiB at 32,768, 512 KiB at the kernel's
/// largest). The set of every live pid the graph holds is made at each `why` and each round's
/// new flags, on the reader's thread, and asked of only by a scan of /proc: at 10,000 live
/// processes a hash set's inserts took 0.3 ms.
#[derive(Default)]
pub struct PidSet(BitSet);

impl PidSet {
    pub fn contains(&self, pid: u32) -> bool {
        self.0.contains(pid as usize)
    }
}

/// Every pid in, but one no process can have (a damaged kept state's): left out, a scan of
/// /proc reads it like any process the graph does not know, and the set stays within 512 KiB.
impl FromIterator<u32> for PidSet {
    fn from_iter<I: IntoIterator<Item = u32>>(pids: I) -> PidSet {
        let possible = pids.into_iter().filter(|&pid| pid < procfs::PID_MAX_LIMIT);
        PidSet(possible.map(|pid| pid as usize).collect())
    }
}

/// One process's hold on an inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Holder {
    pub pid: u32,
    pub fd: u32,
    pub end: End,
    pub comm: Comm,
}

/// What the index is keyed by: a pipe's or socket's inode, or a pty's index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChannelKey {
    Inode(u64),
    Pty(u32),
}

impl ChannelKey {
    /// The channel an fd is part of, if it is a pipe, socket or pty.
    pub fn of(f: &OpenFd) -> Option<ChannelKey> {
        match f.kind {
            FdKind::Pipe | FdKind::Socket => f.inode.map(ChannelKey::Inode),
            FdKind::Pty => f.pty.map(ChannelKey::Pty),
            _ => None,
        }
    }
}

/// The holders of each channel.
#[derive(Default)]
pub struct PeerIndex {
    holders: HashMap<ChannelKey, Vec<Holder>>,
    /// When the last scan of every process ran.
    full_at: Option<Instant>,
}

impl PeerIndex {
    /// Starts a fresh round (facts from an earlier one may be stale).
    pub fn clear(&mut self) {
        self.holders.clear();
    }

    /// Adds the pipes, sockets and ptys of one process.
    pub fn add(&mut self, pid: u32, comm: Comm, fds: &[OpenFd]) {
        for f in fds {
            let Some(key) = ChannelKey::of(f) else {
                continue;
            };
            let list = self.holders.entry(key).or_default();
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

    /// The channel the other end of `fact` is in: the pipe's or pty's own, a socket's peer's.
    pub fn other_key(fact: &FdFact) -> Option<ChannelKey> {
        match fact.fd.kind {
            FdKind::Socket => fact.peer_inode.map(ChannelKey::Inode),
            _ => ChannelKey::of(&fact.fd),
        }
    }

    /// The holders of the other end of the pipe, socket or pty `fact` of process `pid` (other
    /// processes only): the writers of a read end, the readers of a write end, the holders of
    /// a socket's peer, a pty master's slaves and a slave's master.
    pub fn peers(&self, fact: &FdFact, pid: u32) -> Vec<Holder> {
        let Some(key) = Self::other_key(fact) else {
            return Vec::new();
        };
        let socket = fact.fd.kind == FdKind::Socket;
        let end = fact.fd.end;
        let other_end = |h: &&Holder| match end {
            _ if socket => true,
            End::Read => h.end.writes(),
            End::Write => h.end.reads(),
            End::Both => true,
            End::Master => h.end == End::Slave,
            End::Slave => h.end == End::Master,
        };
        self.holders
            .get(&key)
            .map(|l| {
                l.iter()
                    .filter(|h| h.pid != pid)
                    .filter(other_end)
                    .copied()
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Scans every process in /proc for `wanted` channels, unless a scan ran less than `every`
    /// ago. Returns whether it scanned. Processes already indexed (`known`) are skipped.
    pub fn full_scan(
        &mut self,
        wanted: &HashSet<ChannelKey>,
        known: &PidSet,
        every: Duration,
    ) -> bool {
        if wanted.is_empty() || self.full_at.is_some_and(|t| t.elapsed() < every) {
            return false;
        }
        self.full_at = Some(Instant::now());
        for pid in procfs::all_pids().unwrap_or_default() {
            if known.contains(pid) {
                continue;
            }
            let Some(fds) = read_fds(pid) else { continue };
            let wanted_fd = |f: &OpenFd| ChannelKey::of(f).is_some_and(|k| wanted.contains(&k));
            if !fds.iter().any(wanted_fd) {
                continue;
            }
            let comm = procfs::read_stat(pid).map(|s| s.comm).unwrap_or_default();
            let relevant: Vec<OpenFd> = fds.into_iter().filter(wanted_fd).collect();
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
            pty: None,
        }
    }

    fn fact(f: OpenFd) -> FdFact {
        FdFact {
            fd: f,
            other_end_open: Some(true),
            peer_inode: None,
            socket: None,
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
            pty: None,
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
        // A pty's slave has the master's holders as peers, and the other way round.
        let pty = |fd, end| OpenFd {
            fd,
            kind: FdKind::Pty,
            inode: None,
            end,
            pty: Some(3),
        };
        idx.add(50, Comm::from_c(b"bridge"), &[pty(9, End::Master)]);
        idx.add(60, Comm::from_c(b"worker"), &[pty(0, End::Slave)]);
        idx.add(61, Comm::from_c(b"sibling"), &[pty(0, End::Slave)]);
        let of = |pid, f| -> Vec<u32> { idx.peers(&fact(f), pid).iter().map(|h| h.pid).collect() };
        assert_eq!(
            of(60, pty(0, End::Slave)),
            [50],
            "not its sibling on the same slave"
        );
        assert_eq!(of(50, pty(9, End::Master)), [60, 61]);
    }

    #[test]
    fn a_pid_set_holds_what_was_put_in_it_and_nothing_else() {
        let set: PidSet = [1, 63, 64, 32_767, 4_194_303].into_iter().collect();
        for pid in [1, 63, 64, 32_767, 4_194_303] {
            assert!(set.contains(pid), "{pid}");
        }
        for pid in [0, 2, 62, 65, 32_766, 4_194_302, 4_194_304, u32::MAX] {
            assert!(!set.contains(pid), "{pid}");
        }
        let past: PidSet = [u32::MAX].into_iter().collect();
        assert!(
            past.0.get_ref().is_empty(),
            "no pid is that large: nothing held for it"
        );
        assert!(!PidSet::default().contains(0));
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
        let wanted: HashSet<ChannelKey> = [ChannelKey::Inode(inode)].into_iter().collect();
        assert!(idx.full_scan(&wanted, &PidSet::default(), Duration::from_secs(60)));
        let holders = idx.peers(&fact(fd(fds[0] as u32, inode, End::Read)), 0);
        assert!(
            holders.iter().any(|h| h.pid == me && h.end == End::Write),
            "{holders:?}"
        );
        assert!(!idx.full_scan(&wanted, &PidSet::default(), Duration::from_secs(60)));
        // SAFETY: closing our own fds.
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
    }
}
