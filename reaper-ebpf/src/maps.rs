//! Maps and load-time globals shared by the probes. Each static is named as in
//! `reaper_common::names`, which is how the loader finds it.
use core::intrinsics::{AtomicOrdering, atomic_xadd};

use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid,
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf},
};
use reaper_common::{
    ExeKey, ExecEvent, KernelOffsets, LossSlot, PathKey, ProbeConfig, ReaderMark, Tracked,
    copy::{CopiedSite, ForkCopyEvent},
    native::NativeStack,
    python::{PyLayout, PyStack},
};

/// Processes under the gateways, keyed by tgid. Seeded by user space, extended here at fork
/// (before the child can run), removed here when the process is freed.
/// User space sets the real capacity at load (`--max-tracked`).
#[map]
pub static TRACKED: HashMap<u32, Tracked> = HashMap::with_max_entries(1, 0);

/// The one event stream. User space sets the real size at load (`--ring-size`).
#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(4096, 0);

/// Next sequence number (index 0).
#[map]
pub static SEQ: Array<u64> = Array::with_max_entries(1, 0);

/// Set to 1 by the reader when it goes to sleep waiting for a wake-up (index 0); the first
/// record after that wakes it and clears the flag.
#[map]
pub static READER_IDLE: Array<u64> = Array::with_max_entries(1, 0);

/// When a record sent at once last woke the reader (index 0, boot-time ns): such wake-ups
/// are limited to one per `ProbeConfig::wakeup_interval`.
#[map]
pub static AT_ONCE_WOKEN: Array<u64> = Array::with_max_entries(1, 0);

/// What the reader tells the probes (index 0): which generation of programs records, and
/// until when a reader is taken to drain the ring.
#[map]
pub static READER: Array<ReaderMark> = Array::with_max_entries(1, 0);

/// Tracked spawners' user stacks at fork (see `native`), each distinct stack kept once (by a
/// hash of its frames). Allocated as used; user space sets the capacity at load
/// (`--spawn-stacks`).
#[map]
pub static STACKS: HashMap<u64, NativeStack> =
    HashMap::with_max_entries(1, aya_ebpf::bindings::BPF_F_NO_PREALLOC);

/// Scratch space for a native stack being taken, too large for the 512-byte stack.
#[map]
pub static STACK_SCRATCH: PerCpuArray<NativeStack> = PerCpuArray::with_max_entries(1, 0);

/// Tracked Python interpreters, by tgid: where each keeps its frames. Written by user space
/// once per exec of an interpreter; removed here at the process's next exec and at its free.
#[map]
pub static PYTHONS: HashMap<u32, PyLayout> = HashMap::with_max_entries(4096, 0);

/// Interpreter executables user space has read this run, by inode → their layout, with
/// `runtime` as the offset of `_PyRuntime` from the start of the executable's text: an exec
/// of one is given its layout in `PYTHONS` here, before it can fork (see `python::at_exec`).
#[map]
pub static PY_BINARIES: HashMap<ExeKey, PyLayout> = HashMap::with_max_entries(64, 0);

/// Tracked Python spawners' frames at fork, each distinct stack kept once (by a hash of its
/// frames). Allocated as used; user space sets the capacity at load (`--spawn-stacks`).
#[map]
pub static PY_STACKS: HashMap<u64, PyStack> =
    HashMap::with_max_entries(1, aya_ebpf::bindings::BPF_F_NO_PREALLOC);

/// Tracked processes whose stacks are copied at their forks (see `reaper_common::copy`), by
/// tgid → start_boottime (0: found in /proc). Written by user space once per exec of a JIT
/// host; removed here at the process's next exec and at its free.
#[map]
pub static JIT_HOSTS: HashMap<u32, u64> = HashMap::with_max_entries(4096, 0);

/// The sites each spawner's stack was copied at once (see `reaper_common::copy`): later forks
/// from there send no copy. Least recently used entries make room.
#[map]
pub static COPIED_SITES: LruHashMap<CopiedSite, u8> = LruHashMap::with_max_entries(8192, 0);

/// Scratch space for a fork record with a stack copy, too large for the 512-byte stack.
#[map]
pub static FORK_SCRATCH: PerCpuArray<ForkCopyEvent> = PerCpuArray::with_max_entries(1, 0);

/// Scratch space for a Python stack being read, too large for the 512-byte stack.
#[map]
pub static PY_SCRATCH: PerCpuArray<PyStack> = PerCpuArray::with_max_entries(1, 0);

/// Where a Python stack's read is (see `python::stack`): kept in memory, not registers.
#[map]
pub static PY_WALK: PerCpuArray<crate::python::PyWalk> = PerCpuArray::with_max_entries(1, 0);

/// Records that could not be reserved, per event kind, plus tracked-map insert failures.
#[map]
pub static LOSSES: PerCpuArray<u64> = PerCpuArray::with_max_entries(LossSlot::COUNT, 0);

/// Scratch space for exec records, too large for the 512-byte stack.
#[map]
pub static EXEC_SCRATCH: PerCpuArray<ExecEvent> = PerCpuArray::with_max_entries(1, 0);

