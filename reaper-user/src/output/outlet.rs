//! An outlet (stdout, stderr, the `--output` file) that the ring's reader never waits on.
//!
//! A pipe whose reader stopped reading (`reaper-trace | less` left on one page), a terminal
//! held by Ctrl-S or a slow disk blocks a write(2) for as long as it likes; on the reader's
//! thread that would hold the ring, lose records and cost a repair from /proc. So once the
//! run has dropped its privileges ([`Outlet::detach`]: capabilities are each thread's, and
//! that drop needs the process to have one thread), each outlet is written by a thread of
//! its own: the reader hands it whole buffers of lines and goes on. Up to [`WAITING`] bytes
//! wait for a slow outlet; past that, the reader drops whole buffers of lines and counts
//! them ([`Outlet::take_dropped`]: the output says so in a note), and the other outlets lose
//! nothing. Before the detach (start-up), writes are made at once, on the caller's thread.
//!
//! Handles are cloned for each writer of one outlet (the notes, the readable lines and the
//! status line all go to stderr): each keeps its own buffer and hands it on at its flush, so
//! what reaches the outlet is in the order the handles were flushed, as when each wrote to
//! the descriptor itself. An error writing (EPIPE: the reader of stdout went away) is
//! returned by the next write or flush of any handle, as a blocking write would have.
use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use super::writer_thread::{self, FirstError};

/// Bytes that may wait for one outlet's thread; the same bound as a full disk's backlog
/// (see [`super::logfile`]).
pub const WAITING: usize = 64 << 20;
/// A handle's buffer is handed on when it reaches this, at its last complete line.
const BUFFERED: usize = 64 << 10;

/// A handle of one outlet (see the module's comment).
pub struct Outlet {
    buf: Vec<u8>,
    shared: Arc<Shared>,
}

/// What the handles of one outlet share. When the last handle goes, the thread is told to
/// end (the sender is dropped) and waited for.
struct Shared {
    /// The outlet's name in notes and errors: `stdout`, `stderr`, the file's path.
    name: String,
    place: Mutex<Place>,
    counts: Arc<Counts>,
    /// The most that may wait (a test sets it low).
    limit: usize,
    /// Set at the run's end: past the limit, a handle waits for room instead of dropping.
    patient: std::sync::atomic::AtomicBool,
}

/// What the handles and the outlet's thread share.
#[derive(Default)]
struct Counts {
    /// Bytes handed to the thread and not yet written.
    waiting: AtomicUsize,
    /// Lines dropped since the last [`Outlet::take_dropped`].
    dropped: AtomicU64,
    /// The first error writing, once the thread met one: every later write fails with it.
    failed: FirstError,
}

/// Where the outlet's writer is.
enum Place {
    /// On the caller's thread (before [`Outlet::detach`]).
    Here(Box<dyn Write + Send>),
    /// On a thread of its own, fed buffers through `to`.
    Away {
        to: Sender<Vec<u8>>,
        thread: JoinHandle<()>,
    },
    /// Gone: the thread ended (the last handle was dropped) or could not be started.
    Gone,
}

impl Outlet {
    /// An outlet named `name` written to `writer`, on the caller's thread until detached.
    pub fn new(name: impl Into<String>, writer: Box<dyn Write + Send>) -> Outlet {
        Outlet::with_limit(name, writer, WAITING)
    }

    pub(super) fn with_limit(
        name: impl Into<String>,
        writer: Box<dyn Write + Send>,
        limit: usize,
    ) -> Outlet {
        Outlet {
            buf: Vec::with_capacity(BUFFERED),
            shared: Arc::new(Shared {
                name: name.into(),
                place: Mutex::new(Place::Here(writer)),
                counts: Arc::default(),
                limit,
                patient: false.into(),
            }),
        }
    }

    /// Another handle of the same outlet, with a buffer of its own.
    pub fn handle(&self) -> Outlet {
        Outlet {
            buf: Vec::new(),
            shared: Arc::clone(&self.shared),
        }
    }

