//! A JIT host's stack at fork, copied for user space to unwind (see `reaper_common::copy`).
use core::ffi::c_void;

use aya_ebpf::{
    bindings::pt_regs,
    helpers::{
        bpf_probe_read_kernel,
        generated::{bpf_get_current_task_btf, bpf_probe_read_user, bpf_task_pt_regs},
    },
};
use reaper_common::{
    EventKind, ForkEvent,
    copy::{COPY_CHUNK, COPY_CHUNKS, FORK_COPY_FIXED_LEN, FORK_STACK_COPIED, StackCopy},
};

use crate::{
    emit::{recording, send_prefix},
    maps::{FORK_SCRATCH, JIT_HOSTS},
};

/// Whether process `tgid` (started at `start`) is a JIT host whose stacks are copied.
#[inline(always)]
pub fn wanted(tgid: u32, start: u64) -> bool {
    // SAFETY: the value is read at once, not kept.
    match unsafe { JIT_HOSTS.get(tgid) } {
        // 0: found in /proc, before the kernel knew the process's start (its free removes
        // the entry all the same, so a reused tgid never inherits it).
        Some(&kept) => kept == 0 || kept == start,
        None => false,
    }
}

/// Sends the fork record `fill` writes, with the forking thread's stack after it.
#[inline(always)]
pub fn send_fork(fill: impl FnOnce(&mut ForkEvent)) {
    let Some(reader) = recording(EventKind::Fork) else {
        return;
    };
    let Some(record) = FORK_SCRATCH.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: a per-CPU map value, ours alone while this program runs.
    let record = unsafe { &mut *record };
    fill(&mut record.fork);
    record.fork.flags |= FORK_STACK_COPIED;
    let len = copy_stack(&mut record.copy);
    // `len` is one of five constants on every path, so the verifier sees the bound.
    send_prefix(
        reader,
        EventKind::Fork,
        record,
        FORK_COPY_FIXED_LEN as u64 + len,
    );
}

/// Copies the current thread's user registers and its stack from the stack pointer's page up,
/// a page at a time until a read fails (past the stack's top). Returns the bytes copied.
#[inline(always)]
fn copy_stack(copy: &mut StackCopy) -> u64 {
    // SAFETY: plain helper calls; the task pointer is the verifier-checked current task.
    let regs = unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) } as *const pt_regs;
    // SAFETY: reads of the user registers the kernel saved at syscall entry; they fault
    // safely.
    let read = |field: *const u64| unsafe { bpf_probe_read_kernel(field) };
    // SAFETY: field addresses only, not dereferenced here.
    let fields = unsafe {
        (
            &raw const (*regs).rip,
            &raw const (*regs).rsp,
            &raw const (*regs).rbp,
        )
    };
    let (Ok(ip), Ok(sp), Ok(bp)) = (read(fields.0), read(fields.1), read(fields.2)) else {
        copy.len = 0;
        return 0;
    };
    let base = sp & !(COPY_CHUNK as u64 - 1);
    copy.ip = ip;
    copy.sp = sp;
    copy.bp = bp;
    copy.base = base;
    // Straight-line reads, each at a constant offset, and the length returned as a constant
    // on each path (not read back from the map value): the verifier sees the record's bound.
    const _: () = assert!(COPY_CHUNKS == 4);
    let len = if !chunk(copy, base, 0) {
        0
    } else if !chunk(copy, base, 1) {
        COPY_CHUNK
    } else if !chunk(copy, base, 2) {
        2 * COPY_CHUNK
    } else if !chunk(copy, base, 3) {
        3 * COPY_CHUNK
    } else {
        4 * COPY_CHUNK
    };
    copy.len = len as u64;
    len as u64
}

/// Reads chunk `i` (a page) of the stack from `base` up into its place in `copy`.
#[inline(always)]
fn chunk(copy: &mut StackCopy, base: u64, i: usize) -> bool {
    let at = i * COPY_CHUNK;
    // SAFETY: `at + COPY_CHUNK` ≤ the size of `bytes`; the helper faults safely.
    let rc = unsafe {
        bpf_probe_read_user(
            copy.bytes.as_mut_ptr().add(at) as *mut c_void,
            COPY_CHUNK as u32,
            (base + at as u64) as *const c_void,
        )
    };
    rc == 0
}
