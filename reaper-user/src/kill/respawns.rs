//! Recognising a respawn, so that `--kill` never becomes a kill loop: a flagged child with the
//! same argv that its spawner forked within [`RESPAWN_WINDOW`] after a kill. Its spawner is
//! then found respawning (flagged `respawning` by the rules), and `--kill` kills none of its
//! children for a flag again.
use std::collections::VecDeque;
use std::time::Duration;

use rustc_hash::FxHashSet as HashSet;

use crate::lineage::graph::{LineageGraph, Node, NodeId};
use crate::text::Args;

/// A child with the same argv, forked by the same spawner this soon after a kill, is a
/// respawn.
const RESPAWN_WINDOW: Duration = Duration::from_secs(60);
/// The most kills remembered to recognise a respawn (the latest). A respawn is judged once its
/// own flag has held for the grace, which can be long after its fork (its first look, a long
/// `--grace`), so a kill is kept while its spawner is in the graph, not for the window alone.
const KILLS_KEPT: usize = 256;

/// A kill that ended in an exit.
struct Killed {
    spawner: NodeId,
    argv: Args,
    /// Boot-time ns of its first signal.
    at: u64,
}

/// The kills remembered and the spawners found respawning.
#[derive(Default)]
pub(super) struct Respawns {
    /// Kills that ended in an exit (the latest [`KILLS_KEPT`]).
    killed: VecDeque<Killed>,
    /// Spawners found respawning: `--kill` kills none of their children for a flag (a kill
    /// asked through the API is not decided here).
    respawning: HashSet<NodeId>,
}

/// What a flagged process about to be killed for its flag is.
pub(super) enum Judged {
    /// A child of a spawner already found respawning: left alone.
    LeftAlone,
    /// A respawn: its spawner, just found respawning; the child is left alone.
    Respawn(NodeId),
    /// Neither: it may be killed.
    NotARespawn,
}

impl Respawns {
    /// Remembers that `node` was killed, its first signal at boot-time `at`.
    pub(super) fn killed(&mut self, node: &Node, at: u64) {
        let Some(spawner) = node.spawner else {
            return;
        };
        if self.killed.len() == KILLS_KEPT {
            self.killed.pop_front();
        }
        self.killed.push_back(Killed {
            spawner,
            argv: node.argv.clone(),
            at,
        });
    }

    /// Lets go of what the graph no longer holds: it can respawn or be decided on no more.
    pub(super) fn forget_gone(&mut self, graph: &LineageGraph) {
        self.killed.retain(|k| graph.node(k.spawner).is_some());
        self.respawning.retain(|&id| graph.node(id).is_some());
    }

    /// Whether flagged `node` is a respawn, judged by its fork's time however long its flag
    /// took to come and hold: forked within the window after a sibling with the same argv
    /// was killed (not a sibling that merely leaked later).
    pub(super) fn judge(&mut self, node: &Node) -> Judged {
        let Some(spawner) = node.spawner else {
            return Judged::NotARespawn;
        };
        if self.respawning.contains(&spawner) {
            return Judged::LeftAlone;
        }
        let window = u64::try_from(RESPAWN_WINDOW.as_nanos()).unwrap_or(u64::MAX);
        let forked = node.forked_at.unwrap_or(0);
        let again = self.killed.iter().any(|k| {
            k.spawner == spawner && k.argv == node.argv && forked > k.at && forked - k.at < window
        });
        match again {
            true => {
                self.respawning.insert(spawner);
                Judged::Respawn(spawner)
            }
            false => Judged::NotARespawn,
        }
    }
}
