//! Reading which agent session each process is in (`--session-env` or `--session-cgroup`)
//! on a thread of the slow side of its own ([`Dozing`]: handed a read without being woken
//! while reads keep coming): a round's looks or a `why` never wait behind a storm's execs,
//! nor these behind them.
//!
//! The event loop hands on what waits at the end of a turn when no read is under way (what
//! comes meanwhile waits for the next; while records stream, it is gathered first, see
//! `Sessions::take`), and takes what a read found at each turn. A read done while the poll
//! clock ticks is left for the next tick, within a poll period: waking the reader for each
//! added a third to a half to its wake-ups in a fork+exec loop (a read every 10 ms beside
//! ticks up to 16 ms apart). A read done while the reader may sleep wakes it, or what waited
//! behind it would wait for the next record.
use std::sync::{Arc, Mutex, MutexGuard};

use anyhow::Result;
use tokio::sync::Notify;

use super::dozing::Dozing;
use super::pipeline::Pipeline;
use crate::lineage::graph::NodeId;
use crate::lineage::sessions::Read;

/// The session reads of a run: at most one under way.
pub(super) struct SessionReads {
    slow: Dozing,
    under_way: bool,
    done: Arc<Done>,
}

/// What a read left for the event loop, and the wake-up for it.
#[derive(Default)]
struct Done {
    /// One lock for both sides of the hand-over, so that a reader going to sleep either finds
    /// the outcome or is woken for it.
    left: Mutex<Left>,
    wake: Notify,
}

#[derive(Default)]
struct Left {
    outcome: Option<Outcome>,
    /// The reader's poll clock ticks: it comes round within a period without a wake-up.
    reader_ticks: bool,
}

impl Done {
    fn left(&self) -> MutexGuard<'_, Left> {
        // Nothing under the lock panics; a poisoned lock holds a whole value all the same.
        self.left.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// How a read ended.
enum Outcome {
    /// Each process read and what its environment (or cgroup) names.
    Found(Vec<(NodeId, Read)>),
    /// The read never finished (it panicked, or its thread refused it): each keeps what an
    /// earlier read found.
    GivenUp(Vec<NodeId>),
}

/// The read's outcome, left for the event loop when the read ends however it ends: a read
/// that panics unwinds through this and leaves [`Outcome::GivenUp`], or no read would start
/// again.
struct Leave {
    done: Arc<Done>,
    ids: Vec<NodeId>,
    found: Option<Vec<(NodeId, Read)>>,
}

impl Drop for Leave {
    fn drop(&mut self) {
        let outcome = match self.found.take() {
            Some(found) => Outcome::Found(found),
            None => Outcome::GivenUp(std::mem::take(&mut self.ids)),
        };
        let mut left = self.done.left();
        left.outcome = Some(outcome);
        if !left.reader_ticks {
            self.done.wake.notify_one();
        }
    }
}

impl SessionReads {
    pub(super) fn new(slow: Dozing) -> SessionReads {
        SessionReads {
            slow,
            under_way: false,
            done: Arc::default(),
        }
    }

    /// Whether a read is under way (the event loop waits for [`SessionReads::woken`] then).
    pub(super) fn under_way(&self) -> bool {
        self.under_way
    }

    /// Resolves when a read that ended while the reader might sleep left its outcome.
    pub(super) async fn woken(&self) {
        self.done.wake.notified().await
    }

    /// One turn's part: says whether the poll clock `ticks` (see the module's comment), keeps
    /// in `run` what the read under way found if it is done, then hands on what waits if no
    /// read is under way (gathered first while records stream, as they do while the clock
    /// ticks).
    pub(super) fn turn(&mut self, run: &mut Pipeline, ticks: bool) -> Result<()> {
        let outcome = {
            let mut left = self.done.left();
            left.reader_ticks = ticks;
            left.outcome.take()
        };
        self.keep(run, outcome)?;
        if self.under_way {
            return Ok(());
        }
        let Some(to_read) = run.sessions_to_read(ticks)? else {
            return Ok(());
        };
        let leave = Leave {
            done: self.done.clone(),
            ids: to_read.ids(),
            found: None,
        };
        // A job the thread refuses (its slot full, or the thread gone) is dropped here, and
        // with it `leave`: its outcome, given up, is taken at the next turn like any other.
        self.slow.post(move || {
            let mut leave = leave;
            leave.found = Some(to_read.read());
        });
        self.under_way = true;
        Ok(())
    }

