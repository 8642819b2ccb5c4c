//! What a writer moved to a thread of its own needs, whatever it writes (the NDJSON lines, an
//! outlet's bytes): the thread started with the writer, which comes back when the thread
//! cannot be started, and the first error the thread met, kept for the side that feeds it.
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

/// Starts a thread named `name` that runs `run(value)`. When the thread cannot be started,
/// `value` comes back with the error: the caller keeps writing on its own thread.
pub fn start<T: Send + 'static>(
    name: String,
    value: T,
    run: impl FnOnce(T) + Send + 'static,
) -> Result<JoinHandle<()>, (io::Error, T)> {
    let handoff = Arc::new(Mutex::new(Some(value)));
    let theirs = Arc::clone(&handoff);
    let started = std::thread::Builder::new().name(name).spawn(move || {
        let taken = theirs.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(value) = taken {
            run(value);
        }
    });
    started.map_err(|e| {
        let back = handoff
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        (e, back.expect("a thread that never started took nothing"))
    })
}

/// The first error a writer's thread met: every later write fails with it.
#[derive(Default)]
pub struct FirstError {
    /// Read first: the feeding side checks it at every write without a lock.
    met: AtomicBool,
    error: Mutex<Option<(io::ErrorKind, String)>>,
}

impl FirstError {
    /// Keeps `e`, unless an error was kept before.
    pub fn keep(&self, e: &io::Error) {
        let mut error = self.error.lock().unwrap_or_else(PoisonError::into_inner);
        if error.is_none() {
            *error = Some((e.kind(), e.to_string()));
            self.met.store(true, Ordering::Release);
        }
    }

    /// Whether an error was kept.
    pub fn met(&self) -> bool {
        self.met.load(Ordering::Acquire)
    }

    /// The error kept, as an error whose text `context` gives (the text kept, or with what
    /// it is about in front).
    pub fn check(&self, context: impl FnOnce(&str) -> String) -> io::Result<()> {
        if !self.met() {
            return Ok(());
        }
        let error = self.error.lock().unwrap_or_else(PoisonError::into_inner);
        match &*error {
            Some((kind, text)) => Err(io::Error::new(*kind, context(text))),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_error_is_kept_and_given_at_every_check() {
        let first = FirstError::default();
        assert!(first.check(str::to_string).is_ok());
        first.keep(&io::Error::new(io::ErrorKind::BrokenPipe, "gone"));
        first.keep(&io::Error::new(io::ErrorKind::StorageFull, "full"));
        for _ in 0..2 {
            let e = first.check(|t| format!("out: {t}")).unwrap_err();
            assert_eq!(
                (e.kind(), e.to_string()),
                (io::ErrorKind::BrokenPipe, "out: gone".into())
            );
        }
    }

    #[test]
    fn a_started_thread_is_given_the_value() {
        let (to, from) = std::sync::mpsc::channel();
        let thread = start("test".into(), 7, move |v| to.send(v).unwrap()).unwrap();
        assert_eq!(from.recv().unwrap(), 7);
        thread.join().unwrap();
    }
}
