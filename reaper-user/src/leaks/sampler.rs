//! One look at one process and what it found (a `Sample`, with an `FdFact` a pipe or socket):
//! its /proc facts, each pipe's and socket's other end asked of the fd itself through a pidfd,
//! and a UNIX socket's peer asked of the kernel (sock_diag).
use crate::identity::{self, PidRef, ProcessId};
use crate::procfs::facts::{self, Blocked, End, FdKind, OpenFd};
use crate::sockdiag::{SockDiag, UnixPeer};
use crate::text::Comm;

/// One pipe, socket or terminal fd of a sampled process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FdFact {
    pub fd: OpenFd,
    /// Whether the other end is open (see [`identity::pidfd::PidFd::other_end_open`]); `None`: unknown.
    pub other_end_open: Option<bool>,
    /// A connected UNIX socket's peer (the other end's inode).
    pub peer_inode: Option<u64>,
    /// Both ends are held by this process alone (see [`super::channels`]).
    pub internal: bool,
}

/// What one sample of a process found.
#[derive(Clone, Debug, Default)]
pub struct Sample {
    pub pid: u32,
    /// Its name now (a process may rename itself after exec).
    pub comm: Comm,
    /// `/proc/PID/stat` state letter (R, S, D, T, Z...).
    pub state: u8,
    pub rss_kib: Option<u64>,
    pub io: Option<[u64; 4]>,
    pub blocked: Option<Blocked>,
    pub fds: Vec<FdFact>,
}

impl Sample {
    /// Holds a pipe or socket to another process (internal ones do not count).
    pub fn holds_channel(&self) -> bool {
        self.fds.iter().any(FdFact::is_channel)
    }

    pub fn waits_for_input(&self) -> bool {
        self.state == b'S' && matches!(self.blocked, Some(Blocked::WaitingForInput { .. }))
    }

    /// Channels whose other end some live process still holds.
    pub fn has_live_peer(&self) -> bool {
        self.fds
            .iter()
            .any(|f| f.is_channel() && f.other_end_open == Some(true))
    }

    /// A pipe read end whose writers are all gone, or a socket whose peer closed or shut down.
    pub fn eof_pending(&self) -> bool {
        self.fds.iter().any(|f| {
            let reads = f.fd.kind == FdKind::Socket || f.fd.end == End::Read;
            f.is_channel() && reads && f.other_end_open == Some(false)
        })
    }
}

/// Reads processes' facts: /proc, their fds through a pidfd, socket peers from the kernel.
#[derive(Default)]
pub struct Sampler {
    /// Opened at the first socket; `None` after it could not be (peers then stay unknown).
    diag: Option<Option<SockDiag>>,
}

impl Sampler {
    /// Samples the process `id` while its pid still names it. A socket's peer is taken from
    /// `before` (its previous sample) when the socket is the same.
    pub fn sample(&mut self, id: ProcessId, before: Option<&Sample>) -> Option<Sample> {
        // Without the host's pid namespace no pidfd can name it (`--proc-root`): its /proc is
        // read between two checks of its start time instead, and the other end of a channel
        // is left unknown (the peers found in /proc still are known).
        let (pidfd, stat) = match identity::own_pids_are_hosts() {
            true => PidRef::open(id)
                .ok()
                .map(|(h, stat)| (Some(h.pidfd), stat))?,
            false => (None, id.still_same()?),
        };
        let pid = id.pid;
        let fds = facts::read_fds(pid)?
            .into_iter()
            .map(|fd| {
                let socket = fd.kind == FdKind::Socket;
                let other_end_open = match (fd.kind, &pidfd) {
                    (FdKind::Pipe | FdKind::Socket, Some(pidfd)) => {
                        pidfd.other_end_open(fd.fd, fd.end, socket)
                    }
                    _ => None,
                };
                let peer_inode = match (socket, fd.inode) {
                    (true, Some(inode)) => self.peer_of(inode, before),
                    _ => None,
                };
                FdFact {
                    fd,
                    other_end_open,
                    peer_inode,
                    internal: false,
                }
            })
            .collect();
        let mut s = Sample {
            pid,
            comm: stat.comm,
            state: stat.state,
            rss_kib: None, // read for evidence only
            io: facts::read_io(pid),
            blocked: None,
            fds,
        };
        // What its threads are blocked in matters only to `idle`: read it only then. (Internal
        // channels are not marked yet: a live one may make this read needlessly, never miss.)
        if s.state == b'S' && s.has_live_peer() {
            s.blocked = facts::read_blocked(pid);
        }
        if pidfd.is_none() && id.still_same().is_none() {
            return None; // the pid may have named another process for some of the reads
        }
        Some(s)
    }

    /// The peer of UNIX socket `inode` (a connected socket's peer never changes).
    fn peer_of(&mut self, inode: u64, before: Option<&Sample>) -> Option<u64> {
        let known = before.and_then(|b| {
            b.fds
                .iter()
                .find(|f| f.fd.inode == Some(inode) && f.fd.kind == FdKind::Socket)
        });
        if let Some(f) = known {
            return f.peer_inode;
        }
        let diag = self
            .diag
            .get_or_insert_with(|| {
                SockDiag::open()
                    .inspect_err(|e| {
                        eprintln!("reaper-trace: warning: {e}; socket peers stay unknown")
                    })
                    .ok()
            })
            .as_mut()?;
        match diag.unix_peer(inode) {
            Ok(UnixPeer::Connected(peer)) => Some(peer),
            _ => None,
        }
    }
}
