//! `sched_process_free`: a tracked process was released (reaped); forget it.
use aya_ebpf::{macros::btf_tracepoint, programs::BtfTracePointContext};
use reaper_common::{EventKind, FreeEvent};

use crate::{
    emit::{header, send},
    maps::{JIT_HOSTS, PYTHONS, TRACKED, same_process},
    task::Task,
};

#[btf_tracepoint(function = "sched_process_free")]
pub fn sched_process_free(ctx: BtfTracePointContext) -> u32 {
    // Runs from an RCU callback: `current` is unrelated, only the argument counts. Usually in
    // a softirq, which can interrupt another probe on this CPU: so no per-CPU scratch map
    // here (theirs are theirs alone only while nothing nests into them).
    let task = Task(ctx.arg::<*const u8>(0));
    let pid = task.pid();
    let Some(entry) = TRACKED.get_ptr_mut(pid) else {
        return 0;
    };
    if pid != task.tgid() {
        return 0; // a thread
    }
    let start = task.start_boottime();
    // The pid may already name a newer tracked process: only its own entry is removed.
    if !same_process(entry, start) {
        return 0;
    }
    let _ = TRACKED.remove(pid);
    let _ = PYTHONS.remove(pid);
    let _ = JIT_HOSTS.remove(pid);
    send::<FreeEvent>(EventKind::Free, |ev| {
        ev.header = header(EventKind::Free, pid, start);
    });
    0
}
