//! Records shared by reaper's kernel programs and its user-space daemon.
//!
//! Every type here is `#[repr(C)]` and defined once: the kernel side writes it into the ring
//! buffer, user space decodes it (see the `user` feature). Sizes and field orders are part of
//! the contract between the two halves of one build, not a public interface: the public
//! interface is the NDJSON stream produced by `reaper-user`.
#![no_std]

pub mod copy;
pub mod interpreter;
pub mod native;
pub mod python;

/// Names of the maps and load-time globals in the kernel object, as the loader asks for them.
/// An aya `#[map]` is named after its static, so the kernel side's statics carry exactly these
/// names; a unit test of the loader checks the built object holds every one.
pub mod names {
    pub const TRACKED: &str = "TRACKED";
    pub const EVENTS: &str = "EVENTS";
    pub const SEQ: &str = "SEQ";
    pub const READER_IDLE: &str = "READER_IDLE";
    pub const LOSSES: &str = "LOSSES";
    pub const EXEC_SCRATCH: &str = "EXEC_SCRATCH";
    pub const PATH_SCRATCH: &str = "PATH_SCRATCH";
    pub const GATEWAY_EXES: &str = "GATEWAY_EXES";
    pub const GATEWAY_PATHS: &str = "GATEWAY_PATHS";
    pub const GATEWAY_CGROUPS: &str = "GATEWAY_CGROUPS";
    pub const GATEWAY_CGROUP_PATHS: &str = "GATEWAY_CGROUP_PATHS";
    pub const READER: &str = "READER";
    pub const STACKS: &str = "STACKS";
    pub const PYTHONS: &str = "PYTHONS";
    pub const PY_STACKS: &str = "PY_STACKS";
    pub const PY_BINARIES: &str = "PY_BINARIES";
    pub const PY_SCRATCH: &str = "PY_SCRATCH";
    pub const PY_WALK: &str = "PY_WALK";
    pub const JIT_HOSTS: &str = "JIT_HOSTS";
    pub const FORK_SCRATCH: &str = "FORK_SCRATCH";
    pub const STACK_SCRATCH: &str = "STACK_SCRATCH";
    pub const COPIED_SITES: &str = "COPIED_SITES";
    pub const AT_ONCE_WOKEN: &str = "AT_ONCE_WOKEN";
    /// The maps each load has of its own: scratch space, the sites whose stacks were copied
    /// (the unwound frames live in the reader: a new run copies each site again), and when a
    /// record last woke the reader at once (a new run's reader is woken afresh).
    pub const SCRATCH: [&str; 8] = [
        EXEC_SCRATCH,
        PATH_SCRATCH,
        PY_SCRATCH,
        PY_WALK,
        FORK_SCRATCH,
        STACK_SCRATCH,
        COPIED_SITES,
        AT_ONCE_WOKEN,
    ];
    /// The maps that outlive a run under `--state-dir` (pinned): everything the probes keep
    /// between records. The scratch maps are each program's own.
    pub const PINNED: [&str; 15] = [
        TRACKED,
        EVENTS,
        SEQ,
        READER_IDLE,
        LOSSES,
        GATEWAY_EXES,
        GATEWAY_PATHS,
        GATEWAY_CGROUPS,
        GATEWAY_CGROUP_PATHS,
        READER,
        STACKS,
        PYTHONS,
        PY_STACKS,
        PY_BINARIES,
        JIT_HOSTS,
    ];
    pub const OFFSETS: &str = "OFFSETS";
    pub const CONFIG: &str = "CONFIG";
}

/// Length of `task_struct::comm`, NUL included.
pub const COMM_LEN: usize = 16;
/// Bytes of argv copied from the new mm at exec (the rest is cut and flagged `truncated`).
pub const ARGV_MAX: usize = 4096;
/// Bytes of the exec'd filename copied from `linux_binprm::filename`.
pub const FILENAME_MAX: usize = 256;
/// Bytes of a path used as a map key (an executed script's path, a cgroup's path): the path,
/// then zeros. Longer paths cannot be selected.
pub const PATH_KEY_LEN: usize = 256;
/// A path as a map key (see [`PATH_KEY_LEN`]).
pub type PathKey = [u8; PATH_KEY_LEN];

