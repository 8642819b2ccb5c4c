//! `--output FILE`: the NDJSON stream in a file, rotated by size, that survives a full disk.
//!
//! Lines are only ever cut between lines: a rotation happens before a line that would take
//! the file past `--rotate-size`, never inside one. When a write fails (disk full, quota), the
//! unwritten bytes stay buffered (up to [`MAX_BACKLOG`]) and are retried at the next flush;
//! past that, whole lines are dropped and counted. Either way tracing goes on, and stderr says
//! what happened once when it starts and once when writing works again.
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// Unwritten bytes kept while the file cannot be written.
const MAX_BACKLOG: usize = 64 << 20;

/// Rotation settings: `size` bytes a file, `keep` rotated files (`FILE.1` newest).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rotation {
    pub size: u64,
    pub keep: u32,
}

pub struct LogFile {
    path: PathBuf,
    file: File,
    /// Bytes in the current file.
    written: u64,
    rotation: Option<Rotation>,
    /// Complete lines not yet in the file.
    pending: Vec<u8>,
    /// Set while writes fail: the error, reported once.
    failing: Option<io::ErrorKind>,
    /// Lines dropped because the backlog was full, since stderr last said so.
    dropped_since_report: u64,
    /// A short write left the file in the middle of a line.
    mid_line: bool,
    max_backlog: usize,
    /// Where it says that writing fails or works again: standard error, through its
    /// outlet (see [`LogFile::say_on`]), or straight to it.
    said: Option<Box<dyn Write + Send>>,
}

impl LogFile {
    /// Opens `path` for appending (an earlier audit's lines are kept).
    pub fn open(path: &Path, rotation: Option<Rotation>) -> Result<LogFile> {
        let file = open_append(path)
            .with_context(|| format!("--output {}: cannot open it for writing", path.display()))?;
        let written = file.metadata().map(|m| m.len()).unwrap_or(0);
        Ok(LogFile {
            path: path.to_path_buf(),
            file,
            written,
            rotation,
            pending: Vec::with_capacity(64 << 10),
            failing: None,
            dropped_since_report: 0,
            mid_line: false,
            max_backlog: MAX_BACKLOG,
            said: None,
        })
    }

    /// Says what happens to the file on `stderr` (standard error's outlet: this file's own
    /// thread never waits on a terminal).
    pub fn say_on(mut self, stderr: Box<dyn Write + Send>) -> LogFile {
        self.said = Some(stderr);
        self
    }

    /// One line for the operator.
    fn say(&mut self, text: &str) {
        match self.said.as_mut() {
            Some(w) => {
                let _ = writeln!(w, "reaper-trace: {text}").and_then(|()| w.flush());
            }
            None => eprintln!("reaper-trace: {text}"),
        }
    }

    /// Queues complete lines (each with its newline).
    fn push_lines(&mut self, lines: &[u8]) {
        if self.pending.len() + lines.len() > self.max_backlog {
            self.dropped_since_report += lines.iter().filter(|&&b| b == b'\n').count() as u64;
            return;
        }
        self.pending.extend_from_slice(lines);
    }

    /// Writes the queued lines, rotating between lines; keeps what the disk refuses.
    fn write_pending(&mut self) -> io::Result<()> {
        let mut done = 0;
        let result = self.write_lines(&mut done);
        self.pending.drain(..done);
        result
    }

    /// Writes whole lines from `pending[*done..]`, as many a call as fit before the next
    /// rotation, advancing `done` past what the file took.
    fn write_lines(&mut self, done: &mut usize) -> io::Result<()> {
        while *done < self.pending.len() {
            let first = line_len(&self.pending[*done..]);
            let chunk = match self.rotation {
                // A line cut short by a failed write is finished in the same file.
                _ if self.mid_line => first,
                None => self.pending.len() - *done,
                Some(rot) => {
                    if self.written > 0 && self.written + first as u64 > rot.size {
                        self.rotate(rot)?;
                    }
                    let room = rot.size.saturating_sub(self.written) as usize;
                    whole_lines_within(&self.pending[*done..], room).max(first)
                }
            };
            let n = loop {
                match self.file.write(&self.pending[*done..*done + chunk]) {
                    Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                    Ok(n) => break n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            };
            *done += n;
            self.written += n as u64;
            self.mid_line = self.pending[*done - 1] != b'\n';
        }
        Ok(())
    }

    /// FILE → FILE.1 → … → FILE.keep; the oldest beyond `keep` is removed.
    fn rotate(&mut self, rot: Rotation) -> io::Result<()> {
        self.file.flush()?;
        if rot.keep == 0 {
            self.file.set_len(0)?;
        } else {
            let _ = fs::remove_file(numbered(&self.path, rot.keep));
            for k in (1..rot.keep).rev() {
                let from = numbered(&self.path, k);
                if from.exists() {
                    fs::rename(&from, numbered(&self.path, k + 1))?;
                }
            }
            fs::rename(&self.path, numbered(&self.path, 1))?;
        }
        self.file = open_append(&self.path)?;
        self.written = 0;
        Ok(())
    }
}

impl Write for LogFile {
    /// Takes complete NDJSON lines (its [`Outlet`](super::outlet::Outlet) hands on whole
    /// lines only).
    fn write(&mut self, lines: &[u8]) -> io::Result<usize> {
        self.push_lines(lines);
        Ok(lines.len())
    }

