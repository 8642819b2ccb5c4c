//! `respawning`: with `--kill`, it forked a child with the same argv again within 60 s after
//! its child was killed. The killer finds it (see `crate::kill`); the rule keeps the spawners found until
//! the next round of the rules, which looks at each (its sample is its flag's evidence) and
//! raises its flag: held until it exits.
use super::{About, Reason};
use crate::lineage::graph::NodeId;

pub const ABOUT: About = About {
    reason: Reason::Respawning,
    killable: false,
    counts_a_kind: false,
    live: None,
    // Never cleared by a look: its flag goes with its exit.
    cleared: |_| "exited",
    why: |_| "respawning".to_owned(),
};

/// The spawners the killer found respawning, waiting for the next round: the rule's state.
#[derive(Debug, Default)]
pub struct Respawners(Vec<NodeId>);

impl Respawners {
    /// The killer found `spawners` respawning.
    pub fn found(&mut self, spawners: impl IntoIterator<Item = NodeId>) {
        for id in spawners {
            if !self.0.contains(&id) {
                self.0.push(id);
            }
        }
    }

    /// The spawners waiting: the next round looks at each.
    pub fn waiting(&self) -> &[NodeId] {
        &self.0
    }

    /// The spawners found since the last round, for its flags.
    pub fn take(&mut self) -> Vec<NodeId> {
        std::mem::take(&mut self.0)
    }
}