/// The table of record kinds: `Kind = discriminant, "name", its record;` makes
/// [`EventKind`], [`EventKind::ALL`] (the order of the loss counters, see [`LossSlot`]),
/// [`EventKind::from_u32`], [`EventKind::name`] and [`EventKind::min_len`]. A kind is one row
/// here, its record's struct below, its probe in the kernel programs; in user space, its
/// decoding (`capture/decode.rs`), what the graph does with it (`lineage/graph/events.rs`)
/// and its event both ways (`lineage/graph/change.rs`: the event a change writes, the record
/// a line read back stands for), a test there taking every kind of this table around.
macro_rules! kinds {
    ($($(#[$doc:meta])* $kind:ident = $n:literal, $name:literal, $min_len:expr;)*) => {
        /// What a record in the ring buffer describes. The discriminant is the first byte of
        /// every record, so user space can tell records apart before it knows their size.
        #[repr(u32)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum EventKind {
            $($(#[$doc])* $kind = $n,)*
        }

        impl EventKind {
            /// All kinds, in the order of their loss counters (see [`LossSlot`]).
            pub const ALL: [EventKind; [$($n),*].len()] = [$(EventKind::$kind),*];

            pub fn from_u32(v: u32) -> Option<EventKind> {
                match v {
                    $($n => Some(EventKind::$kind),)*
                    _ => None,
                }
            }

            pub const fn name(self) -> &'static str {
                match self {
                    $(EventKind::$kind => $name,)*
                }
            }

            /// The fewest bytes a record of this kind has: its struct, or the fixed part of
            /// a record sent with variable length.
            pub const fn min_len(self) -> usize {
                match self {
                    $(EventKind::$kind => $min_len,)*
                }
            }
        }
    };
}

kinds! {
    /// A tracked process created a new process ([`ForkEvent`]).
    Fork = 1, "fork", core::mem::size_of::<ForkEvent>();
    /// A tracked process executed a new program ([`ExecEvent`], argv cut to its length).
    Exec = 2, "exec", EXEC_FIXED_LEN;
    /// The last thread of a tracked process exited ([`ExitEvent`]).
    Exit = 3, "exit", core::mem::size_of::<ExitEvent>();
    /// A tracked process was released ([`FreeEvent`]).
    Free = 4, "free", core::mem::size_of::<FreeEvent>();
    /// A tracked process called setsid() ([`SetsidEvent`]).
    Setsid = 5, "setsid", core::mem::size_of::<SetsidEvent>();
    /// A process matched a gateway selector in the kernel ([`GatewayEvent`]).
    Gateway = 6, "gateway", core::mem::size_of::<GatewayEvent>();
}

impl EventKind {
    /// The slot of this kind in the per-CPU loss counters.
    pub const fn loss_slot(self) -> u32 {
        self as u32 - 1
    }
}

/// Slots of the per-CPU `LOSSES` array beyond one per [`EventKind`].
pub struct LossSlot;
impl LossSlot {
    /// A tracked process forked a child that could not be inserted into the full tracked map:
    /// the child's own descendants will not be followed in the kernel.
    pub const TRACKED_FULL: u32 = EventKind::ALL.len() as u32;
    /// Number of slots in `LOSSES`.
    pub const COUNT: u32 = Self::TRACKED_FULL + 1;
}

/// The version of the records' layout and of the maps the probes keep. Records carry it, and
/// a state kept across runs (`--state-dir`) names it: a build reads its own layout, and
/// refuses any other rather than misread it.
pub const LAYOUT: u8 = 7;

/// Header at the start of every record.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct EventHeader {
    /// An [`EventKind`] discriminant.
    pub kind: u8,
    /// [`LAYOUT`] of the programs that wrote it.
    pub layout: u8,
    /// The generation of the programs that wrote it (see [`ReaderMark::generation`]): while a
    /// new run's programs take over from the last run's, both see each event, and the reader
    /// keeps one record of it.
    pub generation: u16,
    /// Process id (thread-group id) the event is about.
    pub pid: u32,
    /// Global sequence number. Every record takes one, sent or not (a reservation or a copy
    /// that fails takes one too), so a lost record leaves a gap that the per-CPU loss
    /// counters account for.
    pub seq: u64,
    /// `bpf_ktime_get_boot_ns()` when the event happened.
    pub ts: u64,
    /// `task_struct::start_boottime` of the thread-group leader: with `pid`, the identity of the
    /// process across pid reuse.
    pub start: u64,
}

/// `fork` flag: the child could not be inserted into the tracked map (it is full).
pub const FORK_UNTRACKED: u32 = 1;

/// `fork` flag: this fork put the Python stack it names into the stack store (no fork before
/// had that stack), so its record woke the reader at once (see `send_with_stacks`).
pub const FORK_PY_STACK_FIRST: u32 = 4;

/// A tracked process created a new process (never a thread).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ForkEvent {
    pub header: EventHeader,
    /// Thread-group id of the process that called fork/clone/vfork.
    pub spawner: u32,
    /// Real parent's thread-group id right after the fork (differs with `CLONE_PARENT`).
    pub ppid: u32,
    pub sid: u32,
    pub pgid: u32,
    pub uid: u32,
    pub flags: u32,
    /// Thread id of the thread that called fork/clone/vfork (the spawner's main thread, or
    /// another of its threads: an event loop's, a worker's).
    pub spawner_tid: u32,
    pub _pad: u32,
    /// The spawning thread's user stack at the fork, as `STACKS`' key (a hash of its frames:
    /// see [`native`]); 0: none taken (capture off, the store full, or a JIT host's was copied
    /// instead: see [`copy`]).
    pub stack: u64,
    /// The spawning thread's Python frames at the fork, as `PY_STACKS`' key (a hash of the
    /// frames); 0: none read (not a Python spawner, capture of interpreter frames off, or
    /// the interpreter's state not found).
    pub py_stack: u64,
    pub cgroup_id: u64,
    /// The child's name, which is the spawning thread's until the child execs.
    pub comm: [u8; COMM_LEN],
}

