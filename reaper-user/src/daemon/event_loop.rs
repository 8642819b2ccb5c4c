//! The event loop: the ring read on the pace of the poll clock while records stream, the
//! upkeep on the housekeeping tick, a round of the leak rules started on the scan's timer
//! (both on the poll clock's ticks while records stream) and written, with `--kill`'s
//! decisions, at the wake-up after its reads are done, until a stop condition.
use std::{cell::RefCell, pin::Pin, time::Duration};

use anyhow::{Context, Result};
use aya::maps::{MapData, RingBuf};
use tokio::{
    io::unix::AsyncFd,
    pin,
    signal::unix::{SignalKind, signal},
    sync::{mpsc::UnboundedReceiver, oneshot},
    time::{Instant, Sleep, sleep_until},
};

use super::checkpoints::Checkpoints;
use super::command::{GatewayCommand, Stop};
use super::follow_pidfiles;
use super::pipeline::Pipeline;
use super::rounds::Rounds;
use super::session_reads::SessionReads;
use crate::capture::loader::{KernelMaps, ReaderMarks};
use crate::capture::poll_clock::PollClock;
use crate::cli::Cli;
use crate::gateways::Selectors;
use crate::kill::KillReport;
use crate::lineage::upkeep::FREE_LAG;
use crate::procfs::boottime_now;

/// How often losses are checked and pending reparents re-read when nothing else happens.
const HOUSEKEEPING: Duration = Duration::from_millis(100);
/// Records one tick must find for the poll clock to widen: a fork+exec storm brings several a
/// millisecond and a fork+exit storm dozens; one process's fork, exec, exit and free come in
/// ones and twos a tick (and keep the quiet budget).
const STREAM_BATCH: usize = 6;
/// How soon a child whose parent exited is looked at again.
const LOOK_AGAIN: Duration = Duration::from_millis(5);
/// How soon an interpreter whose libpython the loader had not mapped yet is looked at again:
/// the loader maps it a millisecond or two after the exec, and its layout must reach the
/// kernel before the interpreter's first fork (a gateway that spawns as it starts does so
/// within some 20 ms). A few extra wake-ups per interpreter started.
const LOOK_AGAIN_INTERPRETER: Duration = Duration::from_millis(1);

/// What the event loop reads besides its timers and signals.
pub(super) struct Sources {
    pub(super) ring: AsyncFd<RingBuf<MapData>>,
    pub(super) kernel: KernelMaps,
    pub(super) command: GatewayCommand,
    /// The kill sequences' reports; none without `--kill`.
    pub(super) kill_reports: Option<UnboundedReceiver<KillReport>>,
    /// The lineage checkpoint's writer; none without `--state-dir`.
    pub(super) checkpoints: Option<Checkpoints>,
    pub(super) signals: Signals,
}

/// SIGINT and SIGTERM, caught from before `ready` is written: a stop asked for as soon as the
/// run says it is ready is a stop like any other (the summary, the last checkpoint).
///
/// A task of its own waits for them and sends the first one's name: the event loop then polls
/// one receiver at each wake-up instead of two signal streams (each a watch channel and its
/// notifier: 3% of the reader's CPU in a fork+exec storm).
pub(super) struct Signals {
    first: oneshot::Receiver<&'static str>,
}

impl Signals {
    pub(super) fn catch() -> Result<Signals> {
        let mut interrupt =
            signal(SignalKind::interrupt()).context("installing a SIGINT handler")?;
        let mut terminate =
            signal(SignalKind::terminate()).context("installing a SIGTERM handler")?;
        let (tx, first) = oneshot::channel();
        tokio::spawn(async move {
            // A stream that ended (never, for a signal) is no signal: with both gone the
            // sender is dropped and the loop waits on the rest.
            let name = tokio::select! {
                Some(()) = interrupt.recv() => "SIGINT",
                Some(()) = terminate.recv() => "SIGTERM",
                else => return,
            };
            let _ = tx.send(name);
        });
        Ok(Signals { first })
    }
}

