//! `sched_process_fork`: a tracked process made a new process.
use aya_ebpf::{
    bindings::BPF_ANY,
    helpers::{bpf_get_current_pid_tgid, bpf_get_current_uid_gid},
    macros::btf_tracepoint,
    programs::BtfTracePointContext,
};
use reaper_common::{
    EventKind, FORK_UNTRACKED, ForkEvent, LossSlot, SPAWN_STACKS_COPY, SPAWN_STACKS_NATIVE,
    SPAWN_STACKS_PYTHON, Tracked,
};

use super::gateway;
use crate::{
    copy,
    emit::{header, send},
    global,
    maps::{TRACKED, count_loss, tracked_current},
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
    // A JIT host's stack is copied instead, for user space to unwind: its frame-pointer walk
    // ends in the C library's fork, so it is not taken.
    let copying = capture & SPAWN_STACKS_COPY != 0 && copy::wanted(spawner, spawner_start);
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
        // The spawner's own code, still on its stack: this runs in the forking thread,
        // inside the fork syscall. Taken here, only for a record that goes to the ring (not
        // while another generation records, nor past --state-keep). Frame pointers only.
        ev.stack = match (capture & SPAWN_STACKS_NATIVE, copying) {
            (0, _) | (_, true) => 0,
            _ => native::stack(&ctx),
        };
        // A Python spawner's own frames, when user space found its interpreter.
        ev.py_stack = match capture & SPAWN_STACKS_PYTHON {
            0 => 0,
            _ => python::stack(spawner, spawner_start),
        };
        ev.cgroup_id = child.cgroup_id();
        ev.comm = child.comm();
    };
    if copying {
        copy::send_fork(fill);
    } else {
        send::<ForkEvent>(EventKind::Fork, fill);
    }
    // Counted after the record is submitted: a reader that sees the count and then drains
    // the ring is sure to find the record that names the child.
    if flags & FORK_UNTRACKED != 0 {
        count_loss(LossSlot::TRACKED_FULL);
    }
    0
}
