//! Gateway selectors matched in the kernel, so a new gateway is tracked before it can fork:
//! a program executed (`--gateway-exe`), a process created in or moved into a selected cgroup
//! (`--gateway-cgroup`, `--gateway-unit`). User space fills the maps and numbers the
//! selectors; each match is reported as a `Gateway` record before anything else about it.
use core::ffi::c_void;

use aya_ebpf::{
    bindings::BPF_ANY, helpers::generated::bpf_probe_read_kernel_str, macros::btf_tracepoint,
    programs::BtfTracePointContext,
};
use reaper_common::{
    EventKind, ExeKey, GatewayEvent, LossSlot, MatchedAt, PATH_KEY_LEN, PathKey, Tracked,
};

use crate::{
    emit::{header, send},
    global,
    maps::{
        GATEWAY_CGROUP_PATHS, GATEWAY_CGROUPS, GATEWAY_EXES, GATEWAY_PATHS, PATH_SCRATCH, TRACKED,
        count_loss, same_process,
    },
    task::{Cgroup, Task, file_key, read_ptr_at},
};

/// The selector the program being executed matches, if any (`bprm`: the exec's
/// `linux_binprm`, whose `file` is the executable and `filename` the path it was run by).
#[inline(always)]
pub fn exec_selector(bprm: *const u8) -> Option<u32> {
    if global!(CONFIG.gateway_exes) != 0 {
        // SAFETY: a plain lookup; the value is copied out at once.
        if let Some(&selector) = unsafe { GATEWAY_EXES.get(exe_key(bprm)) } {
            return Some(selector);
        }
    }
    if global!(CONFIG.gateway_paths) != 0 {
        let filename = read_ptr_at(bprm, global!(OFFSETS.bprm_filename));
        let key = path_key(filename)?;
        // SAFETY: as above.
        return unsafe { GATEWAY_PATHS.get(key) }.copied();
    }
    None
}

/// The executable an exec runs (`bprm->file`: the interpreter of a `#!` script) by its inode.
#[inline(always)]
pub fn exe_key(bprm: *const u8) -> ExeKey {
    file_key(read_ptr_at(bprm, global!(OFFSETS.bprm_file)))
}

/// A kernel string as a map key: zero-filled past its end. `None` if it is unreadable or too
/// long to be a key (user space never selects such a path).
#[inline(always)]
fn path_key(s: *const u8) -> Option<&'static PathKey> {
    let buf = PATH_SCRATCH.get_ptr_mut(0)?;
    let words = buf as *mut u64;
    for i in 0..PATH_KEY_LEN / 8 {
        // SAFETY: within the per-CPU value, ours alone while this program runs.
        unsafe { words.add(i).write_volatile(0) };
    }
    // SAFETY: the helper bounds the copy by the buffer size and faults safely.
    let n = unsafe {
        bpf_probe_read_kernel_str(buf as *mut c_void, PATH_KEY_LEN as u32, s as *const c_void)
    };
    // `n` counts the NUL: a full buffer may be a cut path.
    if n <= 0 || n as usize >= PATH_KEY_LEN {
        return None;
    }
    // SAFETY: as above.
    Some(unsafe { &*buf })
}

/// Tracks `task`'s process as a gateway found by `selector` and reports it. Returns its
/// identity.
#[inline(always)]
pub fn announce(task: Task, selector: u32, at: MatchedAt) -> (u32, u64) {
    let leader = task.group_leader();
    let pid = task.tgid();
    let start = leader.start_boottime();
    if TRACKED
        .insert(pid, Tracked { start }, BPF_ANY as u64)
        .is_err()
    {
        count_loss(LossSlot::TRACKED_FULL);
    }
    send::<GatewayEvent>(EventKind::Gateway, |ev| {
        ev.header = header(EventKind::Gateway, pid, start);
        ev.selector = selector;
        ev.matched_at = at as u32;
        ev.ppid = leader.real_parent_tgid();
        ev.sid = leader.sid();
        ev.pgid = leader.pgid();
        ev._pad = 0;
        ev.cgroup_id = leader.cgroup_id();
        ev.comm = leader.comm();
    });
    (pid, start)
}

/// At an untracked process's fork: a child made straight into a selected cgroup
/// (`clone3(CLONE_INTO_CGROUP)`, how service managers start units) is a gateway.
#[inline(always)]
pub fn fork_into_cgroup(child: Task) {
    if child.pid() != child.tgid() {
        return; // a thread
    }
    let id = child.cgroup_id();
    // SAFETY: a plain lookup; the value is copied out at once.
    if let Some(&selector) = unsafe { GATEWAY_CGROUPS.get(id) } {
        announce(child, selector, MatchedAt::Fork);
    }
}

/// A process moved into a cgroup (a write to `cgroup.procs`: how container runtimes and older
/// service managers place a new process). Into a selected one, by an untracked process: a
/// gateway. A tracked one is a descendant already.
#[btf_tracepoint(function = "cgroup_attach_task")]
pub fn cgroup_attach_task(ctx: BtfTracePointContext) -> u32 {
    let cgroup = Cgroup(ctx.arg::<*const u8>(0));
    if !cgroup.on_default_hierarchy() {
        return 0;
    }
    // SAFETY: a plain lookup; the value is copied out at once.
    let Some(&selector) = (unsafe { GATEWAY_CGROUPS.get(cgroup.id()) }) else {
        return 0;
    };
    let task = Task(ctx.arg::<*const u8>(2));
    let pid = task.tgid();
    if let Some(entry) = TRACKED.get_ptr_mut(pid)
        && same_process(entry, task.process_start())
    {
        return 0;
    }
    announce(task, selector, MatchedAt::Attach);
    0
}

/// A new cgroup: selected when it is made inside a selected one, or at a selected path (a
/// restarted unit's cgroup is made again at the same path, with a new id).
#[btf_tracepoint(function = "cgroup_mkdir")]
pub fn cgroup_mkdir(ctx: BtfTracePointContext) -> u32 {
    let cgroup = Cgroup(ctx.arg::<*const u8>(0));
    if !cgroup.on_default_hierarchy() {
        return 0;
    }
    // SAFETY: plain lookups; the values are copied out at once.
    let selector = match unsafe { GATEWAY_CGROUPS.get(cgroup.parent_id()) } {
        Some(&s) => s,
        None => match path_key(ctx.arg::<*const u8>(1)) {
            Some(key) => match unsafe { GATEWAY_CGROUP_PATHS.get(key) } {
                Some(&s) => s,
                None => return 0,
            },
            None => return 0,
        },
    };
    let _ = GATEWAY_CGROUPS.insert(cgroup.id(), selector, BPF_ANY as u64);
    0
}

/// A removed cgroup leaves the selection (its id is never used again).
#[btf_tracepoint(function = "cgroup_rmdir")]
pub fn cgroup_rmdir(ctx: BtfTracePointContext) -> u32 {
    let cgroup = Cgroup(ctx.arg::<*const u8>(0));
    if cgroup.on_default_hierarchy() {
        let _ = GATEWAY_CGROUPS.remove(cgroup.id());
    }
    0
}
