//! A spawner's stack at fork, copied for user space to unwind (see `reaper_common::copy`):
//! a JIT host's at each fork, any other native spawner's once per site.
use core::ffi::c_void;

use aya_ebpf::helpers::{
    bpf_probe_read_kernel,
    generated::{bpf_get_current_task_btf, bpf_probe_read_user, bpf_task_pt_regs},
};
use reaper_common::{
    copy::{COPY_CHUNK, COPY_CHUNKS, COPY_MAX, CopiedSite, SCAN_BYTES, StackCopy, UserRegs},
    python::{HASH_SEED, hash_word},
};

use crate::{
    arch::{REGS_FROM, REGS_WORDS, USER_ADDRESS_MASK, user_regs_in},
    maps::{COPIED_SITES, JIT_HOSTS},
    task::Task,
};

/// Whether process `tgid` (started at `start`) is a JIT host whose stacks are copied.
#[inline(always)]
pub fn jit_host(tgid: u32, start: u64) -> bool {
    // SAFETY: the value is read at once, not kept.
    match unsafe { JIT_HOSTS.get(tgid) } {
        // 0: found in /proc, before the kernel knew the process's start (its free removes
        // the entry all the same, so a reused tgid never inherits it).
        Some(&kept) => kept == 0 || kept == start,
        None => false,
    }
}

/// Reads the current thread's user registers, as the kernel saved them at syscall entry;
/// none when they cannot be read.
#[inline(always)]
pub fn user_regs() -> Option<UserRegs> {
    // SAFETY: plain helper calls; the task pointer is the verifier-checked current task.
    let regs = unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) } as *const u8;
    // SAFETY: a read of the user registers the kernel saved at syscall entry; it faults
    // safely.
    let span: [u64; REGS_WORDS] =
        unsafe { bpf_probe_read_kernel(regs.add(REGS_FROM) as *const [u64; REGS_WORDS]) }.ok()?;
    Some(user_regs_in(&span))
}

/// Words scanned for a site.
const SCAN_WORDS: usize = SCAN_BYTES / 8;
const _: () = assert!(SCAN_BYTES <= COPY_MAX);

/// A hash of the executable's code addresses in the first [`SCAN_BYTES`] above the stack
/// pointer (its callers' return addresses, mostly) and in the link register (aarch64's return
/// address of a function that has not stored it yet), each stripped of a pointer
/// authentication's signature, read into `scratch`; 0 when none could be read. Two callers of the same fork wrapper differ here where a frame-pointer walk that
/// stops in the wrapper sees them alike.
#[inline(always)]
pub fn site_salt(scratch: &mut [u8; COPY_MAX], regs: UserRegs) -> u64 {
    let (start, end) = Task::current().code_range();
    // SAFETY: the helper writes at most SCAN_BYTES ≤ COPY_MAX bytes; it faults safely.
    let rc = unsafe {
        bpf_probe_read_user(
            scratch.as_mut_ptr() as *mut c_void,
            SCAN_BYTES as u32,
            regs.sp as *const c_void,
        )
    };
    if rc != 0 || start >= end {
        return 0;
    }
    let words = scratch.as_ptr() as *const u64;
    let code_len = end - start;
    let mut hash = HASH_SEED;
    let lr = regs.lr & USER_ADDRESS_MASK;
    if lr.wrapping_sub(start) < code_len {
        hash = hash_word(hash, lr);
    }
    for i in 0..SCAN_WORDS {
        // SAFETY: within the scratch array (SCAN_WORDS words ≤ its length); unaligned-safe
        // as the array starts a map value.
        let word = unsafe { *words.add(i) } & USER_ADDRESS_MASK;
        // One unsigned compare for `start <= word < end`, and a branch around the hash (few
        // words are code): a short loop body, run SCAN_WORDS times on each such fork.
        if word.wrapping_sub(start) < code_len {
            hash = hash_word(hash, word);
        }
    }
    hash
}

/// Whether native stack `stack` (a site: see `reaper_common::copy`) of spawner `tgid`
/// (started at `start`) is copied now: the first time the spawner forks from there.
#[inline(always)]
pub fn first_at_site(stack: u64, tgid: u32, start: u64) -> bool {
    let site = CopiedSite {
        stack,
        start,
        tgid,
        _pad: 0,
    };
    // SAFETY: the value is not kept.
    if unsafe { COPIED_SITES.get(site) }.is_some() {
        return false;
    }
    // Two CPUs racing here both copy: user space unwinds the first it takes in (the second
    // finds that one under way or done).
    let _ = COPIED_SITES.insert(site, 1, 0);
    true
}

/// Copies the stack of the thread with registers `regs` from the stack pointer's page up, a
/// page at a time until a read fails (past the stack's top). Returns the bytes copied.
#[inline(always)]
pub fn copy_stack(copy: &mut StackCopy, regs: UserRegs) -> u64 {
    let base = regs.sp & !(COPY_CHUNK as u64 - 1);
    copy.regs = regs;
    copy.exe = Task::current().exe_code();
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
