//! Keeping the graph exact while tracing, off the event path: the children of an exited
//! process read back once the kernel reparented them, processes the kernel does not follow
//! (forked while its tracked map was full) watched in /proc, zombies whose kernel free lags
//! recorded from /proc, and, after a loss, the graph repaired from /proc and the kernel's
//! tracked map. Each step returns what it learnt as events (`reparent`, `exit`, `reaped` with
//! `from_proc`, `snapshot`, `lost`) for output to write.
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use reaper_common::EventKind;
use rustc_hash::FxHashSet as HashSet;

use super::graph::{Change, LineageGraph, NodeId, Seed};
use super::seed::{TrackedMap, seed_of};

use crate::capture::loader::LossCounts;
use crate::procfs::{self, boottime_now, placement};
use crate::stream::{
    Stamped,
    events::{Argv, Event, Exit, Lost, ProcText, Reaped, Reparent, Snapshot},
};

/// How long to wait for the kernel to reparent the children of an exited process.
const REPARENT_PATIENCE: Duration = Duration::from_secs(2);

/// How long after an exit the kernel's free may take before a zombie gone from /proc is
/// recorded as reaped from /proc instead (normally the free comes within milliseconds).
pub const FREE_LAG: Duration = Duration::from_secs(1);

/// A child whose parent exited; its new parent is read from /proc once the kernel set it.
struct PendingReparent {
    node: NodeId,
    pid: u32,
    old_ppid: u32,
    since: Instant,
}

/// What the upkeep still has to look at.
#[derive(Default)]
pub struct Upkeep {
    /// Loss counters as last reported.
    reported_losses: LossCounts,
    /// Pids to re-read from /proc (events about processes the graph did not know).
    resync_pids: HashSet<u32>,
    /// Everything is to be re-read from /proc at the next check: a restart took back a
    /// lineage that lacks what the run before took in after its last checkpoint.
    resync_all: bool,
    /// Children forked while the tracked map was full, not yet reported in a `lost` event.
    untracked_children: Vec<u32>,
    /// Live processes the kernel does not follow: their end is learnt from /proc.
    unfollowed: HashSet<NodeId>,
    pending_reparents: Vec<PendingReparent>,
    /// The zombie (its exit time and node) whose release was the last looked for: the next
    /// turn goes on after it (see [`Upkeep::check_released`]).
    released_cursor: Option<(u64, NodeId)>,
}

/// Zombies looked for in /proc a turn, at most.
const RELEASE_READS: usize = 32;

/// Up to `cap` of the zombies `zombies()` gives (each its exit time and node, in exit order),
/// those after `cursor` in that order first, then from the first: each in its turn. Split by
/// place, not by exit time, as the order is nearly sorted only (two CPUs' exits a few
/// microseconds apart): after the cursor's own place, or where a zombie that exited later
/// than it begins when it was reaped since.
fn in_turn<I: Iterator<Item = (u64, NodeId)>>(
    zombies: impl Fn() -> I,
    cursor: Option<(u64, NodeId)>,
    cap: usize,
) -> Vec<(u64, NodeId)> {
    let after = cursor.map_or(0, |cursor| {
        (zombies().position(|z| z.1 == cursor.1).map(|at| at + 1))
            .or_else(|| zombies().position(|z| z > cursor))
            .unwrap_or(usize::MAX)
    });
    let mut chosen: Vec<(u64, NodeId)> = zombies().skip(after).take(cap).collect();
    let left = cap - chosen.len();
    chosen.extend(zombies().take(after).take(left));
    chosen
}

impl Upkeep {
    /// Goes on from a checkpoint: `reported` losses are not reported again; `resync`: the
    /// graph lacks records the run before took in (re-read from /proc at the next check,
    /// after the ring was drained).
    pub fn resume(&mut self, reported: LossCounts, resync: bool) {
        self.reported_losses = reported;
        self.resync_all = resync;
    }

    /// Losses reported so far (for a checkpoint).
    pub fn reported_losses(&self) -> LossCounts {
        self.reported_losses
    }

    /// What a record's change to `graph` leaves to check later: a process the graph did not
    /// know (re-read from /proc at the next check), one the kernel will not follow, the live
    /// children of an exit.
    pub fn on_change(&mut self, graph: &LineageGraph, change: &Change, pid: u32) {
        match change {
            Change::Unknown { pid } => {
                self.resync_pids.insert(*pid);
            }
            Change::Forked {
                node,
                untracked: true,
                ..
            } => {
                self.untracked_children.push(pid);
                self.unfollowed.insert(*node);
            }
            Change::Exited { orphans, .. } => self.orphaned(graph, orphans),
            _ => {}
        }
    }

