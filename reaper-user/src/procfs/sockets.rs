//! What kind of socket an inode is, from a process's own network namespace: the tables of
//! `/proc/PID/net/` (`unix`, `tcp`, `tcp6`, `udp`, `udp6`, `raw`, `raw6`, `netlink`), as `ss`
//! reads them without sock_diag. A TCP connection whose other end is in the same table (the
//! same network namespace: loopback, or this host's own address) names that socket's inode,
//! so its holder is found like a UNIX socket's peer.
//!
//! Read only for a socket that sock_diag did not name as a UNIX socket of reaper-trace's own
//! namespace, once per namespace for all the sockets a look asks about.
use std::net::SocketAddr;

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

/// A socket's family and, for TCP, where the other end is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SocketKind {
    Unix,
    /// A TCP socket; `peer` is the other end's inode when that end is in the same network
    /// namespace (a connection on this host); `remote` the address it is connected to.
    Tcp {
        peer: Option<u64>,
        remote: Option<SocketAddr>,
        listening: bool,
    },
    Udp,
    Raw,
    Netlink,
    /// In none of the tables: a packet, vsock or alg socket, a netlink socket never bound.
    /// (A UNIX socket of any namespace is in its namespace's `unix` table.)
    Unknown,
}

impl SocketKind {
    /// The protocol's name in the evidence.
    pub fn name(self) -> &'static str {
        match self {
            SocketKind::Unix => "unix",
            SocketKind::Tcp { .. } => "tcp",
            SocketKind::Udp => "udp",
            SocketKind::Raw => "raw",
            SocketKind::Netlink => "netlink",
            SocketKind::Unknown => "unknown",
        }
    }

    /// Whether it can tie a process to another one on this host, as the leak rules count
    /// channels: a UNIX socket or a TCP connection within this host. A connection to another
    /// host, UDP, raw, netlink and sockets of no table never do. (A socket whose kind could
    /// not be read at all is not a `SocketKind`: the sampler counts it, not to miss one.)
    pub fn can_be_channel(self) -> bool {
        match self {
            SocketKind::Unix => true,
            SocketKind::Tcp { peer, .. } => peer.is_some(),
            SocketKind::Udp | SocketKind::Raw | SocketKind::Netlink | SocketKind::Unknown => false,
        }
    }
}

/// One TCP table row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct TcpRow {
    local: SocketAddr,
    remote: SocketAddr,
    /// `st`: 01 established, 0A listen, ...
    state: u8,
}

/// The socket tables of one network namespace.
#[derive(Default)]
pub struct NetTables {
    tcp: HashMap<u64, TcpRow>,
    /// Established TCP sockets by (local, remote): where a connection's other end is found.
    tcp_by_ends: HashMap<(SocketAddr, SocketAddr), u64>,
    unix: HashSet<u64>,
    udp: HashSet<u64>,
    raw: HashSet<u64>,
    netlink: HashSet<u64>,
}

const TCP_ESTABLISHED: u8 = 0x01;
const TCP_LISTEN: u8 = 0x0a;

impl NetTables {
    /// Reads the tables of `pid`'s network namespace (a table that cannot be read is empty).
    pub fn read(pid: u32) -> NetTables {
        // A namespace's tables are as long as it has sockets: read up to a cap each.
        let table = |name: &str| {
            let path = super::proc_path(pid, &format!("net/{name}"));
            crate::untrusted::read_text(&path, crate::untrusted::caps::NET_TABLE)
        };
        let mut t = NetTables::default();
        for name in ["tcp", "tcp6"] {
            for row in table(name).unwrap_or_default().lines().skip(1) {
                if let Some((inode, r)) = parse_tcp_row(row) {
                    t.tcp.insert(inode, r);
                    if r.state == TCP_ESTABLISHED {
                        t.tcp_by_ends.insert((r.local, r.remote), inode);
                    }
                }
            }
        }
        let inodes = |name: &str, column: usize, into: &mut HashSet<u64>| {
            for row in table(name).unwrap_or_default().lines().skip(1) {
                if let Some(i) = row
                    .split_whitespace()
                    .nth(column)
                    .and_then(|v| v.parse().ok())
                {
                    into.insert(i);
                }
            }
        };
        inodes("unix", 6, &mut t.unix);
        inodes("udp", 9, &mut t.udp);
        inodes("udp6", 9, &mut t.udp);
        inodes("raw", 9, &mut t.raw);
        inodes("raw6", 9, &mut t.raw);
        inodes("netlink", 9, &mut t.netlink);
        t
    }

