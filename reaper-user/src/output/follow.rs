//! The API's followers (`GET /v1/events?follow`): each gets the stream's lines from the
//! moment it asked, those its filter picks, through a bounded queue. The run never waits for
//! one: a follower whose queue is full is dropped (its last line says so) and counted in the
//! summary's `delivery.followers_dropped`; the stream's own outlets lose nothing.
//!
//! Lines go to a follower in chunks: those of a batch are gathered and sent when the outlets
//! are flushed (after a batch, or at the housekeeping tick while records stream) or once a
//! chunk is full. A line each was a send, a wake-up and an HTTP chunk each, and a follower
//! cost the reader as much again as the rest of its work in a fork storm (BENCHMARKS.md).
//! The followers of the whole stream (no filter) share each chunk: its lines are gathered
//! once, whatever their number, and each gets the same bytes.
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::leaks::Reason;
use crate::stream::events::{Event, KINDS};

/// Lines a follower may have waiting before it is dropped, unless it asks for fewer
/// (`queue=N`): more than a batch of the ring holds after a slow scan, so that a follower
/// that reads is not dropped by a burst (the connection's task runs between batches).
pub const QUEUE: usize = 65_536;

/// What a follower asked for (`/v1/events?follow&pid=P&event=fork,exec&reason=R`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FollowFilter {
    /// Present (with no value) to follow; the stream from now on is the only way to read it.
    pub follow: Option<String>,
    /// Only events about this process and the processes it spawns from now on (and the
    /// run's own events: `lost`, `note`, `summary`, which are about no process).
    pub pid: Option<u32>,
    /// Only these events, by name (`fork,exec,flag`).
    pub event: Option<String>,
    /// Only events about a flag for this rule (`flag`, `cleared`, `kill`).
    pub reason: Option<Reason>,
    /// How many lines it may fall behind before it is dropped: 2 to [`QUEUE`], the default.
    pub queue: Option<usize>,
}

impl FollowFilter {
    /// What is wrong with it: an event name the stream has no event of.
    pub fn check(&self) -> Result<(), String> {
        let names = self.event.iter().flat_map(|list| list.split(','));
        match names
            .map(str::trim)
            .find(|n| !KINDS.iter().any(|k| k.name == *n))
        {
            Some(unknown) => {
                let all: Vec<&str> = KINDS.iter().map(|k| k.name).collect();
                Err(format!(
                    "no event is named `{unknown}` (the stream's: {})",
                    all.join(", ")
                ))
            }
            None => Ok(()),
        }
    }

    /// The queue it gets.
    pub fn queue(&self) -> usize {
        self.queue.unwrap_or(QUEUE).clamp(2, QUEUE)
    }
}

/// A chunk is sent once its lines reach this many bytes, whatever the batch.
const CHUNK: usize = 64 << 10;

/// Lines on their way to a follower: the bytes, and how many lines they are.
struct Chunk {
    bytes: Bytes,
    lines: usize,
}

/// A follower's queue, from the run to its connection: chunks of lines, bounded by the
/// lines in it (`limit`), counted as they are sent and as the connection takes them.
pub fn queue(limit: usize) -> (FollowQueue, FollowStream) {
    let (chunks, rx) = mpsc::unbounded_channel();
    let queued = Arc::new(AtomicUsize::new(0));
    let queue = FollowQueue {
        chunks,
        queued: queued.clone(),
        limit,
    };
    (queue, FollowStream { chunks: rx, queued })
}

/// The run's end of a follower's queue.
#[derive(Debug)]
pub struct FollowQueue {
    chunks: mpsc::UnboundedSender<Chunk>,
    /// Lines sent and not yet taken by the connection.
    queued: Arc<AtomicUsize>,
    limit: usize,
}

/// The connection's end of a follower's queue.
pub struct FollowStream {
    chunks: mpsc::UnboundedReceiver<Chunk>,
    queued: Arc<AtomicUsize>,
}

impl FollowStream {
    /// The next chunk of lines; `None` once the run ended this follower.
    pub fn poll_chunk(&mut self, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        self.chunks.poll_recv(cx).map(|chunk| {
            chunk.map(|c| {
                self.queued.fetch_sub(c.lines, Ordering::Relaxed);
                c.bytes
            })
        })
    }
}

/// A follower: its queue, the lines gathered for it, and what it asked for.
pub struct Follower {
    queue: FollowQueue,
    /// It follows the whole stream: its lines are the ones [`Followers`] gathers for all such
    /// followers, not its own.
    whole: bool,
    gathered: BytesMut,
    gathered_lines: usize,
    events: Option<Vec<String>>,
    reason: Option<Reason>,
    /// With `pid`: the processes it follows (`pid`'s descendants alive when it asked, and
    /// each one forked by one of them since).
    subtree: Option<HashSet<u32>>,
}