    /// The live children of an exited process, whose new parents are to be read back.
    fn orphaned(&mut self, graph: &LineageGraph, orphans: &[NodeId]) {
        if orphans.is_empty() {
            return;
        }
        let since = Instant::now();
        for &orphan in orphans {
            if let Some(n) = graph.node(orphan) {
                self.pending_reparents.push(PendingReparent {
                    node: orphan,
                    pid: n.pid,
                    old_ppid: n.ppid,
                    since,
                });
            }
        }
    }

    /// Records the release of zombies that are gone from /proc although their kernel free has
    /// not arrived: the kernel frees a reaped task only after an RCU grace period, which lags
    /// by seconds or more on some kernels (seen here: frees not fired 95 s after the reap, for
    /// a kernel tracepoint of its own as much as for reaper's). A late free is then ignored.
    ///
    /// `min_age`: how long ago the exit must be ([`FREE_LAG`] while tracing; zero once the
    /// probes are detached, since no free can come any more).
    ///
    /// At most [`RELEASE_READS`] zombies are read a turn (a leak scan), taken in turns (those
    /// after the last read first, then from the oldest): a process that leaves thousands of
    /// children unreaped costs the reader a few reads a turn, not thousands, and each zombie
    /// is looked at again within a turn for every [`RELEASE_READS`] of them (while no more
    /// than that come of age each turn); with fewer, every one is looked at every turn. Zombies are walked in the order they exited, up to
    /// the first too young to look at.
    pub fn check_released(&mut self, graph: &mut LineageGraph, min_age: Duration) -> Vec<Stamped> {
        if graph.zombie_count() == 0 {
            self.released_cursor = None;
            return Vec::new(); // the common case: nothing to walk
        }
        let now = boottime_now();
        let settled = now.saturating_sub(min_age.as_nanos() as u64);
        // The probes detached: no free can come, every zombie is looked at now.
        let cap = match min_age.is_zero() {
            true => usize::MAX,
            false => RELEASE_READS,
        };
        let old_enough = || {
            (graph.zombies())
                .filter_map(|n| Some((n.exited.as_ref()?.ts, n.id)))
                // The rest exited later (but for exits a few microseconds apart on two
                // CPUs, looked at on the next turn).
                .take_while(|&(ts, _)| ts <= settled)
        };
        let this_turn = in_turn(old_enough, self.released_cursor, cap);
        self.released_cursor = this_turn.last().copied();
        let lagging: Vec<NodeId> = (this_turn.iter())
            .filter_map(|&(_, id)| graph.node(id))
            .filter(|n| n.process().still_same().is_none())
            .map(|n| n.id)
            .collect();
        let mut found = Vec::new();
        for id in lagging {
            report_gone(graph, id, &mut found);
        }
        found
    }

    /// Reads the new parents of children whose parent exited. The kernel reparents them a
    /// little after the exit event, so a child still showing its old parent is retried.
    pub fn check_reparents(&mut self, graph: &mut LineageGraph) -> Vec<Stamped> {
        let pending = std::mem::take(&mut self.pending_reparents);
        let mut found = Vec::new();
        for p in pending {
            let Some(node) = graph.node(p.node) else {
                continue;
            };
            if !node.alive() {
                continue;
            }
            let Some(stat) = node.process().still_same() else {
                continue; // gone: its own exit event tells the rest
            };
            if stat.ppid == p.old_ppid {
                if p.since.elapsed() < REPARENT_PATIENCE {
                    self.pending_reparents.push(p);
                }
                continue;
            }
            graph.reparent(p.node, stat.ppid);
            let ev = Event::Reparent(Reparent {
                pid: p.pid,
                old_ppid: p.old_ppid,
                new_ppid: stat.ppid,
            });
            found.push(Stamped::new(boottime_now(), ev));
        }
        found
    }

    /// Looks in /proc for the processes the kernel does not follow; reports those that are
    /// gone as exited and reaped (status unknown).
    pub fn check_unfollowed(&mut self, graph: &mut LineageGraph) -> Vec<Stamped> {
        let watched: Vec<NodeId> = self.unfollowed.iter().copied().collect();
        let mut found = Vec::new();
        for id in watched {
            let Some(node) = graph.node(id) else {
                self.unfollowed.remove(&id);
                continue;
            };
            if node.process().still_same().is_none() {
                self.unfollowed.remove(&id);
                report_gone(graph, id, &mut found);
            }
        }
        found
    }

    pub fn has_pending_reparents(&self) -> bool {
        !self.pending_reparents.is_empty()
    }

