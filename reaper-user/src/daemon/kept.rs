//! A run's state across its restarts (`--state-dir`), as the daemon starts and stops: what
//! it takes back at the start, the account it leaves at a stop with the probes kept
//! recording, and what it traces, by name, for the checkpoint.
use std::time::Duration;

use anyhow::Result;
use aya::maps::{MapData, RingBuf};

use super::event_loop::drain;
use super::pipeline::{KeptState, Pipeline};
use crate::capture::loader::{Accounting, KernelCounters, LoadFacts, ReaderMarks};
use crate::cli::Cli;
use crate::gateways::Selectors;
use crate::lineage::seed::TrackedMap;
use crate::state::{StateDir, Taken};
use crate::stream::events::Resumed;

/// How many times (a millisecond apart) a kept state's stop waits for the records numbered
/// to be taken in.
const SETTLE_TRIES: usize = 1000;

/// Takes back what the state directory held: the lineage, and (taken whole) the kernel side's
/// count of records taken, the losses reported and the probes' take-over. Returns the `ready`
/// event's `resumed`, and whether the state was taken whole.
pub(super) fn resume(
    taken: &Taken,
    state: &Option<StateDir>,
    facts: &LoadFacts,
    tracked: &mut TrackedMap,
    run: &mut Pipeline,
    t0: u64,
) -> Result<(Option<Resumed>, bool)> {
    let Some(dir) = state else {
        return Ok((None, false));
    };
    let (checkpoint, took, unsaved, whole) = match taken {
        Taken::Nothing => return Ok((None, false)),
        Taken::Lineage(checkpoint) => {
            let took = run.resume(&checkpoint.nodes, tracked)?;
            (checkpoint, took, 0, false)
        }
        Taken::Whole {
            checkpoint,
            kept,
            mark,
        } => {
            let unsaved = mark.received - kept.received;
            let took = run.resume_kept(
                &checkpoint.nodes,
                KeptState {
                    received: mark.received,
                    unsaved,
                    reported: kept.losses,
                    took_over: facts.took_over,
                },
            );
            (checkpoint, took, unsaved, true)
        }
    };
    run.resume_spawn_sites(&checkpoint.build_ids, &checkpoint.unwound);
    run.resume_sessions(checkpoint.sessions.as_deref(), checkpoint.written)?;
    let resumed = Resumed {
        state_dir: dir.path().display().to_string(),
        gap_ns: t0.saturating_sub(checkpoint.written),
        adopted: took.adopted,
        gone: took.gone,
        kernel_kept: whole,
        unsaved,
    };
    Ok((Some(resumed), whole))
}

/// A kept state's account at the stop: its probes go on recording, so the account is taken
/// at a moment when every record numbered so far was taken in or counted lost: the ring
/// drained, then the counters read, again (a millisecond later) while records keep coming
/// in between (or are still being written on another CPU). What comes after waits in the ring
/// for the next run. A storm that never pauses for [`SETTLE_TRIES`] ms leaves the account as
/// it stood, and says so (`consistent: false`).
pub(super) async fn settle_kept(
    ring: &mut RingBuf<MapData>,
    run: &mut Pipeline,
    counters: &KernelCounters,
    marks: &mut ReaderMarks,
) -> Result<Accounting> {
    let mut account = Accounting::default();
    for _ in 0..SETTLE_TRIES {
        drain(ring, run, marks)?;
        account = counters.account()?;
        if run.received() + account.losses.dropped() == account.numbered {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    marks.stopping()?;
    Ok(account)
}

/// What the run traces, by name, for a lineage checkpoint: its `--gateway-pid`s and its
/// selectors. The next run must trace the same to take the lineage back.
pub(super) fn traced(cli: &Cli, selectors: &Selectors) -> Vec<String> {
    let pids = cli.gateway_pid.iter().map(|pid| format!("pid:{pid}"));
    let configured = selectors.labels().into_iter().skip(Selectors::COMMAND + 1);
    pids.chain(configured).collect()
}
