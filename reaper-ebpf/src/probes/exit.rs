//! `sched_process_exit`: the last thread of a tracked process exited.
use aya_ebpf::{macros::btf_tracepoint, programs::BtfTracePointContext};
use reaper_common::{EventKind, ExitEvent};

use crate::{
    emit::{header, send},
    maps::tracked_current,
    task::Task,
};

#[btf_tracepoint(function = "sched_process_exit")]
pub fn sched_process_exit(ctx: BtfTracePointContext) -> u32 {
    let task = Task(ctx.arg::<*const u8>(0));
    // Other threads living on: the process has not exited. Otherwise this also fills in the
    // identity of a seeded entry while the pid is still held.
    let start = || task.group_dead().then(|| task.process_start());
    let Some((pid, start)) = tracked_current(start) else {
        return 0;
    };
    send::<ExitEvent>(EventKind::Exit, |ev| {
        ev.header = header(EventKind::Exit, pid, start);
        ev.status = task.exit_code();
        ev._pad = 0;
    });
    0
}
