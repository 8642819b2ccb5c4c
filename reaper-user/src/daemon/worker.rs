//! The slow side: a thread that reads /proc away from the ring's reader, one for the leak
//! scan's rounds, one for the API's answers (a `why` never waits behind a round's looks) and
//! one unwinding spawn stacks' copies (`reaper-unwind`, `unwinds`); the environments read for
//! sessions have a thread that dozes between jobs instead (`reaper-sessions`, `dozing`).
//! Each takes jobs from a bounded queue, one at a time, each job with the thread's own state
//! (a [`Lookout`]: its own /proc and socket readers; the unwinder of stack copies, see
//! `unwinds`); a full queue refuses a job at once, so the reader never waits to hand one over.
use std::future::Future;
use std::sync::mpsc::{self, SyncSender};
use std::thread;

use anyhow::{Context, Result};
use tokio::sync::oneshot;

use crate::leaks::Lookout;

/// Jobs that may wait for a thread: its asker (the rounds, the answers) has one under way at
/// a time, so one waits at most unless a job outlived what asked it.
const QUEUE: usize = 8;

type Job<S> = Box<dyn FnOnce(&mut S) + Send>;

/// A thread of the slow side, its state `S`. Dropped, its queue closes and the thread ends
/// after the job it is on; it is not waited for (a job reading a process's /proc must not hold
/// the run's close).
pub(super) struct Worker<S = Lookout> {
    jobs: SyncSender<Job<S>>,
}

impl Worker {
    /// Starts a thread reading /proc, named `name` (see [`Worker::start_holding`]).
    pub(super) fn start(name: &str) -> Result<Worker> {
        Worker::start_holding(name, QUEUE)
    }
}

impl<S: Default + 'static> Worker<S> {
    /// Starts the thread, named `name`, with `queue` jobs at most waiting for it; its state is
    /// made there. Capabilities are a thread's, so start it once privileges are dropped.
    pub(super) fn start_holding(name: &str, queue: usize) -> Result<Worker<S>> {
        let (jobs, queue) = mpsc::sync_channel::<Job<S>>(queue);
        thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let mut state = S::default();
                for job in queue {
                    // A job that panics (said on stderr by the panic hook) has no result; the
                    // thread goes on with the next and a state of its own, or every later job
                    // would be refused.
                    let job = std::panic::AssertUnwindSafe(|| job(&mut state));
                    if std::panic::catch_unwind(job).is_err() {
                        state = S::default();
                    }
                }
            })
            .with_context(|| format!("starting the slow side's thread {name}"))?;
        Ok(Worker { jobs })
    }

    /// Runs `job` on the thread; its result, or none when the queue is full or
    /// the thread is gone.
    pub(super) fn run<R, F>(&self, job: F) -> impl Future<Output = Option<R>> + use<R, F, S>
    where
        R: Send + 'static,
        F: FnOnce(&mut S) -> R + Send + 'static,
    {
        let (done, result) = oneshot::channel();
        let queued = self.post(move |state| {
            // The answer that asked may have gone: nobody wants the result then.
            let _ = done.send(job(state));
        });
        async move {
            match queued {
                true => result.await.ok(),
                false => None,
            }
        }
    }

    /// Queues `job`, which delivers its own result (see `unwinds`); false, the job dropped,
    /// when the queue is full or the thread is gone.
    pub(super) fn post<F>(&self, job: F) -> bool
    where
        F: FnOnce(&mut S) + Send + 'static,
    {
        self.jobs.try_send(Box::new(job)).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_job_runs_on_the_slow_sides_thread_and_its_result_comes_back() {
        let worker = Worker::start("reaper-test").unwrap();
        let name = worker.run(|_| thread::current().name().map(str::to_owned));
        assert_eq!(name.await, Some(Some("reaper-test".to_owned())));
    }

    #[tokio::test]
    async fn a_full_queue_refuses_a_job_at_once() {
        let worker = Worker::start("reaper-test").unwrap();
        // The thread held on a job, the queue filled behind it.
        let (release, held) = std::sync::mpsc::channel::<()>();
        let (on_it, started) = std::sync::mpsc::channel::<()>();
        let holding = worker.run(move |_| {
            on_it.send(()).unwrap();
            held.recv().ok()
        });
        // `run` queues at once, before its future is awaited: the thread is on it now.
        started.recv().unwrap();
        let waiting: Vec<_> = (0..QUEUE).map(|_| worker.run(|_| ())).collect();
        assert_eq!(worker.run(|_| ()).await, None, "refused, not waited for");
        release.send(()).unwrap();
        assert_eq!(holding.await, Some(Some(())));
        for job in waiting {
            assert_eq!(job.await, Some(()));
        }
    }

    #[tokio::test]
    async fn a_job_that_panics_has_no_result_and_the_next_one_runs() {
        let worker = Worker::start("reaper-test").unwrap();
        assert_eq!(worker.run(|_| -> u8 { panic!("a job's bug") }).await, None);
        assert_eq!(worker.run(|_| 7).await, Some(7));
    }
}
