//! A spawner's native user stack at fork, as the kernel's frame-pointer walk gives it with
//! build ids (`bpf_get_stack` with `BPF_F_USER_BUILD_ID`): each frame names the object it is
//! in by build id and the offset in that object's file, so it can be named once the spawner,
//! and every process that mapped the same objects, is gone. Kept in `STACKS` once per distinct
//! stack, keyed by a hash of its frames; the fork record carries the key.

/// Frames kept per stack, innermost first (the spawning code is in the innermost few).
pub const NATIVE_FRAMES_MAX: usize = 32;

/// Bytes of a build id the kernel keeps (`BUILD_ID_SIZE_MAX`; a shorter one is padded with
/// zeros).
pub const BUILD_ID_LEN: usize = 20;

/// [`NativeFrame::status`]: no frame.
pub const FRAME_EMPTY: i32 = 0;
/// [`NativeFrame::status`]: `build_id` and `offset` name the frame.
pub const FRAME_BUILD_ID: i32 = 1;
/// [`NativeFrame::status`]: the kernel could not read the object's build id (its note not
/// in memory, the address space busy, code no file backs): `offset` is the address.
pub const FRAME_ADDRESS: i32 = 2;

/// One frame: the kernel's `struct bpf_stack_build_id`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NativeFrame {
    /// [`FRAME_EMPTY`], [`FRAME_BUILD_ID`] or [`FRAME_ADDRESS`].
    pub status: i32,
    pub build_id: [u8; BUILD_ID_LEN],
    /// The file offset in the object ([`FRAME_BUILD_ID`]), or the address.
    pub offset: u64,
}

/// The kernel's frame size, which `bpf_get_stack` divides its buffer by.
pub const NATIVE_FRAME_LEN: usize = core::mem::size_of::<NativeFrame>();
const _: () = assert!(NATIVE_FRAME_LEN == 32);

/// A stack: `STACKS`' value.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NativeStack {
    /// Frames filled.
    pub len: u32,
    pub _pad: u32,
    pub frames: [NativeFrame; NATIVE_FRAMES_MAX],
}
