//! What one kernel record did to the graph, as [`LineageGraph::apply`] returns it: the one
//! value the rest of the run reads of a record. The stream's event is built from it (and the
//! node it names) once; spawn sites, the upkeep and the gateways' announcer read it; none of
//! them writes the graph.
//!
//! Both ways of a kind are here: the event a change writes ([`Change::event`]), and what a
//! line of the stream read back does to a graph, as its record did ([`LineageGraph::replay`],
//! for `why --from` and `tree --from`), which names every kind of event, so a new one is
//! decided on here or does not compile. A test takes every kernel kind around both.
//!
//! [`LineageGraph::apply`]: super::LineageGraph::apply
use reaper_common::MatchedAt;

use super::{LineageGraph, NodeId, Seed};
use crate::capture::decode::{KernelEvent, What};
use crate::identity::boottime_to_ticks;
use crate::stream::events::{
    Argv, Event, Exec, Exit, Fork, ProcText, Reaped, Setsid, SpawningThread, wait_status,
    wait_status_of,
};
use crate::text::Comm;

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

impl LineageGraph {
    /// Applies a line of the stream read back (its event, stamped `ts`) as its record was
    /// applied to the run's graph: the lineage, who was alive and who had each pid come out as
    /// the run knew them. What a line does not carry (a fork's stacks, an exec's interpreter,
    /// a gateway's selector) the graph does not need to say who spawned whom. Returns whether
    /// the line is one of the lineage's; the others (the run's own, the findings) change
    /// nothing here.
    pub fn replay(&mut self, ts: u64, event: &Event) -> bool {
        let start_of = |graph: &LineageGraph, pid: u32| graph.current(pid).map(|n| n.start);
        let record = |pid: u32, start: u64, what: What| KernelEvent {
            seq: 0,
            generation: 0,
            ts,
            pid,
            start,
            what,
        };
        match event {
            Event::Snapshot(s) => {
                let start_ticks = match s.start {
                    0 => start_of(self, s.pid).map_or(0, |start| start.ticks()),
                    ns => boottime_to_ticks(ns),
                };
                self.add_seed(Seed {
                    pid: s.pid,
                    start_ticks,
                    ppid: s.ppid,
                    sid: s.sid,
                    pgid: s.pgid,
                    comm: Comm::from_c(s.comm.bytes()),
                    argv: s.argv.args().clone(),
                    is_gateway: false,
                    uncertain: false,
                });
            }
            Event::Gateway(g) => {
                let what = What::Gateway {
                    selector: 0,
                    matched_at: MatchedAt::Exec,
                    ppid: g.ppid,
                    sid: g.sid,
                    pgid: g.pgid,
                    cgroup_id: 0,
                    comm: Comm::from_c(g.comm.bytes()),
                };
                self.apply(&record(g.pid, g.start, what));
            }
            Event::Fork(f) => {
                let what = What::Fork {
                    spawner: f.spawner,
                    ppid: f.ppid,
                    sid: f.sid,
                    pgid: f.pgid,
                    uid: f.uid,
                    cgroup_id: f.cgroup_id,
                    comm: Comm::from_c(f.comm.bytes()),
                    spawner_tid: f.thread.as_ref().map_or(f.spawner, |t| t.tid),
                    stack: Default::default(),
                    copy: None,
                    untracked: f.untracked,
                };
                self.apply(&record(f.pid, f.start, what));
            }
            Event::Exec(e) => {
                if let Some(start) = start_of(self, e.pid) {
                    let what = What::Exec {
                        old_tid: e.tid,
                        comm: Comm::of_program(e.filename.bytes()),
                        filename: e.filename.bytes().into(),
                        argv: e.argv.args().clone(),
                        truncated: e.truncated,
                        interpreter: None,
                    };
                    self.apply(&record(e.pid, start.boottime_ns(), what));
                }
            }
            Event::Exit(e) => {
                if let Some(node) = self.current(e.pid) {
                    let (id, start) = (node.id, node.start.boottime_ns());
                    match wait_status_of(e.exit_code, e.signal.as_deref(), e.core) {
                        Some(status) => {
                            self.apply(&record(e.pid, start, What::Exit { status }));
                        }
                        // Learnt from /proc: gone, how is not known.
                        None => self.mark_gone(id, ts),
                    }
                }
            }
            Event::Reaped(r) => {
                if let Some(node) = self.current(r.pid) {
                    let (id, start) = (node.id, node.start.boottime_ns());
                    match r.from_proc {
                        true => self.mark_gone(id, ts),
                        false => {
                            self.apply(&record(r.pid, start, What::Free));
                        }
                    }
                }
            }
            Event::Setsid(s) => {
                if let Some(start) = start_of(self, s.pid) {
                    let what = What::Setsid { sid: s.sid };
                    self.apply(&record(s.pid, start.boottime_ns(), what));
                }
            }
            Event::Reparent(r) => {
                if let Some(id) = self.current(r.pid).map(|n| n.id) {
                    self.reparent(id, r.new_ppid);
                }
            }
            Event::Session(s) => {
                // Written after a read of the slow side: its process may be gone and its pid
                // reused by then (an event without a start is of the pid's newest).
                let id = match s.start {
                    0 => self.current(s.pid).map(|n| n.id),
                    start => self.identified(s.pid, start),
                };
                if let Some(id) = id {
                    // An empty value is none: its exec dropped the variable.
                    let value = Some(s.session.bytes()).filter(|v| !v.is_empty());
                    self.set_session(id, value);
                }
            }
            // The run's own lines and the findings: not the lineage's.
            Event::Ready(_)
            | Event::Lost(_)
            | Event::Summary(_)
            | Event::Flag(_)
            | Event::Kill(_)
            | Event::Cleared(_)
            | Event::Check(_)
            | Event::StopCommand(_)
            | Event::Note(_) => return false,
        }
        true
    }
}

#[cfg(test)]
mod tests;
