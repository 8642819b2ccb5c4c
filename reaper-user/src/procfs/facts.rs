//! One process's facts from /proc, for the leak rules: its open fds and which end of each pipe
//! it holds, what it is blocked in, its I/O counters, state and RSS.
//!
//! Every read is a `readlink` or a capped read of a small text file (see [`crate::untrusted`]):
//! a /proc fd entry is never `open()`ed (opening a FIFO through it would block). A process can
//! vanish between any two reads: callers treat `None` as "gone", never as an error.
use std::fs;

use crate::untrusted::{self, caps};

/// What an fd refers to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FdKind {
    Pipe,
    Socket,
    /// A pseudo-terminal: its master (`/dev/ptmx`) or a slave (`/dev/pts/N`). A channel between
    /// the master's holders and the slave's, like a pipe.
    Pty,
    /// Another terminal (`/dev/ttyN`, `/dev/console`).
    Tty,
    /// Anything else: files, devices, anonymous inodes.
    Other,
}

impl FdKind {
    pub fn name(self) -> &'static str {
        match self {
            FdKind::Pipe => "pipe",
            FdKind::Socket => "socket",
            FdKind::Pty => "pty",
            FdKind::Tty => "tty",
            FdKind::Other => "other",
        }
    }
}

/// Which end of a channel an fd is: for a pipe, which way it was opened (`O_ACCMODE` of its
/// flags); for a pty, its master or a slave (both read and write).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum End {
    Read,
    Write,
    Both,
    Master,
    Slave,
}

impl End {
    pub fn name(self) -> &'static str {
        match self {
            End::Read => "read",
            End::Write => "write",
            End::Both => "both",
            End::Master => "master",
            End::Slave => "slave",
        }
    }

    pub fn reads(self) -> bool {
        !matches!(self, End::Write)
    }

    pub fn writes(self) -> bool {
        !matches!(self, End::Read)
    }
}

/// One open fd.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenFd {
    pub fd: u32,
    pub kind: FdKind,
    /// The inode of a pipe or socket.
    pub inode: Option<u64>,
    pub end: End,
    /// A pty's index: `N` of its slave `/dev/pts/N` (a master's from its fdinfo `tty-index`).
    pub pty: Option<u32>,
}

/// Parses a `/proc/PID/fd/N` link target.
pub fn parse_fd_target(target: &[u8]) -> (FdKind, Option<u64>) {
    let inode = |prefix: &[u8]| -> Option<u64> {
        let rest = target.strip_prefix(prefix)?.strip_suffix(b"]")?;
        std::str::from_utf8(rest).ok()?.parse().ok()
    };
    if let Some(ino) = inode(b"pipe:[") {
        return (FdKind::Pipe, Some(ino));
    }
    if let Some(ino) = inode(b"socket:[") {
        return (FdKind::Socket, Some(ino));
    }
    if is_pty_master(target) || pts_index(target).is_some() {
        return (FdKind::Pty, None);
    }
    let tty = target.starts_with(b"/dev/tty") || target == b"/dev/console";
    (if tty { FdKind::Tty } else { FdKind::Other }, None)
}

/// `/dev/ptmx` (or devpts' own `ptmx`): a pty master.
fn is_pty_master(target: &[u8]) -> bool {
    target == b"/dev/ptmx" || target == b"/dev/pts/ptmx"
}

/// `N` of a pty slave `/dev/pts/N`. Once its master is closed the slave's node is gone and the
/// link reads `/dev/pts/N (deleted)`: a hung-up slave, still that pty.
fn pts_index(target: &[u8]) -> Option<u32> {
    let n = target.strip_prefix(b"/dev/pts/")?;
    let n = n.strip_suffix(b" (deleted)").unwrap_or(n);
    std::str::from_utf8(n).ok()?.parse().ok()
}

/// Which end of a pty the link `target` is, and the pty's index (a master's from its fdinfo
/// `tty-index:` line).
pub fn pty_end(target: &[u8], fdinfo: &str) -> Option<(End, u32)> {
    if is_pty_master(target) {
        let index = fdinfo
            .lines()
            .find_map(|l| l.strip_prefix("tty-index:"))
            .and_then(|v| v.trim().parse().ok())?;
        return Some((End::Master, index));
    }
    pts_index(target).map(|n| (End::Slave, n))
}

