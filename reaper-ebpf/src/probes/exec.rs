//! `sched_process_exec`: a tracked process executed a new program.
use core::ffi::c_void;

use aya_ebpf::{
    helpers::generated::{bpf_probe_read_kernel_str, bpf_probe_read_user},
    macros::btf_tracepoint,
    programs::BtfTracePointContext,
};
use reaper_common::{
    ARGV_MAX, COMM_LEN, EXEC_ARGV_TRUNCATED, EXEC_FILENAME_TRUNCATED, EXEC_FIXED_LEN, EventKind,
    FILENAME_MAX, MatchedAt, SPAWN_STACKS_COPY, SPAWN_STACKS_PYTHON, interpreter::Interpreter,
};

use super::gateway;

use crate::{
    emit::{header, recording, send_prefix},
    global,
    maps::{EXEC_SCRATCH, JIT_HOSTS, PYTHONS, tracked_current},
    python,
    task::{Task, read_ptr_at},
};

#[btf_tracepoint(function = "sched_process_exec")]
pub fn sched_process_exec(ctx: BtfTracePointContext) -> u32 {
    // After de_thread(): even an exec from a non-leader thread now runs as the leader, with
    // the process's tgid and start time; `old_pid` (arg 1) is the thread id that called it.
    let task = Task(ctx.arg::<*const u8>(0));
    let bprm = ctx.arg::<*const u8>(2);
    let tracked = tracked_current(|| Some(task.start_boottime()));
    // Without exe selectors (the load-time constants are 0) this is gone from the program,
    // and an untracked exec costs the one lookup above.
    let (pid, start) = match gateway::exec_selector(bprm) {
        Some(selector) => gateway::announce(task, selector, MatchedAt::Exec),
        None => match tracked {
            Some(identity) => identity,
            None => return 0,
        },
    };
    // Whatever interpreter or JIT ran here is gone with the old image; user space looks at
    // the new program when it reads this record.
    let capture = global!(CONFIG.spawn_stacks);
    if capture & SPAWN_STACKS_PYTHON != 0 {
        let _ = PYTHONS.remove(pid);
        python::at_exec(task, gateway::exe_key(bprm), pid, start);
    }
    if capture & SPAWN_STACKS_COPY != 0 {
        let _ = JIT_HOSTS.remove(pid);
    }
    let Some(reader) = recording(EventKind::Exec) else {
        return 0;
    };
    let Some(ev) = EXEC_SCRATCH.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: a per-CPU map value, ours alone while this program runs.
    let ev = unsafe { &mut *ev };
    ev.header = header(EventKind::Exec, pid, start);
    ev.old_tid = ctx.arg::<u32>(1);
    ev.comm = task.comm();
    ev.flags = 0;
    // The file the program runs from (`bprm->file`: the interpreter of a `#!` script, as
    // `/proc/PID/exe` would name it), read here so user space need not.
    let file = read_ptr_at(bprm, global!(OFFSETS.bprm_file));
    let dentry = read_ptr_at(file, global!(OFFSETS.file_dentry));
    let name = read_ptr_at(dentry, global!(OFFSETS.dentry_name));
    // SAFETY: the helper bounds the copy by the buffer size and faults safely.
    let n = unsafe {
        bpf_probe_read_kernel_str(
            ev.program.as_mut_ptr() as *mut c_void,
            COMM_LEN as u32,
            name as *const c_void,
        )
    };
    if n <= 0 {
        ev.program = [0; COMM_LEN];
    }
    // An interpreter's exec wakes the reader now (at most one such wake-up per poll
    // interval, see `emit::at_once_due`): it is looked at (its layout given to the fork
    // probe, a JIT host marked) before it has run far enough to fork.
    let at_once = capture != 0 && Interpreter::of_program(&ev.program).is_some();

    let filename = read_ptr_at(bprm, global!(OFFSETS.bprm_filename));
    // SAFETY: the helper bounds the copy by the buffer size and faults safely.
    let n = unsafe {
        bpf_probe_read_kernel_str(
            ev.filename.as_mut_ptr() as *mut c_void,
            FILENAME_MAX as u32,
            filename as *const c_void,
        )
    };
    ev.filename_len = if n > 0 { (n - 1) as u32 } else { 0 };
    if ev.filename_len as usize == FILENAME_MAX - 1 {
        ev.flags |= EXEC_FILENAME_TRUNCATED;
    }

    // argv lives in the new mm, just copied in by the kernel, so its pages are present.
    let (arg_start, arg_end) = task.arg_range();
    let mut len = arg_end.saturating_sub(arg_start);
    if len > ARGV_MAX as u64 {
        len = ARGV_MAX as u64;
        ev.flags |= EXEC_ARGV_TRUNCATED;
    }
    // SAFETY: `len` ≤ the size of `argv`; the helper faults safely.
    let rc = unsafe {
        bpf_probe_read_user(
            ev.argv.as_mut_ptr() as *mut c_void,
            len as u32,
            arg_start as *const c_void,
        )
    };
    if rc < 0 {
        len = 0;
    }
    ev.argv_len = len as u32;

    // Variable length: only the bytes of argv actually read go into the ring.
    // `size` ≤ size_of::<ExecEvent>() as proven by the bounds above.
    let size = EXEC_FIXED_LEN as u64 + (len & (ARGV_MAX as u64 * 2 - 1));
    send_prefix(reader, EventKind::Exec, ev, size, at_once);
    0
}
