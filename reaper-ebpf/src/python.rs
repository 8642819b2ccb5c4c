//! A Python spawner's own frames, read at fork from its interpreter's memory (see
//! `reaper_common::python`). Every read is a user-memory read that may fail (a page not
//! present, a torn list): a failure ends the walk with what was read so far.
use aya_ebpf::{
    bindings::{BPF_NOEXIST, bpf_pidns_info},
    helpers::{
        bpf_get_current_pid_tgid, bpf_probe_read_user, generated::bpf_get_ns_current_pid_tgid,
    },
};
use reaper_common::python::{
    HASH_SEED, PY_FRAMES_MAX, PY_INTERPRETERS_MAX, PY_NO_CFRAME, PY_THREADS_MAX, PY_WALK_MAX,
    PyFrame, PyLayout, hash_word,
};

use crate::maps::{PY_SCRATCH, PY_STACKS, PYTHONS};

/// Reads a word at `base + off` in the current process.
#[inline(always)]
fn word(base: u64, off: u16) -> u64 {
    if base == 0 {
        return 0;
    }
    // SAFETY: the helper faults safely; a failed read yields 0, which ends every walk.
    unsafe { bpf_probe_read_user((base + off as u64) as *const u64) }.unwrap_or(0)
}

fn byte(base: u64, off: u16) -> u8 {
    // SAFETY: as in `word`.
    unsafe { bpf_probe_read_user((base + off as u64) as *const u8) }.unwrap_or(u8::MAX)
}

/// The forking thread's id as the interpreter knows it: in the process's own pid namespace.
#[inline(always)]
fn native_thread_id(layout: &PyLayout) -> u64 {
    if layout.pidns_ino == 0 {
        return bpf_get_current_pid_tgid() & 0xffff_ffff;
    }
    let mut ns = bpf_pidns_info { pid: 0, tgid: 0 };
    // SAFETY: plain helper call into a stack buffer of the size given.
    let rc = unsafe {
        bpf_get_ns_current_pid_tgid(
            layout.pidns_dev,
            layout.pidns_ino,
            &mut ns,
            size_of::<bpf_pidns_info>() as u32,
        )
    };
    if rc != 0 { 0 } else { ns.pid as u64 }
}

/// The forking thread's state: looked up by its native thread id in each interpreter's list.
#[inline(always)]
fn thread_state(layout: &PyLayout) -> u64 {
    let tid = native_thread_id(layout);
    if tid == 0 {
        return 0;
    }
    let mut interp = word(layout.runtime, layout.interpreters_head);
    for _ in 0..PY_INTERPRETERS_MAX {
        if interp == 0 {
            return 0;
        }
        let mut thread = word(interp, layout.interp_threads_head);
        for _ in 0..PY_THREADS_MAX {
            if thread == 0 {
                break;
            }
            // `native_thread_id` is an unsigned long holding a pid_t.
            if word(thread, layout.thread_native_id) & 0xffff_ffff == tid {
                return thread;
            }
            thread = word(thread, layout.thread_next);
        }
        interp = word(interp, layout.interp_next);
    }
    0
}

/// Reads the current process's Python frames into the stack store, returning the stack's key
/// (0: not a known interpreter, or its state not found).
#[inline(always)]
pub fn stack(tgid: u32, start: u64) -> u64 {
    let Some(layout) = (unsafe { PYTHONS.get(tgid) }) else {
        return 0;
    };
    // 0: found in /proc, before the kernel knew the process's start (its free removes the
    // entry all the same, so a reused tgid never inherits it).
    if layout.start != 0 && layout.start != start {
        return 0;
    }
    let thread = thread_state(layout);
    let mut frame = word(thread, layout.thread_frame);
    if layout.cframe_frame != PY_NO_CFRAME {
        frame = word(frame, layout.cframe_frame);
    }
    let Some(scratch) = PY_SCRATCH.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: a per-CPU map value, ours alone while this program runs.
    let stack = unsafe { &mut *scratch };
    // The count and the hash live in the map value, not in registers: the verifier does not
    // follow values in memory, so a Python frame and a skipped one leave the same state and
    // the walk is verified once per step, not once per count of frames kept so far.
    stack.len = 0;
    stack.truncated = 0;
    stack.hash = HASH_SEED;
    for _ in 0..PY_WALK_MAX {
        if frame == 0 {
            break;
        }
        if byte(frame, layout.frame_owner) < layout.owner_not_python {
            let len = stack.len as usize;
            if len >= PY_FRAMES_MAX {
                stack.truncated = 1;
                break;
            }
            let code = word(frame, layout.frame_code) & !(layout.code_tag_mask as u64);
            let instr = word(frame, layout.frame_instr);
            stack.frames[len & (PY_FRAMES_MAX - 1)] = PyFrame { code, instr };
            stack.hash = hash_word(hash_word(stack.hash, code), instr);
            stack.len += 1;
        }
        frame = word(frame, layout.frame_previous);
    }
    if stack.len == 0 {
        return 0;
    }
    let key = stack.hash | 1;
    // A stack already kept under this key is the same stack: keep the first copy. A full
    // store keeps no more (the record then names none).
    match PY_STACKS.insert(key, stack, BPF_NOEXIST as u64) {
        Ok(()) => key,
        Err(-17) => key, // EEXIST
        Err(_) => 0,
    }
}