/// When the run's chores are due: housekeeping every [`HOUSEKEEPING`] and the leak scan.
///
/// While the reader sleeps their timers wake it. While a stream is read on the poll clock the
/// timers are parked far away and the ticks run whichever chore is due: a tokio timer cost the
/// reader two more wake-ups each time (the timer wheel wakes once to bring a timer 100 ms away
/// down to its finest level, and again when it is due) and a third trip around the loop when
/// re-armed (tokio wakes its own driver for a timer that became the nearest): a fifth of a
/// fork+exec storm's wake-ups.
struct Chores {
    house: Pin<Box<Sleep>>,
    scan: Pin<Box<Sleep>>,
    house_due: Instant,
    scan_due: Instant,
    /// Whether the timers are parked and the ticks run the chores.
    on_ticks: bool,
    /// Housekeeping brought forward to look at something again soon: on its timer until done.
    brought_forward: bool,
    /// Where parked timers wait.
    far: Instant,
}

impl Chores {
    fn new(scan_interval: Duration, far: Instant) -> Chores {
        let now = Instant::now();
        Chores {
            house: Box::pin(sleep_until(now + HOUSEKEEPING)),
            scan: Box::pin(sleep_until(now + scan_interval)),
            house_due: now + HOUSEKEEPING,
            scan_due: now + scan_interval,
            on_ticks: false,
            brought_forward: false,
            far,
        }
    }

    /// Hands the chores to the poll clock's ticks, unless housekeeping was brought forward.
    fn onto_ticks(&mut self) {
        if !self.on_ticks && !self.brought_forward {
            // A later deadline moves a timer without waking tokio's driver.
            self.house.as_mut().reset(self.far);
            self.scan.as_mut().reset(self.far);
            self.on_ticks = true;
        }
    }

    /// Gives the chores back to their timers: the stream paused.
    fn back_to_timers(&mut self) {
        if self.on_ticks {
            self.house.as_mut().reset(self.house_due);
            self.scan.as_mut().reset(self.scan_due);
            self.on_ticks = false;
        }
    }

    /// Housekeeping within `wait`, if it is not due sooner already: something is to be looked
    /// at again (an interpreter not yet mapped, a pending reparent).
    fn look_again_within(&mut self, wait: Duration) {
        // Asked on every turn of the loop while something is pending: no clock read once
        // brought forward.
        if self.brought_forward {
            return;
        }
        let soon = Instant::now() + wait;
        if soon < self.house_due {
            self.house_at(soon);
        }
    }

    /// Brings housekeeping forward to `at`, on its timer: sooner than the next tick may come.
    fn house_at(&mut self, at: Instant) {
        self.house_due = at;
        self.brought_forward = true;
        self.back_to_timers();
        self.house.as_mut().reset(at);
    }

    /// Housekeeping was done: the next is due a period from now.
    fn house_done(&mut self) {
        self.brought_forward = false;
        self.house_due = Instant::now() + HOUSEKEEPING;
        if !self.on_ticks {
            self.house.as_mut().reset(self.house_due);
        }
    }

    /// A leak scan was done: the next is due at `next`.
    fn scan_done(&mut self, next: Instant) {
        self.scan_due = next;
        if !self.on_ticks {
            self.scan.as_mut().reset(next);
        }
    }

    /// The next leak scan at `at`, if that is sooner than it is due.
    fn scan_sooner(&mut self, at: Instant) {
        if at < self.scan_due {
            self.scan_done(at);
        }
    }

    /// Whether a tick is to do housekeeping.
    fn house_due_on_tick(&self, now: Instant) -> bool {
        self.on_ticks && now >= self.house_due
    }

    /// Whether a tick is to scan for leaks.
    fn scan_due_on_tick(&self, now: Instant) -> bool {
        self.on_ticks && now >= self.scan_due
    }
}

