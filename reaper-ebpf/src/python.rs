//! A Python spawner's own frames, read at fork from its interpreter's memory (see
//! `reaper_common::python`). Every read is a user-memory read that may fail (a page not
//! present, a torn list): a failure ends the walk with what was read so far.
use aya_ebpf::{
    bindings::{BPF_NOEXIST, bpf_pidns_info},
    helpers::{
        bpf_get_current_pid_tgid, bpf_probe_read_user, generated::bpf_get_ns_current_pid_tgid,
    },
};
use reaper_common::ExeKey;
use reaper_common::python::{
    HASH_SEED, PY_FRAMES_MAX, PY_INTERPRETERS_MAX, PY_NO_CFRAME, PY_STEPS_MAX, PyFrame, PyLayout,
    PyStack, hash_word,
};

use crate::maps::{PY_BINARIES, PY_SCRATCH, PY_STACKS, PY_WALK, PYTHONS};
use crate::task::Task;

/// Gives a forked child its parent's interpreter layout (the same memory, copied), if the
/// parent's is known: until the child execs (which drops it), its forks are read too.
#[inline(always)]
pub fn inherit(parent: u32, child: u32, start: u64) {
    let Some(layout) = (unsafe { PYTHONS.get(parent) }) else {
        return;
    };
    let copy = PyLayout { start, ..*layout };
    let _ = PYTHONS.insert(child, copy, 0);
}

/// Gives a process that just executed an interpreter this run has read before (the same
/// executable file) its layout now, before it can fork: the reader looks at an exec only
/// once it reads the record, and a program may fork first. The file's layout places
/// `_PyRuntime` from the start of the executable's text, which this exec just mapped. A
/// process in another pid namespace numbers its threads there: the reader's look sets it.
#[inline(always)]
pub fn at_exec(task: Task, exe: ExeKey, pid: u32, start: u64) {
    // SAFETY: a plain lookup; the value is copied out at once.
    let Some(binary) = (unsafe { PY_BINARIES.get(exe) }).copied() else {
        return;
    };
    let (start_code, _) = task.code_range();
    if start_code == 0 || !task.in_initial_pid_namespace() {
        return;
    }
    let layout = PyLayout {
        start,
        runtime: start_code.wrapping_add(binary.runtime),
        ..binary
    };
    let _ = PYTHONS.insert(pid, layout, 0);
}

/// Repeats a block 128 times ([`PY_STEPS_MAX`]).
macro_rules! steps_128 {
    ($step:block) => {
        steps_128!(@8 { steps_128!(@16 $step); })
    };
    (@8 $b:block) => {{
        $b; $b; $b; $b; $b; $b; $b; $b;
    }};
    (@16 $b:block) => {{
        $b; $b; $b; $b; $b; $b; $b; $b; $b; $b; $b; $b; $b; $b; $b; $b;
    }};
}
const _: () = assert!(PY_STEPS_MAX == 128);

/// Where a walk is (see [`stack`]): the next interpreter, the thread state being looked at,
/// the frame being walked (0 while searching), and the interpreters looked at so far.
#[repr(C)]
pub struct PyWalk {
    pub interp: u64,
    pub thread: u64,
    pub frame: u64,
    pub interps: u64,
}

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

/// A Python stack read at a fork: its key in the stack store (0: none read) and whether this
/// read put it there (no fork before had that stack).
pub struct ReadStack {
    pub key: u64,
    pub first: bool,
}

impl ReadStack {
    const NONE: ReadStack = ReadStack {
        key: 0,
        first: false,
    };
}

