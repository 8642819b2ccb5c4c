//! What differs between the architectures the programs are built for (`bpf_target_arch`,
//! set by the user crate's build from the target it is built for): where the kernel saved a
//! thread's user registers at syscall entry.
use core::mem::offset_of;

#[cfg(bpf_target_arch = "x86_64")]
use aya_ebpf::bindings::pt_regs as saved;
#[cfg(bpf_target_arch = "aarch64")]
use aya_ebpf::bindings::user_pt_regs as saved;
use reaper_common::copy::UserRegs;

#[cfg(not(any(bpf_target_arch = "x86_64", bpf_target_arch = "aarch64")))]
compile_error!("reaper's kernel programs are built for x86_64 and aarch64");

/// The span of the saved registers (`struct pt_regs`) that holds the program counter, the
/// stack pointer and the frame pointer (and the link register on aarch64): read in one helper
/// call, not one per register, on every tracked fork of a native spawner.
#[cfg(bpf_target_arch = "x86_64")]
mod span {
    use super::*;
    pub const FROM: usize = offset_of!(saved, rbp);
    pub const TO: usize = offset_of!(saved, rsp) + 8;
    pub const PC: usize = offset_of!(saved, rip);
    pub const SP: usize = offset_of!(saved, rsp);
    pub const FP: usize = offset_of!(saved, rbp);
    /// None: a call pushes its return address.
    pub const LR: Option<usize> = None;
}

/// On aarch64 `struct pt_regs` begins with `struct user_pt_regs` (`regs[31]`, `sp`, `pc`):
/// `x29`, `x30`, `sp` and `pc` are four words in a row.
#[cfg(bpf_target_arch = "aarch64")]
mod span {
    use super::*;
    const X: usize = offset_of!(saved, regs);
    pub const FROM: usize = X + 29 * 8;
    pub const TO: usize = offset_of!(saved, pc) + 8;
    pub const PC: usize = offset_of!(saved, pc);
    pub const SP: usize = offset_of!(saved, sp);
    pub const FP: usize = X + 29 * 8;
    pub const LR: Option<usize> = Some(X + 30 * 8);
}

/// The bits of a user code address. On aarch64 a return address may be signed (pointer
/// authentication: code built with `-mbranch-protection=standard`, as distributions now build
/// their arm64 packages): the signature is in the bits above the 48 of a user address (Linux's user address space unless a process
/// asks for more), stripped before an address is compared with code.
#[cfg(bpf_target_arch = "x86_64")]
pub const USER_ADDRESS_MASK: u64 = u64::MAX;
#[cfg(bpf_target_arch = "aarch64")]
pub const USER_ADDRESS_MASK: u64 = u64::MAX >> 16;

/// Where the span starts in `struct pt_regs`, and its words.
pub const REGS_FROM: usize = span::FROM;
pub const REGS_WORDS: usize = (span::TO - span::FROM) / 8;

const fn within(at: usize) -> bool {
    span::FROM <= at && at + 8 <= span::TO
}
const _: () = assert!(within(span::PC) && within(span::SP) && within(span::FP));
const _: () = assert!(match span::LR {
    Some(at) => within(at),
    None => true,
});

/// The registers in `words`, the words of `struct pt_regs` from [`REGS_FROM`].
#[inline(always)]
pub fn user_regs_in(words: &[u64; REGS_WORDS]) -> UserRegs {
    let word = |offset: usize| words[(offset - span::FROM) / 8];
    UserRegs {
        pc: word(span::PC),
        sp: word(span::SP),
        fp: word(span::FP),
        lr: match span::LR {
            Some(at) => word(at),
            None => 0,
        },
    }
}
