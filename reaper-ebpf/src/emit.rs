//! Putting records into the ring buffer: sequence numbers, loss counting, batched wake-ups.
use core::intrinsics::{AtomicOrdering, atomic_xadd};

use core::ffi::c_void;

use aya_ebpf::{
    bindings::{BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    helpers::{bpf_ktime_get_boot_ns, generated::bpf_ringbuf_output},
};
use reaper_common::{EventHeader, EventKind, LAYOUT};

use crate::{
    global,
    maps::{AT_ONCE_WOKEN, EVENTS, READER, READER_IDLE, SEQ, count_loss},
};

/// Whether this load's records go to the ring, and if so whether a reader drains it (see
/// [`submit_flags`]): the reader names its generation, and a reader drains the ring (or did,
/// less than `--state-keep` ago). Another generation's programs (a run taking over, or the
/// one it takes over from) keep the tracked set exact and leave the records to the one that
/// records. Past `--state-keep` the record is counted lost (its sequence number taken), so
/// the next run reports the gap and repairs it.
///
/// [`send`] asks it; a record built in scratch space asks it before taking its header.
#[inline(always)]
pub fn recording(kind: EventKind) -> Option<Reader> {
    let mark = READER.get(0)?;
    if mark.generation != global!(CONFIG.generation) {
        return None;
    }
    // SAFETY: plain helper call.
    if mark.keep_until != u64::MAX && unsafe { bpf_ktime_get_boot_ns() } > mark.keep_until {
        let _ = next_seq();
        count_loss(kind.loss_slot());
        return None;
    }
    Some(Reader {
        draining: mark.draining != 0,
    })
}

/// Whether a reader is there to wake (see [`recording`]).
#[derive(Clone, Copy)]
pub struct Reader {
    draining: bool,
}

/// Takes the next global sequence number. Every record takes one, sent or not: in its header,
/// written into the reserved space ([`send`]) or into scratch space before the copy
/// ([`send_prefix`]), and for a reservation that failed, taken then (no header is written).
/// So every record lost leaves a gap in the stream that the loss counters explain.
#[inline(always)]
fn next_seq() -> u64 {
    match SEQ.get_ptr_mut(0) {
        // SAFETY: a valid, 8-byte aligned map value, shared by all CPUs, hence atomic. The BPF
        // target has no compare-and-swap, so core's AtomicU64 offers no fetch_add; the
        // intrinsic compiles to one BPF_ATOMIC | BPF_FETCH add.
        Some(p) => unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(p, 1) },
        None => 0,
    }
}

/// A header for an event about process `pid` (identity `start`), stamped now.
#[inline(always)]
pub fn header(kind: EventKind, pid: u32, start: u64) -> EventHeader {
    EventHeader {
        kind: kind as u8,
        layout: LAYOUT,
        generation: global!(CONFIG.generation) as u16,
        pid,
        seq: next_seq(),
        // SAFETY: plain helper call.
        ts: unsafe { bpf_ktime_get_boot_ns() },
        start,
    }
}

/// Chooses the submit flags. A wake-up costs the producer an irq_work and the reader a
/// context switch, per record if nothing batches them. So while events stream, the reader
/// polls the ring on its own every wake-up interval and no record wakes it; only the first
/// record after the reader said it went idle (or a ring filling up) wakes it, at once. With
/// no reader (a kept state between runs), nothing wakes anyone. A record sent `at_once`
/// wakes a draining reader whatever the batch, unless another did less than a poll interval
/// ago (see [`at_once_due`]).
#[inline(always)]
fn submit_flags(reader: Reader, at_once: bool) -> u64 {
    if !reader.draining {
        return BPF_RB_NO_WAKEUP as u64;
    }
    if at_once && at_once_due() {
        // This record wakes the reader: an idle flag is this record's to take, or the next
        // record would wake it again.
        let _ = take_idle();
        return BPF_RB_FORCE_WAKEUP as u64;
    }
    if global!(CONFIG.wakeup_interval) == 0 {
        return 0;
    }
    if take_idle() {
        return BPF_RB_FORCE_WAKEUP as u64;
    }
    if EVENTS.query(BPF_RB_AVAIL_DATA as u64) >= global!(CONFIG.wakeup_bytes) {
        BPF_RB_FORCE_WAKEUP as u64
    } else {
        BPF_RB_NO_WAKEUP as u64
    }
}

