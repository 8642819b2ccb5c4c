//! `sched_process_fork`: a tracked process made a new process.
use aya_ebpf::{
    bindings::BPF_ANY,
    helpers::{bpf_get_current_pid_tgid, bpf_get_current_uid_gid},
    macros::btf_tracepoint,
    programs::BtfTracePointContext,
};
use reaper_common::{
    EventKind, FORK_PY_STACK_FIRST, FORK_UNTRACKED, ForkEvent, LossSlot, SPAWN_STACKS_COPY,
    SPAWN_STACKS_NATIVE, SPAWN_STACKS_PYTHON, Tracked,
    copy::{FORK_COPY_FIXED_LEN, FORK_STACK_COPIED},
};

use super::gateway;
use crate::{
    copy,
    emit::{header, recording, send, send_prefix},
    global,
    maps::{FORK_SCRATCH, TRACKED, count_loss, tracked_current},
    native, python,
    task::Task,
};

#[btf_tracepoint(function = "sched_process_fork")]
pub fn sched_process_fork(ctx: BtfTracePointContext) -> u32 {
    // Runs in the context of the thread that called fork/clone/vfork, before the child is
    // first woken: whatever is inserted here is in place before the child runs.
    let child = Task(ctx.arg::<*const u8>(1));
    // A new thread is not a new process; a stale entry whose pid now names another process
    // is not the spawner.
    let spawner_start = || (child.pid() == child.tgid()).then(|| Task::current().process_start());
    let Some((spawner, spawner_start)) = tracked_current(spawner_start) else {
        if global!(CONFIG.gateway_cgroups) != 0 {
            gateway::fork_into_cgroup(child);
        }
        return 0;
    };
    let pid = child.pid();
    let start = child.start_boottime();
    let flags = match TRACKED.insert(pid, Tracked { start }, BPF_ANY as u64) {
        Ok(()) => 0,
        Err(_) => FORK_UNTRACKED,
    };
    // A forked copy of an interpreter runs it at the same addresses until it execs: a
    // prefork worker's or a double fork's spawns are read as its parent's are.
    let capture = global!(CONFIG.spawn_stacks);
    if capture & SPAWN_STACKS_PYTHON != 0 && flags == 0 {
        python::inherit(spawner, pid, start);
    }
    let fill = |ev: &mut ForkEvent| {
        ev.header = header(EventKind::Fork, pid, start);
        ev.spawner = spawner;
        ev.ppid = child.real_parent_tgid();
        ev.sid = child.sid();
        ev.pgid = child.pgid();
        // The child's credentials are a copy of the caller's (copy_creds), so the helper's
        // answer is exact and saves two kernel reads on the hot path.
        ev.uid = bpf_get_current_uid_gid() as u32;
        ev.flags = flags;
        // This runs in the calling thread: the low half is its thread id.
        ev.spawner_tid = bpf_get_current_pid_tgid() as u32;
        ev._pad = 0;
        ev.stack = 0;
        ev.py_stack = 0;
        ev.cgroup_id = child.cgroup_id();
        ev.comm = child.comm();
    };
    match capture {
        0 => send::<ForkEvent>(EventKind::Fork, fill),
        // Frame pointers alone: built in place in the ring, as without stacks.
        SPAWN_STACKS_NATIVE => send::<ForkEvent>(EventKind::Fork, |ev| {
            fill(ev);
            ev.stack = native::stack(&ctx, 0);
        }),
        _ => send_with_stacks(&ctx, capture, (spawner, spawner_start), fill),
    }
    // Counted after the record is submitted: a reader that sees the count and then drains
    // the ring is sure to find the record that names the child.
    if flags & FORK_UNTRACKED != 0 {
        count_loss(LossSlot::TRACKED_FULL);
    }
    0
}

/// Sends the fork record `fill` writes with the spawner's own code, still on its stack: this
/// runs in the forking thread, inside the fork syscall. Taken here, only for a record that
/// goes to the ring (not while another generation records, nor past --state-keep).
/// - its Python frames, when user space found its interpreter;
/// - a JIT host's stack, copied at each fork for user space to unwind (its frame-pointer walk
///   ends in the C library's fork, so none is taken);
/// - any other spawner's stack by frame pointers, keyed by its site, and copied the first
///   time it forks from that site when its Python frames are not read (see
///   `reaper_common::copy`).
#[inline(always)]
fn send_with_stacks(
    ctx: &BtfTracePointContext,
    capture: u64,
    (spawner, spawner_start): (u32, u64),
    fill: impl FnOnce(&mut ForkEvent),
) {
    let Some(reader) = recording(EventKind::Fork) else {
        return;
    };
    let Some(record) = FORK_SCRATCH.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: a per-CPU map value, ours alone while this program runs.
    let record = unsafe { &mut *record };
    fill(&mut record.fork);
    // A Python stack first seen is named from the spawner's memory, which may be gone
    // milliseconds after its fork: its record wakes the reader at once, whatever the batch
    // (once per stack in the store, and at most once per poll interval: a Python forking
    // from ever-new stacks is batched beyond that, see `emit::at_once_due`). A native copy
    // does not: it is taken at each spawner's first fork from each site (a storm of new
    // processes forking once would wake the reader for each), and is unwound in the mappings
    // of a process up the lineage once it is gone. The mark is kept in the record (map
    // memory), not a register: the verifier then checks the rest of the program once, not
    // once for each value.
    if capture & SPAWN_STACKS_PYTHON != 0 {
        let read = python::stack(spawner, spawner_start);
        record.fork.py_stack = read.key;
        if read.first {
            record.fork.flags |= FORK_PY_STACK_FIRST;
        }
    }
    let copies = capture & SPAWN_STACKS_COPY != 0;
    let jit = copies && copy::jit_host(spawner, spawner_start);
    let native_copy = copies && !jit && record.fork.py_stack == 0;
    // The registers only where a copy may follow: a Python spawner's fork reads none.
    let regs = if jit || native_copy {
        copy::user_regs()
    } else {
        None
    };
    if capture & SPAWN_STACKS_NATIVE != 0 && !jit {
        let salt = match (native_copy, regs) {
            (true, Some(regs)) => copy::site_salt(&mut record.copy.bytes, regs),
            _ => 0,
        };
        record.fork.stack = native::stack(ctx, salt);
    }
    let copied = match regs {
        Some(regs)
            if jit
                || (native_copy
                    && record.fork.stack != 0
                    && copy::first_at_site(record.fork.stack, spawner, spawner_start)) =>
        {
            Some(copy::copy_stack(&mut record.copy, regs))
        }
        _ => None,
    };
    match copied {
        Some(len) => {
            record.fork.flags |= FORK_STACK_COPIED;
            // `len` is one of five constants on every path, so the verifier sees the bound.
            let size = FORK_COPY_FIXED_LEN as u64 + len;
            let at_once = record.fork.flags & FORK_PY_STACK_FIRST != 0;
            send_prefix(reader, EventKind::Fork, record, size, at_once);
        }
        None => {
            let size = core::mem::size_of::<ForkEvent>() as u64;
            let at_once = record.fork.flags & FORK_PY_STACK_FIRST != 0;
            send_prefix(reader, EventKind::Fork, &record.fork, size, at_once);
        }
    }
}
