//! The event loop: the ring read on the pace of the poll clock while records stream, the
//! upkeep on the housekeeping tick, the leak rules and `--kill` on the scan's timer, until a
//! stop condition.
use std::time::Duration;

use anyhow::{Context, Result};
use aya::maps::{MapData, RingBuf};
use tokio::{
    io::unix::AsyncFd,
    signal::unix::{Signal, SignalKind, signal},
    sync::mpsc::{Receiver, UnboundedReceiver},
    time::{Instant, sleep_until},
};

use super::checkpoints::Checkpoints;
use super::command::{GatewayCommand, Stop};
use super::follow_pidfiles;
use super::pipeline::Pipeline;
use crate::api::Query;
use crate::capture::loader::{KernelMaps, ReaderMarks};
use crate::capture::poll_clock::PollClock;
use crate::cli::Cli;
use crate::gateways::Selectors;
use crate::kill::KillReport;
use crate::lineage::upkeep::FREE_LAG;
use crate::procfs::boottime_now;

/// How often losses are checked and pending reparents re-read when nothing else happens.
const HOUSEKEEPING: Duration = Duration::from_millis(100);
/// Records one tick must find for the poll clock to widen: a fork+exec storm brings a dozen a
/// millisecond and a fork+exit storm dozens; one process's fork, exec, exit and free come
/// in ones and twos a tick (and keep the quiet budget).
const STREAM_BATCH: usize = 8;
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
    /// The API's questions; none with `--api off`.
    pub(super) api: Option<Receiver<Query>>,
    pub(super) signals: Signals,
}

/// SIGINT and SIGTERM, caught from before `ready` is written: a stop asked for as soon as the
/// run says it is ready is a stop like any other (the summary, the last checkpoint).
pub(super) struct Signals {
    interrupt: Signal,
    terminate: Signal,
}

impl Signals {
    pub(super) fn catch() -> Result<Signals> {
        Ok(Signals {
            interrupt: signal(SignalKind::interrupt()).context("installing a SIGINT handler")?,
            terminate: signal(SignalKind::terminate()).context("installing a SIGTERM handler")?,
        })
    }
}

