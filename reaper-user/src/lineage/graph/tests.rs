//! The lineage graph's rules, one scenario each.
use super::*;
use crate::capture::decode::{KernelEvent, What};

fn ev(seq: u64, pid: u32, start: u64, what: What) -> KernelEvent {
    KernelEvent {
        seq,
        generation: 1,
        ts: seq * 1000,
        pid,
        start,
        what,
    }
}

fn fork(pid: u32, start: u64, spawner: u32, ppid: u32) -> KernelEvent {
    ev(0, pid, start, super::testing::fork_under(spawner, ppid))
}

fn gateway(g: &mut LineageGraph, pid: u32) -> NodeId {
    g.add_seed(super::testing::gateway(pid)).0
}

fn node_of(c: Change) -> NodeId {
    c.node().unwrap_or_else(|| panic!("not a new node: {c:?}"))
}

#[test]
fn escaped_grandchild_keeps_its_lineage_after_reparenting_to_init() {
    let mut g = LineageGraph::new(100);
    gateway(&mut g, 100);
    let child = node_of(g.apply(&fork(200, 5_000, 100, 100)));
    g.apply(&ev(1, 200, 5_000, What::Setsid { sid: 200 }));
    let grandchild = node_of(g.apply(&fork(300, 6_000, 200, 200)));
    let Change::Exited { orphans, .. } = g.apply(&ev(2, 200, 5_000, What::Exit { status: 0 }))
    else {
        panic!()
    };
    assert_eq!(orphans, vec![grandchild]);
    assert_eq!(g.reparent(grandchild, 1), Some(200));
    g.apply(&ev(3, 200, 5_000, What::Free));
    assert_eq!(g.lineage(grandchild), vec![100, 200, 300]);
    assert!(g.node(child).unwrap().called_setsid);
    assert_eq!(g.node(grandchild).unwrap().ppid, 1);
}

fn matched(pid: u32, start: u64) -> KernelEvent {
    ev(
        0,
        pid,
        start,
        What::Gateway {
            selector: 2,
            matched_at: reaper_common::MatchedAt::Exec,
            ppid: 1,
            sid: pid,
            pgid: pid,
            cgroup_id: 1,
            comm: Comm::from_c(b"hermes"),
        },
    )
}

#[test]
fn each_restarted_instance_is_a_root_of_its_own_lineage() {
    let mut g = LineageGraph::new(100);
    let first = node_of(g.apply(&matched(100, 1_000)));
    let leak = node_of(g.apply(&fork(200, 2_000, 100, 100)));
    g.apply(&ev(1, 100, 1_000, What::Exit { status: 0 }));
    // The restart reuses no pid here, but would be told apart by its start if it did.
    let second = node_of(g.apply(&matched(300, 3_000)));
    let leak2 = node_of(g.apply(&fork(400, 4_000, 300, 300)));
    assert_eq!(g.lineage(leak), vec![100, 200]);
    assert_eq!(g.lineage(leak2), vec![300, 400]);
    assert_eq!(
        g.gateways().map(|n| n.id).collect::<Vec<_>>(),
        vec![first, second]
    );
    assert!(!g.node(first).unwrap().alive());
    // A descendant that executes the gateway program becomes a root where it is.
    let inner = node_of(g.apply(&fork(500, 5_000, 400, 400)));
    assert_eq!(node_of(g.apply(&matched(500, 5_000))), inner);
    let below = node_of(g.apply(&fork(600, 6_000, 500, 500)));
    assert_eq!(g.lineage(below), vec![500, 600]);
    assert_eq!(g.gateways().count(), 3);
}

#[test]
fn clone_parent_child_has_spawner_edge_but_other_real_parent() {
    let mut g = LineageGraph::new(100);
    gateway(&mut g, 100);
    g.apply(&fork(200, 5_000, 100, 100));
    let sibling = node_of(g.apply(&fork(300, 6_000, 200, 100)));
    let n = g.node(sibling).unwrap();
    assert_eq!((n.spawner_pid, n.ppid), (Some(200), 100));
    assert_eq!(g.lineage(sibling), vec![100, 200, 300]);
}

