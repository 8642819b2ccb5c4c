//! The leak scan's rounds, a task each beside the event loop: the event loop starts one when
//! a scan is due (and none is under way or waiting to be written); the round reads what the
//! run holds in its steps (see `daemon/pipeline/scan.rs`) and has its looks and its new
//! flags' evidence read and their spawn sites named on the rounds' thread of the slow side
//! ([`Worker`]) between them, and plans and judges in bounded steps with a yield between
//! each (the event loop drains the ring there: judging 10,000 looks at once held it some
//! 9 ms, planning for them 1.1 to 3 ms);
//! then the event loop, at its next wake-up, drains the ring and writes the round. Every
//! live process's fds, read for the other ends of a new flag's pipes, took 400 ms with
//! 10,000 tracked: the ring is read meanwhile.
use std::cell::{Cell, RefCell};
use std::rc::Rc;

use anyhow::Result;
use tokio::task::JoinHandle;

use super::pipeline::{JudgeStep, Pipeline, PlanStep};
use super::worker::Worker;
use crate::leaks::flags::RssCache;

/// The rounds of a run: at most one under way or waiting to be written.
pub(super) struct Rounds {
    run: Rc<RefCell<Pipeline>>,
    /// Shared with the round under way.
    slow: Rc<Worker>,
    under_way: Option<JoinHandle<()>>,
    /// A round's failure (writing its lines), for the event loop to end the run with.
    failed: Rc<Cell<Option<anyhow::Error>>>,
}

impl Rounds {
    pub(super) fn new(run: Rc<RefCell<Pipeline>>, slow: Worker) -> Rounds {
        Rounds {
            run,
            slow: Rc::new(slow),
            under_way: None,
            failed: Rc::default(),
        }
    }

    /// Starts a round, unless one is under way or waits to be written in `run` (the slow
    /// side is behind: the round due is that one).
    pub(super) fn start(&mut self, run: &mut Pipeline) {
        let busy = self.under_way.as_ref().is_some_and(|r| !r.is_finished());
        if busy {
            return;
        }
        // A round that ended mid-judging, or judged but unread (it panicked meanwhile), is
        // judged to its end and written as it is, or no round would start again.
        run.finish_judging();
        if run.has_judged_round() && !run.round_ready() {
            run.round_unread();
        }
        if run.has_judged_round() {
            return;
        }
        let (shared, slow, failed) = (self.run.clone(), self.slow.clone(), self.failed.clone());
        self.under_way = Some(tokio::task::spawn_local(async move {
            if let Err(e) = round(&shared, &slow).await {
                failed.set(Some(e));
            }
        }));
    }

    /// A round's failure, once.
    pub(super) fn failure(&self) -> Result<()> {
        match self.failed.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Ends the round under way where it is (see [`Rounds::stop`]); awaited by `stop`.
    pub(super) fn abort(&self) {
        if let Some(round) = &self.under_way {
            round.abort();
        }
    }

    /// Ends the round under way where it is: the run stopped. One whose looks are not all
    /// taken judges nothing (what a stop leaves is half torn down, see
    /// `Pipeline::clear_ended`); one being judged is judged to its end by the close, and one
    /// judged is written by it, with its evidence if it was read, else its samples.
    pub(super) async fn stop(mut self) -> Result<()> {
        if let Some(round) = self.under_way.take() {
            round.abort();
            let _ = round.await;
        }
        self.failure()
    }
}

/// One round: the flagged processes' memory read for its gauge, then planned, its looks
/// sampled, judged, its new flags' evidence read, their spawn sites named; the event loop
/// writes it. What a job the slow side refused would have read is left unread (a round
/// asks one job at a time, so its thread refuses only once it is gone).
async fn round(run: &RefCell<Pipeline>, slow: &Worker) -> Result<()> {
    // The flagged processes' memory for the gauge the round's commit sets, read here, not on
    // the reader's thread (see `RssCache`).
    let stale = run.borrow().rss_to_read();
    if !stale.is_empty()
        && let Some(read) = slow.run(move |_| RssCache::read(stale)).await
    {
        run.borrow_mut().rss_read(read);
    }
    let mut planning = run.borrow_mut().plan_round();
    let mut planned = loop {
        let step = run.borrow_mut().plan_step(planning)?;
        match step {
            PlanStep::More(more) => planning = more,
            PlanStep::Planned(planned) => break planned,
        }
        tokio::task::yield_now().await;
    };
    let looks = planned.take_looks();
    let mut sampled = Vec::new();
    if !looks.is_empty() {
        let job = slow.run(move |lookout| {
            let sampled: Vec<_> = looks
                .into_iter()
                .map(|mut look| {
                    let sample = lookout.look(&mut look);
                    (look, sample)
                })
                .collect();
            (sampled, lookout.take_notes())
        });
        let notes;
        (sampled, notes) = job.await.unwrap_or_default();
        run.borrow_mut().tell(&notes)?;
    }
    run.borrow_mut().start_judging(planned, sampled);
    let unread = loop {
        if let JudgeStep::Judged(unread) = run.borrow_mut().judge_step() {
            break unread;
        }
        // Deferred until the runtime has polled its drivers: a record's wake-up meanwhile
        // brings the event loop round before the next step.
        tokio::task::yield_now().await;
    };
    if let Some(mut unread) = unread {
        let job = slow.run(move |lookout| {
            unread.read(lookout);
            unread
        });
        let read = job.await;
        run.borrow_mut().evidence_read(read);
    }
    // The stack copies handed on before the round's flags are unwound first: a flag raised a
    // moment after its spawner's fork is named as one raised later.
    let settled = run.borrow().copies_settled();
    if let Some(settled) = settled {
        settled.await;
    }
    let to_name = run.borrow_mut().round_to_name();
    if let Some(mut to_name) = to_name {
        let naming = std::mem::take(&mut to_name.naming);
        let named = slow.run(move |_| naming.name()).await;
        run.borrow_mut().round_named(Some(to_name), named);
    }
    Ok(())
}
