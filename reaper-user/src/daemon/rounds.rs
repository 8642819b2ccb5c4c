//! The leak scan's rounds, a task each beside the event loop: the event loop starts one when
//! a scan is due (and none is under way), the round reads what the run holds in its steps
//! (see [`crate::daemon::pipeline::ScanRound`]) and has its looks and its new flags'
//! evidence read on the rounds' thread of the slow side ([`Worker`]) between them. Every live process's
//! fds, read for the other ends of a new flag's pipes, took 400 ms with 10,000 tracked: the
//! ring is read meanwhile.
use std::cell::{Cell, RefCell};
use std::rc::Rc;

use anyhow::Result;
use tokio::task::JoinHandle;

use super::pipeline::{Pipeline, Unread};
use super::worker::Worker;

/// The rounds of a run: at most one under way.
pub(super) struct Rounds {
    run: Rc<RefCell<Pipeline>>,
    /// Shared with the round under way.
    slow: Rc<Worker>,
    under_way: Option<JoinHandle<()>>,
    /// A round's failure (writing its lines), for the event loop to end the run with.
    failed: Rc<Cell<Option<anyhow::Error>>>,
    /// A round was written since the event loop last asked (its rules may want a look sooner
    /// than the scan interval: an orphan grace that started).
    done: Rc<Cell<bool>>,
}

impl Rounds {
    pub(super) fn new(run: Rc<RefCell<Pipeline>>, slow: Worker) -> Rounds {
        Rounds {
            run,
            slow: Rc::new(slow),
            under_way: None,
            failed: Rc::default(),
            done: Rc::default(),
        }
    }

    /// Starts a round, unless one is still under way (the slow side is behind: the round due
    /// is the one under way).
    pub(super) fn start(&mut self) {
        if self.under_way.as_ref().is_some_and(|r| !r.is_finished()) {
            return;
        }
        let (run, slow) = (self.run.clone(), self.slow.clone());
        let (failed, done) = (self.failed.clone(), self.done.clone());
        self.under_way = Some(tokio::task::spawn_local(async move {
            match round(&run, &slow).await {
                Ok(()) => done.set(true),
                Err(e) => failed.set(Some(e)),
            }
        }));
    }

    /// Whether a round was written since the last call.
    pub(super) fn take_done(&self) -> bool {
        self.done.take()
    }

    /// A round's failure, once.
    pub(super) fn failure(&self) -> Result<()> {
        match self.failed.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Lets the round under way finish (its reads are bounded), so that what it judged is
    /// written before the close.
    pub(super) async fn finish(mut self) -> Result<()> {
        if let Some(round) = self.under_way.take() {
            let _ = round.await;
        }
        self.failure()
    }
}

/// One round: planned, its looks sampled, judged, its new flags' evidence read, written.
/// What a job the slow side refused would have read is left unread (a round asks one job at
/// a time, so its thread refuses only once it is gone).
async fn round(run: &RefCell<Pipeline>, slow: &Worker) -> Result<()> {
    let mut scan = run.borrow_mut().plan_round()?;
    let looks = scan.take_looks();
    let mut sampled = Vec::new();
    if !looks.is_empty() {
        let job = slow.run(move |lookout| {
            let sampled: Vec<_> = looks
                .into_iter()
                .map(|look| {
                    let sample = lookout.sample(look.process, look.before.as_ref());
                    (look, sample)
                })
                .collect();
            (sampled, lookout.take_notes())
        });
        let notes;
        (sampled, notes) = job.await.unwrap_or_default();
        run.borrow_mut().tell(&notes)?;
    }
    let unread = run.borrow_mut().judge_round(&mut scan, sampled);
    let read = match unread {
        Some(mut unread) => {
            let job = slow.run(move |lookout| {
                let Unread {
                    with_peers,
                    without,
                    near,
                } = &mut unread;
                lookout.read_evidence(with_peers, without, near);
                unread
            });
            job.await
        }
        None => None,
    };
    run.borrow_mut().commit_round(scan, read)
}
