//! reaper's kernel programs: follow the process tree under the gateways, nothing else.
//!
//! The data path is: a tracepoint fires → one map lookup decides whether the process is
//! tracked (untracked processes return here: this is what keeps the tracer cheap) → a record
//! goes into the one ring buffer (global order) with a sequence number → user space.
#![no_std]
#![no_main]
// The BPF target lacks compare-and-swap, so atomic fetch-add is only reachable as an intrinsic.
#![allow(internal_features)]
#![feature(core_intrinsics)]

mod arch;
mod copy;
mod emit;
mod maps;
mod native;
mod probes;
mod python;
mod task;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // Unreachable by construction: any reachable panic gets the program rejected at load.
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