impl Follower {
    /// A follower of `filter`, its lines sent to `queue`; `descendants` are the processes
    /// already under `filter.pid` (itself included).
    pub fn new(
        filter: &FollowFilter,
        queue: FollowQueue,
        descendants: impl IntoIterator<Item = u32>,
    ) -> Follower {
        Follower {
            queue,
            whole: filter.pid.is_none() && filter.event.is_none() && filter.reason.is_none(),
            gathered: BytesMut::new(),
            gathered_lines: 0,
            events: filter
                .event
                .as_ref()
                .map(|list| list.split(',').map(|e| e.trim().to_owned()).collect()),
            reason: filter.reason,
            subtree: filter.pid.map(|_| descendants.into_iter().collect()),
        }
    }

    /// Whether it wants `event`; keeps its subtree up to date first.
    fn picks(&mut self, event: &Event) -> bool {
        if let Some(subtree) = self.subtree.as_mut() {
            match event {
                Event::Fork(f) if subtree.contains(&f.spawner) || subtree.contains(&f.ppid) => {
                    subtree.insert(f.pid);
                }
                // Its pid may be another process's next.
                Event::Reaped(r) if subtree.remove(&r.pid) => return self.passes(event),
                _ => {}
            }
            if event.pid().is_some_and(|pid| !subtree.contains(&pid)) {
                return false;
            }
        }
        self.passes(event)
    }

    fn passes(&self, event: &Event) -> bool {
        let named = self
            .events
            .as_ref()
            .is_none_or(|names| names.iter().any(|n| n == event.name()));
        named && self.reason.is_none_or(|r| event.reason() == Some(r))
    }

    /// Lines it has not read yet: in its queue, and gathered.
    fn behind(&self) -> usize {
        self.queue.queued.load(Ordering::Relaxed) + self.gathered_lines
    }

    /// Sends what was gathered; false when the connection is gone.
    fn send(&mut self) -> bool {
        let bytes = self.gathered.split().freeze();
        let lines = std::mem::take(&mut self.gathered_lines);
        self.send_chunk(&bytes, lines)
    }

    /// Sends `chunk` of `lines` lines (its own, or of the whole stream); false when the
    /// connection is gone.
    fn send_chunk(&mut self, chunk: &Bytes, lines: usize) -> bool {
        if lines == 0 {
            return !self.queue.chunks.is_closed();
        }
        self.queue.queued.fetch_add(lines, Ordering::Relaxed);
        let chunk = Chunk {
            bytes: chunk.clone(),
            lines,
        };
        self.queue.chunks.send(chunk).is_ok()
    }

    /// Sends what was gathered, and the notice that it was dropped, last.
    fn drop_behind(&mut self) {
        self.send();
        let notice = Chunk {
            bytes: Bytes::from_static(DROPPED),
            lines: 1,
        };
        let _ = self.queue.chunks.send(notice);
    }
}

/// The followers of a run.
#[derive(Default)]
pub struct Followers {
    list: Vec<Follower>,
    /// The lines gathered for the followers of the whole stream, once for all of them.
    whole: BytesMut,
    whole_lines: usize,
    /// Followers dropped because they did not keep up.
    pub dropped: u64,
}

impl Followers {
    pub fn add(&mut self, follower: Follower) {
        // The lines gathered for the whole stream so far go to the followers before it: one
        // follows from its question on.
        if follower.whole {
            self.send_whole();
        }
        self.list.push(follower);
    }

    /// Ends every follower's stream: their queues close once what waits in them is read.
    pub fn end(&mut self) {
        self.flush();
        self.list.clear();
    }

    pub fn len(&self) -> usize {
        self.list.len()
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Offers `event`'s `line` (newline included) to each follower that picks it. Returns
    /// how many were dropped for a full queue (a follower gone is forgotten silently).
    pub fn offer(&mut self, event: &Event, line: &[u8]) -> u64 {
        let mut dropped = 0;
        if self.list.iter().any(|f| f.whole) {
            self.whole.extend_from_slice(line);
            self.whole_lines += 1;
        }
        let (whole, whole_lines) = (&self.whole, self.whole_lines);
        self.list.retain_mut(|f| {
            // A follower gone is forgotten, not counted as one that did not keep up.
            if f.queue.chunks.is_closed() {
                return false;
            }
            if f.whole {
                // A queue's last place is kept for the notice that it was dropped.
                if f.queue.queued.load(Ordering::Relaxed) + whole_lines >= f.queue.limit {
                    // What was gathered before this line, then the notice in its place.
                    let before = &whole[..whole.len() - line.len()];
                    f.send_chunk(&Bytes::copy_from_slice(before), whole_lines - 1);
                    f.drop_behind();
                    dropped += 1;
                    return false;
                }
                return true;
            }
            if !f.picks(event) {
                return true;
            }
            // A queue's last place is kept for the notice that it was dropped.
            if f.behind() + 1 >= f.queue.limit {
                f.drop_behind();
                dropped += 1;
                return false;
            }
            f.gathered.extend_from_slice(line);
            f.gathered_lines += 1;
            f.gathered.len() < CHUNK || f.send()
        });
        if self.whole.len() >= CHUNK {
            self.send_whole();
        }
        self.dropped += dropped;
        dropped
    }

    /// Sends the lines gathered for the followers of the whole stream, one chunk shared.
    fn send_whole(&mut self) {
        let chunk = self.whole.split().freeze();
        let lines = std::mem::take(&mut self.whole_lines);
        self.list
            .retain_mut(|f| !f.whole || f.send_chunk(&chunk, lines));
    }

    /// Sends each follower what was gathered for it (with the outlets' flush); forgets a
    /// follower whose connection is gone.
    pub fn flush(&mut self) {
        self.send_whole();
        self.list.retain_mut(Follower::send);
    }
}

/// A dropped follower's last line: a `note` of its own (no `seq` or `ts`: it is not in the
/// run's stream).
pub const DROPPED: &[u8] =
    b"{\"event\":\"note\",\"text\":\"this follower did not keep up and was dropped; the run goes on\"}\n";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::events::Setsid;

