//! A thread of the slow side that takes one job at a time from a slot, and that stays awake
//! for a while after each job, looking at the slot every [`DOZE`], so that a stream of jobs
//! is handed to it without waking it.
//!
//! The session reads (`session_reads`) hand their thread a batch every 10 ms or so through a
//! fork+exec storm; waking a sleeping thread is a futex call and a wake-up of another CPU,
//! and on these machines it was a tenth of the reader's CPU in such a storm. A job posted
//! while the thread dozes costs the reader a lock and waits at most [`DOZE`]; one posted
//! after [`AWAKE_FOR`] without a job wakes it at once. The dozing costs the thread, not the
//! reader: a timed wait every [`DOZE`] for [`AWAKE_FOR`] after each job.
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

/// How often a dozing thread looks at its slot.
const DOZE: Duration = Duration::from_millis(2);
/// How long after a job the thread dozes before it sleeps until woken.
const AWAKE_FOR: Duration = Duration::from_millis(50);

type Job = Box<dyn FnOnce() + Send>;

/// The thread's handle. Dropped, the thread ends after the job it is on; it is not waited
/// for (a job reading a process's /proc must not hold the run's close).
pub(super) struct Dozing {
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    slot: Mutex<Slot>,
    posted: Condvar,
}

#[derive(Default)]
struct Slot {
    job: Option<Job>,
    /// The thread waits to be woken (it does not doze).
    asleep: bool,
    closed: bool,
}

impl Shared {
    fn slot(&self) -> MutexGuard<'_, Slot> {
        // Nothing under the lock panics; a poisoned lock holds a whole value all the same.
        self.slot.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Dozing {
    /// Starts the thread, named `name`. Capabilities are a thread's, so start it once
    /// privileges are dropped.
    pub(super) fn start(name: &str) -> Result<Dozing> {
        let shared = Arc::<Shared>::default();
        let theirs = Arc::clone(&shared);
        thread::Builder::new()
            .name(name.into())
            .spawn(move || theirs.serve())
            .with_context(|| format!("starting the slow side's thread {name}"))?;
        Ok(Dozing { shared })
    }

    /// Puts `job` in the slot, waking the thread only if it sleeps; false, the job dropped,
    /// when the slot holds one already or the thread is gone.
    pub(super) fn post<F>(&self, job: F) -> bool
    where
        F: FnOnce() + Send + 'static,
    {
        let mut slot = self.shared.slot();
        if slot.closed || slot.job.is_some() {
            return false;
        }
        slot.job = Some(Box::new(job));
        if slot.asleep {
            self.shared.posted.notify_one();
        }
        true
    }
}

impl Drop for Dozing {
    fn drop(&mut self) {
        self.shared.slot().closed = true;
        self.shared.posted.notify_one();
    }
}

impl Shared {
    /// The thread: each job as it comes, dozing for a while after each.
    fn serve(&self) {
        // However the thread ends, the slot is closed and a job left in it dropped (a job
        // leaves its outcome as it goes), or posts would be taken that nothing runs.
        let _closing = Closing(self);
        let mut last_job: Option<Instant> = None;
        loop {
            let job = {
                let mut slot = self.slot();
                loop {
                    if slot.closed {
                        return;
                    }
                    if let Some(job) = slot.job.take() {
                        break job;
                    }
                    slot = match last_job {
                        Some(at) if at.elapsed() < AWAKE_FOR => {
                            let (slot, _) = self
                                .posted
                                .wait_timeout(slot, DOZE)
                                .unwrap_or_else(PoisonError::into_inner);
                            slot
                        }
                        _ => {
                            slot.asleep = true;
                            let mut slot = self
                                .posted
                                .wait(slot)
                                .unwrap_or_else(PoisonError::into_inner);
                            slot.asleep = false;
                            slot
                        }
                    };
                }
            };
            // A job that panics (said on stderr by the panic hook) leaves its own outcome as
            // it unwinds (see `session_reads`); the thread goes on with the next.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
            last_job = Some(Instant::now());
        }
    }
}

/// Closes the slot when the thread ends.
struct Closing<'a>(&'a Shared);

impl Drop for Closing<'_> {
    fn drop(&mut self) {
        let left = {
            let mut slot = self.0.slot();
            slot.closed = true;
            slot.job.take()
        };
        drop(left);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn jobs_posted_while_it_sleeps_or_dozes_run_on_the_thread_one_at_a_time() {
        let dozing = Dozing::start("reaper-test").unwrap();
        let (done, ran) = mpsc::channel();
        let patience = Duration::from_secs(60);
        // The first wakes it; the next ones find it dozing; a panic spoils none after it.
        for n in 0..5 {
            let done = done.clone();
            assert!(dozing.post(move || {
                assert_ne!(n, 2, "a job's bug");
                done.send(thread::current().name().map(str::to_owned))
                    .unwrap();
            }));
            if n != 2 {
                let name = ran.recv_timeout(patience).expect("the job ran");
                assert_eq!(name.as_deref(), Some("reaper-test"));
            } else {
                // The slot is free again once the panicking job was taken.
                let cap = Instant::now() + patience;
                while dozing.shared.slot().job.is_some() {
                    assert!(Instant::now() < cap, "the job was never taken");
                    thread::yield_now();
                }
            }
        }
    }

    #[test]
    fn a_slot_that_holds_a_job_refuses_another() {
        let dozing = Dozing::start("reaper-test").unwrap();
        let (release, held) = mpsc::channel::<()>();
        let (on_it, started) = mpsc::channel::<()>();
        assert!(dozing.post(move || {
            on_it.send(()).unwrap();
            held.recv().unwrap_or_default();
        }));
        started.recv().unwrap();
        assert!(
            dozing.post(|| {}),
            "the slot is free while the thread works"
        );
        assert!(!dozing.post(|| {}), "refused, not waited for");
        release.send(()).unwrap();
    }
}