/// Reads the current process's Python frames into the stack store (none: not a known
/// interpreter, or the forking thread's state not found).
///
/// One flat loop of steps, each either a step of the search for the forking thread's state
/// (its interpreter's list, then the next interpreter's) or a step of the walk up its frames.
/// Everything that changes from step to step lives in per-CPU map memory, which the verifier
/// does not follow: every step then leaves it the same state, and it checks each once
/// (nested loops, or a count in a register, multiply the states past its limit on older
/// kernels).
#[inline(always)]
pub fn stack(tgid: u32, start: u64) -> ReadStack {
    let Some(layout) = (unsafe { PYTHONS.get(tgid) }) else {
        return ReadStack::NONE;
    };
    // 0: found in /proc, before the kernel knew the process's start (its free removes the
    // entry all the same, so a reused tgid never inherits it).
    if layout.start != 0 && layout.start != start {
        return ReadStack::NONE;
    }
    let tid = native_thread_id(layout);
    let (Some(scratch), Some(walk)) = (PY_SCRATCH.get_ptr_mut(0), PY_WALK.get_ptr_mut(0)) else {
        return ReadStack::NONE;
    };
    if tid == 0 {
        return ReadStack::NONE;
    }
    // SAFETY: per-CPU map values, ours alone while this program runs.
    let (stack, walk) = unsafe { (&mut *scratch, &mut *walk) };
    walk.interp = word(layout.runtime, layout.interpreters_head);
    walk.thread = 0;
    walk.frame = 0;
    walk.interps = 0;
    stack.len = 0;
    stack.truncated = 0;
    stack.hash = HASH_SEED;
    // Unrolled: an older verifier (6.1) refuses the loop LLVM lays out here (a fall-through
    // into its head), and straight-line steps cost it no more to check.
    'read: {
        steps_128!({
            if !step(layout, stack, walk, tid) {
                break 'read;
            }
        });
    }
    if stack.len == 0 {
        return ReadStack::NONE;
    }
    let key = stack.hash | 1;
    // A stack already kept under this key is the same stack: keep the first copy. A full
    // store keeps no more (the record then names none).
    match PY_STACKS.insert(key, stack, BPF_NOEXIST as u64) {
        Ok(()) => ReadStack { key, first: true },
        Err(-17) => ReadStack { key, first: false }, // EEXIST
        Err(_) => ReadStack::NONE,
    }
}

/// One step of a read: of the search while no frame is found, then of the walk. A function
/// of its own (a BPF-to-BPF call), so the 128 steps are 128 calls of one body.
#[inline(never)]
fn step(layout: &PyLayout, stack: &mut PyStack, walk: &mut PyWalk, tid: u64) -> bool {
    match walk.frame {
        0 => search_step(layout, walk, tid),
        _ => frame_step(layout, stack, walk),
    }
}

/// One step of the search for the forking thread's state: the next thread of the list, or
/// the next interpreter's list. Returns false once there is nothing left to look at.
#[inline(always)]
fn search_step(layout: &PyLayout, walk: &mut PyWalk, tid: u64) -> bool {
    if walk.thread == 0 {
        if walk.interp == 0 || walk.interps >= PY_INTERPRETERS_MAX as u64 {
            return false;
        }
        walk.thread = word(walk.interp, layout.interp_threads_head);
        walk.interp = word(walk.interp, layout.interp_next);
        walk.interps += 1;
        return true;
    }
    // `native_thread_id` is an unsigned long holding a pid_t.
    if word(walk.thread, layout.thread_native_id) & 0xffff_ffff != tid {
        walk.thread = word(walk.thread, layout.thread_next);
        return true;
    }
    let mut frame = word(walk.thread, layout.thread_frame);
    if layout.cframe_frame != PY_NO_CFRAME {
        frame = word(frame, layout.cframe_frame);
    }
    walk.frame = frame;
    frame != 0
}

/// One step up the frames: keeps the frame if it is Python code's. Returns false at the
/// outermost frame, or once [`PY_FRAMES_MAX`] are kept.
#[inline(always)]
fn frame_step(layout: &PyLayout, stack: &mut PyStack, walk: &mut PyWalk) -> bool {
    let frame = walk.frame;
    if byte(frame, layout.frame_owner) < layout.owner_not_python {
        let len = stack.len as usize;
        if len >= PY_FRAMES_MAX {
            stack.truncated = 1;
            return false;
        }
        let code = word(frame, layout.frame_code) & !(layout.code_tag_mask as u64);
        let instr = word(frame, layout.frame_instr);
        stack.frames[len & (PY_FRAMES_MAX - 1)] = PyFrame { code, instr };
        stack.hash = hash_word(hash_word(stack.hash, code), instr);
        stack.len += 1;
    }
    walk.frame = word(frame, layout.frame_previous);
    walk.frame != 0
}
