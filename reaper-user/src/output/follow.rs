//! The API's followers (`GET /v1/events?follow`): each gets the stream's lines from the
//! moment it asked, those its filter picks, through a bounded queue. The run never waits for
//! one: a follower whose queue is full is dropped (its last line says so) and counted in the
//! summary's `delivery.followers_dropped`; the stream's own outlets lose nothing.
use std::collections::HashSet;

use bytes::Bytes;
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

/// A follower: its queue and what it asked for.
pub struct Follower {
    lines: mpsc::Sender<Bytes>,
    events: Option<Vec<String>>,
    reason: Option<Reason>,
    /// With `pid`: the processes it follows (`pid`'s descendants alive when it asked, and
    /// each one forked by one of them since).
    subtree: Option<HashSet<u32>>,
}

impl Follower {
    /// A follower of `filter`, its lines sent to `lines`; `descendants` are the processes
    /// already under `filter.pid` (itself included).
    pub fn new(
        filter: &FollowFilter,
        lines: mpsc::Sender<Bytes>,
        descendants: impl IntoIterator<Item = u32>,
    ) -> Follower {
        Follower {
            lines,
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
}

/// The followers of a run.
#[derive(Default)]
pub struct Followers {
    list: Vec<Follower>,
    /// Followers dropped because they did not keep up.
    pub dropped: u64,
}

impl Followers {
    pub fn add(&mut self, follower: Follower) {
        self.list.push(follower);
    }

    /// Ends every follower's stream: their queues close once what waits in them is read.
    pub fn end(&mut self) {
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
        let mut shared: Option<Bytes> = None;
        self.list.retain_mut(|f| {
            if f.lines.is_closed() {
                return false;
            }
            if !f.picks(event) {
                return true;
            }
            // A queue's last place is kept for the notice that it was dropped.
            if f.lines.capacity() <= 1 {
                let _ = f.lines.try_send(Bytes::from_static(DROPPED));
                dropped += 1;
                return false;
            }
            let line = shared.get_or_insert_with(|| Bytes::copy_from_slice(line));
            f.lines.try_send(line.clone()).is_ok()
        });
        self.dropped += dropped;
        dropped
    }
}

/// A dropped follower's last line: a `note` of its own (no `seq` or `ts`: it is not in the
/// run's stream).
pub const DROPPED: &[u8] =
    b"{\"event\":\"note\",\"text\":\"this follower did not keep up and was dropped; the run goes on\"}\n";