    /// Compares the kernel's loss counters with what was reported; on a new loss, reports it
    /// and repairs the graph from /proc and the kernel's tracked map.
    ///
    /// `now` must be read *before* the ring was last drained: the kernel counts a child it
    /// could not track after submitting the record that names it, so every record a count
    /// stands for has been taken in by then.
    pub fn check_losses(
        &mut self,
        graph: &mut LineageGraph,
        now: LossCounts,
        tracked: &TrackedMap,
    ) -> Vec<Stamped> {
        let new_drops = now.dropped() - self.reported_losses.dropped();
        let new_full = now.tracked_full - self.reported_losses.tracked_full;
        if new_drops == 0 && new_full == 0 && self.resync_pids.is_empty() && !self.resync_all {
            return Vec::new();
        }
        let mut kinds = BTreeMap::new();
        for kind in EventKind::ALL {
            let i = kind.loss_slot() as usize;
            let n = now.kinds[i] - self.reported_losses.kinds[i];
            if n > 0 {
                kinds.insert(kind.name().into(), n);
            }
        }
        if new_full > 0 {
            kinds.insert("tracked_full".into(), new_full);
        }
        self.reported_losses = now;
        let mut found = Vec::new();
        let resync = new_drops > 0 || !self.resync_pids.is_empty() || self.resync_all;
        self.resync_all = false;
        let mut affected = if resync {
            self.resync(graph, tracked, &mut found)
        } else {
            Vec::new()
        };
        affected.append(&mut self.untracked_children);
        affected.sort_unstable();
        affected.dedup();
        if new_drops == 0 && new_full == 0 {
            return found; // a late event for a process already repaired: nothing was lost
        }
        let ev = Event::Lost(Lost {
            count: new_drops + new_full,
            kinds,
            affected,
        });
        found.push(Stamped::new(boottime_now(), ev));
        found
    }

    /// Re-reads from /proc every process the kernel tracks or the graph thinks alive, and
    /// fixes the graph: processes it missed are added (as `snapshot`s, marked uncertain: their
    /// lineage edge is only their parent at that moment), processes that are gone are marked
    /// exited and reaped, each added to `found`. Returns the pids it touched.
    fn resync(
        &mut self,
        graph: &mut LineageGraph,
        tracked: &TrackedMap,
        found: &mut Vec<Stamped>,
    ) -> Vec<u32> {
        let mut affected = Vec::new();
        let kernel_pids: Vec<u32> = tracked.keys().filter_map(|k| k.ok()).collect();
        let mut seeds = Vec::new();
        let asked: Vec<u32> = self.resync_pids.drain().collect();
        for pid in kernel_pids.into_iter().chain(asked) {
            let Ok(stat) = procfs::read_stat(pid) else {
                continue;
            };
            let known = graph
                .current(pid)
                .is_some_and(|n| n.alive() && n.process().matches(&stat));
            if !known && stat.state != b'Z' {
                seeds.push(Seed {
                    uncertain: true,
                    ..seed_of(&stat, false)
                });
            }
        }
        // Parents first, so that lineage edges find their parent node.
        seeds.sort_by_key(|s| s.start_ticks);
        for seed in seeds {
            let pid = seed.pid;
            let (id, new) = graph.add_seed(seed);
            if new {
                found.extend(snapshot(graph, id));
            }
            affected.push(pid);
        }
        // Processes the graph holds alive that are gone (their exit was lost).
        let stale: Vec<(NodeId, u32)> = graph
            .alive()
            .filter(|n| n.process().still_same().is_none())
            .map(|n| (n.id, n.pid))
            .collect();
        for (id, pid) in stale {
            report_gone(graph, id, found);
            affected.push(pid);
        }
        affected
    }
}

/// Marks a process that vanished from /proc unseen as reaped (and, if it was thought alive,
/// exited, status unknown); adds the events that say so to `found`.
fn report_gone(graph: &mut LineageGraph, id: NodeId, found: &mut Vec<Stamped>) {
    let Some((pid, was_alive)) = graph.node(id).map(|n| (n.pid, n.alive())) else {
        return;
    };
    let now = boottime_now();
    graph.mark_gone(id, now);
    if was_alive {
        let exit = Event::Exit(Exit {
            pid,
            exit_code: None,
            signal: None,
            core: false,
        });
        found.push(Stamped::new(now, exit));
    }
    let reaped = Event::Reaped(Reaped {
        pid,
        from_proc: true,
    });
    found.push(Stamped::new(now, reaped));
}