/// Streams events until a stop condition: the duration, a signal, or every gateway gone with
/// no tracked process left alive. Returns which.
///
/// Wake-ups are batched: while records stream, the loop polls the ring every wake-up interval,
/// widening to 16 ms while polls keep finding records (see [`PollClock`]), and no record wakes
/// it. When a poll finds nothing, the clock stops; at the end of every turn without it, the
/// loop tells the kernel it goes idle (the next record then wakes it at once), polls once more
/// to catch a record that raced that, and sleeps; a record committed after that poll finds the
/// flag and wakes it.
///
/// The run is borrowed at each wake-up, for what that wake-up does, and never across an
/// await: the API's answers (`daemon/answers.rs`) borrow it between.
pub(super) async fn event_loop(
    cli: &Cli,
    selectors: &mut Selectors,
    shared: &RefCell<Pipeline>,
    sources: &mut Sources,
    rounds: &mut Rounds,
    sessions: &mut SessionReads,
) -> Result<Stop> {
    let Sources {
        ring,
        kernel,
        command,
        kill_reports,
        checkpoints,
        signals,
    } = sources;
    let far = Instant::now() + Duration::from_secs(86_400 * 365);
    // `--wakeup-interval 0`: every record wakes the reader (the kernel is told not to batch),
    // so there is nothing to poll for.
    let batching = !cli.wakeup_interval.is_zero();
    let mut poll = PollClock::new(cli.wakeup_interval.max(Duration::from_micros(100)))
        .context("creating the reader's poll clock (timerfd)")?;
    kernel.reader_idle.going_idle()?;
    let mut chores = Chores::new(cli.scan_interval, far);
    // The timers (these and the chores') live across iterations and are moved only when their
    // time changes: a fresh timer per wake-up is a timer-wheel insertion and removal each, on
    // the hottest loop.
    let stop_at = sleep_until(cli.duration.map(|d| Instant::now() + d).unwrap_or(far));
    // --check: when the gateway command's settle time is up.
    let settle = sleep_until(far);
    pin!(stop_at, settle);
    let mut settling = false;
    loop {
        // A child whose parent exited, and an interpreter not yet mapped (before the program
        // gets to spawn), are looked at again soon, not at the next tick.
        let look_again = look_again(&shared.borrow());
        if let Some(wait) = look_again {
            chores.look_again_within(wait);
        }
        // Written lines go out at once, except while records stream: then they leave in
        // full buffers and at each housekeeping tick, and all of them when the stream pauses
        // (a write per wake-up was a fifth of the reader's CPU in a fork storm).
        let mut flush = true;
        tokio::select! {
            ready = ring.readable_mut() => {
                // Clear first, then drain: a record arriving meanwhile re-arms readiness.
                ready.context("waiting on the ring buffer")?.clear_ready();
                drain(ring.get_mut(), &mut shared.borrow_mut(), &mut kernel.marks)?;
                if batching {
                    poll.start().context("starting the poll clock")?;
                }
                flush = !batching;
            }
            tick = poll.tick(), if poll.ticking() => {
                tick.context("waiting on the poll clock")?;
                let mut run = shared.borrow_mut();
                let n = drain(ring.get_mut(), &mut run, &mut kernel.marks)?;
                match n {
                    0 => {
                        poll.stop().context("stopping the poll clock")?;
                        chores.back_to_timers();
                    }
                    // A stream, not a few records of one process's life: read less often,
                    // and do the chores on the ticks.
                    n if n >= STREAM_BATCH => {
                        poll.widen().context("widening the poll clock")?;
                        chores.onto_ticks();
                    }
                    _ => {}
                }
                flush = n == 0;
                // A chore done on a tick writes its lines at once, as on its own timer.
                let now = Instant::now();
                if chores.house_due_on_tick(now) {
                    keep_house(cli, selectors, &mut run, ring.get_mut(), kernel, checkpoints)?;
                    chores.house_done();
                    flush = true;
                }
                if chores.scan_due_on_tick(now) {
                    let next = scan_leaks(cli, &mut run, ring.get_mut(), &mut kernel.marks, rounds)?;
                    chores.scan_done(next);
                    flush = true;
                }
            }
            _ = &mut chores.house => {
                let mut run = shared.borrow_mut();
                keep_house(cli, selectors, &mut run, ring.get_mut(), kernel, checkpoints)?;
                chores.house_done();
            }
            _ = &mut chores.scan => {
                let next =
                    scan_leaks(cli, &mut shared.borrow_mut(), ring.get_mut(), &mut kernel.marks, rounds)?;
                chores.scan_done(next);
            }
            Some(report) = next_report(kill_reports) => shared.borrow_mut().report_kill(report)?,
            status = command.wait(), if command.running() => {
                command.status = Some(status?);
                // Its exit event may still be in the ring.
                drain(ring.get_mut(), &mut shared.borrow_mut(), &mut kernel.marks)?;
                if cli.check {
                    settle.as_mut().reset(Instant::now() + cli.settle_time());
                    settling = true;
                }
            }
            // A session read done while no tick would come round: kept, and what waited
            // behind it handed on, below (one done while the clock ticks waits for a tick).
            _ = sessions.woken(), if sessions.under_way() && !poll.ticking() => {}
            _ = &mut settle, if settling => return Ok(Stop::Done),
            Ok(name) = &mut signals.first => return Ok(Stop::Signal(name)),
            _ = &mut stop_at => return Ok(Stop::Duration),
        }
        rounds.failure().context("writing output")?;
        let mut run = shared.borrow_mut();
        // A round read what it needed: written against the graph as the kernel left it, and
        // its rules may want the next look sooner (an orphan grace that started).
        if run.round_ready() {
            drain(ring.get_mut(), &mut run, &mut kernel.marks)?;
            run.commit_round(true).context("writing output")?;
            chores.scan_sooner(next_scan(cli.scan_interval, run.next_look()));
        }
        // No tick will come round: the next record is to wake the reader. Said at the end of
        // every such turn, not only when a tick found nothing: a record that took the flag
        // may have been read by another drain (housekeeping's, a round's) before its wake-up
        // reached the loop, and the ring then has nothing to say; a flag left taken would
        // leave every later record to the housekeeping poll, 100 ms late.
        if batching && !poll.ticking() {
            kernel.reader_idle.going_idle()?;
            if drain(ring.get_mut(), &mut run, &mut kernel.marks)? > 0 {
                poll.start().context("starting the poll clock")?;
            }
        }
        // The execs taken in (by any drain of this turn) have their environments read soon (a
        // per-session process may not live long): gathered while the poll clock ticks (its
        // next tick comes round within a period), handed on now when the reader may sleep
        // next, or, behind a read under way, when that one is done. Last, so that whether the
        // clock ticks is what the reader does next.
        sessions
            .turn(&mut run, poll.ticking())
            .context("writing output")?;
        if flush {
            run.output().flush().context("writing output")?;
        }
        let waiting_for_more = selectors.watches();
        if !command.running() && !waiting_for_more && run.finished() {
            return Ok(Stop::Done);
        }
    }
}