/// Scratch space for a path read as a map key (zeroed, then filled).
#[map]
pub static PATH_SCRATCH: PerCpuArray<PathKey> = PerCpuArray::with_max_entries(1, 0);

/// `--gateway-exe` executables, by inode → the selector's index.
#[map]
pub static GATEWAY_EXES: HashMap<ExeKey, u32> = HashMap::with_max_entries(64, 0);

/// `--gateway-exe` scripts, by the path they are executed by → the selector's index.
#[map]
pub static GATEWAY_PATHS: HashMap<PathKey, u32> = HashMap::with_max_entries(128, 0);

/// Selected cgroups, by id → the selector's index. Kept here as cgroups come and go: a cgroup
/// made under a selected one, or at a selected path, is selected from its mkdir.
#[map]
pub static GATEWAY_CGROUPS: HashMap<u64, u32> = HashMap::with_max_entries(4096, 0);

/// `--gateway-cgroup` / `--gateway-unit` paths (from the cgroup2 root, as the kernel names
/// them: `/system.slice/x.service`) → the selector's index, for cgroups made again.
#[map]
pub static GATEWAY_CGROUP_PATHS: HashMap<PathKey, u32> = HashMap::with_max_entries(64, 0);

/// Kernel struct offsets from the running kernel's BTF (set by user space at load).
#[unsafe(no_mangle)]
pub static OFFSETS: KernelOffsets = KernelOffsets {
    task_pid: 0,
    task_tgid: 0,
    task_real_parent: 0,
    task_group_leader: 0,
    task_start_boottime: 0,
    task_comm: 0,
    task_signal: 0,
    task_mm: 0,
    task_exit_code: 0,
    task_cgroups: 0,
    css_set_dfl_cgrp: 0,
    cgroup_kn: 0,
    kernfs_node_id: 0,
    signal_live: 0,
    signal_pids_sid: 0,
    signal_pids_pgid: 0,
    pid_numbers_nr: 0,
    task_thread_pid: 0,
    pid_level: 0,
    mm_arg_start: 0,
    mm_arg_end: 0,
    bprm_filename: 0,
    bprm_file: 0,
    file_inode: 0,
    inode_ino: 0,
    inode_sb: 0,
    super_block_dev: 0,
    file_dentry: 0,
    dentry_name: 0,
    mm_start_code: 0,
    mm_end_code: 0,
    mm_exe_file: 0,
    kernfs_node_parent: 0,
    cgroup_root: 0,
    cgroup_root_hierarchy_id: 0,
    pt_regs_syscall_nr: 0,
};

/// Run-time settings (set by user space at load).
#[unsafe(no_mangle)]
pub static CONFIG: ProbeConfig = ProbeConfig {
    wakeup_interval: 0,
    wakeup_bytes: 0,
    setsid_ret_offset: 0,
    setsid_nr: 0,
    gateway_exes: 0,
    gateway_paths: 0,
    gateway_cgroups: 0,
    generation: 0,
    spawn_stacks: 0,
};

/// Reads one field of a load-time global. Volatile, so the compiler cannot fold the
/// placeholder value; the verifier then sees the frozen .rodata value as a constant.
#[macro_export]
macro_rules! global {
    ($static:ident . $field:ident) => {
        unsafe { core::ptr::read_volatile(core::ptr::addr_of!($crate::maps::$static.$field)) }
    };
}

/// Whether a tracked-map entry names the process that started at `start`.
///
/// An entry can outlive its process for an RCU grace period (it is removed at
/// `sched_process_free`, after the pid was already released), so a reused pid must not
/// inherit it. Entries seeded from /proc carry `start == 0` until the kernel learns it here,
/// at the process's first event (while its pid is still held, so it cannot be another's).
#[inline(always)]
pub fn same_process(entry: *mut Tracked, start: u64) -> bool {
    // SAFETY: `entry` is a valid value pointer from a TRACKED lookup.
    let known = unsafe { (*entry).start };
    if known == 0 {
        unsafe { (*entry).start = start };
        return true;
    }
    known == start
}

/// The opening of every probe about the current process: its tgid and start time, if it is
/// tracked and its entry is this very process (see [`same_process`]). The untracked path is
/// one map lookup; `start` is read only for a tracked pid, and returns `None` to skip the
/// event (a thread's exit, say) before the entry is touched.
#[inline(always)]
pub fn tracked_current(start: impl FnOnce() -> Option<u64>) -> Option<(u32, u64)> {
    let pid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let entry = TRACKED.get_ptr_mut(pid)?;
    let start = start()?;
    same_process(entry, start).then_some((pid, start))
}

/// Counts one loss in `slot` on this CPU.
#[inline(always)]
pub fn count_loss(slot: u32) {
    if let Some(counter) = LOSSES.get_ptr_mut(slot) {
        // SAFETY: a valid, 8-byte aligned map value. Added atomically though it is this
        // CPU's: raw and BTF tracepoint programs have no CPU-wide guard against nesting, and
        // the free probe runs from an RCU callback, usually in a softirq, which can interrupt
        // any other probe on this CPU between a plain add's load and its store.
        unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(counter, 1) };
    }
}