#[test]
fn reused_pid_before_the_old_free_is_two_processes() {
    let mut g = LineageGraph::new(100);
    gateway(&mut g, 100);
    let old = node_of(g.apply(&fork(200, 5_000, 100, 100)));
    g.apply(&ev(1, 200, 5_000, What::Exit { status: 0 }));
    // The pid is released before sched_process_free fires: a new fork can come first.
    let new = node_of(g.apply(&fork(200, 9_000, 100, 100)));
    assert_ne!(old, new);
    g.apply(&ev(2, 200, 5_000, What::Free));
    assert!(g.node(old).unwrap().reaped_at.is_some());
    let n = g.node(new).unwrap();
    assert!(n.alive() && n.reaped_at.is_none());
    assert_eq!(g.current(200).unwrap().id, new);
}

#[test]
fn seeded_process_is_upgraded_by_its_fork_event_not_duplicated() {
    let mut g = LineageGraph::new(100);
    gateway(&mut g, 100);
    let (seeded, new) = g.add_seed(Seed {
        pid: 200,
        start_ticks: 12,
        ppid: 100,
        sid: 100,
        pgid: 100,
        comm: Comm::from_c(b"w"),
        argv: Args::none(),
        is_gateway: false,
        uncertain: false,
    });
    assert!(new);
    // 123_456_789 ns is tick 12 at 100 ticks per second.
    let id = node_of(g.apply(&fork(200, 123_456_789, 100, 100)));
    assert_eq!(id, seeded);
    assert_eq!(g.node(id).unwrap().start, Start::Exact(123_456_789));
    assert_eq!(g.len(), 2);
}

#[test]
fn events_for_unknown_processes_ask_for_a_resync() {
    let mut g = LineageGraph::new(100);
    assert_eq!(
        g.apply(&ev(0, 7, 1, What::Exit { status: 0 })),
        Change::Unknown { pid: 7 }
    );
}

#[test]
fn pruning_is_bounded_but_keeps_ancestors_of_live_processes() {
    let mut g = LineageGraph::new(2);
    gateway(&mut g, 100);
    g.apply(&fork(200, 5_000, 100, 100));
    let leaf = node_of(g.apply(&fork(300, 6_000, 200, 200)));
    g.apply(&ev(1, 200, 5_000, What::Exit { status: 0 }));
    g.apply(&ev(2, 200, 5_000, What::Free));
    // Many short-lived siblings come and go.
    for i in 0..50u32 {
        let pid = 1000 + i;
        let start = 10_000 + u64::from(i);
        g.apply(&fork(pid, start, 100, 100));
        g.apply(&ev(3, pid, start, What::Exit { status: 0 }));
        g.apply(&ev(4, pid, start, What::Free));
    }
    // gateway + dead spawner 200 + live leaf + at most 2 retained dead siblings.
    assert!(g.len() <= 5, "graph holds {} nodes", g.len());
    assert_eq!(g.lineage(leaf), vec![100, 200, 300]);
    // Once the leaf goes too, the dead chain can be pruned.
    g.apply(&ev(5, 300, 6_000, What::Exit { status: 0 }));
    g.apply(&ev(6, 300, 6_000, What::Free));
    for i in 0..5u32 {
        let pid = 2000 + i;
        g.apply(&fork(pid, 20_000 + u64::from(i), 100, 100));
        g.apply(&ev(7, pid, 20_000 + u64::from(i), What::Free));
    }
    assert!(g.current(200).is_none() && g.current(300).is_none());
}

#[test]
fn exit_status_and_zombie_state() {
    let mut g = LineageGraph::new(100);
    gateway(&mut g, 100);
    let id = node_of(g.apply(&fork(200, 5_000, 100, 100)));
    g.apply(&ev(1, 200, 5_000, What::Exit { status: 3 << 8 }));
    let n = g.node(id).unwrap();
    assert!(n.zombie() && !n.alive());
    assert_eq!(n.exited.unwrap().status, Some(0x300));
    assert_eq!(g.zombies().count(), 1);
    assert_counts(&g);
}

