//! The API's answers (see [`crate::api`]) from the run's parts: one process's lineage,
//! evidence and flags, the tree, the run's status. The sample and the holders' fds are not
//! read here: the answers' task (`daemon/answers.rs`) has them read on its thread of the
//! slow side, between the steps here, which read what the run holds (and, naming a chain's
//! members as they are now, their /proc `stat`).
use std::sync::Arc;

use super::{Pipeline, ToName};

use crate::api::{
    Branch, FollowFilter, FollowQueue, Held, Kill, KindCount, Process, Sessions, SessionsFilter,
    Status, TreeFilter,
};
use crate::identity::ProcessId;
use crate::kill;
use crate::leaks::answer::{self, Witness};
use crate::leaks::{Crowd, Evidence, Inspector, Near, Reason, Sample, flags};
use crate::lineage::graph::{LineageGraph, Node, NodeId};
use crate::output::follow::Follower;
use crate::output::tree::picked_tree;
use crate::procfs::boottime_now;
use crate::sites::NamedSites;
use crate::stream::events::{LeakDetail, ProcessLabel};
use crate::stream::evidence::Frame;

/// The process a `why` asks about, as the graph knows it when asked.
pub struct Asked {
    pub id: NodeId,
    /// Alive: the process to sample and its last sample (see [`crate::leaks::Inspector::to_sample`]).
    pub to_sample: Option<(ProcessId, Option<Arc<Sample>>)>,
}

impl Pipeline {
    pub fn status(&self) -> Status {
        Status {
            pid: crate::procfs::own_pid(),
            gateways: self.gateway_pids(),
            tracked: self.graph.live_count(),
            uptime_secs: boottime_now().saturating_sub(self.started) / 1_000_000_000,
            followers: self.out.followers(),
        }
    }

    pub fn kinds(&self) -> Vec<KindCount> {
        let counts = self.kinds.iter();
        counts
            .map(|(kind, instances)| KindCount {
                kind: kind.clone(),
                instances: *instances,
            })
            .collect()
    }

    /// Sends the stream's lines from now on to `lines`, those `filter` picks; false for a
    /// `pid` not tracked.
    pub fn follow(&mut self, filter: &FollowFilter, lines: FollowQueue) -> bool {
        let descendants: Vec<u32> = match filter.pid {
            Some(pid) => {
                let Some(top) = self.graph.current(pid).map(|n| n.id) else {
                    return false;
                };
                let graph = &self.graph;
                graph
                    .alive()
                    .chain(graph.zombies())
                    .filter(|n| graph.descends_from(n.id, top))
                    .map(|n| n.pid)
                    .collect()
            }
            None => Vec::new(),
        };
        self.out.follow(Follower::new(filter, lines, descendants));
        true
    }

    /// The agent sessions of the live processes, those under `filter`'s gateway; none for a
    /// gateway not tracked. Their memory is as the processes were last looked at.
    pub fn sessions(&self, filter: &SessionsFilter) -> Option<Sessions> {
        let under = match filter.gateway {
            Some(pid) => Some(self.graph.current(pid)?.id),
            None => None,
        };
        let held = self.inspector.held();
        let rss_of = |id| self.inspector.rss_of(id);
        Some(Sessions {
            now: boottime_now(),
            sessions: answer::sessions(&self.graph, held, under, rss_of),
        })
    }

    /// The live tree of the processes `filter` picks; none for a `gateway` not tracked.
    pub fn tree(&self, filter: &TreeFilter) -> Option<Vec<Branch>> {
        picked_tree(&self.graph, &self.inspector.held().by_node(), filter)
    }

    /// The first step of `why PID`: the process the graph knows by `pid` now (the live one,
    /// or the last one that had it), and what to sample of it.
    pub fn asked(&self, pid: u32) -> Option<Asked> {
        let node = self.graph.current(pid)?;
        let to_sample = node.alive().then(|| self.inspector.to_sample(node));
        Some(Asked {
            id: node.id,
            to_sample,
        })
    }

    /// The second step, once sampled: `sample`'s internal channels marked, and who may hold
    /// its other ends (see [`crate::leaks::Inspector::near`]).
    pub fn near(&self, id: NodeId, sample: &mut Sample) -> Near {
        self.inspector.near(&self.graph, id, sample)
    }

    /// What naming the frames that spawned process `id` needs (see `sites::naming`), read on
    /// the slow side; none when there is nothing to read.
    pub fn spawn_to_name(&mut self, id: NodeId) -> Option<ToName> {
        let pid = self.graph.node(id)?.pid;
        self.spawns_to_name([pid]).filter(|t| !t.naming.is_empty())
    }

    /// The frames that spawned the process `to_name` asked about, as `named` read them (none:
    /// they could not be read).
    pub fn spawn_named(&mut self, to_name: ToName, named: Option<NamedSites>) -> Spawned {
        let spawned = self.spawns_named(to_name.asked, named);
        spawned.into_values().next().unwrap_or_default()
    }

    /// The last step: process `id` as a flag would show it, with `evidence` read of it (none
    /// when it is not alive, or it could not be read) and the frames that `spawned` it, with
    /// the flags it holds; none when the graph let it go meanwhile (see [`answer::process`]).
    pub fn process(
        &mut self,
        id: NodeId,
        evidence: Option<Evidence>,
        spawned: Spawned,
    ) -> Option<Process> {
        let crowd = self.inspector.crowd_of(&self.graph, id);
        let mut live = Live {
            inspector: &self.inspector,
            evidence,
            spawned,
            crowd,
            kill_enabled: self.killer.auto(),
            kill_reasons: &self.kill_reasons,
        };
        let held = self.inspector.held();
        answer::process(&self.graph, held, id, &mut live, boottime_now())
    }
}

/// The frames that spawned a process, and whether they were cut.
pub type Spawned = (Arc<[Frame]>, bool);

/// What a run knows of a process beyond the graph and the flags: its /proc read now, its
/// spawn site named now, and what `--kill` would do.
struct Live<'a> {
    inspector: &'a Inspector,
    evidence: Option<Evidence>,
    spawned: Spawned,
    crowd: Option<Crowd>,
    kill_enabled: bool,
    kill_reasons: &'a [Reason],
}

impl Witness for Live<'_> {
    fn detail(&mut self, graph: &LineageGraph, node: &Node) -> LeakDetail {
        let mut detail = flags::detail(graph, node, self.evidence.as_ref());
        if let Some(crowd) = &self.crowd {
            flags::add_crowd(&mut detail, crowd);
        }
        (detail.spawned_at, detail.spawned_at_truncated) = self.spawned.clone();
        detail
    }

    fn server(&self, graph: &LineageGraph, node: &Node) -> Option<(NodeId, Vec<ProcessLabel>)> {
        if !node.alive() {
            return None;
        }
        let top = self.inspector.outermost(graph, node.id);
        if top == node.id {
            return None;
        }
        let chain = graph.chain(node.id);
        let from_top = chain.iter().skip_while(|n| n.id != top);
        let labels = from_top
            .map(|n| flags::label(n, flags::current_name(n)))
            .collect();
        Some((top, labels))
    }

    fn kill(&self, graph: &LineageGraph, node: &Node, flags: &[Held]) -> Kill {
        let held: Vec<_> = flags.iter().map(|f| f.reason).collect();
        let (could, why) = kill::could_kill(graph, node, &held, self.kill_reasons);
        Kill {
            enabled: self.kill_enabled,
            could,
            why,
        }
    }
}