/// Whether a record sent at once may wake the reader now: the first since the last base poll
/// interval (`ProbeConfig::wakeup_interval`) began. Such a record (a Python stack seen first) is
/// one a traced process can make at will, by forking from ever-new stacks: unlimited, each
/// would cost the reader a wake-up. One that is not due is batched like any record: the
/// reader, woken less than an interval ago, finds it at its next poll (its poll interval
/// widens to 16 ms at most while records stream), or the idle flag wakes it. The limit is
/// shared: a traced process using it up delays another spawner's first stack to that poll.
/// A race between CPUs at worst lets two through.
#[inline(always)]
fn at_once_due() -> bool {
    let Some(last) = AT_ONCE_WOKEN.get_ptr_mut(0) else {
        return true;
    };
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_boot_ns() };
    let gap = global!(CONFIG.wakeup_interval);
    // SAFETY: a valid map value, shared by all CPUs; a plain load and store (see above).
    unsafe {
        if now.wrapping_sub(*last) < gap {
            return false;
        }
        *last = now;
    }
    true
}

/// Whether the reader said it goes idle; if so, the flag is cleared, since this record is
/// the one to wake it (or it gives it back, see [`give_back_idle`]). A race between CPUs at
/// worst wakes the reader twice.
#[inline(always)]
fn take_idle() -> bool {
    let Some(idle) = READER_IDLE.get_ptr_mut(0) else {
        return false;
    };
    // SAFETY: a valid map value, shared by all CPUs; a plain load and store, since two CPUs
    // that both see it set only wake the reader twice.
    unsafe {
        if *idle == 0 {
            return false;
        }
        *idle = 0;
    }
    true
}

/// Closes the race between the flag and the commit. [`submit_flags`] reads the flag before
/// the record is committed, and the reader sets it, then polls once more, then sleeps: a
/// reader that went idle in between looked at the ring before this record was there and
/// would sleep until its housekeeping poll (up to 100 ms). So a record committed without a
/// wake-up looks at the flag again. The commit is a full barrier (an `xchg` of the record's
/// header), and the reader fences between setting the flag and its last poll: either that poll
/// sees the record, or this look sees the flag. The ring has no wake-up without a record, so
/// the wake-up is an 8-byte record discarded with a forced wake-up (the reader skips it).
#[inline(always)]
fn after_commit(reader: Reader, flags: u64) {
    let nobody_woken = reader.draining && flags == BPF_RB_NO_WAKEUP as u64;
    if !nobody_woken || global!(CONFIG.wakeup_interval) == 0 || !take_idle() {
        return;
    }
    match EVENTS.reserve::<u64>(0) {
        Some(nudge) => nudge.discard(BPF_RB_FORCE_WAKEUP as u64),
        // A full ring: the flag goes back for the next record to find.
        None => give_back_idle(),
    }
}

/// Sets the reader's idle flag again, taken by a record that could not wake the reader.
#[inline(always)]
fn give_back_idle() {
    if let Some(idle) = READER_IDLE.get_ptr_mut(0) {
        // SAFETY: a valid map value (see `take_idle`).
        unsafe { *idle = 1 };
    }
}

/// Sends the first `size` bytes of a record built in scratch space: a variable-length record
/// (exec's argv), copied into the ring, once [`recording`] said so. Its header (and so its
/// sequence number) is already taken, so a failed copy leaves the gap the loss counter
/// explains.
///
/// `size` must be provably at most `size_of::<T>()` to the verifier at the call site.
#[inline(always)]
pub fn send_prefix<T>(reader: Reader, kind: EventKind, record: &T, size: u64, at_once: bool) {
    let flags = submit_flags(reader, at_once);
    // SAFETY: `record` is valid for `size` bytes (the caller's bound); the helper copies them.
    let rc = unsafe {
        bpf_ringbuf_output(
            core::ptr::addr_of!(EVENTS) as *mut c_void,
            record as *const T as *mut c_void,
            size,
            flags,
        )
    };
    if rc < 0 {
        count_loss(kind.loss_slot());
    } else {
        after_commit(reader, flags);
    }
}

/// Sends a fixed-size record built in place in the ring buffer.
#[inline(always)]
pub fn send<T: 'static>(kind: EventKind, fill: impl FnOnce(&mut T)) {
    let Some(reader) = recording(kind) else {
        return;
    };
    match EVENTS.reserve::<T>(0) {
        Some(mut entry) => {
            // SAFETY: `fill` writes every field the reader looks at.
            let record = unsafe { &mut *entry.as_mut_ptr() };
            fill(record);
            let flags = submit_flags(reader, false);
            entry.submit(flags);
            after_commit(reader, flags);
        }
        None => {
            // Consume a sequence number anyway so the gap shows in the stream.
            let _ = next_seq();
            count_loss(kind.loss_slot());
        }
    }
}