/// How soon housekeeping is to look again at what is pending: a child whose parent exited,
/// an interpreter not yet mapped.
fn look_again(run: &Pipeline) -> Option<Duration> {
    if run.has_pending_interpreters() {
        Some(LOOK_AGAIN_INTERPRETER)
    } else if run.has_pending_reparents() {
        Some(LOOK_AGAIN)
    } else {
        None
    }
}

/// Housekeeping: losses checked (and the graph made exact again after one), interpreters and
/// pid files looked at again, the checkpoint when due.
fn keep_house(
    cli: &Cli,
    selectors: &mut Selectors,
    run: &mut Pipeline,
    ring: &mut RingBuf<MapData>,
    kernel: &mut KernelMaps,
    checkpoints: &mut Option<Checkpoints>,
) -> Result<()> {
    let losses = kernel.counters.losses()?;
    drain(ring, run, &mut kernel.marks)?;
    run.keep_exact(losses, &kernel.tracked)?;
    run.look_again_for_interpreters()?;
    // What was unwound while no record came (the checkpoint keeps a JIT host's child's).
    run.take_unwound()?;
    kernel.marks.still_reading()?;
    follow_pidfiles(selectors, run, &mut kernel.tracked, cli.allow_init)?;
    if let Some(checkpoints) = checkpoints.as_mut() {
        checkpoints.due(run)?;
    }
    Ok(())
}