/// Streams events until a stop condition: the duration, a signal, or every gateway gone with
/// no tracked process left alive. Returns which.
///
/// Wake-ups are batched: while records stream, the loop polls the ring every wake-up interval,
/// widening to 16 ms while polls keep finding records (see [`PollClock`]), and no record wakes
/// it. When a poll finds nothing, it tells the kernel it goes idle (the
/// next record then wakes it at once), polls once more to catch a record that raced that,
/// and sleeps. Housekeeping also polls, which bounds even that race's delay.
pub(super) async fn event_loop(
    cli: &Cli,
    selectors: &mut Selectors,
    run: &mut Pipeline,
    sources: &mut Sources,
) -> Result<Stop> {
    let Sources {
        ring,
        kernel,
        command,
        kill_reports,
        checkpoints,
        signals,
        api,
    } = sources;
    let far = Instant::now() + Duration::from_secs(86_400 * 365);
    // `--wakeup-interval 0`: every record wakes the reader (the kernel is told not to batch),
    // so there is nothing to poll for.
    let batching = !cli.wakeup_interval.is_zero();
    let mut poll = PollClock::new(cli.wakeup_interval.max(Duration::from_micros(100)))
        .context("creating the reader's poll clock (timerfd)")?;
    kernel.reader_idle.going_idle()?;
    // The timers live across iterations and are moved only when their time changes: a fresh
    // timer per wake-up is a timer-wheel insertion and removal each, on the hottest loop.
    let stop_at = sleep_until(cli.duration.map(|d| Instant::now() + d).unwrap_or(far));
    let house = sleep_until(Instant::now() + HOUSEKEEPING);
    let scan = sleep_until(Instant::now() + cli.scan_interval);
    // --check: when the gateway command's settle time is up.
    let settle = sleep_until(far);
    tokio::pin!(stop_at, house, scan, settle);
    let mut settling = false;
    let mut look_again_soon = false;
    loop {
        // A child whose parent exited, and an interpreter not yet mapped (before the program
        // gets to spawn), are looked at again soon, not at the next tick.
        let look_again = if run.has_pending_interpreters() {
            Some(LOOK_AGAIN_INTERPRETER)
        } else if run.has_pending_reparents() {
            Some(LOOK_AGAIN)
        } else {
            None
        };
        if let (Some(wait), false) = (look_again, look_again_soon) {
            let soon = Instant::now() + wait;
            if soon < house.deadline() {
                house.as_mut().reset(soon);
                look_again_soon = true;
            }
        }
        // Written lines go out at once, except while records stream: then they leave in
        // full buffers and at each housekeeping tick, and all of them when the stream pauses
        // (a write per wake-up was a fifth of the reader's CPU in a fork storm).
        let mut flush = true;
        tokio::select! {
            ready = ring.readable_mut() => {
                // Clear first, then drain: a record arriving meanwhile re-arms readiness.
                ready.context("waiting on the ring buffer")?.clear_ready();
                drain(ring.get_mut(), run, &mut kernel.marks)?;
                if batching {
                    poll.start().context("starting the poll clock")?;
                }
                flush = !batching;
            }
            tick = poll.tick(), if poll.ticking() => {
                tick.context("waiting on the poll clock")?;
                let mut n = drain(ring.get_mut(), run, &mut kernel.marks)?;
                if n == 0 {
                    kernel.reader_idle.going_idle()?;
                    n = drain(ring.get_mut(), run, &mut kernel.marks)?;
                }
                match n {
                    0 => poll.stop().context("stopping the poll clock")?,
                    // A stream, not a few records of one process's life: read less often.
                    n if n >= STREAM_BATCH => poll.widen().context("widening the poll clock")?,
                    _ => {}
                }
                flush = n == 0;
            }
            _ = &mut house => {
                let losses = kernel.counters.losses()?;
                drain(ring.get_mut(), run, &mut kernel.marks)?;
                run.keep_exact(losses, &kernel.tracked)?;
                run.look_again_for_interpreters()?;
                kernel.marks.still_reading()?;
                follow_pidfiles(selectors, run, &mut kernel.tracked, cli.allow_init)?;
                if let Some(checkpoints) = checkpoints.as_mut() {
                    checkpoints.due(run)?;
                }
                // The API's questions wait for this tick (100 ms at most), not a branch of
                // their own: a pending receiver polled at every wake-up of a fork storm
                // cost the reader some 8% (measured).
                while let Some(query) = api.as_mut().and_then(|rx| rx.try_recv().ok()) {
                    run.answer(query);
                }
                house.as_mut().reset(Instant::now() + HOUSEKEEPING);
                look_again_soon = false;
            }
            _ = &mut scan => {
                drain(ring.get_mut(), run, &mut kernel.marks)?;
                run.release_lagging(FREE_LAG)?;
                run.scan_leaks()?;
                run.decide_kills()?;
                run.output().draw_status().context("writing output")?;
                scan.as_mut().reset(next_scan(cli.scan_interval, run.next_look()));
            }
            Some(report) = next_report(kill_reports) => run.report_kill(report)?,
            status = command.wait(), if command.running() => {
                command.status = Some(status?);
                // Its exit event may still be in the ring.
                drain(ring.get_mut(), run, &mut kernel.marks)?;
                if cli.check {
                    settle.as_mut().reset(Instant::now() + cli.settle_time());
                    settling = true;
                }
            }
            _ = &mut settle, if settling => return Ok(Stop::Done),
            _ = signals.interrupt.recv() => return Ok(Stop::Signal("SIGINT")),
            _ = signals.terminate.recv() => return Ok(Stop::Signal("SIGTERM")),
            _ = &mut stop_at => return Ok(Stop::Duration),
        }
        if flush {
            run.output().flush().context("writing output")?;
        }
        let waiting_for_more = selectors.watches();
        if !command.running() && !waiting_for_more && run.finished() {
            return Ok(Stop::Done);
        }
    }
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
    run.end_batch()?;
    if n > 0 {
        marks.taken(run.received())?;
    }
    Ok(n)
}
