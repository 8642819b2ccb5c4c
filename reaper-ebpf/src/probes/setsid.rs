//! setsid() by a tracked process, reported when it returns.
//!
//! Preferred hook: the `syscalls/sys_exit_setsid` tracepoint (needs tracefs, which user space
//! mounts when missing). Fallback: the raw `sys_exit` tracepoint, filtered here by syscall
//! number before anything else.
use aya_ebpf::{
    macros::{raw_tracepoint, tracepoint},
    programs::{RawTracePointContext, TracePointContext},
};
use reaper_common::{EventKind, SetsidEvent};

use crate::{
    emit::{header, send},
    global,
    maps::tracked_current,
    task::{Task, read_u32_at},
};

#[tracepoint]
pub fn sys_exit_setsid(ctx: TracePointContext) -> u32 {
    let offset = global!(CONFIG.setsid_ret_offset) as usize;
    // SAFETY: the offset comes from the tracepoint's own format file.
    let ret = unsafe { ctx.read_at::<i64>(offset) }.unwrap_or(-1);
    report(ret);
    0
}

#[raw_tracepoint(tracepoint = "sys_exit")]
pub fn raw_sys_exit(ctx: RawTracePointContext) -> u32 {
    let regs = ctx.arg::<*const u8>(0);
    // The saved syscall number is `orig_ax` (a u64) on x86_64 and `syscallno` (an s32
    // beside another u32) on aarch64: its low 32 bits (little-endian, first) on both.
    let nr = read_u32_at(regs, global!(OFFSETS.pt_regs_syscall_nr));
    if u64::from(nr) != global!(CONFIG.setsid_nr) {
        return 0;
    }
    report(ctx.arg::<i64>(1));
    0
}

#[inline(always)]
fn report(ret: i64) {
    if ret < 0 {
        return; // setsid failed: nothing changed
    }
    let Some((pid, start)) = tracked_current(|| Some(Task::current().process_start())) else {
        return;
    };
    send::<SetsidEvent>(EventKind::Setsid, |ev| {
        ev.header = header(EventKind::Setsid, pid, start);
        // The new session is named after its leader, the caller's thread group: its pid as
        // the initial namespace sees it. (`ret` is the same id inside the caller's own pid
        // namespace: 1, 2, ... in a container.)
        ev.sid = pid;
        ev._pad = 0;
    });
}