    /// The outlet's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// From now on the outlet is written by a thread of its own. Idempotent; a thread that
    /// cannot be started is an error, and the outlet stays on the caller's thread.
    pub fn detach(&self) -> io::Result<()> {
        let mut place = self.shared.lock_place();
        let Place::Here(_) = &*place else {
            return Ok(());
        };
        let Place::Here(writer) = std::mem::replace(&mut *place, Place::Gone) else {
            unreachable!("matched above")
        };
        let (to, from) = channel::<Vec<u8>>();
        let counts = Arc::clone(&self.shared.counts);
        let name = format!("outlet {}", self.shared.name);
        let started = writer_thread::start(name, writer, move |mut writer| {
            for bytes in from {
                if !counts.failed.met() {
                    let wrote = writer.write_all(&bytes).and_then(|()| writer.flush());
                    if let Err(e) = wrote {
                        counts.failed.keep(&e);
                    }
                }
                counts
                    .waiting
                    .fetch_sub(bytes.capacity(), Ordering::Relaxed);
            }
            // The writer's own end (a file's last flush) runs here, off the reader.
            drop(writer);
        });
        match started {
            Ok(thread) => {
                *place = Place::Away { to, thread };
                Ok(())
            }
            Err((e, writer)) => {
                *place = Place::Here(writer);
                Err(e)
            }
        }
    }

    /// Lines dropped since the last call because more than the limit was waiting.
    pub fn take_dropped(&self) -> u64 {
        self.shared.counts.dropped.swap(0, Ordering::Relaxed)
    }

    /// From now on a handle waits for room past the limit instead of dropping lines: the
    /// run's end (the summary, the closing tree), when the ring is read no more.
    pub fn wait_for_room(&self) {
        self.shared.patient.store(true, Ordering::Relaxed);
    }

    /// Whether what waits for the thread is down to half the limit: a stall is over.
    pub fn caught_up(&self) -> bool {
        self.shared.counts.waiting.load(Ordering::Relaxed) <= self.shared.limit / 2
    }

    /// Hands `self.buf[..end]` on: written now, queued for the thread, or dropped and
    /// counted when too much waits already.
    fn hand_on(&mut self, end: usize) -> io::Result<()> {
        if let Err(e) = self.shared.check() {
            // Nothing more reaches a failed outlet: its lines are let go, not kept.
            self.buf.clear();
            return Err(e);
        }
        if end == 0 {
            return Ok(());
        }
        let mut place = self.shared.lock_place();
        match &mut *place {
            Place::Here(writer) => {
                let wrote = writer.write_all(&self.buf[..end]);
                self.buf.drain(..end);
                wrote?;
                writer.flush()
            }
            Place::Away { to, .. } => {
                let counts = &self.shared.counts;
                let full = || {
                    let waiting = counts.waiting.load(Ordering::Relaxed);
                    waiting.saturating_add(end) > self.shared.limit
                };
                while full() && self.shared.patient.load(Ordering::Relaxed) {
                    // The thread takes what waits, or fails (then nothing more is taken).
                    self.shared.check()?;
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                if full() {
                    let lines = self.buf[..end].iter().filter(|&&b| b == b'\n').count();
                    counts
                        .dropped
                        .fetch_add(lines.max(1) as u64, Ordering::Relaxed);
                    self.buf.drain(..end);
                    return Ok(());
                }
                // Copied out at its length (a copy of what one write(2) takes anyway): what
                // waits holds no more memory than it counts, however small each flush is.
                let bytes = self.buf[..end].to_vec();
                self.buf.drain(..end);
                counts
                    .waiting
                    .fetch_add(bytes.capacity(), Ordering::Relaxed);
                if to.send(bytes).is_err() {
                    return Err(self.shared.gone());
                }
                Ok(())
            }
            Place::Gone => Err(self.shared.gone()),
        }
    }
}

impl Shared {
    fn lock_place(&self) -> std::sync::MutexGuard<'_, Place> {
        self.place.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The error the thread met, if it did.
    fn check(&self) -> io::Result<()> {
        (self.counts.failed).check(|text| format!("{}: {text}", self.name))
    }