/// `exec` flag: argv was longer than [`ARGV_MAX`] and was cut.
pub const EXEC_ARGV_TRUNCATED: u32 = 1;
/// `exec` flag: the filename was longer than [`FILENAME_MAX`] and was cut.
pub const EXEC_FILENAME_TRUNCATED: u32 = 2;

/// A tracked process executed a new program. Sent with variable length: only the first
/// `argv_len` bytes of `argv` are in the record.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ExecEvent {
    pub header: EventHeader,
    /// Thread id that called execve (differs from `pid` for exec from a non-leader thread).
    pub old_tid: u32,
    pub flags: u32,
    pub filename_len: u32,
    pub argv_len: u32,
    pub comm: [u8; COMM_LEN],
    /// The name of the file the new program runs from (its first [`COMM_LEN`] - 1 bytes,
    /// NUL-padded): the interpreter of a `#!` script, where `filename` names the script.
    pub program: [u8; COMM_LEN],
    pub filename: [u8; FILENAME_MAX],
    /// NUL-separated arguments as laid out in the new mm (`arg_start..arg_end`).
    pub argv: [u8; ARGV_MAX],
}

/// Offset of `argv` in [`ExecEvent`]: the fixed part of an exec record.
pub const EXEC_FIXED_LEN: usize = core::mem::offset_of!(ExecEvent, argv);

/// The last thread of a tracked process exited (the whole thread group is dead).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ExitEvent {
    pub header: EventHeader,
    /// `task_struct::exit_code`: a wait(2) status (exit code << 8, or the killing signal, with
    /// 0x80 when it dumped core).
    pub status: u32,
    pub _pad: u32,
}

/// A tracked process was released (reaped by its parent, or auto-reaped).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FreeEvent {
    pub header: EventHeader,
}

/// A tracked process called setsid() successfully.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SetsidEvent {
    pub header: EventHeader,
    pub sid: u32,
    pub _pad: u32,
}

