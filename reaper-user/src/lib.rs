//! reaper: an exact spawn-lineage tracer for the descendants of gateway processes.
//!
//! The data path is a straight line: kernel probes (`reaper-ebpf`) → ring buffer →
//! [`decode`] → [`graph`] → [`output`]. [`tracer`] drives it; [`daemon`] runs it.
pub mod btf;
pub mod cli;
pub mod daemon;
pub mod decode;
pub mod events;
pub mod features;
pub mod graph;
pub mod inspect;
pub mod kill;
pub mod leaks;
pub mod loader;
pub mod logfile;
pub mod metrics;
pub mod output;
pub mod privileges;
pub mod procfs;
pub mod report;
pub mod seed;
pub mod serve;
pub mod status;
pub mod text;
pub mod tracefs;
pub mod tracer;
pub mod tree;
