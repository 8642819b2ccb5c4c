//! The runs' sockets in [`SOCKET_DIR`]: which of them a live run serves. A run that was killed
//! leaves its socket file behind; clients skip a socket nobody answers, and a run starting
//! removes those whose run is gone.
use std::io::ErrorKind;
use std::os::unix::net::UnixStream;
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

/// Whether a run listens at `socket` (connecting is immediate on a UNIX socket).
pub fn serving(socket: &Path) -> Serving {
    match UnixStream::connect(socket) {
        Ok(_) => Serving::Yes,
        Err(e) if e.kind() == ErrorKind::PermissionDenied => Serving::Refused,
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
    fn a_socket_named_by_a_live_reaper_trace_is_its_own_run() {
        let own = PathBuf::from(format!("{}.sock", std::process::id()));
        // This test binary is not named reaper-trace; pid 1 is not one either.
        assert!(!run_of(&own));
        assert!(!run_of(Path::new("1.sock")));
        assert!(!run_of(Path::new("x.sock")));
    }
}
