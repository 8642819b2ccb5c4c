//! The reader's clock while records stream: a periodic timerfd, waited on in the same epoll as
//! the ring buffer.
//!
//! Why not a tokio timer: re-arming one at every wake-up inserts it ahead of the time driver's
//! next wake, and tokio then unparks its own driver (an eventfd write) so that the next
//! `epoll_wait` returns at once, empty: every poll cost a second trip around the event loop
//! and two extra syscalls. A periodic timerfd is armed once when streaming starts and disarmed
//! once when it stops; in between, each tick is one `epoll_wait` and one 8-byte read.
//!
//! The period widens while records keep coming: each tick that found a stream's worth of
//! records (the event loop decides) doubles it, up to
//! [`WIDEST`] (or the base period, if that is wider), and it snaps back to the base period when
//! the stream pauses. A storm is then read in batches several times larger, at a latency still
//! inside its budget (25 ms at p99 while records stream), and a lone record after a quiet spell
//! still wakes the reader at once (the kernel wakes it; this clock is stopped then).
use std::{
    io,
    os::fd::{AsFd, AsRawFd, RawFd},
    time::Duration,
};

use nix::{
    sys::{
        time::TimeSpec,
        timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags},
    },
    unistd::read,
};
use tokio::io::{Interest, unix::AsyncFd};

/// The timerfd, as tokio's reactor needs it (nix gives only `AsFd`).
struct Timer(TimerFd);

impl AsRawFd for Timer {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

/// The widest the period gets while records stream: with the time to read a batch, records
/// still reach the graph within 25 ms at p99.
pub const WIDEST: Duration = Duration::from_millis(16);

/// A periodic clock, stopped or ticking every `period`.
pub struct PollClock {
    fd: AsyncFd<Timer>,
    /// The period it starts at.
    base: Duration,
    /// The period now.
    period: Duration,
    ticking: bool,
}

impl PollClock {
    /// A stopped clock that ticks every `period` once started.
    pub fn new(period: Duration) -> io::Result<PollClock> {
        let timer = TimerFd::new(
            ClockId::CLOCK_MONOTONIC,
            TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC,
        )?;
        // SAFETY: the AsyncFd owns the timerfd, open and unchanged for as long as it lives.
        let fd = unsafe { AsyncFd::register_with_interest(Timer(timer), Interest::READABLE) }?;
        Ok(PollClock {
            fd,
            base: period,
            period,
            ticking: false,
        })
    }

    /// The period it ticks at now.
    #[cfg(test)]
    pub fn period(&self) -> Duration {
        self.period
    }

    /// Whether it ticks.
    pub fn ticking(&self) -> bool {
        self.ticking
    }

    /// Starts ticking at the base period (first tick one period from now); nothing if it
    /// already ticks.
    pub fn start(&mut self) -> io::Result<()> {
        if !self.ticking {
            self.period = self.base;
            self.arm()?;
            self.ticking = true;
        }
        Ok(())
    }

    /// A tick found records: the next ones come twice as far apart, up to [`WIDEST`].
    pub fn widen(&mut self) -> io::Result<()> {
        let wider = (self.period * 2).min(WIDEST.max(self.base));
        if self.ticking && wider != self.period {
            self.period = wider;
            self.arm()?;
        }
        Ok(())
    }

    /// Stops ticking.
    pub fn stop(&mut self) -> io::Result<()> {
        if self.ticking {
            self.fd.get_ref().0.unset()?;
            self.ticking = false;
        }
        Ok(())
    }

    fn arm(&self) -> io::Result<()> {
        let period = TimeSpec::from_duration(self.period);
        self.fd
            .get_ref()
            .0
            .set(Expiration::Interval(period), TimerSetTimeFlags::empty())?;
        Ok(())
    }

    /// The next tick (ticks missed meanwhile count as one). Never resolves while stopped.
    pub async fn tick(&mut self) -> io::Result<()> {
        loop {
            let mut ready = self.fd.readable_mut().await?;
            let mut count = [0u8; 8];
            // The read takes every expiration so far, so the fd is not readable after it:
            // clearing now saves a read that would only say EAGAIN (an expiration racing the
            // clear is kept: tokio clears only what it had seen).
            match read(ready.get_inner().0.as_fd(), &mut count) {
                Ok(_) => {
                    ready.clear_ready();
                    return Ok(());
                }
                Err(nix::errno::Errno::EAGAIN) => ready.clear_ready(),
                Err(e) => return Err(e.into()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn ticks_only_while_started() {
        let mut clock = PollClock::new(Duration::from_millis(1)).unwrap();
        assert!(!clock.ticking());
        let stopped = tokio::time::timeout(Duration::from_millis(20), clock.tick()).await;
        assert!(stopped.is_err(), "a stopped clock never ticks");
        clock.start().unwrap();
        for _ in 0..3 {
            clock.tick().await.unwrap();
        }
        clock.stop().unwrap();
        let stopped = tokio::time::timeout(Duration::from_millis(20), clock.tick()).await;
        assert!(stopped.is_err(), "stopped again");
    }

    #[tokio::test]
    async fn widens_while_records_stream_and_starts_narrow_again() {
        let mut clock = PollClock::new(Duration::from_millis(2)).unwrap();
        clock.start().unwrap();
        let mut seen = Vec::new();
        for _ in 0..6 {
            clock.widen().unwrap();
            seen.push(clock.period().as_millis());
        }
        assert_eq!(seen, [4, 8, 16, 16, 16, 16], "doubling up to the widest");
        clock.tick().await.unwrap();
        clock.stop().unwrap();
        clock.start().unwrap();
        assert_eq!(
            clock.period(),
            Duration::from_millis(2),
            "a pause resets it"
        );
        // A base period wider than the widest stays as it is.
        let mut slow = PollClock::new(Duration::from_millis(50)).unwrap();
        slow.start().unwrap();
        slow.widen().unwrap();
        assert_eq!(slow.period(), Duration::from_millis(50));
    }
}
