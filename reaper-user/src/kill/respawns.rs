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
/// How long after a window's end it is taken as passed: the records of forks made just
/// before its end are read by then, unless the ring lags by more than that.
const PASSED_AFTER: Duration = Duration::from_secs(10);

/// One spawner's children of one argv.
type Key = (NodeId, Args);

/// A time after kills of a [`Key`]'s children in which a child the spawner forks with that
/// argv is a respawn: the kills' windows, merged where they overlap (boot-time ns, both ends
/// excluded).
#[derive(Clone, Copy)]
struct Window {
    from: u64,
    to: u64,
}

impl Window {
    fn holds(self, forked: u64) -> bool {
        self.from < forked && forked < self.to
    }
}

/// A window that has passed, kept while a child its spawner forked within it lives that may
/// yet be judged a respawn of it (its argv the window's, or not exec'd yet): `witness`, one
/// such child (looked for again when it is gone or runs another argv).
struct Passed {
    window: Window,
    witness: NodeId,
}

/// The kills remembered and the spawners found respawning. A respawn is judged once its own
/// flag has held for the grace, which can be long after its fork (its first look, a long
/// `--grace`): a window is kept while it is open, then while a child forked within it lives.
/// So what is kept is bounded by the kills of a minute (each window once, whatever the
/// children) and by the live processes, however many kills a day brings; each kill and each
/// judgement is a look-up, and the graph is walked once in a round, only when a window passed
/// or a witness is gone.
#[derive(Default)]
pub(super) struct Respawns {
    open: HashMap<Key, Vec<Window>>,
    passed: HashMap<Key, Vec<Passed>>,
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
        let to = at.saturating_add(ns(RESPAWN_WINDOW));
        let windows = self.open.entry((spawner, node.argv.clone())).or_default();
        // Kills are reported in the order their sequences end, not begin: merged either way.
        match windows.iter_mut().find(|w| w.from < to && at < w.to) {
            Some(open) => {
                open.from = open.from.min(at);
                open.to = open.to.max(to);
            }
            None => windows.push(Window { from: at, to }),
        }
    }

    /// Lets go of what can be judged a respawn no more at boot-time `now`: what the graph no
    /// longer holds, the kills of spawners found respawning (their children are judged no
    /// more), and each window that has passed with no child forked within it alive.
    pub(super) fn forget_gone(&mut self, graph: &LineageGraph, now: u64) {
        self.respawning.retain(|&id| graph.holds(id));
        let respawning = &self.respawning;
        let kept = |&(spawner, _): &Key| graph.holds(spawner) && !respawning.contains(&spawner);
        self.open.retain(|key, _| kept(key));
        self.passed.retain(|key, _| kept(key));
        // A child that may yet be judged a respawn of `key`'s kills.
        let may_respawn =
            |n: &Node, (_, argv): &Key| n.alive() && (n.argv == *argv || n.execs == 0);
        let passed_at = now.saturating_sub(ns(PASSED_AFTER));
        let mut to_witness: Vec<(Key, Window)> = Vec::new();
        self.open.retain(|key, windows| {
            windows.retain(|w| match passed_at >= w.to {
                true => {
                    to_witness.push((key.clone(), *w));
                    false
                }
                false => true,
            });
            !windows.is_empty()
        });
        self.passed.retain(|key, windows| {
            let witnessed = |p: &Passed| graph.node(p.witness).is_some_and(|n| may_respawn(n, key));
            windows.retain(|p| match witnessed(p) {
                true => true,
                false => {
                    to_witness.push((key.clone(), p.window));
                    false
                }
            });
            !windows.is_empty()
        });
        if to_witness.is_empty() {
            return;
        }
        // One pass over the graph: the live children of the spawners concerned, by fork time.
        let spawners: HashSet<NodeId> = to_witness.iter().map(|((s, _), _)| *s).collect();
        let mut forks: HashMap<NodeId, Vec<(u64, &Node)>> = HashMap::default();
        for child in graph.alive() {
            if let (Some(spawner), Some(forked)) = (child.spawner, child.forked_at)
                && spawners.contains(&spawner)
            {
                forks.entry(spawner).or_default().push((forked, child));
            }
        }
        for children in forks.values_mut() {
            children.sort_unstable_by_key(|&(forked, child)| (forked, child.id));
        }
        for (key, window) in to_witness {
            let Some(children) = forks.get(&key.0) else {
                continue;
            };
            // The children forked within the window: the first that may yet respawn is its
            // witness.
            let from = children.partition_point(|&(forked, _)| forked <= window.from);
            let mut within =
                (children[from..].iter()).take_while(|&&(forked, _)| window.holds(forked));
            if let Some(&(_, witness)) = within.find(|&&(_, n)| may_respawn(n, &key)) {
                let witness = witness.id;
                self.passed
                    .entry(key)
                    .or_default()
                    .push(Passed { window, witness });
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
        let key = (spawner, node.argv.clone());
        let open = self.open.get(&key).into_iter().flatten();
        let passed = self.passed.get(&key).into_iter().flatten();
        let again = open
            .copied()
            .chain(passed.map(|p| p.window))
            .any(|w| w.holds(forked));
        match again {
            true => {
                self.respawning.insert(spawner);
                Judged::Respawn(spawner)
            }
            false => Judged::NotARespawn,
        }
    }
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::decode::What;
    use crate::lineage::graph::testing::{record, supervised};

    const SEC: u64 = 1_000_000_000;

    /// However many kills come after it, a kill's window is kept while it is open, then while
    /// a child forked within it lives; a window with none goes as it passes. A child forked
    /// within it with another argv is no respawn.
    #[test]
    fn a_kill_is_known_while_a_child_forked_within_its_window_lives() {
        let (supervisor, respawned, other) = (40_001, 40_002, 40_003);
        let graph = supervised(&[(respawned, 12 * SEC), (other, 13 * SEC)]);
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
        assert_eq!(respawns.open.len(), 1_001, "windows open: every kill kept");
        // Every window passed: the gateway forked nothing within them, the supervisor did.
        respawns.forget_gone(&graph, 200 * SEC);
        assert!(respawns.open.is_empty());
        assert_eq!(
            respawns.passed.len(),
            1,
            "only the window a live child was forked in"
        );
        let mut stranger = node(&graph, other);
        stranger.argv = Args::from_list(["another"]);
        assert!(matches!(respawns.judge(&stranger), Judged::NotARespawn));
        assert!(matches!(
            respawns.judge(&node(&graph, respawned)),
            Judged::Respawn(_)
        ));
        // Its spawner found respawning: its children are left alone, and its kills go.
        assert!(matches!(respawns.judge(&stranger), Judged::LeftAlone));
        respawns.forget_gone(&graph, 201 * SEC);
        assert!(respawns.passed.is_empty());
    }

    /// Kills of one argv close together are one window; once it has passed, it goes with the
    /// last child forked within it.
    #[test]
    fn kills_close_together_are_one_window_that_goes_with_its_last_child() {
        let (first, second) = (40_002, 40_003);
        let mut graph = supervised(&[(first, 12 * SEC), (second, 14 * SEC)]);
        let worker = graph.current(first).unwrap().clone();
        let mut respawns = Respawns::default();
        for i in 0..100 {
            respawns.killed(&worker, 10 * SEC + i * SEC);
        }
        // One whose sequence began earlier, reported later: merged too.
        respawns.killed(&worker, 5 * SEC);
        assert_eq!(respawns.open.values().flatten().count(), 1);
        respawns.forget_gone(&graph, 200 * SEC);
        assert_eq!(respawns.passed.values().flatten().count(), 1);
        // Its witness exits: another child forked within it keeps it.
        record(&mut graph, 220 * SEC, (first, 2), What::Exit { status: 0 });
        respawns.forget_gone(&graph, 230 * SEC);
        assert_eq!(respawns.passed.values().flatten().count(), 1);
        record(&mut graph, 240 * SEC, (second, 3), What::Exit { status: 0 });
        respawns.forget_gone(&graph, 250 * SEC);
        assert!(respawns.passed.is_empty());
    }
}
