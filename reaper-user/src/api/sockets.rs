//! The runs' sockets in [`SOCKET_DIR`]: which of them a live run serves. A run that was killed
//! leaves its socket file behind; clients skip a socket nobody answers, and a run starting
//! removes those whose run is gone.
use std::io::ErrorKind;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::SOCKET_DIR;

/// What is at a socket's path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Serving {
    /// A run listens there.
    Yes,
    /// A run is there, but this user may not connect.
    Refused,
    /// Nobody listens: its run is gone (or not listening yet, or no longer).
    Nobody,
}

/// Whether a run listens at `socket`. The connection is made without waiting: a UNIX
/// socket's connect is immediate, or, once the listener's backlog is full (a run flooded, or
/// stopped), says so at once instead of waiting for room: a run is there all the same.
pub fn serving(socket: &Path) -> Serving {
    use nix::errno::Errno;
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, UnixAddr, connect};
    let flags = SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC;
    let Ok(fd) = nix::sys::socket::socket(AddressFamily::Unix, SockType::Stream, flags, None)
    else {
        return Serving::Nobody;
    };
    let Ok(address) = UnixAddr::new(socket) else {
        return Serving::Nobody;
    };
    match connect(fd.as_raw_fd(), &address) {
        Ok(()) | Err(Errno::EAGAIN) => Serving::Yes,
        Err(Errno::EACCES | Errno::EPERM) => Serving::Refused,
        Err(_) => Serving::Nobody,
    }
}

/// The sockets in [`SOCKET_DIR`] (`PID.sock`), oldest name first, whoever serves them.
fn all() -> Result<Vec<PathBuf>> {
    let mut found: Vec<PathBuf> = match std::fs::read_dir(SOCKET_DIR) {
        Ok(entries) => entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "sock"))
            .collect(),
        Err(e) if e.kind() == ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {SOCKET_DIR}")),
    };
    found.sort();
    Ok(found)
}

/// The sockets in [`SOCKET_DIR`] a run may answer on: those nobody listens on left out.
pub fn live() -> Result<Vec<PathBuf>> {
    Ok(all()?
        .into_iter()
        .filter(|s| serving(s) != Serving::Nobody)
        .collect())
}

/// Removes the sockets in [`SOCKET_DIR`] whose run is gone: nobody listens there, and the pid
/// the name gives is not a reaper-trace (one that bound its socket and is about to listen
/// keeps it). `own` is left alone. Returns those removed.
pub fn remove_dead(own: &Path) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    for socket in all().unwrap_or_default() {
        if socket == own || serving(&socket) != Serving::Nobody || run_of(&socket) {
            continue;
        }
        if std::fs::remove_file(&socket).is_ok() {
            removed.push(socket);
        }
    }
    removed
}

/// Whether the pid `socket` is named by (`PID.sock`) is a reaper-trace now.
fn run_of(socket: &Path) -> bool {
    let pid = socket
        .file_stem()
        .and_then(|s| s.to_str())
        .and_then(|s| s.parse::<u32>().ok());
    let comm = pid.and_then(|pid| crate::procfs::read_stat(pid).ok());
    comm.is_some_and(|s| s.comm.as_bytes().starts_with(b"reaper-trace"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_socket_nobody_listens_on_is_told_from_a_served_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("1.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        assert_eq!(serving(&path), Serving::Yes);
        drop(listener); // the file stays, as a killed run's does
        assert!(path.exists());
        assert_eq!(serving(&path), Serving::Nobody);
        assert_eq!(serving(&dir.path().join("none.sock")), Serving::Nobody);
    }

    #[test]
    fn a_listener_whose_backlog_is_full_is_served_and_asking_does_not_wait() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("1.sock");
        use nix::sys::socket::{
            AddressFamily, Backlog, SockFlag, SockType, UnixAddr, bind, connect, listen, socket,
        };
        let address = UnixAddr::new(&path).unwrap();
        let stream = |flags| socket(AddressFamily::Unix, SockType::Stream, flags, None).unwrap();
        // Never accepts, and holds one connection waiting: the next ones find its backlog
        // full, as at a run that is stopped or flooded.
        let listener = stream(SockFlag::SOCK_CLOEXEC);
        bind(listener.as_raw_fd(), &address).unwrap();
        listen(&listener, Backlog::new(1).unwrap()).unwrap();
        let mut held = Vec::new();
        loop {
            let fd = stream(SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC);
            match connect(fd.as_raw_fd(), &address) {
                Ok(()) => held.push(fd),
                Err(nix::errno::Errno::EAGAIN) => break,
                Err(e) => panic!("connecting: {e}"),
            }
            assert!(held.len() < 64, "a backlog of 1 took {}", held.len());
        }
        assert_eq!(
            serving(&path),
            Serving::Yes,
            "after {} connections",
            held.len()
        );
    }

    #[test]
    fn a_socket_named_by_a_live_reaper_trace_is_its_own_run() {
        let own = PathBuf::from(format!("{}.sock", std::process::id()));
        // This test binary is not named reaper-trace; pid 1 is not one either.
        assert!(!run_of(&own));
        assert!(!run_of(Path::new("1.sock")));
        assert!(!run_of(Path::new("x.sock")));
    }
}
