//! One look at one process and what it found (a `Sample`, with an `FdFact` a pipe, socket or
//! pty): its /proc facts, each channel's other end asked of the fd itself through a pidfd, a
//! UNIX socket's peer asked of the kernel (sock_diag), and any other socket's kind (and a TCP
//! connection's other end on this host) read from its network namespace's tables.
use crate::identity::{self, PidRef, ProcessId};
use crate::procfs;
use crate::procfs::facts::{self, Blocked, End, FdKind, OpenFd};
use crate::procfs::sockets::{NetTables, SocketKind};
use crate::sockdiag::{SockDiag, UnixPeer};
use crate::text::Comm;

/// One pipe, socket or terminal fd of a sampled process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FdFact {
    pub fd: OpenFd,
    /// Whether the other end is open (see [`identity::pidfd::PidFd::other_end_open`]); `None`: unknown.
    pub other_end_open: Option<bool>,
    /// A connected UNIX socket's peer, or a TCP connection's other end on this host (the other
    /// end's inode).
    pub peer_inode: Option<u64>,
    /// A socket's kind; `None` when it could not be told.
    pub socket: Option<SocketKind>,
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

    /// A pipe read end whose writers are all gone, a socket whose peer closed or shut down, or
    /// a pty whose other side is gone (a slave hung up, a master whose slaves all closed).
    pub fn eof_pending(&self) -> bool {
        self.fds.iter().any(|f| {
            let reads = matches!(f.fd.kind, FdKind::Socket | FdKind::Pty) || f.fd.end == End::Read;
            f.is_channel() && reads && f.other_end_open == Some(false)
        })
    }
}

/// Reads processes' facts: /proc, their fds through a pidfd, socket peers from the kernel.
#[derive(Default)]
pub struct Sampler {
    /// Opened at the first socket; `None` after it could not be (peers then stay unknown).
    diag: Option<Option<SockDiag>>,
    /// What to tell the operator (why socket peers stay unknown), until taken.
    notes: Vec<String>,
}

impl Sampler {
    /// What the operator is to be told, once each.
    pub fn take_notes(&mut self) -> Vec<String> {
        std::mem::take(&mut self.notes)
    }

    /// Samples the process `id` while its pid still names it; with `exe`, the program it runs
    /// too, put there as /proc names it (links resolved; none when /proc could not say). A
    /// socket's peer is taken from `before` (its previous sample) when the socket is the same.
    pub fn sample(
        &mut self,
        id: ProcessId,
        before: Option<&Sample>,
        exe: Option<&mut Option<Box<[u8]>>>,
    ) -> Option<Sample> {
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
        // The counters before the channels: a read of EOF moves them, and the close that caused
        // it is then already visible below, so a look never takes a server's last read of a
        // closed pipe for data moved while its peer still looked open.
        let io = facts::read_io(pid);
        if let Some(exe) = exe {
            *exe = procfs::read_exe(pid).map(Into::into);
        }
        // Read once per look, and only if a socket is not a UNIX one sock_diag knows.
        let mut tables = None;
        let fds = facts::read_fds(pid)?
            .into_iter()
            .map(|fd| {
                let socket = fd.kind == FdKind::Socket;
                let other_end_open = match (fd.kind, &pidfd) {
                    (FdKind::Pipe | FdKind::Socket | FdKind::Pty, Some(pidfd)) => {
                        pidfd.other_end_open(fd.fd, fd.end, socket)
                    }
                    _ => None,
                };
                let (kind, peer_inode) = match (socket, fd.inode) {
                    (true, Some(inode)) => self.socket_of(pid, inode, before, &mut tables),
                    _ => (None, None),
                };
                FdFact {
                    fd,
                    other_end_open,
                    peer_inode,
                    socket: kind,
                    internal: false,
                }
            })
            .collect();
        let mut s = Sample {
            pid,
            comm: stat.comm,
            state: stat.state,
            rss_kib: None, // read for evidence only
            io,
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

    /// The kind of socket `inode` and its other end's inode: a UNIX socket's peer from
    /// sock_diag, any other socket from `pid`'s network namespace's tables (read into
    /// `tables` once per look). A socket seen in `before` keeps what was found then (a
    /// connected socket's other end never changes).
    fn socket_of(
        &mut self,
        pid: u32,
        inode: u64,
        before: Option<&Sample>,
        tables: &mut Option<NetTables>,
    ) -> (Option<SocketKind>, Option<u64>) {
        let known = before.and_then(|b| {
            b.fds
                .iter()
                .find(|f| f.fd.inode == Some(inode) && f.fd.kind == FdKind::Socket)
        });
        if let Some(f) = known {
            return (f.socket, f.peer_inode);
        }
        let notes = &mut self.notes;
        let diag = self
            .diag
            .get_or_insert_with(|| {
                SockDiag::open()
                    .inspect_err(|e| notes.push(format!("warning: {e}; socket peers stay unknown")))
                    .ok()
            })
            .as_mut();
        match diag.map(|d| d.unix_peer(inode)) {
            Some(Ok(UnixPeer::Connected(peer))) => return (Some(SocketKind::Unix), Some(peer)),
            Some(Ok(UnixPeer::None)) => return (Some(SocketKind::Unix), None),
            _ => {}
        }
        // Not a UNIX socket of reaper-trace's namespace: TCP, UDP, netlink..., or a UNIX
        // socket of another namespace (a container's), which its own tables list.
        let kind = tables
            .get_or_insert_with(|| NetTables::read(pid))
            .kind(inode);
        let peer = match kind {
            SocketKind::Tcp { peer, .. } => peer,
            _ => None,
        };
        (Some(kind), peer)
    }
}
