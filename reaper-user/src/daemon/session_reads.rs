//! Reading which agent session each process is in (`--session-env` or `--session-cgroup`),
//! a task beside the event loop: the event loop starts one at the end of a turn when
//! environments (or cgroups) wait to be read and none is under way (what comes meanwhile
//! waits for the next, and the event loop comes round when that one is done; while records
//! stream, they are gathered first);
//! the reads are made on a thread of the slow side of their own ([`Worker`]), and what they
//! found is kept by the run when the task wakes with it. A thread of its own: a round's looks
//! or a `why` never wait behind a storm's execs, nor these behind them.
use std::cell::{Cell, RefCell};
use std::rc::Rc;

use anyhow::Result;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::pipeline::Pipeline;
use super::worker::Worker;

/// The session reads of a run: at most one under way.
pub(super) struct SessionReads {
    run: Rc<RefCell<Pipeline>>,
    slow: Rc<Worker>,
    under_way: Option<JoinHandle<()>>,
    /// Told when a read is done.
    done: Rc<Notify>,
    /// A read's failure (writing its lines), for the event loop to end the run with.
    failed: Rc<Cell<Option<anyhow::Error>>>,
}

impl SessionReads {
    pub(super) fn new(run: Rc<RefCell<Pipeline>>, slow: Worker) -> SessionReads {
        SessionReads {
            run,
            slow: Rc::new(slow),
            under_way: None,
            done: Rc::default(),
            failed: Rc::default(),
        }
    }

    /// Starts reading what waits in `run`, unless a read is under way (what waits then waits
    /// for a turn after it) or, while records `stream`, what waits is still gathering (see
    /// `Sessions::take`).
    pub(super) fn start(&mut self, run: &mut Pipeline, stream: bool) -> Result<()> {
        if self.under_way.as_ref().is_some_and(|r| !r.is_finished()) {
            return Ok(());
        }
        let Some(to_read) = run.sessions_to_read(stream)? else {
            return Ok(());
        };
        let (shared, slow, failed) = (self.run.clone(), self.slow.clone(), self.failed.clone());
        let done = self.done.clone();
        let ids = to_read.ids();
        self.under_way = Some(tokio::task::spawn_local(async move {
            match slow.run(move |_| to_read.read()).await {
                Some(found) => {
                    if let Err(e) = shared.borrow_mut().sessions_read(found) {
                        failed.set(Some(e));
                    }
                }
                // The job was refused or panicked: nothing waits for it any more.
                None => shared.borrow_mut().sessions_given_up(&ids),
            }
            done.notify_one();
        }));
        Ok(())
    }

    /// Resolves once a read is done (at once if one was done since the last time asked).
    pub(super) async fn done(&self) {
        self.done.notified().await
    }

    /// A read's failure, once.
    pub(super) fn failure(&self) -> Result<()> {
        match self.failed.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Ends the read under way (see [`SessionReads::stop`]); awaited by `stop`.
    pub(super) fn abort(&self) {
        if let Some(read) = &self.under_way {
            read.abort();
        }
    }

    /// Ends the read under way where it is: the run stopped (what it would have found is left
    /// unread), and lets go of the run.
    pub(super) async fn stop(mut self) -> Result<()> {
        if let Some(read) = self.under_way.take() {
            read.abort();
            let _ = read.await;
        }
        self.failure()
    }
}
