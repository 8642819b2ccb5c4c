//! `sched_process_exit`: the last thread of a tracked process exited.
use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid, macros::btf_tracepoint, programs::BtfTracePointContext,
};
use reaper_common::{EventKind, ExitEvent};

use crate::{
    emit::{header, send},
    maps::{TRACKED, same_process},
    task::Task,
};

#[btf_tracepoint(function = "sched_process_exit")]
pub fn sched_process_exit(ctx: BtfTracePointContext) -> u32 {
    let pid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let Some(entry) = TRACKED.get_ptr_mut(pid) else {
        return 0;
    };
    let task = Task(ctx.arg::<*const u8>(0));
    if !task.group_dead() {
        return 0; // other threads live on: the process has not exited
    }
    let start = task.process_start();
    // Also fills in the identity of a seeded entry while the pid is still held.
    if !same_process(entry, start) {
        return 0;
    }
    send::<ExitEvent>(EventKind::Exit, |ev| {
        ev.header = header(EventKind::Exit, pid, start);
        ev.status = task.exit_code();
        ev._pad = 0;
    });
    0
}
