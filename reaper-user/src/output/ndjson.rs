//! The NDJSON stream's lines: made from the events and written to the stream's outlets and to
//! the API's followers, by a thread of their own once detached.
//!
//! In a fork storm, making each line was a tenth of the reader's CPU and handing the outlets
//! their buffers (a copy, a thread woken) nearly as much again, all of it for a line nobody
//! waits on. So once the run has dropped its privileges ([`NdjsonLines::detach`], with the
//! outlets: a thread started before would keep them), the reader numbers each event, keeps
//! it in a batch and hands whole batches to the thread (at a flush, when one is full, before
//! a follower is added), which makes the lines and writes them. Everything it writes to is
//! an [`super::outlet::Outlet`] (it never waits on a slow reader of stdout, until the run's
//! end, when every outlet waits for room) or a follower's bounded queue, so what holds it is
//! CPU alone; the messages waiting for it are bounded, and a reader that gets that far ahead
//! waits for it, as it would have made the lines itself.
//! While batches keep coming the thread dozes between them rather than waiting to be woken
//! (see [`DOZE`]), so that handing one over costs the reader no wake-up of another CPU.
//!
//! Before the detach (start-up, and every test that does not detach), each line is made and
//! written at once on the caller's thread. A write that failed on the thread fails the next
//! event or flush, as a write of the reader's own would have.
use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError, sync_channel};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::output::follow::{Follower, Followers};
use crate::output::writer_thread::{self, FirstError};
use crate::stream::events::{Envelope, Event};

/// Events handed to the thread at once, at most.
const BATCH: usize = 1024;
/// Messages (batches among them) that may wait for the thread before the reader waits for
/// it: some 16,000 events at most.
const WAITING: usize = 16;
/// After a message, the thread looks for the next every [`DOZE`] for [`AWAKE_FOR`] before it
/// sleeps until one comes: a message sent to a thread asleep in its wait costs the reader a
/// futex call that wakes another CPU (as much as making the lines did in a fork storm); one
/// sent while it dozes costs nothing but the send.
const DOZE: Duration = Duration::from_millis(2);
const AWAKE_FOR: Duration = Duration::from_millis(50);

/// The stream's lines, made here or by their thread (see the module's comment).
pub struct NdjsonLines {
    place: Place,
    /// Events not yet handed to the thread.
    batch: Vec<Numbered>,
    /// Events were handed on or kept since the last flush.
    unflushed: bool,
    /// Whether any outlet takes the stream (`--json`, `--output`): without one, lines are made
    /// only while someone follows.
    has_writers: bool,
    /// Followers added, for the count (those the sink let go are in `shared`).
    followers_added: usize,
    shared: Arc<Shared>,
}

/// One event with its place in the stream.
struct Numbered {
    seq: u64,
    ts: u64,
    event: Event,
}

/// Where the lines are made.
enum Place {
    Here(Sink),
    Away {
        to: SyncSender<Message>,
        thread: JoinHandle<()>,
    },
    /// The thread could not be started, or has ended.
    Gone,
}

/// What the reader tells the thread, in the stream's order.
enum Message {
    Events(Vec<Numbered>),
    Follow(Box<Follower>),
    Flush,
    EndFollowers,
    /// Everything before this is written: the thread says so on the sender.
    Written(SyncSender<()>),
}

/// What the lines are written to, and where each is made.
struct Sink {
    writers: Vec<Box<dyn Write + Send>>,
    followers: Followers,
    line: Vec<u8>,
    shared: Arc<Shared>,
}

/// What the reader and the thread share.
#[derive(Default)]
struct Shared {
    /// The first error writing; every later event or flush fails with it.
    failed: FirstError,
    /// Followers the sink let go (they went away, or did not keep up).
    followers_gone: AtomicUsize,
    /// Followers dropped for not keeping up: in all, and not yet said.
    followers_dropped: AtomicU64,
    followers_dropped_unsaid: AtomicU64,
    /// An emptied batch given back for the next.
    spare: Mutex<Option<Vec<Numbered>>>,
}

