//! reaper: an exact spawn-lineage tracer for the descendants of gateway processes.
//!
//! The data path is a straight line, one folder a step:
//! kernel probes (`reaper-ebpf`) → ring buffer → [`capture`] (load, attach, decode) →
//! [`lineage`] (the graph, kept exact) → [`leaks`] (rules and flags) → [`kill`] (optional) →
//! [`output`] (NDJSON, human lines, log file, metrics). [`procfs`] holds every /proc read and
//! [`identity`] every "is this still the same process" answer. [`daemon`] drives the steps,
//! each on its own timer; [`report`] reads an audit afterwards.
pub mod api;
pub mod capture;
pub mod cli;
pub mod closing;
pub mod daemon;
pub mod exit_status;
pub mod gateways;
pub mod identity;
pub mod kill;
pub mod leaks;
pub mod lineage;
pub mod output;
pub mod privileges;
pub mod procfs;
pub mod replay;
pub mod report;
pub mod resident;
pub mod sites;
pub mod sockdiag;
pub mod state;
pub mod stream;
pub mod text;