#[test]
fn a_multithreaded_process_reported_exiting_by_several_threads_exits_once() {
    let mut g = LineageGraph::new(100);
    gateway(&mut g, 100);
    let id = node_of(g.apply(&fork(200, 5_000, 100, 100)));
    let exit = |seq, ts| {
        let mut e = ev(seq, 200, 5_000, What::Exit { status: 9 });
        e.ts = ts;
        e
    };
    assert!(matches!(g.apply(&exit(1, 6_000)), Change::Exited { .. }));
    assert!(matches!(g.apply(&exit(2, 6_100)), Change::Duplicate));
    assert!(matches!(g.apply(&exit(3, 6_200)), Change::Duplicate));
    assert_eq!(
        g.node(id).unwrap().exited.unwrap().ts,
        6_000,
        "the first one"
    );
    assert_counts(&g);
}

#[test]
fn a_free_after_a_release_learnt_from_proc_is_a_duplicate() {
    let mut g = LineageGraph::new(100);
    gateway(&mut g, 100);
    let id = node_of(g.apply(&fork(200, 5_000, 100, 100)));
    g.apply(&ev(1, 200, 5_000, What::Exit { status: 0 }));
    g.mark_gone(id, 9_000);
    assert_eq!(g.node(id).unwrap().reaped_at, Some(9_000));
    assert!(
        !g.node(id).unwrap().uncertain,
        "its exit was seen: nothing guessed"
    );
    assert!(matches!(
        g.apply(&ev(2, 200, 5_000, What::Free)),
        Change::Duplicate
    ));
    assert_eq!(g.node(id).unwrap().reaped_at, Some(9_000));
    assert_counts(&g);
}

/// The kept counts agree with a walk of the graph.
fn assert_counts(g: &LineageGraph) {
    assert_eq!(g.live_count(), g.alive().count(), "live");
    let live_walked: Vec<NodeId> = (g.nodes.values().filter(|n| n.alive()))
        .map(|n| n.id)
        .collect();
    let live: Vec<NodeId> = g.alive().map(|n| n.id).collect();
    assert_eq!(live, live_walked, "the live nodes' bits");
    assert_eq!(g.zombie_count(), g.zombies().count(), "zombies");
    let walked: Vec<u32> = g
        .nodes
        .values()
        .filter(|n| n.is_gateway)
        .map(|n| n.pid)
        .collect();
    let kept: Vec<u32> = g.gateways().map(|n| n.pid).collect();
    assert_eq!(walked.len(), kept.len());
    assert!(walked.iter().all(|p| kept.contains(p)));
    let alive = g.gateways().filter(|n| n.alive()).count();
    assert_eq!(g.live_gateways(), alive, "live gateways");
}

#[test]
fn kept_counts_follow_every_state_change() {
    let mut g = LineageGraph::new(3);
    gateway(&mut g, 100);
    assert_counts(&g);
    for i in 0..20u32 {
        let (pid, start) = (1000 + i, 10_000 + u64::from(i));
        g.apply(&fork(pid, start, 100, 100));
        assert_counts(&g);
        match i % 4 {
            // exit then free; free without exit (lost exit); exit only (zombie); gone.
            0 => {
                g.apply(&ev(1, pid, start, What::Exit { status: 0 }));
                g.apply(&ev(2, pid, start, What::Free));
            }
            1 => {
                g.apply(&ev(2, pid, start, What::Free));
            }
            2 => {
                g.apply(&ev(1, pid, start, What::Exit { status: 0 }));
                g.apply(&ev(1, pid, start, What::Exit { status: 0 }));
            }
            _ => {
                let id = g.current(pid).unwrap().id;
                g.mark_gone(id, 5);
                g.mark_gone(id, 6);
            }
        }
        assert_counts(&g);
    }
    let id = g.current(1002).unwrap().id;
    g.set_gateway(id);
    g.set_gateway(id);
    assert_counts(&g);
    assert_eq!((g.live_count(), g.zombie_count()), (1, 5));
}