impl NdjsonLines {
    pub fn new(writers: Vec<Box<dyn Write + Send>>) -> NdjsonLines {
        let shared = Arc::<Shared>::default();
        NdjsonLines {
            has_writers: !writers.is_empty(),
            place: Place::Here(Sink {
                writers,
                followers: Followers::default(),
                line: Vec::with_capacity(1024),
                shared: Arc::clone(&shared),
            }),
            batch: Vec::new(),
            unflushed: false,
            followers_added: 0,
            shared,
        }
    }

    /// Whether lines are made at all: an outlet takes them, or someone follows.
    pub fn wanted(&self) -> bool {
        self.has_writers || self.followers() > 0
    }

    /// The event numbered `seq`, stamped `ts`: written now, or kept for the thread.
    pub fn push(&mut self, seq: u64, ts: u64, event: Event) -> io::Result<()> {
        self.check()?;
        self.unflushed = true;
        let numbered = Numbered { seq, ts, event };
        match &mut self.place {
            Place::Here(sink) => sink.write(&numbered),
            Place::Away { .. } => {
                self.batch.push(numbered);
                if self.batch.len() >= BATCH {
                    self.hand_on()?;
                }
                Ok(())
            }
            Place::Gone => Err(gone()),
        }
    }

    /// Lines go out: the thread is handed what waits and told to flush.
    pub fn flush(&mut self) -> io::Result<()> {
        self.check()?;
        if !std::mem::take(&mut self.unflushed) {
            return Ok(());
        }
        self.hand_on()?;
        match &mut self.place {
            Place::Here(sink) => sink.flush(),
            Place::Away { .. } => self.send(Message::Flush),
            Place::Gone => Err(gone()),
        }
    }

    /// Sends the stream's lines from now on to `follower` too. When the thread has ended (a
    /// write failed), the follower is let go, its stream ended, and the next event or flush
    /// says why.
    pub fn follow(&mut self, follower: Follower) {
        self.followers_added += 1;
        let _ = self.hand_on();
        match &mut self.place {
            Place::Here(sink) => sink.follow(follower),
            Place::Away { .. } => {
                if self.send(Message::Follow(Box::new(follower))).is_err() {
                    self.shared.let_go(1, 0);
                }
            }
            Place::Gone => self.shared.let_go(1, 0),
        }
    }

    /// Ends every follower's stream once their last lines are handed to them (the run's end).
    pub fn end_followers(&mut self) -> io::Result<()> {
        self.hand_on()?;
        match &mut self.place {
            Place::Here(sink) => {
                sink.end_followers();
                Ok(())
            }
            Place::Away { .. } => {
                self.send(Message::EndFollowers)?;
                self.catch_up()
            }
            Place::Gone => Err(gone()),
        }
    }

    /// Waits until every line handed on so far is made and written into the outlets' buffers
    /// (the run's end; a flush hands those on).
    pub fn catch_up(&mut self) -> io::Result<()> {
        self.hand_on()?;
        if let Place::Away { .. } = self.place {
            let (done, written) = sync_channel(1);
            self.send(Message::Written(done))?;
            // The thread ended instead (it failed, or panicked): `check` says which.
            let _ = written.recv();
        }
        self.check()
    }

    /// The followers now.
    pub fn followers(&self) -> usize {
        self.followers_added
            .saturating_sub(self.shared.followers_gone.load(Ordering::Relaxed))
    }

    /// Followers dropped so far for not keeping up.
    pub fn followers_dropped(&self) -> u64 {
        self.shared.followers_dropped.load(Ordering::Relaxed)
    }

    /// Followers dropped for not keeping up since the last call.
    pub fn take_followers_dropped(&self) -> u64 {
        let unsaid = &self.shared.followers_dropped_unsaid;
        match unsaid.load(Ordering::Relaxed) {
            0 => 0,
            _ => unsaid.swap(0, Ordering::Relaxed),
        }
    }