/// Where the kernel found a process matching a gateway selector.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatchedAt {
    /// It executed a selected program (`GATEWAY_EXES`, `GATEWAY_PATHS`).
    Exec = 1,
    /// It was created in a selected cgroup by an untracked parent (`CLONE_INTO_CGROUP`).
    Fork = 2,
    /// It was moved into a selected cgroup.
    Attach = 3,
}

impl MatchedAt {
    pub fn from_u32(v: u32) -> Option<MatchedAt> {
        match v {
            1 => Some(MatchedAt::Exec),
            2 => Some(MatchedAt::Fork),
            3 => Some(MatchedAt::Attach),
            _ => None,
        }
    }
}

/// A process became a gateway: it matched a selector in the kernel and is tracked from this
/// moment (before it can fork). Sent before the event that made it match (an exec's record
/// follows).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct GatewayEvent {
    pub header: EventHeader,
    /// The selector's index, as user space numbered them in the maps' values.
    pub selector: u32,
    /// A [`MatchedAt`] discriminant.
    pub matched_at: u32,
    pub ppid: u32,
    pub sid: u32,
    pub pgid: u32,
    pub _pad: u32,
    pub cgroup_id: u64,
    pub comm: [u8; COMM_LEN],
}

/// Key of `GATEWAY_EXES`: an executable file by its inode, which names it whatever path,
/// symlink or hard link it is executed through.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ExeKey {
    /// `super_block::s_dev`, the kernel's encoding: `major << 20 | minor`.
    pub dev: u64,
    pub ino: u64,
}

/// Value of the in-kernel tracked-process map (keyed by tgid).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Tracked {
    /// `start_boottime` of the process, or 0 when user space seeded it from /proc (which only
    /// knows clock ticks); the kernel fills it in at the process's first fork.
    pub start: u64,
}

/// What the reader tells the probes, in the one-entry `READER` array. Written whole by user
/// space; read by the probes before each record.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ReaderMark {
    /// The generation of programs that records (see [`ProbeConfig::generation`]). A new run
    /// attaches its programs, then moves this to theirs, then detaches the last run's: no
    /// event goes unseen in between, and records of an event both saw are told apart by it.
    pub generation: u64,
    /// Boot-time ns after which no reader is taken to be draining the ring (`--state-keep`):
    /// the probes then stop recording, count what they skip as lost, and only keep the
    /// tracked set exact. `u64::MAX` while a run without a state directory reads.
    pub keep_until: u64,
    /// Records taken from the ring by every run of this state, written by the reader after
    /// each batch: with the kernel's sequence numbers, how a run tells what the run before
    /// took in after its last checkpoint.
    pub received: u64,
    /// 1 while a reader runs; 0 once it stopped (a kept state's probes go on): no record
    /// then wakes anyone, which would cost an interrupt each once the ring fills.
    pub draining: u64,
}

/// Field offsets resolved by user space from the running kernel's BTF and passed to the
/// programs as one read-only global. Rust eBPF emits no CO-RE relocations, so nothing here may
/// be baked in at build time.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct KernelOffsets {
    pub task_pid: u64,
    pub task_tgid: u64,
    pub task_real_parent: u64,
    pub task_group_leader: u64,
    pub task_start_boottime: u64,
    pub task_comm: u64,
    pub task_signal: u64,
    pub task_mm: u64,
    pub task_exit_code: u64,
    pub task_cgroups: u64,
    pub css_set_dfl_cgrp: u64,
    pub cgroup_kn: u64,
    pub kernfs_node_id: u64,
    pub signal_live: u64,
    /// Offset of `signal_struct::pids[PIDTYPE_SID]`.
    pub signal_pids_sid: u64,
    /// Offset of `signal_struct::pids[PIDTYPE_PGID]`.
    pub signal_pids_pgid: u64,
    /// Offset of `pid::numbers[0].nr` (the pid number in the initial namespace).
    pub pid_numbers_nr: u64,
    /// Offsets of `task_struct::thread_pid` and `pid::level` (how deep in nested pid
    /// namespaces the task's pid is: 0 in the initial one).
    pub task_thread_pid: u64,
    pub pid_level: u64,
    pub mm_arg_start: u64,
    pub mm_arg_end: u64,
    pub bprm_filename: u64,
    pub bprm_file: u64,
    pub file_inode: u64,
    pub inode_ino: u64,
    pub inode_sb: u64,
    pub super_block_dev: u64,
    /// Offset of `file::f_path.dentry`, and of `dentry::d_name.name`: the executable's name.
    pub file_dentry: u64,
    pub dentry_name: u64,
    /// Offsets of `mm_struct::start_code` and `end_code`: the executable's text.
    pub mm_start_code: u64,
    pub mm_end_code: u64,
    /// Offset of `mm_struct::exe_file`: the executable's file.
    pub mm_exe_file: u64,
    pub kernfs_node_parent: u64,
    /// Offset of `cgroup::root` (the hierarchy a cgroup is in).
    pub cgroup_root: u64,
    pub cgroup_root_hierarchy_id: u64,
    /// Offset of the syscall number in `struct pt_regs` (`orig_ax` on x86_64, `syscallno` on
    /// aarch64), for the raw `sys_exit` fallback of the setsid hook.
    pub pt_regs_syscall_nr: u64,
}

