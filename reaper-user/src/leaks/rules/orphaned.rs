//! `orphaned`: a process on its spawn chain between the gateway and it (the gateway included)
//! exited, and it still holds a channel `--orphan-grace` later: its spawning session ended
//! while it still holds open pipes or sockets (the setsid-escaped grandchild, the worker whose
//! agent was SIGKILLed, every server of a Node host that was killed). The rule waits on each
//! break ([`Breaks`]): from when the exit let go of its files, for the grace, then asks the
//! inspector for one look.
//!
//! Where its agent session has an owner above it (a per-session process whose exit ends the
//! session, see `graph::session`), a break inside the running session is no leak (a double
//! fork's middle process exiting, a wrapper gone): the break is the owner's exit, the end of
//! the session, and the flag names it. Without one (no session variable, or a server that a
//! gateway started with the value, whose session is its own) the rule is the chain's, as
//! above.
use std::time::Duration;

use rustc_hash::FxHashMap as HashMap;

use super::{About, Observed, Reason, Why};
use crate::lineage::graph::session::SessionsOf;
use crate::lineage::graph::{LineageGraph, Node, NodeId};
use crate::stream::words::{human_duration, thread_text, who};

pub const ABOUT: About = About {
    reason: Reason::Orphaned,
    killable: true,
    counts_a_kind: false,
    live: Some(rule),
    cleared: |_| "holds no pipe or socket to another process now",
    why,
};

/// Its spawn chain broke at least `--orphan-grace` ago and it still holds a channel (it can
/// still be waiting on, or keeping open, a channel of a session that is gone). One that exits
/// within the grace (a server reading EOF when its host crashed) never holds. `Some(now)`: it
/// holds from the look that confirmed it (`--kill`'s `--grace` counts from the flag's write,
/// a moment later: see `Killer::decide`).
fn rule(o: &Observed) -> Option<u64> {
    let broke = o.broken_since?;
    (o.holds_channel && o.now.saturating_sub(broke) >= o.orphan_grace).then_some(o.now)
}

/// How long a spawner's exit may take to let go of its files before its orphans are judged
/// anyway (a process stuck in its exit, for one).
const EXIT_SETTLE_CAP: Duration = Duration::from_secs(10);

/// The breaks the rule waits on: for each watched process whose spawn chain broke, since when
/// (once the exit let go of its files) and whether the look at the grace's end was taken;
/// and when the earliest grace still running ends. Only broken chains are kept.
#[derive(Default)]
pub struct Breaks {
    broken: HashMap<NodeId, Break>,
    next_end: Option<u64>,
}

#[derive(Default)]
struct Break {
    /// The exit that broke it (a session's owner, or the nearest exited spawner).
    gone: Option<NodeId>,
    since: Option<u64>,
    looked: bool,
    /// An environment on its chain waits to be read: its session, so its break, is not
    /// known for now, and it is judged by no look.
    unsettled: bool,
}

impl Breaks {
    /// Starts a round of looks over the live descendants (see [`Breaks::due`]).
    pub fn begin_round(&mut self) {
        self.next_end = None;
    }

    /// Whether `node` is to be looked at now for this rule: its chain broke `grace` ns ago
    /// (counted once the exit let go of its files: until then the other ends the spawner
    /// held still poll open) and that look was not taken yet. `sessions` are `graph`'s, shared
    /// by the calls of one step of a round's plan (each spawn chain walked once a step).
    pub fn due<'g>(
        &mut self,
        graph: &'g LineageGraph,
        sessions: &mut SessionsOf<'g>,
        node: &Node,
        now: u64,
        grace: u64,
    ) -> bool {
        // An environment on its chain waits to be read: its session, so its break, is not
        // known yet. Judged once it is, the break it had kept (an exec that keeps a read
        // pending starts no grace over).
        if graph.session_unsettled(node.id) {
            if let Some(b) = self.broken.get_mut(&node.id) {
                b.unsettled = true;
            }
            return false;
        }
        let Some(gone) = break_of(graph, sessions, node) else {
            self.broken.remove(&node.id);
            return false;
        };
        let b = self.broken.entry(node.id).or_default();
        b.unsettled = false;
        // Another exit breaks it now (its session became known): its grace counts from that.
        if b.gone != Some(gone.id) {
            *b = Break {
                gone: Some(gone.id),
                ..Break::default()
            };
        }
        if b.since.is_none() && exit_settled(gone, now) {
            b.since = Some(gone.exited.map_or(now, |e| e.ts));
        }
        let Some(end) = b.since.map(|since| since.saturating_add(grace)) else {
            return false;
        };
        match (b.looked, now >= end) {
            (true, _) => false,
            (false, true) => {
                b.looked = true;
                true
            }
            (false, false) => {
                self.next_end = Some(self.next_end.map_or(end, |t| t.min(end)));
                false
            }
        }
    }

    /// Since when `id`'s chain counts as broken (none while its session is not known).
    pub fn since(&self, id: NodeId) -> Option<u64> {
        self.broken
            .get(&id)
            .filter(|b| !b.unsettled)
            .and_then(|b| b.since)
    }

    /// When the earliest grace still running ends (boot-time ns): the scan is moved there, so
    /// a confirmed orphan is flagged then, not a scan interval later.
    pub fn next_look(&self) -> Option<u64> {
        self.next_end
    }

    /// `id` ended.
    pub fn forget(&mut self, id: NodeId) {
        self.broken.remove(&id);
    }
}

