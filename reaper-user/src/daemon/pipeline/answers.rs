//! The API's answers (see [`crate::api`]) from the run's parts: one process's lineage,
//! evidence and flags, the tree, the run's status. The sample and the holders' fds are not
//! read here: the answers' task (`daemon/answers.rs`) has them read on its thread of the
//! slow side, between the steps here, which read what the run holds (and, naming a chain's
//! members as they are now, their /proc `stat`).
use super::Pipeline;

use crate::api::{
    Branch, FollowFilter, FollowQueue, Held, Kill, KindCount, Process, ServerOf, Status, TreeFilter,
};
use crate::identity::ProcessId;
use crate::kill;
use crate::leaks::{Evidence, Near, Sample, flags};
use crate::lineage::graph::{Node, NodeId};
use crate::output::follow::Follower;
use crate::output::tree::picked_tree;
use crate::procfs::boottime_now;
use crate::sites::NamedThisRound;

/// The process a `why` asks about, as the graph knows it when asked.
pub struct Asked {
    pub id: NodeId,
    /// Alive: the process to sample and its last sample (see [`crate::leaks::Inspector::to_sample`]).
    pub to_sample: Option<(ProcessId, Option<Sample>)>,
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

    /// The live tree of the processes `filter` picks; none for a `gateway` not tracked.
    pub fn tree(&self, filter: &TreeFilter) -> Option<Vec<Branch>> {
        let flags = flags::active_by_node(&self.inspector);
        picked_tree(&self.graph, &flags, filter)
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

    /// The last step: process `id` as a flag would show it, with `evidence` read of it (none
    /// when it is not alive, or it could not be read), with the flags it holds; none when the
    /// graph let it go meanwhile.
    pub fn process(&mut self, id: NodeId, evidence: Option<Evidence>) -> Option<Process> {
        let node = self.graph.node(id)?;
        let pid = node.pid;
        let mut detail = flags::detail(&self.graph, node, evidence.as_ref());
        if let Some(crowd) = self.inspector.crowd_of(&self.graph, node.id) {
            flags::add_crowd(&mut detail, &crowd);
        }
        let (start, alive) = (node.start.boottime_ns(), node.alive());
        let exited = node.exited.map(|e| e.ts);
        let flags = self.held_by(id);
        // An inner process of a server: the server is judged, flagged and killed whole, from
        // its outermost process.
        let top = match alive {
            true => self.inspector.outermost(&self.graph, id),
            false => id,
        };
        let server = (top != id).then(|| {
            let chain = self.graph.chain(id);
            let from_top = chain.iter().skip_while(|n| n.id != top);
            detail.chain = from_top
                .map(|n| flags::label(n, flags::current_name(n)))
                .collect();
            ServerOf {
                pid: self.graph.node(top).map_or(0, |n| n.pid),
                flags: self.held_by(top),
            }
        });
        // An inner process without a flag of its own is killed with its server, when its
        // outermost process is.
        let (could, why) = match (&server, flags.is_empty()) {
            (Some(s), true) => {
                let outer = self.graph.node(top).unwrap_or(node);
                let (could, why) = self.could_kill(outer, &s.flags);
                (
                    could,
                    format!("its server's outermost process {}: {why}", s.pid),
                )
            }
            _ => self.could_kill(node, &flags),
        };
        let kill = Kill {
            enabled: self.killer.is_some(),
            could,
            why,
        };
        (detail.spawned_at, detail.spawned_at_truncated) =
            self.spawned_at(pid, &mut NamedThisRound::default());
        // The symbolizer's caches (megabytes) go now, as after a scan's naming.
        if self.sites.as_mut().is_some_and(|sites| sites.named_all()) {
            crate::resident::give_back_freed();
        }
        Some(Process {
            pid,
            start,
            alive,
            exited,
            now: boottime_now(),
            flags,
            kill,
            server,
            detail,
        })
    }

    /// Whether `--kill` could act on `node`, holding `flags`, and why or why not.
    fn could_kill(&self, node: &Node, flags: &[Held]) -> (bool, String) {
        let held: Vec<_> = flags.iter().map(|f| f.reason).collect();
        kill::could_kill(&self.graph, node, &held, &self.kill_reasons)
    }

    /// The flags process `id` holds now.
    fn held_by(&self, id: NodeId) -> Vec<Held> {
        let active = self.inspector.active();
        active
            .filter(|(flagged, _, _)| *flagged == id)
            .map(|(_, reason, since)| Held { reason, since })
            .collect()
    }
}
