//! Taking records from the ring: each one decoded into a [`KernelEvent`], counted, and timed
//! from the kernel to the end of the batch that brought it. The counts make the summary's
//! `delivery` (every record the kernel numbered is received or counted as dropped); the times
//! make its `latency_ns`.
use std::collections::{BTreeMap, HashMap};
use std::mem::{Discriminant, discriminant};

use hdrhistogram::Histogram;
use reaper_common::EventKind;

use super::decode::{KernelEvent, What, decode};
use super::loader::{Accounting, TakeOver};
use crate::procfs::boottime_now;
use crate::stream::events::{Delivery, Latency};

/// Delivery accounting and latency of the records read so far.
pub struct Reader {
    /// Kernel records received.
    received: u64,
    /// The ring's bytes those records took, by this run.
    received_bytes: u64,
    /// Records that did not decode (a build mismatch; never expected).
    undecodable: u64,
    /// Kernel timestamps of the records of the batch being read.
    batch_ts: Vec<u64>,
    /// Time from an event in the kernel to the end of the batch that applied it, in ns.
    latency: Histogram<u64>,
    /// While this run's programs took over from the run before's, both saw each event.
    overlap: Option<Overlap>,
}

/// The events the run before's programs recorded while this run's were being attached: the
/// same event recorded by this run's programs is a second record of it, taken in and not
/// applied again.
struct Overlap {
    /// The run before's generation, as records carry it.
    before: u16,
    /// Boot-time ns from the first attach to the run before's programs detached.
    window: (u64, u64),
    /// Events of the window recorded once so far, with the generation that recorded them.
    seen: HashMap<(Discriminant<What>, u32, u64), u16>,
}

/// How late past the take-over a record of it may still be stamped: both generations' programs
/// run back to back for one event, microseconds apart.
const OVERLAP_SLACK_NS: u64 = 10_000_000;

impl Default for Reader {
    fn default() -> Self {
        Reader {
            received: 0,
            received_bytes: 0,
            undecodable: 0,
            batch_ts: Vec::new(),
            latency: Histogram::new_with_bounds(1, 3_600_000_000_000, 2).expect("valid bounds"),
            overlap: None,
        }
    }
}

impl Reader {
    /// Goes on from a kept state: `received` records were taken by the runs before, and
    /// `took_over` names the take-over of its probes (see [`Overlap`]).
    pub fn resume(&mut self, received: u64, took_over: Option<TakeOver>) {
        self.received = received;
        self.overlap = took_over.map(|t| Overlap {
            before: t.before.generation as u16,
            window: t.overlap,
            seen: HashMap::new(),
        });
    }

    /// Records taken so far, by every run of a kept state.
    pub fn received(&self) -> u64 {
        self.received
    }

    /// Takes one ring-buffer record: its event, or none if it does not decode (counted) or
    /// is the second record of an event of the take-over.
    pub fn take(&mut self, bytes: &[u8]) -> Option<KernelEvent> {
        self.received += 1;
        // As the ring lays a record out: an 8-byte header, the whole rounded up to 8.
        self.received_bytes += (bytes.len() as u64 + 8).next_multiple_of(8);
        match decode(bytes) {
            Ok(ev) => {
                if self.overlap.is_some() && self.seen_twice(&ev) {
                    return None;
                }
                self.batch_ts.push(ev.ts);
                Some(ev)
            }
            Err(_) => {
                self.undecodable += 1;
                None
            }
        }
    }

    /// Whether `ev` is the second record of an event of the take-over: one of the window
    /// that the other generation already recorded. The window closes for good once this
    /// run's programs record an event well past it.
    fn seen_twice(&mut self, ev: &KernelEvent) -> bool {
        let Some(o) = self.overlap.as_mut() else {
            return false;
        };
        let (from, to) = o.window;
        if ev.generation != o.before && ev.ts > to + OVERLAP_SLACK_NS {
            self.overlap = None;
            return false;
        }
        if ev.ts < from {
            return false;
        }
        let key = (discriminant(&ev.what), ev.pid, ev.start);
        match o.seen.get(&key) {
            Some(&generation) if generation != ev.generation => {
                o.seen.remove(&key);
                true
            }
            _ => {
                o.seen.insert(key, ev.generation);
                false
            }
        }
    }