/// Where `node`'s spawn chain counts as broken for this rule, once it is: the exit of its
/// session's owner, where one is seen above it (nothing before: a break inside a running
/// session is no leak); else the nearest exited process on its chain.
fn break_of<'g>(
    graph: &'g LineageGraph,
    sessions: &mut SessionsOf<'g>,
    node: &Node,
) -> Option<&'g Node> {
    let session = sessions.of(node.id);
    let owner = session.and_then(|s| sessions.owner(&s).filter(|o| o.id != node.id));
    match owner {
        Some(owner) => owner.exited.is_some().then_some(owner),
        None => graph.exited_spawner(node.id),
    }
}

/// Whether the exited spawner `gone` has let go of the channels it held, so that its orphans
/// are judged on what is left.
fn exit_settled(gone: &Node, now: u64) -> bool {
    let exited = gone.exited.map_or(now, |e| e.ts);
    let cap = u64::try_from(EXIT_SETTLE_CAP.as_nanos()).unwrap_or(u64::MAX);
    gone.process().exit_settled() || now.saturating_sub(exited) >= cap
}

/// The end of its session, when it was judged by it; else the nearest member of its chain
/// that exited, and when.
fn why(w: &Why) -> String {
    let detail = w.detail;
    if let Some(session) = &detail.session
        && let (Some(owner), Some(ended)) = (session.owner, session.ended)
    {
        let owner = match detail.ancestors.iter().find(|a| a.process.pid == owner) {
            Some(a) => who(owner, &a.process.comm, &a.process.argv),
            None => owner.to_string(),
        };
        return format!(
            "its session {} ended {} ago (its owner {owner} exited)",
            session.id.for_terminal(),
            human_duration(w.ts.saturating_sub(ended))
        );
    }
    detail
        .ancestors
        .iter()
        .rev()
        .skip(1)
        .enumerate()
        .find_map(|(up, a)| {
            let exited = a.exited?;
            Some(format!(
                "{} {}{} exited {} ago",
                if up == 0 { "spawner" } else { "ancestor" },
                who(a.process.pid, &a.process.comm, &a.process.argv),
                match up {
                    0 => thread_text(detail.thread.as_ref()),
                    _ => String::new(),
                },
                human_duration(w.ts.saturating_sub(exited))
            ))
        })
        .unwrap_or_else(|| "its spawner exited".into())
}

#[cfg(test)]
mod tests {
    use super::super::tests::{SEC, waiting};
    use super::*;
    use crate::capture::decode::What;
    use crate::lineage::graph::testing::{fork, gateway, record};

    /// Pids above `pid_max` (32768 here): the exited one is gone from /proc, so its exit has
    /// let go of its files.
    const GATEWAY: u32 = 40_000;

    #[test]
    fn a_break_asks_for_one_look_once_its_grace_is_over() {
        let mut g = LineageGraph::new(100);
        g.add_seed(gateway(GATEWAY));
        let (spawner, helper) = (GATEWAY + 1, GATEWAY + 2);
        record(&mut g, 1, (spawner, 1), fork(GATEWAY));
        record(&mut g, 2, (helper, 2), fork(spawner));
        let node = g.current(helper).unwrap().clone();
        let (mut breaks, grace) = (Breaks::default(), 2 * SEC);
        breaks.begin_round();
        assert!(
            !breaks.due(&g, &mut g.sessions_of(), &node, 5 * SEC, grace),
            "its chain is whole"
        );
        assert_eq!((breaks.since(node.id), breaks.next_look()), (None, None));

        record(&mut g, 10 * SEC, (spawner, 1), What::Exit { status: 0 });
        breaks.begin_round();
        assert!(
            !breaks.due(&g, &mut g.sessions_of(), &node, 11 * SEC, grace),
            "within the grace"
        );
        assert_eq!(breaks.since(node.id), Some(10 * SEC));
        assert_eq!(breaks.next_look(), Some(12 * SEC));
        breaks.begin_round();
        assert!(
            breaks.due(&g, &mut g.sessions_of(), &node, 12 * SEC, grace),
            "the grace is over"
        );
        breaks.begin_round();
        assert!(
            !breaks.due(&g, &mut g.sessions_of(), &node, 13 * SEC, grace),
            "looked at once"
        );
        assert_eq!(breaks.next_look(), None);
        breaks.forget(node.id);
        assert_eq!(breaks.since(node.id), None);
    }

    #[test]
    fn orphaned_needs_a_broken_chain_and_a_channel() {
        assert_eq!(rule(&waiting(true, 0, None, true)), Some(100 * SEC));
        assert_eq!(rule(&waiting(true, 0, None, false)), None);
        let only_plumbing = Observed {
            holds_channel: false,
            ..waiting(true, 0, None, true)
        };
        assert_eq!(rule(&only_plumbing), None);
    }

    #[test]
    fn a_server_still_exiting_within_the_grace_is_not_orphaned() {
        let just_broken = Observed {
            broken_since: Some(99 * SEC),
            ..waiting(true, 0, None, true)
        };
        assert_eq!(rule(&just_broken), None, "broken 1 s ago, grace 2 s");
        let confirmed = Observed {
            now: 101 * SEC,
            ..just_broken
        };
        assert_eq!(rule(&confirmed), Some(101 * SEC), "still holding at 2 s");
    }
}