    /// What the connection would read now: each chunk.
    fn read(stream: &mut FollowStream) -> Vec<Bytes> {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut chunks = Vec::new();
        while let Poll::Ready(Some(chunk)) = stream.poll_chunk(&mut cx) {
            chunks.push(chunk);
        }
        chunks
    }

    fn setsid(pid: u32) -> Event {
        Event::Setsid(Setsid { pid, sid: pid })
    }

    #[test]
    fn a_batchs_lines_go_as_one_chunk_at_the_flush_and_a_full_queue_ends_with_the_notice() {
        let mut followers = Followers::default();
        let (reading, mut read_end) = queue(QUEUE);
        let (stalled, mut stalled_end) = queue(4);
        let all = FollowFilter::default();
        followers.add(Follower::new(&all, reading, []));
        followers.add(Follower::new(&all, stalled, []));
        for pid in 1..=2 {
            assert_eq!(
                followers.offer(&setsid(pid), format!("{pid}\n").as_bytes()),
                0
            );
        }
        assert!(read(&mut read_end).is_empty(), "gathered until the flush");
        followers.flush();
        assert_eq!(read(&mut read_end), [Bytes::from_static(b"1\n2\n")]);
        // The stalled one read nothing: two lines wait; a third fills its last place but
        // one, a fourth drops it.
        assert_eq!(followers.offer(&setsid(3), b"3\n"), 0);
        assert_eq!(followers.offer(&setsid(4), b"4\n"), 1);
        assert_eq!((followers.len(), followers.dropped), (1, 1));
        let got: Vec<u8> = read(&mut stalled_end).concat();
        let notice = String::from_utf8_lossy(DROPPED);
        assert_eq!(String::from_utf8_lossy(&got), format!("1\n2\n3\n{notice}"));
        assert!(stalled_end.chunks.is_closed(), "its stream ends there");
        followers.flush();
        assert_eq!(read(&mut read_end).concat(), b"3\n4\n");
    }

    #[test]
    fn the_followers_of_the_whole_stream_share_one_chunk_and_a_filtered_one_gets_its_own() {
        let mut followers = Followers::default();
        let all = FollowFilter::default();
        let (one, mut one_end) = queue(QUEUE);
        let (two, mut two_end) = queue(QUEUE);
        let (picky, mut picky_end) = queue(QUEUE);
        followers.add(Follower::new(&all, one, []));
        followers.add(Follower::new(&all, two, []));
        let fork_only = FollowFilter {
            event: Some("fork".into()),
            ..FollowFilter::default()
        };
        followers.add(Follower::new(&fork_only, picky, []));
        for pid in 1..=3 {
            followers.offer(&setsid(pid), format!("{pid}\n").as_bytes());
        }
        followers.flush();
        let (one, two) = (read(&mut one_end), read(&mut two_end));
        assert_eq!(one, [Bytes::from_static(b"1\n2\n3\n")]);
        assert_eq!(one, two);
        assert_eq!(one[0].as_ptr(), two[0].as_ptr(), "one chunk, shared");
        assert!(read(&mut picky_end).is_empty(), "no fork among them");
        assert_eq!(one_end.queued.load(Ordering::Relaxed), 0, "taken, counted");
    }

    #[test]
    fn a_full_chunk_goes_at_once_and_a_follower_gone_is_forgotten() {
        let mut followers = Followers::default();
        let (reading, mut read_end) = queue(QUEUE);
        followers.add(Follower::new(&FollowFilter::default(), reading, []));
        let line = vec![b'x'; CHUNK / 2];
        followers.offer(&setsid(1), &line);
        assert!(read(&mut read_end).is_empty());
        followers.offer(&setsid(2), &line);
        assert_eq!(
            read(&mut read_end).concat().len(),
            CHUNK,
            "sent without a flush"
        );
        drop(read_end);
        followers.flush();
        assert!(followers.is_empty());
        // One gone with a full queue behind it is not counted as dropped.
        let (tiny, tiny_end) = queue(2);
        followers.add(Follower::new(&FollowFilter::default(), tiny, []));
        followers.offer(&setsid(3), b"3\n");
        followers.flush();
        drop(tiny_end);
        assert_eq!(followers.offer(&setsid(4), b"4\n"), 0);
        assert_eq!((followers.len(), followers.dropped), (0, 0));
    }
}
