//! Spawn stacks' copies unwound on a thread of the slow side of their own
//! (`reaper-unwind`, holding the [`Unwinder`]): reading a spawner's mappings and its objects'
//! call frame information never holds the ring's reader (see `sites::unwinding`).
//!
//! The reader hands on each copy after the record that brought it and takes what was unwound
//! at the end of each batch of records; nothing wakes it for that. What names a spawn (a
//! round's flags, an answer, `--check`'s verdict) first waits for the copies handed on before
//! it ([`Unwinds::settled`]), so that a flag raised a moment after its spawner's fork is named
//! as one raised later; a thread stuck on a copy (an object on a file system that never
//! answers) is waited for [`SETTLE_CAP`] once, and not again until it moves.
use std::cell::Cell;
use std::future::Future;
use std::rc::Rc;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::Result;
use tokio::sync::Notify;

use super::worker::Worker;
use crate::sites::{UNWINDS_WAITING, Unwind, Unwinder, Unwound};

/// The longest anything waits for the copies handed on before it.
const SETTLE_CAP: Duration = Duration::from_secs(5);

/// The run's unwinding thread, and what it gave.
pub(super) struct Unwinds {
    slow: Worker<Unwinder>,
    given: Receiver<Unwound>,
    give: Sender<Unwound>,
    done: Arc<Done>,
    /// Copies handed on so far.
    handed: u64,
    /// How many were done when a wait for them ran out: none is waited for again until
    /// more are done.
    stuck_at: Rc<Cell<Option<u64>>>,
}

/// How many copies the thread is done with (however each ended), and the wake-ups for it.
#[derive(Default)]
struct Done {
    count: Mutex<u64>,
    changed: Condvar,
    wake: Notify,
}