#[test]
fn a_saved_lineage_comes_back_through_a_dead_ancestor_and_forgets_dead_leaves() {
    let mut g = LineageGraph::new(100);
    gateway(&mut g, 100);
    let a = node_of(g.apply(&fork(200, 5_000, 100, 100)));
    let spawned_at = SpawnStack {
        native: Some(0x71),
        python: Some(0x93),
    };
    let mut c = fork(300, 6_000, 200, 200);
    if let What::Fork { stack, .. } = &mut c.what {
        *stack = spawned_at;
    }
    node_of(g.apply(&c));
    node_of(g.apply(&fork(400, 7_000, 100, 100)));
    // A exits (its child lives on); the other child exits and is reaped.
    g.apply(&ev(1, 200, 5_000, What::Exit { status: 0 }));
    g.apply(&ev(2, 400, 7_000, What::Exit { status: 0 }));
    g.apply(&ev(3, 400, 7_000, What::Free));
    assert!(g.node(a).is_some_and(|n| !n.alive()));
    let saved = g.save();
    let pids: Vec<u32> = saved.iter().map(|s| s.pid).collect();
    assert_eq!(
        pids,
        [100, 200, 300],
        "live processes and their ancestors, spawners first"
    );

    // The next run: the gateway is gone since, the grandchild still runs.
    let mut next = LineageGraph::new(100);
    let restored = next.restore(&saved, |pid, _| pid == 300, 9_000);
    assert_eq!(restored.alive.len(), 1);
    assert_eq!(restored.gone, 1, "the gateway, alive at the save");
    let c = restored.alive[0];
    assert_eq!(next.lineage(c), [100, 200, 300], "the lineage survives");
    assert_eq!(next.node(c).unwrap().comm, Comm::from_c(b"c"));
    assert_eq!(
        next.node(c).unwrap().spawn_stack,
        spawned_at,
        "the stacks it was spawned at (their stores are pinned)"
    );
    assert_eq!(next.live_count(), 1);
    assert_eq!(next.zombie_count(), 0, "the dead are not zombies");
    let a = next.current(200).unwrap();
    assert_eq!(
        a.exited.map(|e| e.ts),
        Some(1_000),
        "A's exit as the run before saw it"
    );
    let gw = next.current(100).unwrap();
    assert_eq!(
        gw.exited.map(|e| (e.ts, e.status)),
        Some((9_000, None)),
        "an exit no run saw"
    );

    // Nothing alive any more: nothing comes back, and both are counted gone.
    let mut empty = LineageGraph::new(100);
    let restored = empty.restore(&saved, |_, _| false, 9_000);
    assert_eq!((restored.alive.len(), restored.gone), (0, 2));
    assert!(empty.is_empty());
}

#[test]
fn the_command_gateway_becomes_one_at_its_fork_and_the_change_says_so() {
    let mut g = LineageGraph::new(100);
    g.expect_gateway(200);
    assert_eq!(g.expected_gateway(), Some(200));
    let change = g.apply(&fork(200, 5_000, 100, 100));
    let Change::Forked { node, command, .. } = change else {
        panic!("a fork: {change:?}");
    };
    assert!(command, "{change:?}");
    assert!(g.node(node).unwrap().is_gateway);
    assert_eq!(g.gateways().count(), 1);
    assert_eq!(g.expected_gateway(), None, "expected once");
    let other = g.apply(&fork(300, 6_000, 200, 200));
    assert!(
        matches!(other, Change::Forked { command: false, .. }),
        "{other:?}"
    );
}

#[test]
fn an_untracked_fork_leaves_an_uncertain_node() {
    let mut g = LineageGraph::new(100);
    gateway(&mut g, 100);
    let mut record = fork(200, 5_000, 100, 100);
    if let What::Fork { untracked, .. } = &mut record.what {
        *untracked = true;
    }
    let change = g.apply(&record);
    assert!(
        matches!(
            change,
            Change::Forked {
                untracked: true,
                ..
            }
        ),
        "{change:?}"
    );
    assert!(g.node(node_of(change)).unwrap().uncertain);
}