    /// The run stops: what a read left is kept, none waited for (its `session` events are
    /// written before the close; a read still under way is left unread).
    pub(super) fn stop(mut self, run: &mut Pipeline) -> Result<()> {
        let outcome = self.done.left().outcome.take();
        self.keep(run, outcome)
    }

    /// Keeps in `run` what a read left (`outcome`, if any): that read is no longer under way.
    fn keep(&mut self, run: &mut Pipeline, outcome: Option<Outcome>) -> Result<()> {
        let Some(outcome) = outcome else {
            return Ok(());
        };
        self.under_way = false;
        match outcome {
            Outcome::Found(found) => run.sessions_read(found),
            Outcome::GivenUp(ids) => {
                run.sessions_given_up(&ids);
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `done` was told to wake the reader (its permit taken if so).
    async fn woken(done: &Done) -> bool {
        tokio::select! {
            biased;
            _ = done.wake.notified() => true,
            _ = std::future::ready(()) => false,
        }
    }

    fn leave(done: &Arc<Done>, ids: Vec<NodeId>) -> Leave {
        Leave {
            done: done.clone(),
            ids,
            found: None,
        }
    }

    fn outcome(done: &Done) -> Option<Outcome> {
        done.left().outcome.take()
    }

    #[tokio::test]
    async fn a_read_done_while_the_clock_ticks_is_left_for_the_next_tick_unwoken() {
        let done = Arc::new(Done::default());
        done.left().reader_ticks = true;
        let mut read = leave(&done, vec![7]);
        read.found = Some(vec![(7, Read::NamesNone)]);
        drop(read);
        assert!(
            !woken(&done).await,
            "the tick comes round without a wake-up"
        );
        assert!(matches!(outcome(&done), Some(Outcome::Found(f)) if f.len() == 1));
    }

    #[tokio::test]
    async fn a_read_done_while_the_reader_may_sleep_wakes_it() {
        let done = Arc::new(Done::default());
        let mut read = leave(&done, vec![7]);
        read.found = Some(vec![(7, Read::NamesNone)]);
        drop(read);
        assert!(woken(&done).await);
        assert!(matches!(outcome(&done), Some(Outcome::Found(_))));
    }

    #[tokio::test]
    async fn a_read_that_panics_or_is_refused_is_given_up_not_lost() {
        let done = Arc::new(Done::default());
        let slow = Dozing::start("reaper-test").unwrap();
        let read = leave(&done, vec![1, 2]);
        assert!(slow.post(move || {
            let _read = read;
            panic!("a read's bug");
        }));
        let patience = std::time::Duration::from_secs(30);
        let woke = tokio::time::timeout(patience, done.wake.notified()).await;
        assert!(woke.is_ok(), "a read that panicked never left its outcome");
        assert!(matches!(outcome(&done), Some(Outcome::GivenUp(ids)) if ids == [1, 2]));
        // Refused (the thread held, its slot full): the job, dropped at once, leaves its
        // outcome as it goes.
        let (release, held) = std::sync::mpsc::channel::<()>();
        let (on_it, started) = std::sync::mpsc::channel::<()>();
        assert!(slow.post(move || {
            on_it.send(()).unwrap();
            held.recv().unwrap_or_default()
        }));
        // The thread is on the holding job before the slot fills behind it.
        started.recv().unwrap();
        assert!(slow.post(|| {}));
        let read = leave(&done, vec![3]);
        assert!(!slow.post(move || drop(read)));
        assert!(matches!(outcome(&done), Some(Outcome::GivenUp(ids)) if ids == [3]));
        release.send(()).unwrap();
    }
}
