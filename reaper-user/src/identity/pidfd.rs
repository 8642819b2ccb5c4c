//! Process file descriptors (pidfds): a handle on one process that a recycled pid cannot
//! redirect, and a way to look at one of its fds without opening anything by path.
use std::{
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
};

use crate::procfs::facts::End;

/// A pidfd for one process.
pub struct PidFd(OwnedFd);

impl PidFd {
    /// A handle on the process that has `pid` now. Check its identity (start time) *after*
    /// this: if it matches then, this handle is that process, whatever happens to the pid.
    pub fn open(pid: u32) -> io::Result<PidFd> {
        // SAFETY: plain syscall; a non-negative result is a new fd that we own.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh, owned descriptor.
        Ok(PidFd(unsafe { OwnedFd::from_raw_fd(fd as i32) }))
    }

    /// A duplicate of the process's fd `target` (`pidfd_getfd`, Linux 5.6+; needs the right to
    /// ptrace the process, which root has).
    fn get_fd(&self, target: u32) -> io::Result<OwnedFd> {
        // SAFETY: plain syscall; a non-negative result is a new fd that we own.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_pidfd_getfd,
                self.0.as_raw_fd(),
                target as libc::c_int,
                0,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh, owned descriptor.
        Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
    }

    /// Whether the other end of the pipe or socket at the process's fd `target` is still open:
    /// a pipe read end with no writers left polls `POLLHUP` (EOF is pending), a write end with
    /// no readers `POLLERR`, a stream socket whose peer closed `POLLRDHUP`/`POLLHUP`. `None`:
    /// unknown (the fd is gone, or a listening socket, which has no other end).
    ///
    /// The duplicate is only polled with a zero timeout and closed: nothing is read or
    /// written, and the process's own fd is untouched.
    pub fn other_end_open(&self, target: u32, end: End, socket: bool) -> Option<bool> {
        let dup = self.get_fd(target).ok()?;
        if socket && is_listening(&dup) {
            return None;
        }
        let events = match end {
            End::Write => libc::POLLOUT,
            _ => libc::POLLIN | libc::POLLRDHUP,
        };
        let mut pfd = libc::pollfd {
            fd: dup.as_raw_fd(),
            events,
            revents: 0,
        };
        // SAFETY: one valid pollfd, zero timeout.
        if unsafe { libc::poll(&mut pfd, 1, 0) } < 0 {
            return None;
        }
        let closed = match end {
            End::Write => pfd.revents & libc::POLLERR != 0,
            _ => pfd.revents & (libc::POLLHUP | libc::POLLRDHUP) != 0,
        };
        Some(!closed)
    }
}

impl PidFd {
    /// Sends `signal` to exactly this process (`pidfd_send_signal`): never to whatever else
    /// may have its pid by now. `ESRCH`: it has exited.
    pub fn send_signal(&self, signal: i32) -> io::Result<()> {
        // SAFETY: plain syscall; no siginfo.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.0.as_raw_fd(),
                signal,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Whether the process has exited (a pidfd polls readable then).
    pub fn has_exited(&self) -> bool {
        let mut pfd = libc::pollfd {
            fd: self.0.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, zero timeout.
        unsafe { libc::poll(&mut pfd, 1, 0) > 0 }
    }
}

impl AsRawFd for PidFd {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.0.as_raw_fd()
    }
}

fn is_listening(fd: &OwnedFd) -> bool {
    let mut value: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: valid pointers to an int and its length.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ACCEPTCONN,
            (&mut value as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    rc == 0 && value != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    // The tests' other threads share this process's fd table, and some fork: a child forked
    // while an end is open holds a copy of it until it execs (the ends are close-on-exec) or
    // exits. So an end this test closed is closed *eventually*, and a closed fd's number may
    // be handed out again at once.

    fn pipe() -> (i32, i32) {
        let mut fds = [0; 2];
        // SAFETY: valid array for pipe2(2).
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        (fds[0], fds[1])
    }

    /// A duplicate of `fd` numbered `min` or more: far above the few dozen the other threads
    /// hold, so that its number stays free once it is closed.
    fn fd_at_least(fd: i32, min: i32) -> i32 {
        // SAFETY: duplicating our own open fd.
        let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, min) };
        assert!(dup >= min, "F_DUPFD: {}", io::Error::last_os_error());
        dup
    }

    fn close(fd: i32) {
        // SAFETY: closing our own fd.
        unsafe { libc::close(fd) };
    }

    /// `look`'s answer once it is `want`, or its last one after 10 s (a copy of a closed end
    /// held by a child another test forked goes when that child execs or exits).
    fn once(want: Option<bool>, look: impl Fn() -> Option<bool>) -> Option<bool> {
        let cap = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let seen = look();
            if seen == want || std::time::Instant::now() > cap {
                return seen;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// Looks at this process's own fds through a pidfd, as the inspector does for others.
    #[test]
    fn sees_eof_pending_and_readers_gone() {
        let me = PidFd::open(std::process::id()).unwrap();
        let (r, w) = pipe();
        let r = {
            let far = fd_at_least(r, 512);
            close(r);
            far
        };
        assert_eq!(me.other_end_open(r as u32, End::Read, false), Some(true));
        assert_eq!(me.other_end_open(w as u32, End::Write, false), Some(true));
        close(w);
        let eof = || me.other_end_open(r as u32, End::Read, false);
        assert_eq!(once(Some(false), eof), Some(false));
        close(r);
        assert_eq!(me.other_end_open(r as u32, End::Read, false), None);

        let (r, w) = pipe();
        close(r);
        let readers_gone = || me.other_end_open(w as u32, End::Write, false);
        assert_eq!(once(Some(false), readers_gone), Some(false));
        close(w);
    }

    #[test]
    fn signals_reach_only_the_process_and_exit_is_seen() {
        // SAFETY: the child only pauses until a signal ends it.
        let child = unsafe { libc::fork() };
        if child == 0 {
            unsafe {
                libc::pause();
                libc::_exit(0);
            }
        }
        let fd = PidFd::open(child as u32).unwrap();
        assert!(!fd.has_exited());
        fd.send_signal(libc::SIGTERM).unwrap();
        let mut status = 0;
        // SAFETY: reaping our own child.
        unsafe { libc::waitpid(child, &mut status, 0) };
        assert!(fd.has_exited());
        let err = fd.send_signal(libc::SIGTERM).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ESRCH));
    }

    #[test]
    fn socket_peers() {
        let mut sv = [0; 2];
        // SAFETY: valid array for socketpair(2).
        let rc = unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
                0,
                sv.as_mut_ptr(),
            )
        };
        assert_eq!(rc, 0);
        let me = PidFd::open(std::process::id()).unwrap();
        assert_eq!(me.other_end_open(sv[0] as u32, End::Both, true), Some(true));
        close(sv[1]);
        let peer_gone = || me.other_end_open(sv[0] as u32, End::Both, true);
        assert_eq!(once(Some(false), peer_gone), Some(false));
        close(sv[0]);
    }
}
