//! Readable lines on an outlet the gateway command writes to as well (`-- CMD` inherits
//! reaper-trace's stdout and stderr): each write(2) is whole lines and at most `PIPE_BUF`
//! bytes, which a pipe delivers without interleaving another writer's bytes, so neither side's
//! lines are split by the other's. (A single line longer than `PIPE_BUF` cannot be kept whole
//! on a pipe; it goes in one write of its own.) It sits behind an
//! [`Outlet`](super::outlet::Outlet), which hands on whole lines, or the status line's text
//! (drawn in place, with no newline): a flush writes that rest as it is.
use std::io::{self, Write};

/// The most a pipe write keeps together (`PIPE_BUF` on Linux).
const PIPE_BUF: usize = 4096;
/// Buffered before a flush is forced, as the plain outlets' `BufWriter`s do.
const BUFFERED: usize = 64 << 10;

/// A buffered writer whose every write(2) is whole lines of at most [`PIPE_BUF`] bytes.
pub struct WholeLines<W: Write> {
    inner: W,
    buf: Vec<u8>,
}

impl<W: Write> WholeLines<W> {
    pub fn new(inner: W) -> Self {
        WholeLines {
            inner,
            buf: Vec::with_capacity(BUFFERED),
        }
    }

    /// Writes out every complete line buffered, in whole-line chunks.
    fn write_lines(&mut self) -> io::Result<()> {
        let mut at = 0;
        while let Some(end) = chunk_end(&self.buf[at..]) {
            self.inner.write_all(&self.buf[at..at + end])?;
            at += end;
        }
        self.buf.drain(..at);
        Ok(())
    }
}

/// The length of the next chunk of `pending` to write: the whole lines that fit in
/// [`PIPE_BUF`], or one longer line alone; None when no complete line is pending.
fn chunk_end(pending: &[u8]) -> Option<usize> {
    let window = &pending[..pending.len().min(PIPE_BUF)];
    match window.iter().rposition(|&b| b == b'\n') {
        Some(last) => Some(last + 1),
        None => pending.iter().position(|&b| b == b'\n').map(|n| n + 1),
    }
}

impl<W: Write> Write for WholeLines<W> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(bytes);
        if self.buf.len() >= BUFFERED {
            self.write_lines()?;
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.write_lines()?;
        if !self.buf.is_empty() {
            self.inner.write_all(&self.buf)?;
            self.buf.clear();
        }
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records each write(2) it is given.
    #[derive(Default)]
    struct Writes(Vec<Vec<u8>>);

    impl Write for Writes {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.0.push(b.to_vec());
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn every_write_is_whole_lines_within_pipe_buf() {
        let mut w = WholeLines::new(Writes::default());
        let line = format!("[    2.604s] fork {}\n", "x".repeat(80));
        for _ in 0..2000 {
            w.write_all(line.as_bytes()).unwrap();
        }
        w.write_all(b"partial").unwrap();
        w.flush().unwrap();
        let (rest, writes) = w.inner.0.split_last().unwrap();
        assert!(writes.len() > 1);
        for chunk in writes {
            assert!(chunk.len() <= PIPE_BUF, "{}", chunk.len());
            assert!(chunk.ends_with(b"\n"));
        }
        assert_eq!(
            writes.iter().map(Vec::len).sum::<usize>(),
            2000 * line.len()
        );
        assert_eq!(rest, b"partial", "the rest goes alone, at the flush");
    }

    #[test]
    fn a_line_longer_than_pipe_buf_goes_alone() {
        let mut w = WholeLines::new(Writes::default());
        let long = format!("{}\n", "y".repeat(PIPE_BUF * 2));
        w.write_all(b"short\n").unwrap();
        w.write_all(long.as_bytes()).unwrap();
        w.flush().unwrap();
        assert_eq!(w.inner.0, [b"short\n".to_vec(), long.into_bytes()]);
    }
}
