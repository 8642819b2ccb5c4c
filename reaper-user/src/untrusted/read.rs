//! Capped reads of a traced process's /proc entries: a text, a listing.
//!
//! The entries are the kernel's own files, never a FIFO or a device, but a process decides how
//! long they are (its command line, its mappings, its fds, its sockets), so each read stops at
//! its cap. A path that reaches into the process's own files (`/proc/PID/root/...`) is not
//! read here but opened through [`super::Checked`].
use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// What a capped read found: the bytes up to the cap, and whether there were more.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Capped {
    pub bytes: Vec<u8>,
    pub cut: bool,
}

impl Capped {
    /// The text, as far as it is whole lines: a cut text ends before its last, partial line.
    /// Bytes that are not UTF-8 (a process names itself as it likes) are replaced.
    pub fn whole_lines(self) -> String {
        let mut bytes = self.bytes;
        if self.cut {
            let end = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
            bytes.truncate(end);
        }
        match String::from_utf8(bytes) {
            Ok(text) => text,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        }
    }
}

/// Opens the /proc entry `path` to read without blocking, taking it as a controlling
/// terminal, or following a symlink at its last step.
pub fn open(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_NOFOLLOW)
        .open(path)
}

/// Reads `path` up to `cap` bytes.
pub fn read(path: &Path, cap: usize) -> io::Result<Capped> {
    let mut bytes = Vec::new();
    // One byte past the cap tells whether there was more.
    open(path)?.take(cap as u64 + 1).read_to_end(&mut bytes)?;
    let cut = bytes.len() > cap;
    bytes.truncate(cap);
    Ok(Capped { bytes, cut })
}

/// Reads the text `path` up to `cap` bytes, whole lines (see [`Capped::whole_lines`]).
pub fn read_text(path: &Path, cap: usize) -> io::Result<String> {
    read(path, cap).map(Capped::whole_lines)
}

/// The names in directory `path`, `cap` at most, and whether there were more.
pub fn list_dir(path: &Path, cap: usize) -> io::Result<(Vec<OsString>, bool)> {
    let mut entries = std::fs::read_dir(path)?.flatten();
    let names: Vec<OsString> = entries.by_ref().take(cap).map(|e| e.file_name()).collect();
    let cut = names.len() == cap && entries.next().is_some();
    Ok((names, cut))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_stops_at_its_cap_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t");
        std::fs::write(&path, b"one\ntwo\nthree\n").unwrap();
        let whole = read(&path, 100).unwrap();
        assert_eq!((whole.bytes.len(), whole.cut), (14, false));
        let exact = read(&path, 14).unwrap();
        assert!(!exact.cut, "a file exactly the cap is whole");
        let cut = read(&path, 10).unwrap();
        assert_eq!(
            (cut.bytes.as_slice(), cut.cut),
            (&b"one\ntwo\nth"[..], true)
        );
        assert_eq!(cut.whole_lines(), "one\ntwo\n", "the partial line dropped");
        assert_eq!(read_text(&path, 100).unwrap(), "one\ntwo\nthree\n");
    }

    #[test]
    fn text_that_is_not_utf8_is_replaced_not_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("status");
        std::fs::write(&path, b"Name:\t\xff\xfe\nNSpid:\t7\t1\n").unwrap();
        let text = read_text(&path, 1024).unwrap();
        assert!(text.ends_with("NSpid:\t7\t1\n"), "{text:?}");
    }

    #[test]
    fn a_fifo_or_a_symlink_at_the_path_neither_blocks_nor_is_followed() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        // Opened without blocking: nothing to read, no writer awaited.
        assert_eq!(read(&fifo, 10).unwrap(), Capped::default());
        let link = dir.path().join("link");
        std::os::unix::fs::symlink("/etc/hostname", &link).unwrap();
        let refused = read(&link, 10).unwrap_err();
        assert_eq!(refused.raw_os_error(), Some(libc::ELOOP), "{refused}");
    }

    #[test]
    fn a_listing_stops_at_its_cap() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..5 {
            std::fs::write(dir.path().join(i.to_string()), b"").unwrap();
        }
        assert_eq!(list_dir(dir.path(), 10).unwrap().0.len(), 5);
        assert!(!list_dir(dir.path(), 5).unwrap().1);
        let (names, cut) = list_dir(dir.path(), 3).unwrap();
        assert_eq!((names.len(), cut), (3, true));
    }
}