/// The access mode in a `/proc/PID/fdinfo/N` text (`flags:` is octal).
pub fn parse_fdinfo_end(text: &str) -> Option<End> {
    let flags = text
        .lines()
        .find_map(|l| l.strip_prefix("flags:"))
        .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())?;
    Some(match flags & libc::O_ACCMODE as u32 {
        0 => End::Read,
        1 => End::Write,
        _ => End::Both,
    })
}

/// The pipes, sockets and terminals a process holds (other fds are of no use to the rules):
/// among its first [`caps::FDS`] fds, as a process may hold as many as its limit lets it.
pub fn read_fds(pid: u32) -> Option<Vec<OpenFd>> {
    let dir = super::proc_path(pid, "fd");
    let (names, _) = untrusted::list_dir(&dir, caps::FDS).ok()?;
    let mut fds = Vec::new();
    for name in names {
        let Some(fd) = name.to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        let Ok(target) = fs::read_link(dir.join(&name)) else {
            continue; // closed meanwhile
        };
        let target = target.as_os_str().as_encoded_bytes();
        let (kind, inode) = parse_fd_target(target);
        if kind == FdKind::Other {
            continue;
        }
        let info = super::read_text(pid, &format!("fdinfo/{fd}")).unwrap_or_default();
        let (end, pty) = match kind {
            // A master whose index is not in its fdinfo (an old kernel) is a channel to
            // nobody known: listed, never matched.
            FdKind::Pty => match pty_end(target, &info) {
                Some((end, index)) => (end, Some(index)),
                None => (End::Master, None),
            },
            _ => (parse_fdinfo_end(&info).unwrap_or(End::Both), None),
        };
        fds.push(OpenFd {
            fd,
            kind,
            inode,
            end,
            pty,
        });
    }
    fds.sort_by_key(|f| f.fd);
    Some(fds)
}

/// What a thread is blocked in, from `/proc/PID/task/TID/syscall`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Blocked {
    /// Running on a CPU (or about to).
    Running,
    /// In a system call that waits for input: read, poll, select, epoll and friends.
    WaitingForInput { syscall: u64, fd: Option<u32> },
    /// In some other system call (a sleep, a lock, a wait for a child).
    Other { syscall: u64 },
    /// Not in a system call (stopped, or preempted in user space).
    NotInSyscall,
}

/// System calls that wait for data to read on an fd: the first argument is the fd.
const READS_FD: [libc::c_long; 8] = [
    libc::SYS_read,
    libc::SYS_pread64,
    libc::SYS_readv,
    libc::SYS_preadv,
    libc::SYS_preadv2,
    libc::SYS_recvfrom,
    libc::SYS_recvmsg,
    libc::SYS_recvmmsg,
];

/// System calls that wait on many fds. aarch64 has only the newer ones (its C library's
/// `poll`, `select` and `epoll_wait` call them).
const WAITS_ON_MANY: [libc::c_long; 4] = [
    libc::SYS_ppoll,
    libc::SYS_pselect6,
    libc::SYS_epoll_pwait,
    libc::SYS_epoll_pwait2,
];
#[cfg(target_arch = "x86_64")]
const WAITS_ON_MANY_OLD: [libc::c_long; 3] =
    [libc::SYS_poll, libc::SYS_select, libc::SYS_epoll_wait];
#[cfg(not(target_arch = "x86_64"))]
const WAITS_ON_MANY_OLD: [libc::c_long; 0] = [];

/// Whether system call `nr` (this architecture's numbers) waits for data to read: `Some(true)`
/// when its first argument is the fd read from, `Some(false)` when it waits on many.
fn waits_for_input(nr: u64) -> Option<bool> {
    let nr = libc::c_long::try_from(nr).ok()?;
    if READS_FD.contains(&nr) {
        Some(true)
    } else if WAITS_ON_MANY.contains(&nr) || WAITS_ON_MANY_OLD.contains(&nr) {
        Some(false)
    } else {
        None
    }
}

