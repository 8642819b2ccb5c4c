//! What the inspector finds: the reasons a process is flagged, the evidence a flag carries,
//! and the changes (a flag starts or stops holding) it returns to the run.
use std::rc::Rc;

use serde::{Deserialize, Serialize};

use super::peers::Holder;
use super::sampler::Sample;
use crate::lineage::graph::NodeId;
use crate::procfs::placement::Placement;

/// Why a process is flagged: the `reason` of the `flag`, `cleared` and `kill` events, written
/// by its name (`orphaned`, ...).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// A process on its spawn chain (the gateway included) exited; it holds pipes or sockets.
    Orphaned,
    /// Waits for input on pipes or sockets whose other end is open, and moved no data for
    /// `--idle-after`.
    Idle,
    /// Holds the read end of a pipe with no writers left (EOF pending) for `--idle-after`.
    Deaf,
    /// Exited, and not reaped by its parent for `--zombie-after`.
    Zombie,
    /// Respawns what `--kill` killed (raised by the killer, not by a rule).
    Respawning,
    /// One of more than `--max-instances` instances of its kind alive under its gateway
    /// instance, and not one of the newest of them.
    Accumulating,
    /// A reason this build does not know, read back from a later build's stream; never
    /// raised (so never written).
    #[default]
    #[serde(other)]
    Other,
}

impl Reason {
    pub const ALL: [Reason; 6] = [
        Reason::Orphaned,
        Reason::Idle,
        Reason::Deaf,
        Reason::Zombie,
        Reason::Respawning,
        Reason::Accumulating,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Reason::Orphaned => "orphaned",
            Reason::Idle => "idle",
            Reason::Deaf => "deaf",
            Reason::Zombie => "zombie",
            Reason::Respawning => "respawning",
            Reason::Accumulating => "accumulating",
            Reason::Other => "other",
        }
    }

    /// A `--kill-reasons` name: the rules a kill may follow (zombies cannot be killed).
    pub fn killable(name: &str) -> Option<Reason> {
        [
            Reason::Orphaned,
            Reason::Idle,
            Reason::Deaf,
            Reason::Accumulating,
        ]
        .into_iter()
        .find(|r| r.name() == name)
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The /proc facts about a live process, and who holds the other ends of its pipes.
#[derive(Clone, Debug)]
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
    pub exe: Rc<[u8]>,
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
        node: NodeId,
        pid: u32,
        reason: Reason,
        because: &'static str,
    },
}
