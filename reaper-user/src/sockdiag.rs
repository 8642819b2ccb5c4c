//! The other end of a UNIX socket, asked of the kernel: `sock_diag` over netlink with
//! `UNIX_DIAG_PEER`, the way `ss -xp` and lsof find it. /proc names a socket only by its own
//! inode (`socket:[ino]`); the two ends of a socket pair are two inodes, and only the kernel
//! knows which two belong together.
//!
//! One request per socket (an exact lookup by inode, not a dump of every socket on the
//! machine); callers keep the answers, since a connected socket's peer never changes. The
//! lookup sees the sockets of reaper-trace's own network namespace.
use std::io;

use netlink_packet_core::{NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload};
use netlink_packet_sock_diag::{
    SockDiagMessage,
    unix::{ShowFlags, StateFlags, UnixRequest},
};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_SOCK_DIAG};
use std::os::{fd::AsFd, unix::net::UnixStream};

/// The inode of an open file (for a socket, the number /proc shows as `socket:[N]`).
pub(crate) fn fstat_inode(fd: impl AsFd) -> io::Result<u64> {
    Ok(nix::sys::stat::fstat(fd.as_fd())?.st_ino)
}

/// What the kernel says about one UNIX socket's other end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnixPeer {
    /// Connected to the socket with this inode.
    Connected(u64),
    /// Connected once, but the other end was closed (the kernel keeps the link and reports
    /// inode 0), or never connected (a listening or unbound socket).
    None,
    /// Not a UNIX socket of this network namespace (TCP, UDP, netlink, another namespace).
    NotUnix,
}

/// A netlink socket for sock_diag requests.
pub struct SockDiag {
    socket: Socket,
    buf: Vec<u8>,
    seq: u32,
}

impl SockDiag {
    /// Opens the netlink socket and checks that the kernel answers for UNIX sockets: a kernel
    /// without `CONFIG_UNIX_DIAG` (or with the `unix_diag` module not loaded and no way to
    /// load it) answers "no such socket" for every inode, which would read as "not a UNIX
    /// socket". A socket pair of its own must be named, or the open fails, saying why.
    pub fn open() -> io::Result<SockDiag> {
        let mut socket = Socket::new(NETLINK_SOCK_DIAG)?;
        socket.bind_auto()?;
        socket.connect(&SocketAddr::new(0, 0))?;
        let mut diag = SockDiag {
            socket,
            buf: vec![0; 8192],
            seq: 0,
        };
        let (a, b) = UnixStream::pair()?;
        let (ia, ib) = (fstat_inode(&a)?, fstat_inode(&b)?);
        if diag.unix_peer(ia)? != UnixPeer::Connected(ib) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "the kernel does not name UNIX socket peers (sock_diag for AF_UNIX needs \
                 CONFIG_UNIX_DIAG, or the unix_diag module: `modprobe unix_diag`)",
            ));
        }
        Ok(diag)
    }

    /// The peer of the UNIX socket with inode `inode`.
    pub fn unix_peer(&mut self, inode: u64) -> io::Result<UnixPeer> {
        let Ok(ino) = u32::try_from(inode) else {
            return Ok(UnixPeer::NotUnix); // socket inodes are 32-bit (get_next_ino)
        };
        self.seq = self.seq.wrapping_add(1);
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST;
        header.sequence_number = self.seq;
        let mut request = NetlinkMessage::new(
            header,
            SockDiagMessage::UnixRequest(UnixRequest {
                state_flags: StateFlags::all(),
                inode: ino,
                show_flags: ShowFlags::PEER,
                // "No cookie": look the socket up by its inode alone.
                cookie: [0xff; 8],
            })
            .into(),
        );
        request.finalize();
        let mut out = vec![0; request.buffer_len()];
        request.serialize(&mut out);
        self.socket.send(&out, 0)?;
        loop {
            let len = self.socket.recv(&mut &mut self.buf[..], 0)?;
            let mut at = 0;
            while at < len {
                let reply = NetlinkMessage::<SockDiagMessage>::deserialize(&self.buf[at..len])
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
                let step = reply.header.length as usize;
                if reply.header.sequence_number == self.seq {
                    match reply.payload {
                        NetlinkPayload::InnerMessage(SockDiagMessage::UnixResponse(r))
                            if u64::from(r.header.inode) == inode =>
                        {
                            return Ok(match r.peer() {
                                Some(p) if p != 0 => UnixPeer::Connected(u64::from(p)),
                                _ => UnixPeer::None,
                            });
                        }
                        // ENOENT: no UNIX socket has this inode here.
                        NetlinkPayload::Error(e) if e.code.is_some() => {
                            return Ok(UnixPeer::NotUnix);
                        }
                        NetlinkPayload::Error(_) | NetlinkPayload::Done(_) => {
                            return Ok(UnixPeer::NotUnix);
                        }
                        _ => {}
                    }
                }
                if step == 0 {
                    break;
                }
                at += step;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::{fd::AsRawFd, unix::net::UnixListener};

    /// The inode as /proc names it (`socket:[N]`), to check it is the one fstat gives.
    fn inode_of(fd: i32) -> u64 {
        let link = std::fs::read_link(format!("/proc/self/fd/{fd}")).unwrap();
        let text = link.to_str().unwrap();
        text.trim_start_matches("socket:[")
            .trim_end_matches(']')
            .parse()
            .unwrap()
    }

    #[test]
    fn names_each_end_of_a_socket_pair_and_sees_the_close() {
        let mut diag = SockDiag::open().unwrap();
        let (a, b) = UnixStream::pair().unwrap();
        let (ia, ib) = (inode_of(a.as_raw_fd()), inode_of(b.as_raw_fd()));
        assert_eq!(fstat_inode(&a).unwrap(), ia);
        assert_eq!(diag.unix_peer(ia).unwrap(), UnixPeer::Connected(ib));
        assert_eq!(diag.unix_peer(ib).unwrap(), UnixPeer::Connected(ia));
        drop(b);
        assert_eq!(diag.unix_peer(ia).unwrap(), UnixPeer::None);
    }

    #[test]
    fn a_listener_has_no_peer_and_other_inodes_are_not_unix() {
        let mut diag = SockDiag::open().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let l = UnixListener::bind(dir.path().join("s")).unwrap();
        assert_eq!(
            diag.unix_peer(inode_of(l.as_raw_fd())).unwrap(),
            UnixPeer::None
        );
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        assert_eq!(
            diag.unix_peer(inode_of(tcp.as_raw_fd())).unwrap(),
            UnixPeer::NotUnix
        );
    }
}
