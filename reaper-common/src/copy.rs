//! A copy of a spawner's user stack at fork, for user space to unwind with its objects' call
//! frame information, where the kernel's frame-pointer walk stops short: in the C library's
//! `fork` (Debian's keeps no frame pointers), or in code built without them (a Rust binary's).
//! - A JIT host (a Node host): its stacks are copied at each tracked fork, since its native
//!   code and the JavaScript over it look the same to a frame-pointer walk from any site.
//!   User space marks such spawners (`JIT_HOSTS`, by tgid).
//! - Any other spawner whose Python frames are not read (C, Rust, Go...): its stack is copied
//!   once per site, the first time it forks from there (`COPIED_SITES`). A site is the
//!   frame-pointer walk's frames and the executable's code addresses found in the first
//!   [`SCAN_BYTES`] above the stack pointer and in the link register (return addresses, which
//!   tell apart callers the walk cannot see past); the fork record's `stack` names it, and
//!   user space keeps the unwound frames under that key.
use crate::{ExeKey, ForkEvent};

/// Bytes above the stack pointer scanned for code addresses of the executable.
pub const SCAN_BYTES: usize = 1024;

/// `COPIED_SITES`' key: a site a spawner's stack was copied at.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CopiedSite {
    /// The fork record's `stack`.
    pub stack: u64,
    /// The spawner's identity.
    pub start: u64,
    pub tgid: u32,
    pub _pad: u32,
}

/// Bytes copied per read, a page: reads start at the page of the stack pointer, so the last
/// one that succeeds ends at the stack's top (a page boundary), and the next one fails whole.
pub const COPY_CHUNK: usize = 4096;
/// Reads per copy.
pub const COPY_CHUNKS: usize = 4;
/// Most bytes copied, from the page of the stack pointer up: a Node host's spawn path (its
/// JavaScript frames, the binding's C++, libuv, the C library) takes a few KiB of it.
pub const COPY_MAX: usize = COPY_CHUNK * COPY_CHUNKS;

/// A thread's user registers as the kernel saved them at syscall entry: what an unwinder
/// starts from.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UserRegs {
    /// Where it was (in the C library's fork): `rip` on x86_64, `pc` on aarch64.
    pub pc: u64,
    /// Its stack pointer: `rsp`, `sp`.
    pub sp: u64,
    /// Its frame pointer: `rbp`, `x29`.
    pub fp: u64,
    /// Its link register, `x30` on aarch64: the return address of a function that has not
    /// stored it on the stack (a leaf, or one before its prologue). 0 on x86_64, where a call
    /// pushes its return address.
    pub lr: u64,
}

/// Where the spawner's executable was at the fork, as its mm says (`exe_file`, `start_code`,
/// `end_code`): what its own frames in a copy are unwound in once it is gone, and its
/// `/proc/PID/maps` with it (a spawner that forks and exits at once, as a shell after
/// `cmd &`). The frame it forked in (the C library's fork) is placed by the kernel's
/// frame-pointer walk, which names that frame's object by build id and file offset.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExeCode {
    /// The executable's file; zeros when it could not be read.
    pub file: ExeKey,
    /// Its code's addresses: `start_code..end_code`.
    pub start: u64,
    pub end: u64,
}

/// The forking thread's user registers at the fork syscall and its stack from there up.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct StackCopy {
    pub regs: UserRegs,
    pub exe: ExeCode,
    /// The address `bytes` were copied from: the start of `sp`'s page.
    pub base: u64,
    /// Bytes of `bytes` copied (a multiple of [`COPY_CHUNK`]).
    pub len: u64,
    pub bytes: [u8; COPY_MAX],
}

/// A fork record with the copy after it: sent with variable length, only the first
/// `copy.len` bytes of `copy.bytes` in the ring. `fork.flags` has [`FORK_STACK_COPIED`].
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ForkCopyEvent {
    pub fork: ForkEvent,
    pub copy: StackCopy,
}

/// `fork` flag: the record is a [`ForkCopyEvent`].
pub const FORK_STACK_COPIED: u32 = 2;

/// The fixed part of a [`ForkCopyEvent`], before the stack's bytes.
pub const FORK_COPY_FIXED_LEN: usize =
    core::mem::offset_of!(ForkCopyEvent, copy) + core::mem::offset_of!(StackCopy, bytes);
