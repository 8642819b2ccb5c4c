//! From the kernel to typed records: what the running kernel offers ([`features`], [`btf`],
//! [`tracefs`]), the probes loaded and attached with this kernel's offsets ([`loader`]), and
//! each ring-buffer record decoded into a [`decode::KernelEvent`] and accounted for
//! ([`reader`]: delivery and latency; [`shared`]: the maps the probes and the reader share),
//! read on the pace of a [`poll_clock::PollClock`] while records stream; what of it outlives
//! a run is pinned in bpffs ([`pins`]).
pub mod btf;
pub mod decode;
pub mod features;
pub mod loader;
pub mod pins;
pub mod poll_clock;
pub mod reader;
pub mod shared;
pub mod sizes;
pub mod tracefs;