#[test]
fn a_process_found_in_proc_then_seen_forking_takes_the_forks_facts() {
    let mut g = LineageGraph::new(100);
    gateway(&mut g, 100);
    let (seeded, _) = g.add_seed(Seed {
        pid: 200,
        start_ticks: boottime_to_ticks(5_000),
        ppid: 1,
        sid: 7,
        pgid: 7,
        comm: Comm::from_c(b"later"),
        argv: Args::none(),
        is_gateway: false,
        uncertain: false,
    });
    let id = node_of(g.apply(&fork(200, 5_000, 100, 100)));
    assert_eq!(id, seeded, "the same process");
    let n = g.node(id).unwrap();
    assert_eq!((n.ppid, n.sid, n.pgid), (100, 100, 100));
    assert_eq!(n.comm, Comm::from_c(b"c"));
    assert_eq!(n.start, Start::Exact(5_000));
}

#[test]
fn gateways_that_come_and_go_are_pruned_like_any_process() {
    // A gateway restarting every second, each instance leaving a helper that exits: a day's
    // worth of instances holds no more than the retention bound and the live ones.
    let mut g = LineageGraph::new(10);
    for i in 0..6_000u32 {
        let (gw, helper) = (1_000 + 2 * i, 1_001 + 2 * i);
        let start = 10 * u64::from(i) + 1;
        let instance = node_of(g.apply(&matched(gw, start)));
        g.apply(&fork(helper, start + 1, gw, gw));
        for (pid, start) in [(helper, start + 1), (gw, start)] {
            g.apply(&ev(1, pid, start, What::Exit { status: 0 }));
            g.apply(&ev(2, pid, start, What::Free));
        }
        assert!(g.node(instance).is_some_and(|n| !n.alive()));
        assert_eq!(g.live_gateways(), 0);
    }
    assert!(g.len() <= 10, "{} nodes kept", g.len());
    assert!(g.gateways().count() <= 10);
    assert_counts(&g);
    // A live instance stays, whatever its age.
    let live = node_of(g.apply(&matched(30_000, 1)));
    for i in 0..100u32 {
        let pid = 40_000 + i;
        g.apply(&matched(pid, 2));
        g.apply(&ev(1, pid, 2, What::Exit { status: 0 }));
        g.apply(&ev(2, pid, 2, What::Free));
    }
    assert!(g.node(live).is_some());
    assert_eq!(g.live_gateways(), 1);
    assert_counts(&g);
}

/// A zombie left unreaped while 10,000 others exit and are reaped: the walk of the zombies
/// finds it alone, in exit order with a later one, and what it walks stays within twice the
/// zombies (not the 10,000 exits recorded).
#[test]
fn the_zombies_walk_is_as_long_as_the_zombies_not_as_the_exits_recorded() {
    let mut g = LineageGraph::new(100);
    gateway(&mut g, 100);
    let kept = node_of(g.apply(&fork(200, 5_000, 100, 100)));
    g.apply(&ev(1, 200, 5_000, What::Exit { status: 0 }));
    for i in 0..10_000u32 {
        let (pid, start) = (1000 + i % 20_000, 10_000 + u64::from(i));
        g.apply(&fork(pid, start, 100, 100));
        g.apply(&ev(2, pid, start, What::Exit { status: 0 }));
        // As an exit leaves it (the reap that follows leaves it as it is).
        assert!(g.exit_order.len() <= 2 * g.zombie_count() + 64);
        g.apply(&ev(3, pid, start, What::Free));
    }
    let later = node_of(g.apply(&fork(300, 50_000, 100, 100)));
    g.apply(&ev(4, 300, 50_000, What::Exit { status: 0 }));
    let zombies: Vec<NodeId> = g.zombies().map(|n| n.id).collect();
    assert_eq!(zombies, [kept, later]);
    assert_counts(&g);
}
