//! What each kernel event does to the graph: the fork fixes the lineage edge, exec names the
//! process, exit and free end it, setsid marks its escape, a gateway record makes a root.
use super::{Applied, ExitInfo, LineageGraph, NodeId, Start};
use crate::capture::decode::{KernelEvent, What};

impl LineageGraph {
    /// Applies one kernel event.
    pub fn apply(&mut self, ev: &KernelEvent) -> Applied {
        match &ev.what {
            What::Gateway {
                ppid,
                sid,
                pgid,
                cgroup_id,
                comm,
                ..
            } => {
                // A process already followed (a descendant that executed a selected program,
                // or one seeded at start) becomes a root of lineage where it is.
                if let Some(id) = self.find(ev.pid, ev.start) {
                    self.set_gateway(id);
                    return Applied::Node(id);
                }
                let mut node = self.blank(ev.pid, Start::Exact(ev.start));
                node.ppid = *ppid;
                node.sid = *sid;
                node.pgid = *pgid;
                node.cgroup_id = Some(*cgroup_id);
                node.comm = *comm;
                node.is_gateway = true;
                Applied::Node(self.insert(node))
            }
            What::Fork {
                spawner,
                ppid,
                sid,
                pgid,
                uid,
                cgroup_id,
                comm,
                spawner_tid,
                stack,
                ..
            } => {
                let thread = (spawner_tid != spawner).then_some((*spawner_tid, *comm));
                // A fork seen after seeding already found the child in /proc: same process.
                if let Some(id) = self.find(ev.pid, ev.start) {
                    let spawner_node = self.current_id(*spawner).filter(|&s| s != id);
                    let node = self.nodes.get_mut(id).unwrap();
                    if node.seeded && !node.is_gateway && node.spawner != spawner_node {
                        let old = node.spawner;
                        node.spawner = spawner_node;
                        self.move_spawned(old, spawner_node);
                    }
                    let node = self.nodes.get_mut(id).unwrap();
                    node.seeded = false;
                    node.spawner_pid = Some(*spawner);
                    node.forked_at = Some(ev.ts);
                    node.spawning_thread = thread;
                    node.spawn_stack = *stack;
                    node.uid = Some(*uid);
                    node.cgroup_id = Some(*cgroup_id);
                    return Applied::Node(id);
                }
                let mut node = self.blank(ev.pid, Start::Exact(ev.start));
                node.spawner = self.current_id(*spawner);
                node.spawner_pid = Some(*spawner);
                node.ppid = *ppid;
                node.sid = *sid;
                node.pgid = *pgid;
                node.uid = Some(*uid);
                node.cgroup_id = Some(*cgroup_id);
                node.comm = *comm;
                node.forked_at = Some(ev.ts);
                node.spawning_thread = thread;
                node.spawn_stack = *stack;
                // Until it execs, a child runs its parent's program.
                if let Some(parent) = node.spawner.and_then(|s| self.nodes.get(s)) {
                    node.filename = parent.filename.clone();
                    node.argv = parent.argv.clone();
                }
                Applied::Node(self.insert(node))
            }
            What::Exec {
                comm,
                filename,
                argv,
                ..
            } => {
                let Some(id) = self.find(ev.pid, ev.start) else {
                    return Applied::Unknown;
                };
                let node = self.nodes.get_mut(id).unwrap();
                node.comm = *comm;
                node.filename = Some(filename.clone());
                node.argv = argv.clone();
                node.execs += 1;
                Applied::Node(id)
            }
            What::Exit { status } => {
                let Some(id) = self.find(ev.pid, ev.start) else {
                    return Applied::Unknown;
                };
                // The kernel can report one process's exit more than once: when the threads of
                // a SIGKILLed process exit together, each may find the group dead by the time
                // it reaches the tracepoint. The first report is the exit.
                if self
                    .nodes
                    .get(id)
                    .unwrap()
                    .exited
                    .is_some_and(|e| e.status.is_some())
                {
                    return Applied::Duplicate;
                }
                self.set_exited(
                    id,
                    ExitInfo {
                        ts: ev.ts,
                        status: Some(*status),
                    },
                );
                let orphans = self
                    .nodes
                    .get(id)
                    .unwrap()
                    .real_children
                    .iter()
                    .copied()
                    .filter(|c| {
                        self.nodes
                            .get(*c)
                            .is_some_and(|n| n.alive() && n.ppid == ev.pid)
                    })
                    .collect();
                Applied::Exit { node: id, orphans }
            }
            What::Free => {
                let Some(id) = self.find(ev.pid, ev.start) else {
                    return Applied::Unknown;
                };
                if self.nodes.get(id).unwrap().reaped_at.is_some() {
                    return Applied::Duplicate;
                }
                self.mark_reaped(id, ev.ts);
                Applied::Node(id)
            }
            What::Setsid { sid } => {
                let Some(id) = self.find(ev.pid, ev.start) else {
                    return Applied::Unknown;
                };
                let node = self.nodes.get_mut(id).unwrap();
                node.sid = *sid;
                node.pgid = *sid;
                node.called_setsid = true;
                Applied::Node(id)
            }
        }
    }

    /// A node's spawner changed from `from` to `to`: the spawned counts follow.
    fn move_spawned(&mut self, from: Option<NodeId>, to: Option<NodeId>) {
        if from == to {
            return;
        }
        if let Some(n) = from.and_then(|f| self.nodes.get_mut(f)) {
            n.spawned = n.spawned.saturating_sub(1);
        }
        if let Some(n) = to.and_then(|t| self.nodes.get_mut(t)) {
            n.spawned += 1;
        }
    }
}
