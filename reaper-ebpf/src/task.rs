//! Reads of `task_struct` and friends through offsets resolved from BTF at start-up.
use reaper_common::{ExeKey, copy::ExeCode};

use crate::global;

/// A kernel `task_struct *`.
#[derive(Clone, Copy)]
pub struct Task(pub *const u8);

#[inline(always)]
pub fn read<T: Copy + Default>(base: *const u8, off: u64) -> T {
    // SAFETY: `base` is a BTF-typed kernel pointer and `off` a frozen constant, so the
    // verifier checks the access against the struct's BTF and turns it into a
    // fault-tolerant load (a bad address reads as zero), without a helper call.
    unsafe { core::ptr::read_volatile(base.wrapping_add(off as usize) as *const T) }
}

#[inline(always)]
fn read_ptr(base: *const u8, off: u64) -> *const u8 {
    read::<usize>(base, off) as *const u8
}

impl Task {
    pub fn current() -> Task {
        // SAFETY: plain helper call.
        Task(unsafe { aya_ebpf::helpers::generated::bpf_get_current_task_btf() } as *const u8)
    }
    pub fn pid(self) -> u32 {
        read::<i32>(self.0, global!(OFFSETS.task_pid)) as u32
    }
    pub fn tgid(self) -> u32 {
        read::<i32>(self.0, global!(OFFSETS.task_tgid)) as u32
    }
    pub fn start_boottime(self) -> u64 {
        read(self.0, global!(OFFSETS.task_start_boottime))
    }
    pub fn group_leader(self) -> Task {
        Task(read_ptr(self.0, global!(OFFSETS.task_group_leader)))
    }
    /// `start_boottime` of the thread-group leader: the process's identity with its tgid.
    pub fn process_start(self) -> u64 {
        self.group_leader().start_boottime()
    }
    pub fn real_parent_tgid(self) -> u32 {
        Task(read_ptr(self.0, global!(OFFSETS.task_real_parent))).tgid()
    }
    pub fn comm(self) -> [u8; reaper_common::COMM_LEN] {
        read(self.0, global!(OFFSETS.task_comm))
    }
    pub fn exit_code(self) -> u32 {
        read::<i32>(self.0, global!(OFFSETS.task_exit_code)) as u32
    }
    fn signal(self) -> *const u8 {
        read_ptr(self.0, global!(OFFSETS.task_signal))
    }
    /// True once every thread of the group has entered do_exit (`signal->live` reached 0).
    /// Read instead of the tracepoint's `group_dead` argument, which older kernels lack.
    pub fn group_dead(self) -> bool {
        read::<i32>(self.signal(), global!(OFFSETS.signal_live)) == 0
    }
    fn pid_nr(pid: *const u8) -> u32 {
        if pid.is_null() {
            return 0;
        }
        read::<i32>(pid, global!(OFFSETS.pid_numbers_nr)) as u32
    }
    pub fn sid(self) -> u32 {
        Self::pid_nr(read_ptr(self.signal(), global!(OFFSETS.signal_pids_sid)))
    }
    pub fn pgid(self) -> u32 {
        Self::pid_nr(read_ptr(self.signal(), global!(OFFSETS.signal_pids_pgid)))
    }
    /// The task's cgroup in the v2 hierarchy.
    pub fn cgroup(self) -> Cgroup {
        let css_set = read_ptr(self.0, global!(OFFSETS.task_cgroups));
        Cgroup(read_ptr(css_set, global!(OFFSETS.css_set_dfl_cgrp)))
    }
    pub fn cgroup_id(self) -> u64 {
        self.cgroup().id()
    }
    /// `(start_code, end_code)` of the task's mm: its executable's text (user addresses).
    pub fn code_range(self) -> (u64, u64) {
        let mm = read_ptr(self.0, global!(OFFSETS.task_mm));
        if mm.is_null() {
            return (0, 0);
        }
        (
            read(mm, global!(OFFSETS.mm_start_code)),
            read(mm, global!(OFFSETS.mm_end_code)),
        )
    }
    /// Where the task's executable is: its file and its code's addresses.
    pub fn exe_code(self) -> ExeCode {
        let mm = read_ptr(self.0, global!(OFFSETS.task_mm));
        if mm.is_null() {
            return ExeCode::default();
        }
        let file = read_ptr(mm, global!(OFFSETS.mm_exe_file));
        let (start, end) = self.code_range();
        ExeCode {
            file: match file.is_null() {
                true => ExeKey::default(),
                false => file_key(file),
            },
            start,
            end,
        }
    }
    /// Whether the task's pid is in the initial pid namespace (its thread ids are the ones
    /// the probes see).
    pub fn in_initial_pid_namespace(self) -> bool {
        let pid = read_ptr(self.0, global!(OFFSETS.task_thread_pid));
        !pid.is_null() && read::<u32>(pid, global!(OFFSETS.pid_level)) == 0
    }
    /// `(arg_start, arg_end)` of the task's mm (user addresses).
    pub fn arg_range(self) -> (u64, u64) {
        let mm = read_ptr(self.0, global!(OFFSETS.task_mm));
        if mm.is_null() {
            return (0, 0);
        }
        (
            read(mm, global!(OFFSETS.mm_arg_start)),
            read(mm, global!(OFFSETS.mm_arg_end)),
        )
    }
}