    /// What the socket `inode` is.
    pub fn kind(&self, inode: u64) -> SocketKind {
        if let Some(r) = self.tcp.get(&inode) {
            let connected = r.state == TCP_ESTABLISHED;
            return SocketKind::Tcp {
                peer: connected
                    .then(|| self.tcp_by_ends.get(&(r.remote, r.local)).copied())
                    .flatten(),
                remote: connected.then_some(r.remote),
                listening: r.state == TCP_LISTEN,
            };
        }
        if self.unix.contains(&inode) {
            return SocketKind::Unix;
        }
        if self.udp.contains(&inode) {
            return SocketKind::Udp;
        }
        if self.raw.contains(&inode) {
            return SocketKind::Raw;
        }
        if self.netlink.contains(&inode) {
            return SocketKind::Netlink;
        }
        SocketKind::Unknown
    }
}

/// `0: 0100007F:1F90 0100007F:9C40 01 ... inode ...` → (inode, row).
fn parse_tcp_row(row: &str) -> Option<(u64, TcpRow)> {
    let cols: Vec<&str> = row.split_whitespace().collect();
    let local = parse_addr(cols.get(1)?)?;
    let remote = parse_addr(cols.get(2)?)?;
    let state = u8::from_str_radix(cols.get(3)?, 16).ok()?;
    let inode = cols.get(9)?.parse().ok()?;
    Some((
        inode,
        TcpRow {
            local,
            remote,
            state,
        },
    ))
}

/// `0100007F:1F90` (IPv4) or 32 hex digits and a port (IPv6): the kernel prints each 32-bit
/// word of the address in host order (little-endian here).
fn parse_addr(text: &str) -> Option<SocketAddr> {
    let (addr, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |i: usize| -> Option<[u8; 4]> {
        let w = u32::from_str_radix(addr.get(i * 8..i * 8 + 8)?, 16).ok()?;
        Some(w.to_le_bytes())
    };
    let ip: std::net::IpAddr = match addr.len() {
        8 => std::net::Ipv4Addr::from(word(0)?).into(),
        32 => {
            let mut bytes = [0u8; 16];
            for i in 0..4 {
                bytes[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            std::net::Ipv6Addr::from(bytes).into()
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sockdiag::fstat_inode;

    #[test]
    fn addresses_read_as_the_kernel_prints_them() {
        assert_eq!(
            parse_addr("0100007F:1F90"),
            Some("127.0.0.1:8080".parse().unwrap())
        );
        assert_eq!(
            parse_addr("00000000000000000000000001000000:0016"),
            Some("[::1]:22".parse().unwrap())
        );
        assert_eq!(parse_addr("zz:1"), None);
    }

    #[test]
    fn a_loopback_connection_names_its_other_end_and_other_sockets_are_no_channel() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let t = NetTables::read(std::process::id());
        let (ci, si) = (fstat_inode(&client).unwrap(), fstat_inode(&server).unwrap());
        match t.kind(ci) {
            SocketKind::Tcp { peer, remote, .. } => {
                assert_eq!(peer, Some(si));
                assert_eq!(remote, Some(listener.local_addr().unwrap()));
            }
            other => panic!("{other:?}"),
        }
        assert!(t.kind(ci).can_be_channel());
        let l = t.kind(fstat_inode(&listener).unwrap());
        assert!(
            matches!(
                l,
                SocketKind::Tcp {
                    listening: true,
                    peer: None,
                    ..
                }
            ),
            "{l:?}"
        );
        assert_eq!(t.kind(fstat_inode(&udp).unwrap()), SocketKind::Udp);
        assert!(!SocketKind::Udp.can_be_channel());
        assert_eq!(t.kind(fstat_inode(&a).unwrap()), SocketKind::Unix);
        assert_eq!(t.kind(1), SocketKind::Unknown);
    }
}