    /// Writes what is queued. Never fails: a refusing disk is reported on stderr and the
    /// lines wait (or, past the backlog limit, are dropped and counted). Said on stderr
    /// directly, not as a `note`: this is the stream's own outlet failing, and a note would be
    /// queued behind the lines it cannot write.
    fn flush(&mut self) -> io::Result<()> {
        match self.write_pending() {
            Ok(()) => {
                if self.failing.take().is_some() {
                    let text = format!(
                        "{}: writing again; {} events dropped meanwhile",
                        self.path.display(),
                        self.dropped_since_report
                    );
                    self.say(&text);
                    self.dropped_since_report = 0;
                }
            }
            Err(e) => {
                if self.failing.is_none() {
                    let text = format!(
                        "warning: {}: {e}; still tracing, events wait in memory (up to {} \
                         MiB, then they are dropped and counted)",
                        self.path.display(),
                        MAX_BACKLOG >> 20
                    );
                    self.say(&text);
                    self.failing = Some(e.kind());
                }
            }
        }
        Ok(())
    }
}

/// Opens for appending; a new file is readable by its owner and group only (argv can hold
/// secrets).
impl Drop for LogFile {
    /// A last try at the end of the run; what still cannot be written is said, not hidden.
    fn drop(&mut self) {
        let _ = self.flush();
        if self.failing.is_some() {
            let waiting = self.pending.iter().filter(|&&b| b == b'\n').count() as u64;
            let text = format!(
                "{}: {} events could not be written (the stream on stdout, if any, has them)",
                self.path.display(),
                waiting + self.dropped_since_report
            );
            self.say(&text);
        }
    }
}

fn open_append(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o640)
        .open(path)
}

/// Length of the first line of `buf` (with its newline).
fn line_len(buf: &[u8]) -> usize {
    buf.iter()
        .position(|&b| b == b'\n')
        .map_or(buf.len(), |i| i + 1)
}

/// Length of the longest run of whole lines at the start of `buf` within `room` bytes.
fn whole_lines_within(buf: &[u8], room: usize) -> usize {
    let window = &buf[..buf.len().min(room)];
    window
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |i| i + 1)
}

/// `FILE.k`.
pub fn numbered(path: &Path, k: u32) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(format!(".{k}"));
    PathBuf::from(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(n: usize) -> Vec<String> {
        (0..n)
            .map(|i| format!("{{\"seq\":{i},\"pad\":\"{}\"}}\n", "x".repeat(i % 50)))
            .collect()
    }

    fn read(path: &Path) -> String {
        fs::read_to_string(path).unwrap_or_default()
    }

    #[test]
    fn rotation_keeps_every_line_whole_and_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.ndjson");
        let rot = Rotation {
            size: 1000,
            keep: 100,
        };
        let mut f = LogFile::open(&path, Some(rot)).unwrap();
        let all = lines(500);
        for (i, l) in all.iter().enumerate() {
            f.write_all(l.as_bytes()).unwrap();
            if i % 7 == 0 {
                f.flush().unwrap();
            }
        }
        f.flush().unwrap();
        let mut joined = String::new();
        let mut k = 100;
        while k > 0 {
            let p = numbered(&path, k);
            let text = read(&p);
            if !text.is_empty() {
                assert!(
                    text.len() as u64 <= rot.size,
                    "{} is {} bytes",
                    p.display(),
                    text.len()
                );
                assert!(text.ends_with('\n'));
            }
            joined += &text;
            k -= 1;
        }
        joined += &read(&path);
        assert_eq!(joined, all.concat());
        assert!(numbered(&path, 2).exists());
    }

    #[test]
    fn rotation_keeps_only_the_newest_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.ndjson");
        let mut f = LogFile::open(&path, Some(Rotation { size: 200, keep: 2 })).unwrap();
        for l in lines(200) {
            f.write_all(l.as_bytes()).unwrap();
            f.flush().unwrap();
        }
        assert!(numbered(&path, 1).exists() && numbered(&path, 2).exists());
        assert!(!numbered(&path, 3).exists());
        assert!(read(&path).ends_with(
            "\"seq\":199,\"pad\":\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"}\n"
        ));
    }

    #[test]
    fn a_line_larger_than_the_rotation_size_gets_a_file_of_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.ndjson");
        let mut f = LogFile::open(&path, Some(Rotation { size: 100, keep: 5 })).unwrap();
        let big = format!("{{\"argv\":\"{}\"}}\n", "a".repeat(500));
        for l in ["{\"a\":1}\n", &big, "{\"b\":2}\n"] {
            f.write_all(l.as_bytes()).unwrap();
        }
        f.flush().unwrap();
        assert_eq!(read(&numbered(&path, 2)), "{\"a\":1}\n");
        assert_eq!(read(&numbered(&path, 1)), big);
        assert_eq!(read(&path), "{\"b\":2}\n");
    }

    #[test]
    fn a_full_disk_keeps_lines_waiting_then_drops_and_counts() {
        // /dev/full refuses every write with ENOSPC.
        let mut f = LogFile::open(Path::new("/dev/full"), None).unwrap();
        f.max_backlog = 100;
        f.write_all(b"{\"seq\":0}\n").unwrap();
        f.flush().unwrap(); // reports, does not fail
        assert_eq!(f.failing, Some(io::ErrorKind::StorageFull));
        assert_eq!(f.pending, b"{\"seq\":0}\n");
        for _ in 0..20 {
            f.write_all(b"{\"seq\":1}\n").unwrap();
        }
        assert_eq!(f.pending.len(), 100);
        assert_eq!(f.dropped_since_report, 11);
    }
}