    fn gone(&self) -> io::Error {
        io::Error::new(
            io::ErrorKind::BrokenPipe,
            format!("{}: its writer thread has ended", self.name),
        )
    }
}

impl Write for Outlet {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(bytes);
        if self.buf.len() >= BUFFERED {
            // Whole lines only: a partial line waits for the rest.
            if let Some(last) = self.buf.iter().rposition(|&b| b == b'\n') {
                self.hand_on(last + 1)?;
            }
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.hand_on(self.buf.len())
    }
}

impl Drop for Outlet {
    fn drop(&mut self) {
        let _ = self.flush();
    }
}

impl Drop for Shared {
    /// The last handle is gone: what waits is written before the run ends (a reader of
    /// stdout that never reads holds the exit, as a blocking write would have).
    fn drop(&mut self) {
        let place = std::mem::replace(
            self.place.get_mut().unwrap_or_else(PoisonError::into_inner),
            Place::Gone,
        );
        if let Place::Away { to, thread } = place {
            drop(to);
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

    use super::*;

    /// A writer that takes each write only when the test lets it, and keeps what it took.
    struct Gate {
        open: Receiver<()>,
        kept: Arc<Mutex<Vec<u8>>>,
    }

    impl Write for Gate {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            self.open
                .recv()
                .map_err(|_| io::Error::from(io::ErrorKind::BrokenPipe))?;
            self.kept.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn gated(limit: usize) -> (Outlet, SyncSender<()>, Arc<Mutex<Vec<u8>>>) {
        let (open, gate) = sync_channel(0);
        let kept = Arc::new(Mutex::new(Vec::new()));
        let writer = Gate {
            open: gate,
            kept: Arc::clone(&kept),
        };
        (
            Outlet::with_limit("test", Box::new(writer), limit),
            open,
            kept,
        )
    }

    #[test]
    fn a_stalled_outlet_never_holds_the_writer_and_drops_whole_lines_past_its_limit() {
        let (mut outlet, open, kept) = gated(100);
        outlet.detach().unwrap();
        // The thread takes the first buffer and waits at the gate with it; the next ones
        // wait in the queue, up to the limit; the rest are dropped, whole lines counted.
        for n in 0..40 {
            writeln!(outlet, "line {n:02}").unwrap();
            outlet.flush().unwrap();
        }
        let dropped = outlet.take_dropped();
        assert!(dropped > 0 && dropped < 40, "{dropped} dropped");
        assert_eq!(outlet.take_dropped(), 0, "counted once");
        // Let it all through: what was kept arrives whole and in order.
        let feeder = std::thread::spawn(move || while open.send(()).is_ok() {});
        drop(outlet);
        feeder.join().unwrap();
        let text = String::from_utf8(kept.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len() as u64 + dropped, 40, "{text}");
        let mut numbers = lines.iter().map(|l| l.strip_prefix("line ").unwrap());
        assert!(numbers.all(|n| n.len() == 2), "whole lines: {text}");
        assert!(lines.windows(2).all(|w| w[0] < w[1]), "in order: {text}");
    }

    #[test]
    fn handles_of_one_outlet_arrive_in_the_order_they_were_flushed() {
        let (mut first, open, kept) = gated(WAITING);
        let feeder = std::thread::spawn(move || while open.send(()).is_ok() {});
        let mut second = first.handle();
        first.write_all(b"a\n").unwrap();
        second.write_all(b"b\n").unwrap();
        second.flush().unwrap();
        first.flush().unwrap();
        first.detach().unwrap();
        second.write_all(b"c\n").unwrap();
        second.flush().unwrap();
        drop((first, second));
        feeder.join().unwrap();
        assert_eq!(kept.lock().unwrap().as_slice(), b"b\na\nc\n");
    }

    #[test]
    fn an_error_on_the_thread_fails_the_next_write() {
        let (mut outlet, open, _) = gated(WAITING);
        outlet.detach().unwrap();
        drop(open);
        outlet.write_all(b"lost\n").unwrap();
        outlet.flush().unwrap();
        // The thread meets the closed gate (a broken pipe) and says so from then on.
        let cap = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let failed = loop {
            match outlet.flush() {
                Err(e) => break e,
                Ok(()) => assert!(std::time::Instant::now() < cap, "the error never came"),
            }
            std::thread::yield_now();
        };
        assert_eq!(failed.kind(), io::ErrorKind::BrokenPipe);
        assert!(failed.to_string().starts_with("test: "), "{failed}");
    }
}