/// A process newly added to the graph from /proc, as a `snapshot` event.
pub fn snapshot(graph: &LineageGraph, id: NodeId) -> Option<Stamped> {
    let n = graph.node(id)?;
    let ev = Event::Snapshot(Snapshot {
        pid: n.pid,
        start: n.start.boottime_ns(),
        ppid: n.ppid,
        spawner: n.spawner_pid,
        comm: ProcText::new("comm", n.comm),
        argv: Argv::new(n.argv.clone()),
        sid: n.sid,
        pgid: n.pgid,
        placement: placement::read(n.pid),
    });
    Some(Stamped::new(boottime_now(), ev))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::decode::What;
    use crate::identity::ticks_per_second;
    use crate::lineage::graph::testing::record;

    /// Zombies are taken in turns, `cap` a turn: those after the last taken first, then from
    /// the first; with no more than `cap`, every one every turn.
    #[test]
    fn zombies_are_looked_at_in_turns_of_at_most_the_cap() {
        let zombies: Vec<(u64, NodeId)> = (1..=10).map(|i| (i * 100, i)).collect();
        let all = || zombies.iter().copied();
        let ids = |t: &[(u64, NodeId)]| t.iter().map(|&(_, id)| id).collect::<Vec<_>>();
        let first = in_turn(all, None, 4);
        assert_eq!(ids(&first), [1, 2, 3, 4]);
        let second = in_turn(all, first.last().copied(), 4);
        assert_eq!(ids(&second), [5, 6, 7, 8]);
        let third = in_turn(all, second.last().copied(), 4);
        assert_eq!(ids(&third), [9, 10, 1, 2], "then from the first");
        // The last one taken reaped since: the turn goes on after where it was.
        let fourth = in_turn(|| all().filter(|&(_, id)| id != 2), Some((200, 2)), 4);
        assert_eq!(ids(&fourth), [3, 4, 5, 6]);
        let few = in_turn(|| all().take(3), Some((200, 2)), 4);
        assert_eq!(ids(&few), [3, 1, 2], "fewer than the cap: every one");
        let gone_last = in_turn(|| all().take(3), Some((1000, 10)), 4);
        assert_eq!(ids(&gone_last), [1, 2, 3], "after the last: from the first");
    }

    /// Two exits recorded out of their time order (two CPUs a few microseconds apart) where a
    /// turn ends: the one recorded after the cursor is taken next, never skipped.
    #[test]
    fn a_zombie_recorded_out_of_time_order_still_comes_in_its_turn() {
        let mut zombies: Vec<(u64, NodeId)> = (1..=5).map(|i| (i * 100, i)).collect();
        zombies.swap(2, 3); // 4 (at 400) recorded before 3 (at 300)
        let all = || zombies.iter().copied();
        let ids = |t: &[(u64, NodeId)]| t.iter().map(|&(_, id)| id).collect::<Vec<_>>();
        let first = in_turn(all, None, 3);
        assert_eq!(ids(&first), [1, 2, 4]);
        let second = in_turn(all, first.last().copied(), 3);
        assert_eq!(ids(&second), [3, 5, 1]);
    }

    /// Forty processes the graph holds as zombies (their exits recorded long ago) that /proc
    /// still shows are not reported; once reaped (here by this test) and the probes detached,
    /// every one is, in one turn.
    #[test]
    fn zombies_gone_from_proc_are_reported_reaped_and_those_it_shows_are_not() {
        /// Killed and waited for however the test ends.
        struct Children(Vec<std::process::Child>);
        impl Drop for Children {
            fn drop(&mut self) {
                for child in &mut self.0 {
                    let _ = child.kill();
                    let _ = child.wait();
                }
            }
        }
        let children = Children(
            (0..40)
                .map(|_| {
                    std::process::Command::new("sleep")
                        .arg("600")
                        .spawn()
                        .unwrap()
                })
                .collect(),
        );
        let mut g = LineageGraph::new(100);
        for child in &children.0 {
            let stat = procfs::read_stat(child.id()).unwrap();
            g.add_seed(seed_of(&stat, false));
            let start = stat.start_ticks * (1_000_000_000 / ticks_per_second());
            record(&mut g, 1, (stat.pid, start), What::Exit { status: 0 });
        }
        assert_eq!(g.zombie_count(), 40);
        let mut upkeep = Upkeep::default();
        for _ in 0..3 {
            assert!(upkeep.check_released(&mut g, FREE_LAG).is_empty());
        }
        drop(children);
        let found = upkeep.check_released(&mut g, Duration::ZERO);
        let reaped = |s: &Stamped| matches!(&*s.event, Event::Reaped(r) if r.from_proc);
        assert_eq!(found.iter().filter(|s| reaped(s)).count(), 40, "{found:?}");
        assert_eq!(g.zombie_count(), 0);
    }
}