/// A kernel `struct cgroup *`.
#[derive(Clone, Copy)]
pub struct Cgroup(pub *const u8);

impl Cgroup {
    /// Whether it is in the v2 (default) hierarchy, whose id is 0. Ids of cgroups in v1
    /// hierarchies (a hybrid host mounts both) are numbered apart and may equal a v2 one's.
    pub fn on_default_hierarchy(self) -> bool {
        let root = read_ptr(self.0, global!(OFFSETS.cgroup_root));
        read::<i32>(root, global!(OFFSETS.cgroup_root_hierarchy_id)) == 0
    }
    /// The cgroup id: its kernfs node's id, which is the inode number of its directory.
    pub fn id(self) -> u64 {
        let kn = read_ptr(self.0, global!(OFFSETS.cgroup_kn));
        read(kn, global!(OFFSETS.kernfs_node_id))
    }
    /// The id of the cgroup it was made in (0 for the root).
    pub fn parent_id(self) -> u64 {
        let kn = read_ptr(self.0, global!(OFFSETS.cgroup_kn));
        let parent = read_ptr(kn, global!(OFFSETS.kernfs_node_parent));
        if parent.is_null() {
            return 0;
        }
        read(parent, global!(OFFSETS.kernfs_node_id))
    }
}

/// A `struct file *`'s file by its inode.
#[inline(always)]
pub fn file_key(file: *const u8) -> ExeKey {
    let inode = read_ptr(file, global!(OFFSETS.file_inode));
    let sb = read_ptr(inode, global!(OFFSETS.inode_sb));
    ExeKey {
        dev: u64::from(read::<u32>(sb, global!(OFFSETS.super_block_dev))),
        ino: read::<u64>(inode, global!(OFFSETS.inode_ino)),
    }
}

/// Reads a pointer-sized field at `off` from `base` (used for tracepoint arguments' structs).
pub fn read_ptr_at(base: *const u8, off: u64) -> *const u8 {
    read_ptr(base, off)
}

/// Reads a u32 at `off` from `base` when `base` is an untyped address (a raw tracepoint's
/// argument): the verifier cannot check a direct load there, so this goes through the helper.
pub fn read_u32_at(base: *const u8, off: u64) -> u32 {
    // SAFETY: bpf_probe_read_kernel faults safely; a failed read yields 0.
    unsafe {
        aya_ebpf::helpers::bpf_probe_read_kernel(base.wrapping_add(off as usize) as *const u32)
    }
    .unwrap_or(0)
}
