//! What the inspector finds: the reasons a process is flagged, the evidence a flag carries,
//! and the changes (a flag starts or stops holding) it returns to the run.
use std::sync::Arc;

use super::peers::Holder;
use super::sampler::Sample;
use crate::lineage::graph::NodeId;
use crate::procfs::placement::Placement;

pub use super::rules::Reason;

/// The /proc facts about a live process, and who holds the other ends of its pipes.
#[derive(Clone, Debug, Default)]
pub struct Evidence {
    pub sample: Sample,
    /// The holders of each pipe and socket in `sample`, by fd.
    pub peers: Vec<(u32, Vec<Holder>)>,
    /// The processes of its server, outermost (this one) first: its wrappers' children down to
    /// the one doing the I/O. Just this one for a server of one process.
    pub server: Vec<NodeId>,
    /// Its pid namespace and cgroup.
    pub placement: Placement,
}

/// A flag that starts holding.
#[derive(Clone, Debug)]
pub struct Flagged {
    pub node: NodeId,
    pub pid: u32,
    pub reason: Reason,
    /// Boot-time ns since when the condition holds.
    pub since: u64,
    /// The facts it was flagged on (none for a zombie: it has no fds left).
    pub evidence: Option<Evidence>,
    /// For `accumulating`: its kind and how many instances of it are alive.
    pub crowd: Option<Crowd>,
}

/// What an `accumulating` flag says of the instances of its process's kind.
#[derive(Clone, Debug)]
pub struct Crowd {
    /// The executable's path.
    pub exe: Arc<[u8]>,
    /// The instances' command line, with the values they differ in as `*`.
    pub pattern: String,
    /// Live instances of the kind under the gateway instance.
    pub instances: usize,
    /// The newest instance's pid.
    pub newest: u32,
}

/// A flag that starts or stops holding.
#[derive(Clone, Debug)]
pub enum Change {
    Flag(Box<Flagged>),
    Cleared {
        pid: u32,
        reason: Reason,
        because: &'static str,
    },
}
