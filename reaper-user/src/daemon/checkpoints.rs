//! The lineage checkpoint's writer (`--state-dir`): every [`CHECKPOINT_EVERY`] on the
//! housekeeping tick while the lineage changes, and once at the stop after the last record was
//! taken in. The loop only encodes it; the file is written and synced on a thread of its own,
//! one at a time, so a slow disk never holds up the ring's reader.
use std::path::PathBuf;
use std::thread::JoinHandle;
use std::time::Instant;

use anyhow::{Context, Result, anyhow};

use super::pipeline::Pipeline;
use crate::output::Output;
use crate::procfs::boottime_now;
use crate::state::{CHECKPOINT_EVERY, Checkpoint, FORMAT, KernelKept, StateDir};

pub(super) struct Checkpoints {
    dir: StateDir,
    /// What the run traces (see [`crate::state::check`]).
    selectors: Vec<String>,
    boot_id: String,
    /// The generation of this run's probes.
    generation: u64,
    /// Where they are pinned.
    pins: PathBuf,
    last: Instant,
    /// Events written when the last one was taken (see [`crate::output::Output::written`]).
    written: Option<u64>,
    /// The write in flight.
    writing: Option<JoinHandle<Result<()>>>,
    /// A write failed and was reported; the next success says so.
    failing: bool,
}

impl Checkpoints {
    pub(super) fn new(
        dir: StateDir,
        selectors: Vec<String>,
        boot_id: String,
        generation: u64,
        pins: PathBuf,
    ) -> Checkpoints {
        Checkpoints {
            pins,
            dir,
            selectors,
            boot_id,
            generation,
            last: Instant::now(),
            written: None,
            writing: None,
            failing: false,
        }
    }

    /// Starts writing one if the last is [`CHECKPOINT_EVERY`] old, the lineage changed since
    /// and the last write is done. A failed write (a full disk) does not stop the audit: it is
    /// said in a note, once until a write succeeds again, and the next one is tried.
    pub(super) fn due(&mut self, run: &mut Pipeline) -> Result<()> {
        let changed = self.written != Some(run.output().written());
        if !changed || self.last.elapsed() < CHECKPOINT_EVERY {
            return Ok(());
        }
        if self.writing.as_ref().is_some_and(|w| !w.is_finished()) {
            return Ok(());
        }
        let done = self.finish();
        self.report(done, run.output())?;
        match self.encode(run) {
            Ok(text) => {
                let dir = self.dir.clone();
                self.writing = Some(std::thread::spawn(move || dir.write(&text)));
                Ok(())
            }
            Err(e) => self.report(Err(e), run.output()),
        }
    }

    /// The last one, at the stop: written before this returns.
    pub(super) fn write(&mut self, run: &mut Pipeline) -> Result<()> {
        self.finish()?;
        let text = self.encode(run)?;
        self.dir
            .write(&text)
            .context("writing the lineage checkpoint (--state-dir)")
    }

    fn report(&mut self, done: Result<()>, out: &mut Output) -> Result<()> {
        match (done, self.failing) {
            (Ok(()), true) => {
                self.failing = false;
                out.note("the lineage checkpoint is written again")
            }
            (Err(e), false) => {
                self.failing = true;
                out.note(&format!(
                    "warning: {e:#}; a restart now would lose what changed"
                ))
            }
            _ => Ok(()),
        }
    }

    fn encode(&mut self, run: &mut Pipeline) -> Result<Vec<u8>> {
        self.written = Some(run.output().written());
        self.last = Instant::now();
        let checkpoint = Checkpoint {
            format: FORMAT,
            boot_id: self.boot_id.clone(),
            selectors: self.selectors.clone(),
            written: boottime_now(),
            nodes: run.saved(),
            build_ids: run.saved_build_ids(),
            unwound: run.saved_unwound(),
            sessions: Some(run.sessions_kept_as()),
            // Encoded between two batches: it holds exactly the records taken so far.
            kernel: Some(KernelKept {
                layout: reaper_common::LAYOUT,
                generation: self.generation,
                received: run.received(),
                losses: run.reported_losses(),
                pins: self.pins.clone(),
            }),
        };
        Ok(serde_json::to_vec(&checkpoint)?)
    }

    /// Waits for the write in flight, if any, and says how it went.
    fn finish(&mut self) -> Result<()> {
        match self.writing.take() {
            Some(w) => w
                .join()
                .map_err(|_| anyhow!("the checkpoint writer panicked"))?
                .context("writing the lineage checkpoint (--state-dir)"),
            None => Ok(()),
        }
    }
}
