//! A tracked spawner's native user stack at fork, with build ids (see
//! `reaper_common::native`), kept once per distinct stack.
use aya_ebpf::{
    EbpfContext,
    bindings::{BPF_F_USER_BUILD_ID, BPF_F_USER_STACK, BPF_NOEXIST},
    helpers::bpf_get_stack,
};
use reaper_common::{
    native::{NATIVE_FRAME_LEN, NATIVE_FRAMES_MAX},
    python::{HASH_SEED, hash_word},
};

use crate::maps::{STACK_SCRATCH, STACKS};

/// Words of a stack's frames, all hashed (the helper zeroes the frames past the last).
const WORDS: usize = NATIVE_FRAMES_MAX * NATIVE_FRAME_LEN / 8;

/// Takes the current thread's user stack by frame pointers, each frame as a build id and a
/// file offset where the kernel can read the object's build id, and keeps it in `STACKS`
/// under a hash of its frames and `salt` (what else tells its site: see `copy::site_salt`).
/// Returns its key, or 0 when none was taken or the store is full.
#[inline(always)]
pub fn stack<C: EbpfContext>(ctx: &C, salt: u64) -> u64 {
    let Some(scratch) = STACK_SCRATCH.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: a per-CPU map value, ours alone while this program runs.
    let stack = unsafe { &mut *scratch };
    let size = core::mem::size_of_val(&stack.frames) as u32;
    // SAFETY: the helper writes at most `size` bytes into the scratch value.
    let got = unsafe {
        bpf_get_stack(
            ctx.as_ptr(),
            stack.frames.as_mut_ptr().cast(),
            size,
            (BPF_F_USER_STACK | BPF_F_USER_BUILD_ID) as u64,
        )
    };
    if got <= 0 {
        return 0;
    }
    stack.len = got as u32 / NATIVE_FRAME_LEN as u32;
    let words = stack.frames.as_ptr() as *const u64;
    let mut hash = hash_word(HASH_SEED, salt);
    for i in 0..WORDS {
        // SAFETY: within the frames array (WORDS words long).
        hash = hash_word(hash, unsafe { *words.add(i) });
    }
    let key = hash | 1;
    // A stack already kept under this key is the same stack: keep the first copy. A full
    // store keeps no more (the record then names none).
    match STACKS.insert(key, stack, BPF_NOEXIST as u64) {
        Ok(()) => key,
        Err(-17) => key, // EEXIST
        Err(_) => 0,
    }
}