    /// Ends a batch of records: each one's latency, from the kernel to now, is recorded.
    pub fn end_batch(&mut self) {
        if self.batch_ts.is_empty() {
            return;
        }
        let now = boottime_now();
        for ts in self.batch_ts.drain(..) {
            let _ = self.latency.record(now.saturating_sub(ts).max(1));
        }
    }

    /// What the kernel sent and what arrived, as of `account`: taken once the probes are
    /// detached and the ring drained, or (a kept state's probes go on) once every record
    /// numbered by then was taken in or counted lost.
    pub fn delivery(&self, account: Accounting) -> Delivery {
        let (kernel_events, losses) = (account.numbered, account.losses);
        let mut dropped = BTreeMap::new();
        for kind in EventKind::ALL {
            dropped.insert(kind.name().into(), losses.kinds[kind.loss_slot() as usize]);
        }
        Delivery {
            kernel_events,
            received: self.received,
            received_bytes: self.received_bytes,
            dropped,
            tracked_full: losses.tracked_full,
            consistent: kernel_events == self.received + losses.dropped() && self.undecodable == 0,
            // The API's, counted by the output.
            followers_dropped: 0,
        }
    }

    /// Records that did not decode (a build mismatch; never expected).
    pub fn undecodable(&self) -> u64 {
        self.undecodable
    }

    /// The latency of the records read so far.
    pub fn latency(&self) -> Latency {
        Latency {
            count: self.latency.len(),
            p50: self.latency.value_at_quantile(0.5),
            p99: self.latency.value_at_quantile(0.99),
            max: self.latency.max(),
        }
    }
}

#[cfg(test)]
mod tests {
    use reaper_common::{EventHeader, EventKind, FreeEvent, LAYOUT, ReaderMark};

    use super::*;

    /// A `free` record of `pid` at `ts`, as generation `generation` writes it.
    fn free(generation: u16, pid: u32, ts: u64) -> Vec<u8> {
        let ev = FreeEvent {
            header: EventHeader {
                kind: EventKind::Free as u8,
                layout: LAYOUT,
                generation,
                pid,
                seq: 0,
                ts,
                start: 7,
            },
        };
        // SAFETY: reading the bytes of a plain record.
        let bytes = unsafe {
            std::slice::from_raw_parts((&ev as *const FreeEvent).cast::<u8>(), size_of_val(&ev))
        };
        bytes.to_vec()
    }

    fn taking_over(from: (u64, u64)) -> Reader {
        let mut reader = Reader::default();
        let before = ReaderMark {
            generation: 4,
            ..Default::default()
        };
        reader.resume(
            10,
            Some(TakeOver {
                before,
                overlap: from,
            }),
        );
        reader
    }

    #[test]
    fn an_event_both_generations_recorded_during_the_take_over_is_applied_once() {
        let mut reader = taking_over((1_000, 2_000));
        // The gap's record, before the overlap: applied.
        assert!(reader.take(&free(4, 50, 500)).is_some());
        // One event of the overlap, recorded by both: the second record is taken, not applied.
        assert!(reader.take(&free(4, 51, 1_500)).is_some());
        assert!(reader.take(&free(5, 51, 1_501)).is_none());
        // Either order.
        assert!(reader.take(&free(5, 52, 1_600)).is_some());
        assert!(reader.take(&free(4, 52, 1_601)).is_none());
        // An event only one generation saw: applied.
        assert!(reader.take(&free(5, 53, 1_700)).is_some());
        // Well past the overlap, the window closes: nothing is held back any more.
        assert!(
            reader
                .take(&free(5, 54, 2_000 + OVERLAP_SLACK_NS + 1))
                .is_some()
        );
        assert!(reader.overlap.is_none());
        // Every record counted, the runs before's included.
        assert_eq!(reader.received(), 10 + 7);
    }
}
