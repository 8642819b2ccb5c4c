//! reaper: an exact spawn-lineage tracer for the descendants of gateway processes.
//!
//! The data path is a straight line, one folder a step:
//! kernel probes (`reaper-ebpf`) → ring buffer → `capture` (load, attach, decode) →
//! `lineage` (the graph, kept exact) → `leaks` (rules and flags) → `kill` (optional) →
//! `output` (NDJSON, human lines, log file, metrics). `untrusted` reads what a traced process
//! controls, `procfs` holds every /proc read and `identity` every "is this still the same
//! process" answer. `daemon` drives the steps; `report` reads an audit afterwards. The layers,
//! bottom up, are drawn in docs/design.md.
//!
//! The modules are the crate's own: what is exported below is what the binary, the
//! integration tests, the fuzz targets and the docs example use, nothing more, so that the
//! compiler sees what nothing uses.
mod api;
mod capture;
mod cli;
mod closing;
mod commands;
mod daemon;
mod exit_status;
mod gateways;
mod identity;
mod kill;
mod leaks;
mod lineage;
mod output;
mod privileges;
mod procfs;
mod replay;
mod report;
mod resident;
mod serve;
mod sites;
mod sockdiag;
mod state;
mod stream;
mod text;
mod untrusted;

/// The `reaper-trace` binary: reads the command line and runs what it asks.
pub use commands::main;

/// For the fuzz targets: the parsers of what the kernel, /proc, the command line and an audit
/// hand over, each of which must refuse anything, never panic.
pub mod parse {
    pub use crate::capture::btf::KernelBtf;
    pub use crate::capture::decode::decode;
    pub use crate::cli::{
        parse_duration, parse_kill_reasons, parse_listen_addr, parse_ring_size, parse_rotate_size,
        parse_size,
    };
    pub use crate::procfs::facts::{
        parse_fd_target, parse_fdinfo_end, parse_io, parse_rss_kib, parse_syscall,
    };
    pub use crate::procfs::parse_stat;
    pub use crate::replay::At;
    pub use crate::report::{audit::Audit, html::render};
    pub use crate::text::Args;
}

/// For the docs example (man pages, completions) and the test that holds the docs to the
/// code: the command lines and the rules' table.
pub mod docs {
    pub use crate::api::client::{EventsCli, KillCli, SessionsCli, TreeCli, WhyCli};
    pub use crate::api::top::TopCli;
    pub use crate::cli::Cli;
    pub use crate::leaks::rules::TABLE as RULES;
    pub use crate::report::ReportCli;
    pub use crate::stream::evidence::ESCAPED_MEANING;
}

/// For the integration tests: the parts they drive or check against the real kernel.
pub mod testing {
    pub use crate::capture::pins::is_bpffs;
    pub use crate::identity::boottime_to_ticks;
    pub use crate::kill::{KillOptions, Killer, Outcome};
    pub use crate::leaks::Reason;
    pub use crate::leaks::rules::line::flag_line;
    pub use crate::lineage::graph::{LineageGraph, Seed};
    pub use crate::procfs::{boottime_now, read_stat};
    pub use crate::sites::build_ids::build_id_of;
    pub use crate::stream::events::LeakDetail;
    pub use crate::stream::evidence::Frame;
    pub use crate::stream::readable::spawn_site_text;
    pub use crate::text::{Args, Comm};

    /// The ingest path as a run's reader takes records (decode, graph, events, NDJSON lines
    /// written to nowhere), on one gateway found in /proc: for the allocation test.
    pub struct Ingest(crate::daemon::pipeline::Pipeline);

    impl Ingest {
        /// `gateway`: the gateway, as /proc would show it; `retain_dead` as the option.
        pub fn new(gateway: Seed, retain_dead: usize) -> anyhow::Result<Ingest> {
            use std::time::Duration;
            let out = crate::output::Output::new(vec![Box::new(std::io::sink())], None, 0);
            let inspect = crate::leaks::InspectOptions {
                scan_interval: Duration::from_secs(1),
                idle_after: Duration::from_secs(600),
                zombie_after: Duration::from_secs(60),
                orphan_grace: Duration::from_secs(2),
                max_instances: 8,
            };
            let graph = LineageGraph::new(retain_dead);
            // Nothing killed: no flag leads to a kill, and nobody asks.
            let (killer, _) = crate::kill::Killer::new(crate::kill::KillOptions {
                auto: false,
                reasons: vec![],
                grace: Duration::ZERO,
                term_timeout: Duration::ZERO,
                dry_run: true,
            });
            let mut run =
                crate::daemon::pipeline::Pipeline::new(graph, out, inspect, killer, vec![], vec![]);
            run.add_seeds(vec![gateway])?;
            Ok(Ingest(run))
        }

        /// Takes in one ring-buffer record.
        pub fn record(&mut self, bytes: &[u8]) -> anyhow::Result<()> {
            self.0.record(bytes)
        }

        /// Ends a batch of records, as a drain of the ring does.
        pub fn end_batch(&mut self) -> anyhow::Result<()> {
            self.0.end_batch()
        }

        /// Records that did not decode.
        pub fn undecodable(&self) -> u64 {
            self.0.undecodable()
        }
    }
}
