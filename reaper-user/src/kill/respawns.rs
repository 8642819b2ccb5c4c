//! Recognising a respawn, so that `--kill` never becomes a kill loop: a flagged child with the
//! same argv that its spawner forked within [`RESPAWN_WINDOW`] after a kill. Its spawner is
//! then found respawning (flagged `respawning` by the rules), and `--kill` kills none of its
//! children for a flag again.
use std::time::Duration;

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use crate::lineage::graph::{LineageGraph, Node, NodeId};
use crate::text::Args;

/// A child with the same argv, forked by the same spawner this soon after a kill, is a
/// respawn.
const RESPAWN_WINDOW: Duration = Duration::from_secs(60);

/// The time after kills of one spawner's children of one argv in which a child it forks
/// with that argv is a respawn: the kills' windows, merged where they overlap (boot-time ns,
/// both ends excluded).
struct Window {
    spawner: NodeId,
    argv: Args,
    from: u64,
    to: u64,
}

/// The kills remembered and the spawners found respawning. A respawn is judged once its own
/// flag has held for the grace, which can be long after its fork (its first look, a long
/// `--grace`): a window is kept while it is open, and as it passes the children forked
/// within it are kept instead, while they live. So what is kept is bounded by the kills of
/// one window and by the live processes, however many kills a day brings.
#[derive(Default)]
pub(super) struct Respawns {
    /// Windows still open.
    windows: Vec<Window>,
    /// Live children forked within windows that have passed, with the argv killed in each.
    forked_within: HashMap<NodeId, Vec<Args>>,
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
        let to = at.saturating_add(window_ns());
        let same = |w: &&mut Window| w.spawner == spawner && w.argv == node.argv;
        match self
            .windows
            .iter_mut()
            .filter(same)
            .find(|w| w.from <= at && at < w.to)
        {
            Some(open) => open.to = open.to.max(to),
            None => self.windows.push(Window {
                spawner,
                argv: node.argv.clone(),
                from: at,
                to,
            }),
        }
    }

    /// Lets go of what can be judged a respawn no more at boot-time `now`: what the graph no
    /// longer holds, the kills of spawners found respawning (their children are judged no
    /// more), and each window that has passed, its spawner's live children forked within it
    /// kept instead (one pass over the live processes, when a window passed).
    pub(super) fn forget_gone(&mut self, graph: &LineageGraph, now: u64) {
        self.respawning.retain(|&id| graph.node(id).is_some());
        let alive = |id: NodeId| graph.node(id).is_some_and(Node::alive);
        self.forked_within.retain(|&id, _| alive(id));
        let respawning = &self.respawning;
        self.windows
            .retain(|w| graph.node(w.spawner).is_some() && !respawning.contains(&w.spawner));
        if self.windows.iter().all(|w| now < w.to) {
            return;
        }
        let (passed, open) = std::mem::take(&mut self.windows)
            .into_iter()
            .partition(|w| now >= w.to);
        self.windows = open;
        let mut by_spawner: HashMap<NodeId, Vec<Window>> = HashMap::default();
        for w in passed {
            by_spawner.entry(w.spawner).or_default().push(w);
        }
        for child in graph.alive() {
            let (Some(spawner), Some(forked)) = (child.spawner, child.forked_at) else {
                continue;
            };
            // Its argv is compared when it is judged: its exec may be yet to come.
            let windows = by_spawner.get(&spawner).into_iter().flatten();
            for w in windows.filter(|w| w.from < forked && forked < w.to) {
                let argvs = self.forked_within.entry(child.id).or_default();
                if !argvs.contains(&w.argv) {
                    argvs.push(w.argv.clone());
                }
            }
        }
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
        let forked = node.forked_at.unwrap_or(0);
        let within_passed =
            (self.forked_within.get(&node.id)).is_some_and(|argvs| argvs.contains(&node.argv));
        let within_open = self.windows.iter().any(|w| {
            w.spawner == spawner && w.argv == node.argv && w.from < forked && forked < w.to
        });
        match within_passed || within_open {
            true => {
                self.respawning.insert(spawner);
                Judged::Respawn(spawner)
            }
            false => Judged::NotARespawn,
        }
    }
}

/// [`RESPAWN_WINDOW`] in ns.
fn window_ns() -> u64 {
    u64::try_from(RESPAWN_WINDOW.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::decode::What;
    use crate::lineage::graph::testing::{fork, gateway, record};

    const SEC: u64 = 1_000_000_000;

    /// However many kills come after it, a kill's window is kept while it is open, and the
    /// children forked within it once it has passed, while they live; a window with none goes
    /// as it passes.
    #[test]
    fn a_kill_is_known_while_a_child_forked_within_its_window_lives() {
        // Pids above pid_max (32768 here): none is a real process.
        let (gw, supervisor, respawned) = (40_000, 40_001, 40_002);
        let mut graph = LineageGraph::new(16);
        graph.add_seed(gateway(gw));
        record(&mut graph, SEC, (supervisor, 1), fork(gw));
        record(&mut graph, 12 * SEC, (respawned, 2), fork(supervisor));
        let node = |graph: &LineageGraph, pid| graph.current(pid).unwrap().clone();
        let mut respawns = Respawns::default();
        // The supervisor's worker (the respawn's node stands in for it), killed at 10 s; then
        // 1,000 kills of the gateway's children, of another argv each, 100 ms apart.
        respawns.killed(&node(&graph, respawned), 10 * SEC);
        let mut helper = node(&graph, supervisor);
        for i in 0..1_000 {
            helper.argv = Args::from_list([format!("helper-{i}")]);
            respawns.killed(&helper, 11 * SEC + i * SEC / 10);
        }
        respawns.forget_gone(&graph, 50 * SEC);
        assert_eq!(
            respawns.windows.len(),
            1_001,
            "windows open: every kill kept"
        );
        // Every window passed: the gateway forked nothing within them, the supervisor did.
        respawns.forget_gone(&graph, 200 * SEC);
        assert!(respawns.windows.is_empty());
        assert_eq!(
            respawns.forked_within.len(),
            1,
            "only the live child forked within"
        );
        assert!(matches!(
            respawns.judge(&node(&graph, respawned)),
            Judged::Respawn(_)
        ));
        // Its spawner found respawning: its children are left alone from now on.
        assert!(matches!(
            respawns.judge(&node(&graph, respawned)),
            Judged::LeftAlone
        ));
    }

    /// Kills of one argv close together are one window; a child forked within one that has
    /// passed is let go when it exits.
    #[test]
    fn kills_close_together_are_one_window_and_its_children_go_when_they_exit() {
        let (gw, supervisor, child) = (40_000, 40_001, 40_002);
        let mut graph = LineageGraph::new(16);
        graph.add_seed(gateway(gw));
        record(&mut graph, SEC, (supervisor, 1), fork(gw));
        record(&mut graph, 12 * SEC, (child, 2), fork(supervisor));
        let worker = graph.current(child).unwrap().clone();
        let mut respawns = Respawns::default();
        for i in 0..100 {
            respawns.killed(&worker, 10 * SEC + i * SEC);
        }
        assert_eq!(respawns.windows.len(), 1);
        respawns.forget_gone(&graph, 200 * SEC);
        assert_eq!(respawns.forked_within.len(), 1);
        record(&mut graph, 220 * SEC, (child, 2), What::Exit { status: 0 });
        respawns.forget_gone(&graph, 230 * SEC);
        assert!(respawns.forked_within.is_empty());
    }
}