impl Done {
    fn count(&self) -> MutexGuard<'_, u64> {
        // Nothing under the lock panics; a poisoned lock holds a whole value all the same.
        self.count.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Counts a job done when dropped, however the job ended (one that panics too: or what waits
/// for it would wait out its cap).
struct Counted(Arc<Done>);

impl Drop for Counted {
    fn drop(&mut self) {
        *self.0.count() += 1;
        self.0.changed.notify_all();
        self.0.wake.notify_waiters();
    }
}

impl Unwinds {
    /// Starts the thread; capabilities are a thread's, so start it once privileges are
    /// dropped.
    pub(super) fn start() -> Result<Unwinds> {
        let (give, given) = mpsc::channel();
        Ok(Unwinds {
            slow: Worker::start_holding("reaper-unwind", UNWINDS_WAITING)?,
            given,
            give,
            done: Arc::default(),
            handed: 0,
            stuck_at: Rc::default(),
        })
    }

    /// Hands `job` on; gives it back when the thread's queue is full.
    pub(super) fn hand_on(&mut self, job: Unwind) -> Option<Unwind> {
        // The job travels in a slot it can be taken back from: a refused closure is dropped.
        let slot = Arc::new(Mutex::new(Some(job)));
        let (taken, give, done) = (slot.clone(), self.give.clone(), self.done.clone());
        let queued = self.slow.post(move |unwinder| {
            // Dropped last: what the job gives is in the channel before it counts as done.
            let _counted = Counted(done);
            let Some(job) = taken.lock().ok().and_then(|mut job| job.take()) else {
                return;
            };
            // A job that panics still gives something back, or its copy would stay under
            // way for the reader (a host's share of the queue, a site never unwound again);
            // the panic goes on to the worker, which starts over with a fresh unwinder.
            let nothing = job.nothing();
            let unwinding = std::panic::AssertUnwindSafe(|| unwinder.unwind(job));
            let (unwound, panicked) = match std::panic::catch_unwind(unwinding) {
                // One site of a batch may have panicked, the others located.
                Ok(unwound) => (unwound, unwinder.take_panic()),
                Err(panic) => (nothing, Some(panic)),
            };
            // The run may be closing: nobody takes it then.
            if let Some(unwound) = unwound {
                let _ = give.send(unwound);
            }
            if let Some(panic) = panicked {
                std::panic::resume_unwind(panic);
            }
        });
        if queued {
            self.handed += 1;
            return None;
        }
        slot.lock().ok().and_then(|mut job| job.take())
    }

    /// What the thread gave so far.
    pub(super) fn take(&mut self) -> impl Iterator<Item = Unwound> + '_ {
        self.given.try_iter()
    }

    /// A wait for the copies handed on so far, none when they are done (or a wait for the
    /// thread ran out and it has done nothing since).
    pub(super) fn settled(&self) -> Option<impl Future<Output = ()> + use<>> {
        self.settled_within(SETTLE_CAP)
    }

    /// [`Unwinds::settled`], waiting `cap` at most.
    fn settled_within(&self, cap: Duration) -> Option<impl Future<Output = ()> + use<>> {
        let target = self.handed;
        let done = *self.done.count();
        if done >= target || self.stuck_at.get() == Some(done) {
            return None;
        }
        let (shared, stuck_at) = (self.done.clone(), self.stuck_at.clone());
        Some(async move {
            let settled = async {
                loop {
                    let woken = shared.wake.notified();
                    tokio::pin!(woken);
                    woken.as_mut().enable();
                    if *shared.count() >= target {
                        return;
                    }
                    woken.await;
                }
            };
            if tokio::time::timeout(cap, settled).await.is_err() {
                stuck_at.set(Some(*shared.count()));
            }
        })
    }

    /// [`Unwinds::settled`], blocking: for the run's end, when the ring no longer waits on the
    /// reader.
    pub(super) fn settle_here(&self) {
        let target = self.handed;
        let count = self.done.count();
        if *count >= target || self.stuck_at.get() == Some(*count) {
            return;
        }
        let waited = self
            .done
            .changed
            .wait_timeout_while(count, SETTLE_CAP, |n| *n < target);
        if let Ok((count, ran_out)) = waited
            && ran_out.timed_out()
        {
            self.stuck_at.set(Some(*count));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A native site's copy with nothing to unwind it in: no process holds its code, and
    /// nothing names its spawner's executable.
    fn unreadable_site(stack: u64) -> Unwind {
        Unwind::Site {
            key: (stack, 1),
            holders: Vec::new(),
            spawner: 0,
            exec_path: None,
            seen_at: None,
            forked_in: None,
            walk: None,
            copy: Box::default(),
        }
    }

    /// Holds the unwinding thread on a job of its own until the sender is dropped.
    fn hold(unwinds: &Unwinds) -> std::sync::mpsc::Sender<()> {
        let (release, held) = std::sync::mpsc::channel::<()>();
        let (on_it, started) = std::sync::mpsc::channel::<()>();
        assert!(unwinds.slow.post(move |_| {
            on_it.send(()).unwrap();
            let _ = held.recv();
        }));
        started.recv().unwrap();
        release
    }

    #[tokio::test]
    async fn a_copy_handed_on_is_taken_back_once_settled() {
        let mut unwinds = Unwinds::start().unwrap();
        assert!(
            unwinds.settled().is_none(),
            "nothing handed on: nothing to wait for"
        );
        let release = hold(&unwinds);
        assert!(unwinds.hand_on(unreadable_site(7)).is_none(), "handed on");
        let settled = unwinds.settled().expect("a copy under way is waited for");
        assert_eq!(
            unwinds.take().count(),
            0,
            "not unwound while the thread is held"
        );
        drop(release);
        settled.await;
        let given: Vec<Unwound> = unwinds.take().collect();
        assert!(
            matches!(given[..], [Unwound::Site { key: (7, _), ref frames, .. }] if frames.is_empty()),
            "the site comes back, with no frames to replace its walk"
        );
        assert!(unwinds.settled().is_none());
    }

    #[tokio::test]
    async fn a_full_queue_gives_the_copy_back() {
        let mut unwinds = Unwinds::start().unwrap();
        let release = hold(&unwinds);
        for stack in 0..UNWINDS_WAITING as u64 {
            assert!(unwinds.hand_on(unreadable_site(stack)).is_none());
        }
        let refused = unwinds.hand_on(unreadable_site(99));
        assert!(matches!(refused, Some(Unwind::Site { key: (99, _), .. })));
        let settled = unwinds.settled().expect("copies under way");
        drop(release);
        settled.await;
        assert_eq!(unwinds.take().count(), UNWINDS_WAITING);
    }

    #[tokio::test]
    async fn a_stuck_thread_is_waited_for_once_until_it_moves() {
        let mut unwinds = Unwinds::start().unwrap();
        let release = hold(&unwinds);
        assert!(unwinds.hand_on(unreadable_site(1)).is_none());
        let wait = unwinds.settled_within(Duration::from_millis(50)).unwrap();
        wait.await;
        assert!(
            unwinds.settled().is_none(),
            "ran out once: not waited for again"
        );
        settle_blocking_returns(&unwinds);
        drop(release);
        // Once the thread moves, what is handed on is waited for again.
        while unwinds.take().count() == 0 {
            tokio::task::yield_now().await;
        }
        let release = hold(&unwinds);
        assert!(unwinds.hand_on(unreadable_site(2)).is_none());
        let settled = unwinds.settled().expect("the thread moved");
        drop(release);
        settled.await;
        assert_eq!(unwinds.take().count(), 1);
    }

    /// The run's end does not wait on a thread that ran out a wait already.
    fn settle_blocking_returns(unwinds: &Unwinds) {
        let before = std::time::Instant::now();
        unwinds.settle_here();
        assert!(before.elapsed() < SETTLE_CAP, "not waited for again");
    }

    #[test]
    fn a_copy_given_nothing_for_is_still_given_back() {
        let Some(Unwound::Site { key, frames, .. }) = unreadable_site(3).nothing() else {
            panic!("a site's copy comes back");
        };
        assert_eq!((key, frames.len()), ((3, 1), 0));
        assert!(Unwind::Forget(vec![1]).nothing().is_none());
    }

    #[test]
    fn a_job_that_panics_is_counted_done() {
        let unwinds = Unwinds::start().unwrap();
        let done = unwinds.done.clone();
        assert!(unwinds.slow.post(move |_| {
            let _counted = Counted(done);
            panic!("a job's bug");
        }));
        let mut unwinds = unwinds;
        unwinds.handed += 1;
        unwinds.settle_here();
        assert_eq!(*unwinds.done.count(), 1);
    }
}
