//! A node's spawn chain and what it says: its lineage, whether it left its gateway's session,
//! and the exited spawner that ended the session that spawned it.
use super::{LineageGraph, Node, NodeId};

impl LineageGraph {
    /// Pids from the root of the lineage (a gateway, normally) down to `id`.
    pub fn lineage(&self, id: NodeId) -> Vec<u32> {
        self.chain(id).iter().map(|n| n.pid).collect()
    }

    /// Whether `id` left its gateway's session, process group or cgroup: by its own setsid()
    /// or an ancestor's (a session is inherited), a setpgid(), or a move to another cgroup.
    /// Without a gateway on its chain there is nothing to compare with: false (whether it
    /// called setsid() itself is `called_setsid`, never this).
    pub fn escaped(&self, id: NodeId) -> bool {
        let chain = self.chain(id);
        let Some(node) = chain.last() else {
            return false;
        };
        match chain.first().filter(|g| g.is_gateway && g.id != node.id) {
            Some(g) => {
                node.called_setsid
                    || node.sid != g.sid
                    || node.pgid != g.pgid
                    || matches!((g.cgroup_id, node.cgroup_id), (Some(a), Some(b)) if a != b)
            }
            None => false,
        }
    }

    /// Whether `ancestor` is on `id`'s spawn chain ([`Self::chain`], `id` itself included),
    /// without collecting the chain.
    pub fn descends_from(&self, id: NodeId, ancestor: NodeId) -> bool {
        let mut at = self.nodes.get(id);
        let mut steps = 0;
        while let Some(node) = at {
            if node.id == ancestor {
                return true;
            }
            steps += 1;
            if node.is_gateway || steps > self.nodes.len() {
                return false;
            }
            at = node.spawner.and_then(|s| self.nodes.get(s));
        }
        false
    }

    /// The gateway `id` descends from (itself, for a gateway); none when its chain reaches
    /// none (a process whose spawner was never known).
    pub fn gateway_of(&self, id: NodeId) -> Option<&Node> {
        let mut at = self.nodes.get(id)?;
        // Bounded like `chain`: a malformed cycle must not hang a walk.
        for _ in 0..=self.nodes.len() {
            if at.is_gateway {
                return Some(at);
            }
            at = self.nodes.get(at.spawner?)?;
        }
        None
    }

    /// The spawn chain of `id`, from its gateway (or the oldest known spawner) down to `id`.
    pub fn chain(&self, id: NodeId) -> Vec<&Node> {
        let mut chain = Vec::new();
        let mut at = self.nodes.get(id);
        while let Some(node) = at {
            chain.push(node);
            if node.is_gateway || chain.len() > self.nodes.len() {
                break;
            }
            at = node.spawner.and_then(|s| self.nodes.get(s));
        }
        chain.reverse();
        chain
    }

    /// The nearest process above `id` on its spawn chain (its gateway included) that has
    /// exited: the end of the session that spawned it.
    pub fn exited_spawner(&self, id: NodeId) -> Option<&Node> {
        let mut at = self.nodes.get(id)?;
        // Bounded like `chain`: a malformed cycle must not hang the inspector.
        for _ in 0..self.nodes.len() {
            if at.is_gateway {
                return None;
            }
            at = self.nodes.get(at.spawner?)?;
            if at.exited.is_some() {
                return Some(at);
            }
        }
        None
    }
}