    /// From now on the lines are made and written by a thread of their own. Idempotent; a
    /// thread that cannot be started is an error, and the lines stay on the caller's thread.
    pub fn detach(&mut self) -> io::Result<()> {
        let Place::Here(_) = self.place else {
            return Ok(());
        };
        let Place::Here(sink) = std::mem::replace(&mut self.place, Place::Gone) else {
            unreachable!("matched above")
        };
        let (to, from) = sync_channel(WAITING);
        match writer_thread::start("reaper-ndjson".into(), sink, |sink| sink.serve(from)) {
            Ok(thread) => {
                self.place = Place::Away { to, thread };
                Ok(())
            }
            Err((e, sink)) => {
                self.place = Place::Here(sink);
                Err(e)
            }
        }
    }

    /// Hands the batch to the thread, if there is one and anything waits.
    fn hand_on(&mut self) -> io::Result<()> {
        if self.batch.is_empty() {
            return Ok(());
        }
        let next = self
            .shared
            .spare
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .unwrap_or_else(|| Vec::with_capacity(BATCH));
        let batch = std::mem::replace(&mut self.batch, next);
        self.send(Message::Events(batch))
    }

    fn send(&mut self, message: Message) -> io::Result<()> {
        let Place::Away { to, .. } = &self.place else {
            return Ok(());
        };
        if to.send(message).is_err() {
            // The thread ended: it failed (said by `check`) or panicked.
            self.check()?;
            return Err(gone());
        }
        Ok(())
    }

    /// The error the thread met, if it did.
    fn check(&self) -> io::Result<()> {
        self.shared.failed.check(str::to_string)
    }
}

impl Drop for NdjsonLines {
    /// What waits is handed on and written before the run ends.
    fn drop(&mut self) {
        let _ = self.hand_on();
        let _ = self.send(Message::Flush);
        if let Place::Away { to, thread } = std::mem::replace(&mut self.place, Place::Gone) {
            drop(to);
            let _ = thread.join();
        }
    }
}

impl Sink {
    /// Makes the event's line and writes it to every writer and to the followers that take
    /// it.
    fn write(&mut self, numbered: &Numbered) -> io::Result<()> {
        let env = Envelope {
            event: numbered.event.name(),
            seq: numbered.seq,
            ts: numbered.ts,
            body: &numbered.event,
        };
        self.line.clear();
        env.write_json(&mut self.line).map_err(io::Error::other)?;
        self.line.push(b'\n');
        for w in &mut self.writers {
            w.write_all(&self.line)?;
        }
        if !self.followers.is_empty() {
            Self::with_followers(&mut self.followers, &self.shared, 0, |f| {
                f.offer(&numbered.event, &self.line)
            });
        }
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        Self::with_followers(&mut self.followers, &self.shared, 0, |f| {
            f.flush();
            0
        });
        for w in &mut self.writers {
            w.flush()?;
        }
        Ok(())
    }

    fn follow(&mut self, follower: Follower) {
        // Adding one sends the lines gathered so far, and lets go of those gone meanwhile.
        Self::with_followers(&mut self.followers, &self.shared, 1, |f| {
            f.add(follower);
            0
        });
    }

    fn end_followers(&mut self) {
        Self::with_followers(&mut self.followers, &self.shared, 0, |f| {
            f.end();
            0
        });
    }

    /// Does `what` to the followers, adding `added` of them and returning how many it dropped
    /// for not keeping up; every follower let go on the way is counted.
    fn with_followers(
        followers: &mut Followers,
        shared: &Shared,
        added: usize,
        what: impl FnOnce(&mut Followers) -> u64,
    ) {
        let before = followers.len() + added;
        let dropped = what(followers);
        shared.let_go(before.saturating_sub(followers.len()), dropped);
    }

