//! The maps the probes and the reader share, as user space sees them: what the kernel
//! counts (sequence numbers handed out, records lost) and what the reader tells the probes
//! (wake me, which generation records, how many records were taken, `--state-keep`).
use std::sync::atomic::{Ordering, fence};
use std::time::Duration;

use anyhow::Result;
use aya::maps::{Array, HashMap, MapData, PerCpuArray};
use reaper_common::native::NativeStack;
use reaper_common::python::{PyLayout, PyStack};
use reaper_common::{EventKind, ExeKey, LossSlot, ReaderMark};

use crate::procfs::boottime_now;

/// A load that took over a kept state from the run before.
#[derive(Clone, Copy, Debug)]
pub struct TakeOver {
    /// What the run before told its probes last.
    pub before: ReaderMark,
    /// Boot-time ns from the first attach to the run before's programs detached: the events
    /// of this window may be recorded by both generations.
    pub overlap: (u64, u64),
}

/// The `READER` entry: which generation records, the records taken so far over every run of
/// the state, and (`--state-keep`) until when the probes record with no one draining.
pub struct ReaderMarks {
    pub(super) map: Array<MapData, ReaderMark>,
    pub(super) mark: ReaderMark,
    pub(super) keep: Option<Duration>,
}

impl ReaderMarks {
    /// Says the reader has taken `received` records in all, and drains the ring (the probes
    /// record `--state-keep` longer). Only a kept state's next run reads the count: without
    /// one, the batch costs no write.
    pub fn taken(&mut self, received: u64) -> Result<()> {
        if self.keep.is_none() {
            return Ok(());
        }
        self.mark.received = received;
        self.write()
    }

    /// Moves `keep_until` on when half of `--state-keep` has passed (nothing to do without a
    /// kept state, or when records were taken meanwhile).
    pub fn still_reading(&mut self) -> Result<()> {
        match self.keep {
            Some(keep) if boottime_now() + keep.as_nanos() as u64 / 2 > self.mark.keep_until => {
                self.write()
            }
            _ => Ok(()),
        }
    }

    /// Says the reader stops: the probes of a kept state go on, and wake no one.
    pub fn stopping(&mut self) -> Result<()> {
        self.mark.draining = 0;
        self.map.set(0, self.mark, 0)?;
        Ok(())
    }

    pub(super) fn write(&mut self) -> Result<()> {
        self.mark.draining = 1;
        self.mark.keep_until = match self.keep {
            Some(keep) => boottime_now() + keep.as_nanos() as u64,
            None => u64::MAX,
        };
        Ok(self.map.set(0, self.mark, 0)?)
    }
}

/// The flag by which the reader asks the next record to wake it.
pub struct ReaderIdle(pub(super) Array<MapData, u64>);

impl ReaderIdle {
    /// Says the reader is about to sleep until a record wakes it. The fence orders the flag
    /// before the reader's last poll: a producer reads the flag after its commit (a full
    /// barrier), so either that poll sees the record or the producer sees the flag and wakes
    /// the reader (`reaper-ebpf/src/emit.rs`, `after_commit`).
    pub fn going_idle(&mut self) -> Result<()> {
        self.0.set(0, 1, 0)?;
        fence(Ordering::SeqCst);
        Ok(())
    }
}

/// The kernel's own accounting: sequence numbers handed out and records lost.
pub struct KernelCounters {
    pub(super) losses: PerCpuArray<MapData, u64>,
    pub(super) seq: Array<MapData, u64>,
}

impl KernelCounters {
    /// Sequence numbers the kernel has handed out so far (one per record it tried to send).
    pub fn kernel_events(&self) -> Result<u64> {
        Ok(self.seq.get(&0, 0)?)
    }

    /// Records numbered, then records lost, as of now.
    pub fn account(&self) -> Result<Accounting> {
        let numbered = self.kernel_events()?;
        Ok(Accounting {
            numbered,
            losses: self.losses()?,
        })
    }

    /// Losses so far, summed over CPUs.
    pub fn losses(&self) -> Result<LossCounts> {
        let slot = |i: u32| -> Result<u64> { Ok(self.losses.get(&i, 0)?.iter().sum()) };
        let mut kinds = [0u64; EventKind::ALL.len()];
        for kind in EventKind::ALL {
            kinds[kind.loss_slot() as usize] = slot(kind.loss_slot())?;
        }
        Ok(LossCounts {
            kinds,
            tracked_full: slot(LossSlot::TRACKED_FULL)?,
        })
    }
}

/// The kernel's account of its records at one moment (see [`KernelCounters::account`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct Accounting {
    /// Sequence numbers handed out.
    pub numbered: u64,
    pub losses: LossCounts,
}

/// Loss counters read from the kernel.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LossCounts {
    /// Records that could not be reserved, indexed by `EventKind::loss_slot`.
    pub kinds: [u64; EventKind::ALL.len()],
    pub tracked_full: u64,
}

impl LossCounts {
    pub fn dropped(&self) -> u64 {
        self.kinds.iter().sum()
    }
}

/// The maps of `--spawn-stacks`: the native stacks, the Python interpreters the probe reads
/// frames from, and the Python stacks it read.
pub struct StackMaps {
    pub native: HashMap<MapData, u64, NativeStack>,
    pub interpreters: HashMap<MapData, u32, PyLayout>,
    pub python: HashMap<MapData, u64, PyStack>,
    /// The interpreter executables read, by inode (see `python::Binaries`).
    pub binaries: HashMap<MapData, ExeKey, PyLayout>,
    pub jit_hosts: HashMap<MapData, u32, u64>,
}
