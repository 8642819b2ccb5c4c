//! Taking records from the ring: each one decoded into a [`KernelEvent`], counted, and timed
//! from the kernel to the end of the batch that brought it. The counts make the summary's
//! `delivery` (every record the kernel numbered is received or counted as dropped); the times
//! make its `latency_ns`.
use std::collections::BTreeMap;

use anyhow::Result;
use hdrhistogram::Histogram;
use reaper_common::EventKind;

use super::decode::{KernelEvent, decode};
use super::loader::KernelCounters;
use crate::procfs::boottime_now;
use crate::stream::events::{Delivery, Latency};

/// Delivery accounting and latency of the records read so far.
pub struct Reader {
    /// Kernel records received.
    received: u64,
    /// Records that did not decode (a build mismatch; never expected).
    undecodable: u64,
    /// Kernel timestamps of the records of the batch being read.
    batch_ts: Vec<u64>,
    /// Time from an event in the kernel to the end of the batch that applied it, in ns.
    latency: Histogram<u64>,
}

impl Default for Reader {
    fn default() -> Self {
        Reader {
            received: 0,
            undecodable: 0,
            batch_ts: Vec::new(),
            latency: Histogram::new_with_bounds(1, 3_600_000_000_000, 2).expect("valid bounds"),
        }
    }
}

impl Reader {
    /// Takes one ring-buffer record: its event, or none if it does not decode (counted).
    pub fn take(&mut self, bytes: &[u8]) -> Option<KernelEvent> {
        self.received += 1;
        match decode(bytes) {
            Ok(ev) => {
                self.batch_ts.push(ev.ts);
                Some(ev)
            }
            Err(_) => {
                self.undecodable += 1;
                None
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

    /// What the kernel sent and what arrived, once the probes are detached and the ring
    /// drained.
    pub fn delivery(&self, counters: &KernelCounters) -> Result<Delivery> {
        let kernel_events = counters.kernel_events()?;
        let losses = counters.losses()?;
        let mut dropped = BTreeMap::new();
        for kind in EventKind::ALL {
            dropped.insert(kind.name().into(), losses.kinds[kind.loss_slot() as usize]);
        }
        Ok(Delivery {
            kernel_events,
            received: self.received,
            dropped,
            tracked_full: losses.tracked_full,
            consistent: kernel_events == self.received + losses.dropped() && self.undecodable == 0,
        })
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