/// The leak scan: zombies whose free lags recorded, then a round of the rules started (its
/// flags, `--kill`'s decisions and the status line follow when it is done, see [`Rounds`]).
/// A round whose reads are done is written first, so that the one due can start. Returns
/// when the next one is due: a scan interval from now (once the round is written, the event
/// loop brings it forward to when its rules want a look, see `scan_sooner`; what they want
/// now is what the round under way is to look at).
fn scan_leaks(
    cli: &Cli,
    run: &mut Pipeline,
    ring: &mut RingBuf<MapData>,
    marks: &mut ReaderMarks,
    rounds: &mut Rounds,
) -> Result<Instant> {
    drain(ring, run, marks)?;
    run.release_lagging(FREE_LAG)?;
    if run.round_ready() {
        run.commit_round(true).context("writing output")?;
    }
    rounds.start(run);
    Ok(Instant::now() + cli.scan_interval)
}

/// When the next leak scan runs: a scan interval from now, or sooner when an orphan grace
/// ends before (`grace_end`, boot-time ns).
fn next_scan(interval: Duration, grace_end: Option<u64>) -> Instant {
    let regular = Instant::now() + interval;
    let Some(end) = grace_end else {
        return regular;
    };
    let wait = Duration::from_nanos(end.saturating_sub(boottime_now()));
    regular.min(Instant::now() + wait)
}

/// The next step a kill sequence reports; never, without `--kill`.
async fn next_report(reports: &mut Option<UnboundedReceiver<KillReport>>) -> Option<KillReport> {
    match reports.as_mut() {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// Reads every record now in the ring, then tells the kernel how many were taken in all (a
/// kept state's count, for the next run). Returns how many.
pub(super) fn drain(
    ring: &mut RingBuf<MapData>,
    run: &mut Pipeline,
    marks: &mut ReaderMarks,
) -> Result<usize> {
    let mut n = 0;
    while let Some(item) = ring.next() {
        run.record(&item)?;
        n += 1;
    }
    // An empty drain ends no batch: ending one looks again at interpreters not yet mapped,
    // whose looks are counted, and the loop drains once more, empty, at each idle turn's end.
    if n > 0 {
        run.end_batch()?;
        marks.taken(run.received())?;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn chores_run_on_their_timers_or_on_the_ticks_never_both() {
        let far = Instant::now() + Duration::from_secs(3600);
        let mut chores = Chores::new(Duration::from_secs(5), far);
        let (house, scan) = (chores.house_due, chores.scan_due);
        // On their timers: a tick leaves them alone, even past their time.
        let past_both = scan + Duration::from_secs(1);
        assert!(!chores.house_due_on_tick(past_both));
        assert!(!chores.scan_due_on_tick(past_both));
        assert_eq!(chores.house.deadline(), house);

        // On the ticks: the timers parked far away, a tick runs what is due.
        chores.onto_ticks();
        assert_eq!(
            (chores.house.deadline(), chores.scan.deadline()),
            (far, far)
        );
        assert!(!chores.house_due_on_tick(house - Duration::from_millis(1)));
        assert!(chores.house_due_on_tick(house));
        assert!(!chores.scan_due_on_tick(house));
        chores.house_done();
        assert!(chores.house_due > house);
        assert_eq!(chores.house.deadline(), far, "housekeeping done on a tick");
        chores.scan_done(scan + Duration::from_secs(5));
        assert_eq!(chores.scan.deadline(), far, "a scan done on a tick");

        // The stream pauses: the timers are set to the chores' times again.
        chores.back_to_timers();
        assert!(!chores.house_due_on_tick(past_both));
        assert_eq!(
            (chores.house.deadline(), chores.scan.deadline()),
            (chores.house_due, scan + Duration::from_secs(5))
        );

        // Something to look at again sooner than a tick may come: housekeeping on its timer.
        chores.onto_ticks();
        let soon = Instant::now() + Duration::from_millis(1);
        chores.house_at(soon);
        assert!(!chores.house_due_on_tick(past_both));
        assert_eq!(chores.house.deadline(), soon);
        assert_eq!(chores.scan.deadline(), chores.scan_due);
        // It stays on its timer, a stream or not, until done.
        chores.onto_ticks();
        assert_eq!(chores.house.deadline(), soon);
        chores.house_done();
        chores.onto_ticks();
        assert_eq!(chores.house.deadline(), far);
    }
}