    /// The thread: takes the reader's messages in order until it goes, or until a write fails
    /// (the error is kept for the reader; nothing more is written).
    fn serve(mut self, from: Receiver<Message>) {
        let mut last = Instant::now();
        loop {
            let message = match from.try_recv() {
                Ok(message) => message,
                Err(TryRecvError::Empty) if last.elapsed() < AWAKE_FOR => {
                    std::thread::sleep(DOZE);
                    continue;
                }
                Err(TryRecvError::Empty) => match from.recv() {
                    Ok(message) => message,
                    Err(_) => break,
                },
                Err(TryRecvError::Disconnected) => break,
            };
            last = Instant::now();
            let done = match message {
                Message::Events(mut batch) => {
                    let wrote = batch.iter().try_for_each(|numbered| self.write(numbered));
                    batch.clear();
                    *self
                        .shared
                        .spare
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner) = Some(batch);
                    wrote
                }
                Message::Follow(follower) => {
                    self.follow(*follower);
                    Ok(())
                }
                Message::Flush => self.flush(),
                Message::EndFollowers => {
                    self.end_followers();
                    Ok(())
                }
                Message::Written(done) => {
                    let _ = done.send(());
                    Ok(())
                }
            };
            if let Err(e) = done {
                self.shared.fail(&e);
                return;
            }
        }
        let _ = self.flush();
    }
}

impl Shared {
    fn fail(&self, e: &io::Error) {
        self.failed.keep(e);
    }

    /// `gone` followers were let go, `dropped` of them for not keeping up.
    fn let_go(&self, gone: usize, dropped: u64) {
        if gone > 0 {
            self.followers_gone.fetch_add(gone, Ordering::Relaxed);
        }
        if dropped > 0 {
            self.followers_dropped.fetch_add(dropped, Ordering::Relaxed);
            self.followers_dropped_unsaid
                .fetch_add(dropped, Ordering::Relaxed);
        }
    }
}

fn gone() -> io::Error {
    io::Error::new(
        io::ErrorKind::BrokenPipe,
        "the thread that writes the NDJSON stream has ended",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::tests::Kept;
    use crate::stream::events::Setsid;

    struct Broken;

    impl Write for Broken {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::ErrorKind::BrokenPipe.into())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn setsid(pid: u32) -> Event {
        Event::Setsid(Setsid { pid, sid: pid })
    }

    #[test]
    fn lines_made_on_the_thread_arrive_whole_numbered_and_in_order() {
        let kept = Kept::default();
        let mut lines = NdjsonLines::new(vec![Box::new(kept.clone())]);
        lines.push(0, 1, setsid(1)).unwrap();
        lines.flush().unwrap();
        assert!(
            kept.0.lock().unwrap().ends_with(b"\n"),
            "before the detach: at once"
        );
        lines.detach().unwrap();
        // More than a batch, and a flush part-way.
        for seq in 1..3 * BATCH as u64 {
            lines.push(seq, 1, setsid(seq as u32)).unwrap();
            if seq == 100 {
                lines.flush().unwrap();
            }
        }
        lines.catch_up().unwrap();
        let text = String::from_utf8(kept.0.lock().unwrap().clone()).unwrap();
        let seqs: Vec<u64> = text
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["seq"]
                    .as_u64()
                    .unwrap()
            })
            .collect();
        assert_eq!(seqs, (0..3 * BATCH as u64).collect::<Vec<_>>());
    }

    #[test]
    fn a_write_that_fails_on_the_thread_fails_a_later_event_or_flush() {
        let mut lines = NdjsonLines::new(vec![Box::new(Broken)]);
        lines.detach().unwrap();
        lines.push(0, 1, setsid(1)).unwrap();
        let cap = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let failed = loop {
            let tried = lines.flush().and_then(|()| lines.push(1, 1, setsid(1)));
            match tried {
                Err(e) => break e,
                Ok(()) => assert!(std::time::Instant::now() < cap, "the error never came"),
            }
            std::thread::yield_now();
        };
        assert_eq!(failed.kind(), io::ErrorKind::BrokenPipe);
        assert!(lines.catch_up().is_err(), "and every later one");
    }
}
