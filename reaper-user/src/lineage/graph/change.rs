//! What one kernel record did to the graph, as [`LineageGraph::apply`] returns it: the one
//! value the rest of the run reads of a record. The stream's event is built from it (and the
//! node it names) once; spawn sites, the upkeep and the gateways' announcer read it; none of
//! them writes the graph.
//!
//! [`LineageGraph::apply`]: super::LineageGraph::apply
use reaper_common::MatchedAt;

use super::{LineageGraph, NodeId};
use crate::stream::events::{
    Argv, Event, Exec, Exit, Fork, ProcText, Reaped, Setsid, SpawningThread, wait_status,
};

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

    /// The stream's event for what a record about process `pid` changed in `graph`, built
    /// from the node it names (`interpreter`: an exec's, when its frames are read). A gateway
    /// match has none of its own: the tracer announces the gateway with its selector's name;
    /// a record that changed nothing has none.
    pub fn event(
        &self,
        graph: &LineageGraph,
        pid: u32,
        interpreter: Option<String>,
    ) -> Option<Event> {
        let node = self.node().and_then(|id| graph.node(id));
        Some(match (self, node) {
            (&Change::Forked { untracked, .. }, Some(n)) => Event::Fork(Fork {
                pid,
                ppid: n.ppid,
                spawner: n.spawner_pid.unwrap_or_default(),
                comm: ProcText::new("comm", n.comm),
                start: n.start.boottime_ns(),
                sid: n.sid,
                pgid: n.pgid,
                uid: n.uid.unwrap_or_default(),
                cgroup_id: n.cgroup_id.unwrap_or_default(),
                untracked,
                thread: SpawningThread::of(n.spawning_thread),
            }),
            (&Change::Execed { tid, truncated, .. }, Some(n)) => Event::Exec(Exec {
                pid,
                filename: ProcText::new("filename", n.filename.clone().unwrap_or_default()),
                argv: Argv::new(n.argv.clone()),
                truncated,
                tid,
                interpreter,
            }),
            (Change::Exited { .. }, Some(n)) => {
                let status = n.exited.and_then(|e| e.status).unwrap_or_default();
                let (exit_code, signal, core) = wait_status(status);
                Event::Exit(Exit {
                    pid,
                    exit_code,
                    signal,
                    core,
                })
            }
            // Its node may be pruned already: the pid is all it says.
            (Change::Reaped { .. }, _) => Event::Reaped(Reaped {
                pid,
                from_proc: false,
            }),
            (Change::Setsid { .. }, Some(n)) => Event::Setsid(Setsid { pid, sid: n.sid }),
            _ => return None,
        })
    }
}