/// Parses `/proc/PID/syscall`: `running`, `-1 sp pc` (not in a syscall), or
/// `nr arg1 ... arg6 sp pc`.
pub fn parse_syscall(text: &str) -> Option<Blocked> {
    let mut words = text.split_whitespace();
    let first = words.next()?;
    if first == "running" {
        return Some(Blocked::Running);
    }
    let nr: i64 = first.parse().ok()?;
    if nr < 0 {
        return Some(Blocked::NotInSyscall);
    }
    let nr = nr as u64;
    Some(match waits_for_input(nr) {
        Some(reads_fd) => {
            let fd = words
                .next()
                .and_then(|a| u64::from_str_radix(a.trim_start_matches("0x"), 16).ok())
                .filter(|_| reads_fd)
                .and_then(|a| u32::try_from(a).ok());
            Blocked::WaitingForInput { syscall: nr, fd }
        }
        None => Blocked::Other { syscall: nr },
    })
}

/// Whether the whole process waits for input: no thread runs, and some thread waits in a read,
/// poll, select or epoll (a Node.js server waits in epoll on its main thread while its helper
/// threads sleep on futexes). Its first [`caps::THREADS`] threads are asked.
pub fn read_blocked(pid: u32) -> Option<Blocked> {
    let (tasks, _) = untrusted::list_dir(&super::proc_path(pid, "task"), caps::THREADS).ok()?;
    let mut waiting = None;
    let mut other = None;
    for task in tasks {
        let Some(task) = task.to_str() else {
            continue;
        };
        let Some(b) = super::read_text(pid, &format!("task/{task}/syscall"))
            .ok()
            .and_then(|t| parse_syscall(&t))
        else {
            continue;
        };
        match b {
            Blocked::Running => return Some(Blocked::Running),
            Blocked::WaitingForInput { .. } => waiting = waiting.or(Some(b)),
            _ => other = other.or(Some(b)),
        }
    }
    waiting.or(other)
}

/// Bytes and calls of I/O so far, from `/proc/PID/io` (`rchar`, `wchar`, `syscr`, `syscw`):
/// any change means the process moved data.
pub fn parse_io(text: &str) -> Option<[u64; 4]> {
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim_start_matches(':').trim().parse().ok())
    };
    Some([
        field("rchar")?,
        field("wchar")?,
        field("syscr")?,
        field("syscw")?,
    ])
}

pub fn read_io(pid: u32) -> Option<[u64; 4]> {
    parse_io(&super::read_text(pid, "io").ok()?)
}

/// Resident memory in KiB, from `/proc/PID/statm` (`size resident shared ...` in pages: far
/// cheaper to produce than `status`).
pub fn parse_rss_kib(statm: &str, page_kib: u64) -> Option<u64> {
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // A count no kernel writes is no answer (found by the proc_files fuzz target).
    pages.checked_mul(page_kib)
}

