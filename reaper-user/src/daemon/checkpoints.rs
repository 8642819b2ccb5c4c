//! The lineage checkpoint's writer (`--state-dir`): every [`CHECKPOINT_EVERY`] on the
//! housekeeping tick, and once at the stop after the last record was taken in.
use std::time::Instant;

use anyhow::{Context, Result};

use super::pipeline::Pipeline;
use crate::procfs::boottime_now;
use crate::state::{CHECKPOINT_EVERY, Checkpoint, FORMAT, StateDir};

pub(super) struct Checkpoints {
    dir: StateDir,
    /// What the run traces (see [`crate::state::check`]).
    selectors: Vec<String>,
    boot_id: String,
    last: Instant,
    /// Events written when the last one was (see [`crate::output::Output::written`]).
    written: Option<u64>,
}

impl Checkpoints {
    pub(super) fn new(dir: StateDir, selectors: Vec<String>, boot_id: String) -> Checkpoints {
        Checkpoints {
            dir,
            selectors,
            boot_id,
            last: Instant::now(),
            written: None,
        }
    }

    /// Writes one if the last is [`CHECKPOINT_EVERY`] old and the lineage changed since.
    pub(super) fn due(&mut self, run: &mut Pipeline) -> Result<()> {
        let changed = self.written != Some(run.output().written());
        match changed && self.last.elapsed() >= CHECKPOINT_EVERY {
            true => self.write(run),
            false => Ok(()),
        }
    }

    pub(super) fn write(&mut self, run: &mut Pipeline) -> Result<()> {
        self.written = Some(run.output().written());
        let checkpoint = Checkpoint {
            format: FORMAT,
            boot_id: self.boot_id.clone(),
            selectors: self.selectors.clone(),
            written: boottime_now(),
            nodes: run.saved(),
        };
        self.dir
            .save(&checkpoint)
            .context("writing the lineage checkpoint (--state-dir)")?;
        self.last = Instant::now();
        Ok(())
    }
}
