//! What each kernel event does to the graph: the fork fixes the lineage edge, exec names the
//! process, exit and free end it, setsid marks its escape, a gateway record makes a root.
//! Every change a record makes is made here, and said in the [`Change`] returned.
use super::{Change, ExitInfo, LineageGraph, Node, NodeId, Start};
use crate::capture::decode::{KernelEvent, What};

impl LineageGraph {
    /// Applies one kernel event; returns what it changed.
    pub fn apply(&mut self, ev: &KernelEvent) -> Change {
        match &ev.what {
            What::Gateway {
                selector,
                matched_at,
                ppid,
                sid,
                pgid,
                cgroup_id,
                comm,
            } => {
                let (selector, at) = (*selector as usize, *matched_at);
                // A process already followed (a descendant that executed a selected program,
                // or one seeded at start) becomes a root of lineage where it is.
                if let Some(id) = self.find(ev.pid, ev.start) {
                    self.set_gateway(id);
                    return Change::Matched {
                        node: id,
                        selector,
                        at,
                    };
                }
                let mut node = self.blank(ev.pid, Start::Exact(ev.start));
                node.ppid = *ppid;
                node.sid = *sid;
                node.pgid = *pgid;
                node.cgroup_id = Some(*cgroup_id);
                node.comm = *comm;
                node.is_gateway = true;
                Change::Matched {
                    node: self.insert(node),
                    selector,
                    at,
                }
            }
            What::Fork {
                spawner, untracked, ..
            } => {
                let command = self.expected_gateway == Some(ev.pid);
                if command {
                    self.expected_gateway = None;
                }
                // A fork seen after seeding already found the child in /proc: same process,
                // as the fork found it (what /proc said was read after; the records since
                // follow this one).
                let id = match self.find(ev.pid, ev.start) {
                    Some(id) => {
                        let spawner_node = self.current_id(*spawner).filter(|&s| s != id);
                        let node = self.nodes.get_mut(id).unwrap();
                        if node.seeded && !node.is_gateway && node.spawner != spawner_node {
                            let old = node.spawner;
                            node.spawner = spawner_node;
                            self.move_spawned(old, spawner_node);
                        }
                        let node = self.nodes.get_mut(id).unwrap();
                        node.seeded = false;
                        take_fork(node, ev);
                        id
                    }
                    None => {
                        let mut node = self.blank(ev.pid, Start::Exact(ev.start));
                        node.spawner = self.current_id(*spawner);
                        take_fork(&mut node, ev);
                        // Until it execs, a child runs its parent's program.
                        if let Some(parent) = node.spawner.and_then(|s| self.nodes.get(s)) {
                            node.filename = parent.filename.clone();
                            node.argv = parent.argv.clone();
                        }
                        self.insert(node)
                    }
                };
                if *untracked {
                    // Forked while the tracked map was full: the kernel will not follow its
                    // children.
                    self.mark_uncertain(id);
                }
                if command {
                    self.set_gateway(id);
                }
                Change::Forked {
                    node: id,
                    untracked: *untracked,
                    command,
                }
            }
            What::Exec {
                comm,
                filename,
                argv,
                old_tid,
                truncated,
                ..
            } => {
                let Some(id) = self.find(ev.pid, ev.start) else {
                    return Change::Unknown { pid: ev.pid };
                };
                let node = self.nodes.get_mut(id).unwrap();
                node.comm = *comm;
                node.filename = Some(filename.clone());
                node.argv = argv.clone();
                node.execs += 1;
                Change::Execed {
                    node: id,
                    tid: *old_tid,
                    truncated: *truncated,
                }
            }
            What::Exit { status } => {
                let Some(id) = self.find(ev.pid, ev.start) else {
                    return Change::Unknown { pid: ev.pid };
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
                    return Change::Duplicate;
                }
                self.set_exited(
                    id,
                    ExitInfo {
                        ts: ev.ts,
                        status: Some(*status),
                    },
                );
                // Its children are listed no more once it exited (a dead gateway would keep
                // thousands): those alive are its orphans now.
                let children = std::mem::take(&mut self.nodes.get_mut(id).unwrap().real_children);
                let orphans = children
                    .into_iter()
                    .filter(|c| {
                        self.nodes
                            .get(*c)
                            .is_some_and(|n| n.alive() && n.ppid == ev.pid)
                    })
                    .collect();
                Change::Exited { node: id, orphans }
            }
            What::Free => {
                // A free of a process never known says nothing (its exit, if it was one of
                // ours, was resynced already).
                let Some(id) = self.find(ev.pid, ev.start) else {
                    return Change::Duplicate;
                };
                if self.nodes.get(id).unwrap().reaped_at.is_some() {
                    return Change::Duplicate;
                }
                self.mark_reaped(id, ev.ts);
                Change::Reaped { node: id }
            }
            What::Setsid { sid } => {
                let Some(id) = self.find(ev.pid, ev.start) else {
                    return Change::Unknown { pid: ev.pid };
                };
                let node = self.nodes.get_mut(id).unwrap();
                node.sid = *sid;
                node.pgid = *sid;
                node.called_setsid = true;
                Change::Setsid { node: id }
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
            let id = n.id;
            self.retire_if_done(id);
        }
        if let Some(n) = to.and_then(|t| self.nodes.get_mut(t)) {
            n.spawned += 1;
        }
    }
}

/// The facts fork record `ev` gives of its child, on its node.
fn take_fork(node: &mut Node, ev: &KernelEvent) {
    let What::Fork {
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
    } = &ev.what
    else {
        return;
    };
    node.spawner_pid = Some(*spawner);
    node.ppid = *ppid;
    node.sid = *sid;
    node.pgid = *pgid;
    node.uid = Some(*uid);
    node.cgroup_id = Some(*cgroup_id);
    node.comm = *comm;
    node.forked_at = Some(ev.ts);
    // The thread that forked it, when not its spawner's main one.
    node.spawning_thread = (spawner_tid != spawner).then_some((*spawner_tid, *comm));
    node.spawn_stack = *stack;
}
