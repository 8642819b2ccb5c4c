//! What one kernel record did to the graph, as [`LineageGraph::apply`] returns it: the one
//! value the rest of the run reads of a record. The stream's event is built from it (and the
//! node it names) once; spawn sites, the upkeep and the gateways' announcer read it; none of
//! them writes the graph.
//!
//! [`LineageGraph::apply`]: super::LineageGraph::apply
use reaper_common::MatchedAt;

use super::NodeId;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// A process forked: a new node, or one found in /proc at start-up now seen forking.
    Forked {
        node: NodeId,
        /// The tracked map was full: the kernel will not follow this child's own children
        /// (the node is uncertain from now on).
        untracked: bool,
        /// It is the `-- CMD` gateway the run started (see [`LineageGraph::expect_gateway`]).
        ///
        /// [`LineageGraph::expect_gateway`]: super::LineageGraph::expect_gateway
        command: bool,
    },
    /// A process exec'd: the node names its new program.
    Execed {
        node: NodeId,
        /// The thread that called exec (the process's tid before exec made it the leader).
        tid: u32,
        /// Its argv was cut to fit the record.
        truncated: bool,
    },
    /// A process exited: also the live processes whose real parent it was, to be reparented.
    Exited { node: NodeId, orphans: Vec<NodeId> },
    /// A process was freed (reaped).
    Reaped { node: NodeId },
    /// A process called setsid().
    Setsid { node: NodeId },
    /// A process matched a gateway selector in the kernel: a root of lineage from now on.
    Matched {
        node: NodeId,
        /// The selector's number (see `crate::gateways::Selectors`).
        selector: usize,
        at: MatchedAt,
    },
    /// A process the graph does not know (only after a loss): `pid` is to be resynced.
    Unknown { pid: u32 },
    /// Nothing new: an exit the kernel reported twice, a free already learnt from /proc, or
    /// the free of a process never known.
    Duplicate,
}

impl Change {
    /// The node the record was about, when the graph holds it.
    pub fn node(&self) -> Option<NodeId> {
        match *self {
            Change::Forked { node, .. }
            | Change::Execed { node, .. }
            | Change::Exited { node, .. }
            | Change::Reaped { node }
            | Change::Setsid { node }
            | Change::Matched { node, .. } => Some(node),
            Change::Unknown { .. } | Change::Duplicate => None,
        }
    }
}