/// Run-time settings of the kernel programs, set by user space at load.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ProbeConfig {
    /// The reader's base poll interval in ns (`--wakeup-interval`). Not 0: wake the reader
    /// only when it said it went idle (it polls on its own while events stream), and a record
    /// sent at once at most once per interval; 0: the kernel's default, a wake-up whenever
    /// the reader has caught up.
    pub wakeup_interval: u64,
    /// Wake the reader at once when this many bytes are waiting in the ring.
    pub wakeup_bytes: u64,
    /// Offset of `ret` in the `syscalls/sys_exit_setsid` record, read from tracefs.
    pub setsid_ret_offset: u64,
    /// The setsid syscall number on this architecture (for the raw `sys_exit` fallback).
    pub setsid_nr: u64,
    /// 1: executables are selected by inode (`GATEWAY_EXES`): exec looks them up.
    pub gateway_exes: u64,
    /// 1: scripts are selected by the path they are executed by (`GATEWAY_PATHS`).
    pub gateway_paths: u64,
    /// 1: cgroups are selected (`GATEWAY_CGROUPS`, `GATEWAY_CGROUP_PATHS`): forks from
    /// untracked processes, moves into cgroups and new cgroups are looked at.
    pub gateway_cgroups: u64,
    /// This load's generation: it records while `ReaderMark::generation` names it.
    pub generation: u64,
    /// What is taken of a tracked spawner's stack at each fork (`--spawn-stacks`): the
    /// [`SPAWN_STACKS_NATIVE`], [`SPAWN_STACKS_PYTHON`] and [`SPAWN_STACKS_COPY`] bits.
    pub spawn_stacks: u64,
}

/// [`ProbeConfig::spawn_stacks`] bit: the native user stack, by frame pointers (see
/// [`native`]).
pub const SPAWN_STACKS_NATIVE: u64 = 1;
/// [`ProbeConfig::spawn_stacks`] bit: a Python spawner's own frames (see [`python`]).
pub const SPAWN_STACKS_PYTHON: u64 = 2;
/// [`ProbeConfig::spawn_stacks`] bit: a copy of a JIT host's stack (see [`copy`]).
pub const SPAWN_STACKS_COPY: u64 = 4;

#[cfg(feature = "user")]
mod pod {
    // SAFETY: plain #[repr(C)] data with no padding holes that matter and no pointers.
    unsafe impl aya::Pod for super::Tracked {}
    unsafe impl aya::Pod for super::KernelOffsets {}
    unsafe impl aya::Pod for super::ProbeConfig {}
    unsafe impl aya::Pod for super::ExeKey {}
    unsafe impl aya::Pod for super::ReaderMark {}
    unsafe impl aya::Pod for super::python::PyLayout {}
    unsafe impl aya::Pod for super::python::PyStack {}
    unsafe impl aya::Pod for super::native::NativeStack {}
    unsafe impl aya::Pod for super::copy::CopiedSite {}
}