pub fn read_rss_kib(pid: u32) -> Option<u64> {
    parse_rss_kib(
        &super::read_text(pid, "statm").ok()?,
        super::page_size() as u64 / 1024,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fd_targets() {
        assert_eq!(
            parse_fd_target(b"pipe:[88123]"),
            (FdKind::Pipe, Some(88123))
        );
        assert_eq!(parse_fd_target(b"socket:[7]"), (FdKind::Socket, Some(7)));
        assert_eq!(parse_fd_target(b"/dev/pts/3"), (FdKind::Pty, None));
        assert_eq!(parse_fd_target(b"/dev/ptmx"), (FdKind::Pty, None));
        assert_eq!(parse_fd_target(b"/dev/tty1"), (FdKind::Tty, None));
        assert_eq!(parse_fd_target(b"/dev/pts/x"), (FdKind::Other, None));
        assert_eq!(pty_end(b"/dev/pts/3", ""), Some((End::Slave, 3)));
        assert_eq!(
            pty_end(b"/dev/pts/3 (deleted)", ""),
            Some((End::Slave, 3)),
            "hung up"
        );
        assert_eq!(
            pty_end(b"/dev/ptmx", "pos:\t0\nflags:\t02\ntty-index:\t7\n"),
            Some((End::Master, 7))
        );
        assert_eq!(pty_end(b"/dev/ptmx", "flags:\t02\n"), None);
        assert_eq!(parse_fd_target(b"/tmp/pipe:[1]"), (FdKind::Other, None));
        assert_eq!(parse_fd_target(b"pipe:[x]"), (FdKind::Other, None));
        assert_eq!(
            parse_fd_target(b"anon_inode:[eventpoll]"),
            (FdKind::Other, None)
        );
    }

    #[test]
    fn fdinfo_access_modes() {
        let info = |flags: &str| format!("pos:\t0\nflags:\t{flags}\nmnt_id:\t15\nino:\t1\n");
        assert_eq!(parse_fdinfo_end(&info("00")), Some(End::Read));
        assert_eq!(parse_fdinfo_end(&info("02000001")), Some(End::Write));
        assert_eq!(parse_fdinfo_end(&info("02004002")), Some(End::Both));
        assert_eq!(parse_fdinfo_end("pos: 0\n"), None);
        assert_eq!(parse_fdinfo_end("flags:\t9\n"), None);
    }

    #[test]
    fn syscall_lines() {
        assert_eq!(parse_syscall("running\n"), Some(Blocked::Running));
        assert_eq!(
            parse_syscall("-1 0x7ffc 0x7f00\n"),
            Some(Blocked::NotInSyscall)
        );
        // This architecture's numbers: `read`, `epoll_pwait` and `nanosleep`.
        let (read, epoll, sleep) = (
            libc::SYS_read as u64,
            libc::SYS_epoll_pwait as u64,
            libc::SYS_nanosleep as u64,
        );
        assert_eq!(
            parse_syscall(&format!(
                "{read} 0x0 0x7ffd4 0x1000 0x0 0x0 0x0 0x7ffd 0x7f12\n"
            )),
            Some(Blocked::WaitingForInput {
                syscall: read,
                fd: Some(0)
            })
        );
        assert_eq!(
            parse_syscall(&format!(
                "{read} 0x5 0x7ffd4 0x1000 0x0 0x0 0x0 0x7ffd 0x7f12\n"
            )),
            Some(Blocked::WaitingForInput {
                syscall: read,
                fd: Some(5)
            })
        );
        assert_eq!(
            parse_syscall(&format!(
                "{epoll} 0x3 0x7ffd 0x400 0xffffffff 0x0 0x8 0x7ffd 0x7f12\n"
            )),
            Some(Blocked::WaitingForInput {
                syscall: epoll,
                fd: None
            })
        );
        assert_eq!(
            parse_syscall(&format!(
                "{sleep} 0x1 0x0 0x7ffd 0x0 0x0 0x0 0x7ffd 0x7f12\n"
            )),
            Some(Blocked::Other { syscall: sleep })
        );
        assert_eq!(parse_syscall(""), None);
        assert_eq!(parse_syscall("x y"), None);
    }

    #[test]
    fn io_and_rss() {
        let io = "rchar: 10\nwchar: 20\nsyscr: 3\nsyscw: 4\nread_bytes: 0\n";
        assert_eq!(parse_io(io), Some([10, 20, 3, 4]));
        assert_eq!(parse_io("rchar: 1\n"), None);
        assert_eq!(parse_rss_kib("1000 78 20 5 0 90 0\n", 4), Some(312));
        assert_eq!(parse_rss_kib("1000\n", 4), None);
    }

    #[test]
    fn reads_its_own_pipe_ends() {
        let mut fds = [0; 2];
        // SAFETY: valid array for pipe(2).
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let me = std::process::id();
        let open = read_fds(me).unwrap();
        let find = |fd: i32| open.iter().find(|f| f.fd == fd as u32).unwrap().clone();
        let (r, w) = (find(fds[0]), find(fds[1]));
        assert_eq!((r.kind, r.end), (FdKind::Pipe, End::Read));
        assert_eq!((w.kind, w.end), (FdKind::Pipe, End::Write));
        assert_eq!(r.inode, w.inode);
        // SAFETY: closing our own fds.
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
        assert!(read_io(me).is_some());
        assert!(read_rss_kib(me).unwrap() > 0);
        assert!(read_blocked(me).is_some());
    }

    #[test]
    fn an_impossible_statm_is_no_answer_not_an_overflow() {
        // The input the proc_files fuzz target crashed on (its first byte picked statm).
        assert_eq!(parse_rss_kib("S     5404444444444444444444444444", 4), None);
        assert_eq!(parse_rss_kib("100 18446744073709551615 0", 4), None);
        assert_eq!(parse_rss_kib("100 25 0", 4), Some(100));
    }
}
