//! A Python spawner's own frames at fork: where its interpreter keeps them (set by user space
//! once per exec of an interpreter) and the frames the fork probe read there.
//!
//! CPython keeps one thread state per thread in a list under each interpreter, and each
//! thread state points at its innermost frame (through a `_PyCFrame` on 3.11 and 3.12); each
//! frame names its code object and its instruction. The probe finds the forking thread's state
//! by its native thread id rather than through the thread-local current state, which 3.12+
//! clears while `subprocess` drops the GIL around `vfork`.

/// Frames kept per stack, innermost first; deeper frames are cut. A power of two.
pub const PY_FRAMES_MAX: usize = 32;
/// Steps of one read: each looks at one thread state (to find the forking thread's) or one
/// frame (kept, or skipped: the C-stack shims of 3.12+). Past it the read ends with what it
/// has: 32 frames with their shims take about 40, which leaves the search some 80 threads.
pub const PY_STEPS_MAX: usize = 128;
/// Interpreters looked at (the main one, then subinterpreters).
pub const PY_INTERPRETERS_MAX: usize = 4;
/// [`PyLayout::cframe_frame`] when the thread state points at the frame itself (3.13+).
pub const PY_NO_CFRAME: u16 = u16::MAX;

/// Where one process's interpreter keeps its frames: the address of `_PyRuntime` in that
/// process and the version's field offsets (bytes). The `PYTHONS` map's value, by tgid.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PyLayout {
    /// `start_boottime` of the process it was found in: a reused tgid is another process.
    /// 0 for a process found in /proc (its start known only to the clock tick).
    pub start: u64,
    /// Address of `_PyRuntime` in the process.
    pub runtime: u64,
    /// The pid namespace the process sees its thread ids in (`native_thread_id` is the tid
    /// there), as the device and inode of `/proc/PID/ns/pid`; 0 for the initial namespace.
    pub pidns_dev: u64,
    pub pidns_ino: u64,
    /// `_PyRuntimeState.interpreters.head`.
    pub interpreters_head: u16,
    /// `PyInterpreterState.next`, `.threads.head`.
    pub interp_next: u16,
    pub interp_threads_head: u16,
    /// `PyThreadState.next`, `.native_thread_id`.
    pub thread_next: u16,
    pub thread_native_id: u16,
    /// `PyThreadState.current_frame` (3.13+) or `.cframe` (3.11, 3.12).
    pub thread_frame: u16,
    /// `_PyCFrame.current_frame`, or [`PY_NO_CFRAME`].
    pub cframe_frame: u16,
    /// `_PyInterpreterFrame.f_code` / `.f_executable`, `.previous`, `.prev_instr` /
    /// `.instr_ptr`, `.owner`.
    pub frame_code: u16,
    pub frame_previous: u16,
    pub frame_instr: u16,
    pub frame_owner: u16,
    /// Frames whose owner is this or above are not Python code (the C-stack shims of 3.12+,
    /// the interpreter's own entry frames of 3.14).
    pub owner_not_python: u8,
    /// Low bits of the frame's code reference that are tags, not address (3.14's
    /// `_PyStackRef`).
    pub code_tag_mask: u8,
    pub _pad: [u8; 2],
}

/// One Python frame as read at the fork: its code object and the instruction it was at,
/// both addresses in the spawner.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PyFrame {
    pub code: u64,
    pub instr: u64,
}

/// A spawner's Python frames at a fork, innermost first: the `PY_STACKS` map's value, keyed
/// by a hash of its frames, so a spawner that spawns the same way a thousand times keeps
/// one copy.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PyStack {
    pub len: u32,
    /// 1: the walk stopped at [`PY_FRAMES_MAX`] with frames left.
    pub truncated: u32,
    /// The hash of the frames so far (the key it is kept under).
    pub hash: u64,
    pub frames: [PyFrame; PY_FRAMES_MAX],
}

/// Folds one word into a stack's hash (FNV-1a over words: cheap in the kernel, and the
/// reader never needs to compute it).
#[inline(always)]
pub const fn hash_word(hash: u64, word: u64) -> u64 {
    (hash ^ word).wrapping_mul(0x0000_0100_0000_01b3)
}

/// The hash a stack starts from.
pub const HASH_SEED: u64 = 0xcbf2_9ce4_8422_2325;
