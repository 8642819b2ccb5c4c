//! The inspector's rounds in their steps, their looks answered with made-up samples (the
//! rules need no /proc).
use super::*;
use crate::capture::decode::What;
use crate::lineage::graph::testing::{fork, gateway, record};

const SECOND: u64 = 1_000_000_000;

fn inspector() -> Inspector {
    Inspector::new(InspectOptions {
        scan_interval: Duration::from_secs(1),
        idle_after: Duration::from_secs(60),
        zombie_after: Duration::from_secs(1),
        orphan_grace: Duration::from_secs(1),
        max_instances: 10,
    })
}

/// A gateway (100) and its child (200), forked at 1 ns; the child's id.
fn a_child() -> (LineageGraph, NodeId) {
    let mut g = LineageGraph::new(100);
    g.add_seed(gateway(100));
    record(&mut g, 1, (200, 5_000), fork(100));
    let id = g.current(200).unwrap().id;
    (g, id)
}

/// A gateway (100) whose child (200) exited at 1 s and is not reaped.
fn a_zombie() -> LineageGraph {
    let (mut g, _) = a_child();
    record(&mut g, SECOND, (200, 5_000), What::Exit { status: 0 });
    g
}

/// A round planned at `now`, all its steps taken.
fn planned(inspector: &mut Inspector, g: &LineageGraph, now: u64) -> Round {
    let mut planning = inspector.plan(now);
    while inspector.plan_step(g, &mut planning) {}
    planning.round()
}

/// A round at `now`, all its steps taken, each look answered with what `found` makes of
/// it: what its looks asked for (the program of which exec) and the flags it changed.
fn judged(
    inspector: &mut Inspector,
    g: &LineageGraph,
    now: u64,
    found: impl Fn(&Look) -> Option<Sample>,
) -> (Vec<Option<u32>>, Vec<Change>) {
    let mut round = planned(inspector, g, now);
    let looks = std::mem::take(&mut round.looks);
    let asked = looks.iter().map(|l| l.exe_for).collect();
    let sampled = looks.into_iter().map(|l| {
        let sample = found(&l);
        (l, sample)
    });
    inspector.judge_round(g, &mut round, sampled.collect());
    (asked, round.changes)
}

fn reasons(changes: &[Change]) -> Vec<(&'static str, Reason)> {
    changes
        .iter()
        .map(|c| match c {
            Change::Flag(f) => ("flag", f.reason),
            Change::Cleared { reason, .. } => ("cleared", *reason),
        })
        .collect()
}

/// A round in its steps, its looks answered with made-up samples (the rules need no
/// /proc): a pipe read end whose writers are gone, for `--idle-after`, is `deaf`. Its
/// process exits before the round is written: its exit clears the flag, and a flag never
/// written is not counted.
#[test]
fn a_round_judges_the_samples_its_looks_bring_and_a_flag_never_written_is_not_counted() {
    let (mut g, id) = a_child();
    let mut inspector = inspector();
    let round_at =
        |inspector: &mut Inspector, now: u64| judged(inspector, &g, now, |_| Some(deaf(200, 9))).1;
    // The first look comes within a sample period (15 s: idle-after / 4), then one each.
    assert_eq!(reasons(&round_at(&mut inspector, 100 * SECOND)), []);
    assert_eq!(reasons(&round_at(&mut inspector, 115 * SECOND)), []);
    let flagged = round_at(&mut inspector, 176 * SECOND);
    assert_eq!(reasons(&flagged), [("flag", Reason::Deaf)]);
    assert_eq!(inspector.raised(Reason::Deaf), 1);

    record(&mut g, 177 * SECOND, (200, 5_000), What::Exit { status: 0 });
    assert_eq!(reasons(&inspector.exited(id)), [("cleared", Reason::Deaf)]);
    inspector.withdraw(id, Reason::Deaf);
    assert_eq!(inspector.raised(Reason::Deaf), 0);
    assert_eq!(inspector.active().count(), 0);
}

/// A sample of process `pid` reading pipe `inode`, whose writers are gone.
fn deaf(pid: u32, inode: u64) -> Sample {
    let fd = crate::procfs::facts::OpenFd {
        fd: 0,
        kind: crate::procfs::facts::FdKind::Pipe,
        inode: Some(inode),
        end: crate::procfs::facts::End::Read,
        pty: None,
    };
    let fact = crate::leaks::FdFact {
        fd,
        other_end_open: Some(false),
        peer_inode: None,
        socket: None,
        internal: false,
    };
    Sample {
        pid,
        state: b'S',
        fds: vec![fact],
        ..Sample::default()
    }
}

/// 2,500 servers are judged in bounded steps, the graph changing between them: one
/// flagged process exits after the step that flagged it, and the rest are still judged.
#[test]
fn a_round_of_many_looks_is_judged_in_bounded_steps_while_the_graph_changes() {
    const N: u32 = 2_500;
    let mut g = LineageGraph::new(100);
    g.add_seed(gateway(100));
    for pid in 1_000..1_000 + N {
        record(&mut g, 1, (pid, 5_000), fork(100));
    }
    let mut inspector = inspector();
    let (mut steps, mut exited) = (0, None);
    for now in [100 * SECOND, 115 * SECOND, 176 * SECOND] {
        let mut round = planned(&mut inspector, &g, now);
        let looks = std::mem::take(&mut round.looks);
        let sampled = looks.into_iter().map(|l| {
            let pid = g.node(l.id).unwrap().pid;
            (l, Some(deaf(pid, u64::from(pid))))
        });
        let mut judging = Judging::new(sampled.collect());
        steps = 0;
        while inspector.judge_step(&g, &mut round, &mut judging) {
            steps += 1;
            let first = round.changes.first().map(|c| match c {
                Change::Flag(f) => (f.node, f.pid),
                Change::Cleared { .. } => unreachable!("nothing held to clear"),
            });
            if let (Some((node, pid)), None) = (first, exited) {
                record(&mut g, now, (pid, 5_000), What::Exit { status: 0 });
                assert_eq!(
                    reasons(&inspector.exited(node)),
                    [("cleared", Reason::Deaf)]
                );
                exited = Some(node);
            }
        }
    }
    assert!(
        steps > 3 * N as usize / 1_000,
        "{steps} steps for {N} looks"
    );
    assert!(exited.is_some(), "a flag raised before the last step");
    assert_eq!(inspector.raised(Reason::Deaf), u64::from(N));
    let deaf_held = inspector.active().filter(|&(_, r, _)| r == Reason::Deaf);
    assert_eq!(deaf_held.count(), N as usize - 1);
}

/// 2,500 deaf descendants, each flagged by three rounds of made-up samples.
fn deaf_descendants(n: u32) -> (LineageGraph, Inspector) {
    let mut g = LineageGraph::new(100);
    g.add_seed(gateway(100));
    for pid in 1_000..1_000 + n {
        record(&mut g, 1, (pid, 5_000), fork(100));
    }
    let mut inspector = inspector();
    for now in [100 * SECOND, 115 * SECOND, 176 * SECOND] {
        judged(&mut inspector, &g, now, |l| {
            let pid = g.node(l.id).unwrap().pid;
            Some(deaf(pid, u64::from(pid)))
        });
    }
    assert_eq!(inspector.raised(Reason::Deaf), u64::from(n));
    (g, inspector)
}

/// A round of 2,500 flagged (so due) descendants is planned in bounded steps while the
/// graph changes: the flag of one found exited without its exit record's clearing (as a
/// loss's repair finds it) is cleared by the plan, once; one exiting after each step until
/// the looks are made (three steps each for the watches and the live descendants; a look
/// made before its process exits finds nothing) is not looked at; every other one is.
#[test]
fn a_round_of_many_processes_is_planned_in_bounded_steps_while_the_graph_changes() {
    const N: u32 = 2_500;
    let (mut g, mut inspector) = deaf_descendants(N);
    record(
        &mut g,
        177 * SECOND,
        (1_000, 5_000),
        What::Exit { status: 0 },
    );

    let mut planning = inspector.plan(177 * SECOND);
    let (mut steps, mut cleared, mut exited) = (0, Vec::new(), Vec::new());
    while inspector.plan_step(&g, &mut planning) {
        steps += 1;
        cleared.extend(planning.take_changes());
        if steps >= 6 {
            continue;
        }
        let pid = 1_000 + N - steps;
        let id = g.current(pid).unwrap().id;
        record(&mut g, 177 * SECOND, (pid, 5_000), What::Exit { status: 0 });
        let by_exit = reasons(&inspector.exited(id));
        assert!(by_exit.contains(&("cleared", Reason::Deaf)), "{by_exit:?}");
        exited.push(id);
    }
    cleared.extend(planning.take_changes());
    let round = planning.round();
    // Three steps for each of the watches, the live descendants and the looks.
    assert_eq!(steps, 3 * 3 - 1, "{steps} steps for {N}");
    assert_eq!(exited.len(), 5);
    // (Its `accumulating` flag too: ten instances of a kind may live.)
    let each: Vec<(u32, Reason)> = (cleared.iter())
        .map(|c| match c {
            Change::Cleared { pid, reason, .. } => (*pid, *reason),
            Change::Flag(_) => unreachable!("a plan raises nothing"),
        })
        .collect();
    let once: HashSet<(u32, Reason)> = each.iter().copied().collect();
    assert!(each.contains(&(1_000, Reason::Deaf)), "{each:?}");
    assert!(each.iter().all(|&(pid, _)| pid == 1_000), "{each:?}");
    assert_eq!(once.len(), each.len(), "each cleared once: {each:?}");
    let looked: HashSet<NodeId> = round.looks.iter().map(|l| l.id).collect();
    assert!(exited.iter().all(|id| !looked.contains(id)));
    assert_eq!(looked.len(), N as usize - 1 - exited.len());
}

/// A process that exec'd since its last look is looked at the next round, its program
/// read by that look, though its next sample is not due yet; once per exec, also when
/// that look read nothing (else it would be looked at every round).
#[test]
fn a_process_that_execd_is_looked_at_next_round_for_its_program() {
    let (mut g, id) = a_child();
    let mut inspector = inspector();
    let round_at = |inspector: &mut Inspector, g: &LineageGraph, now: u64| {
        // After the second exec, the look finds nothing (/proc refused it).
        let found = (g.node(id).unwrap().execs < 2).then(Sample::default);
        judged(inspector, g, now, |_| found.clone()).0
    };
    assert_eq!(round_at(&mut inspector, &g, 100 * SECOND), []);
    assert_eq!(round_at(&mut inspector, &g, 115 * SECOND), [Some(0)]);
    assert_eq!(
        round_at(&mut inspector, &g, 116 * SECOND),
        [],
        "next due at 130 s"
    );
    let exec = || What::Exec {
        old_tid: 200,
        comm: crate::text::Comm::from_c(b"node"),
        filename: b"/bin/node".as_slice().into(),
        argv: crate::text::Args::from_list(["node", "bridge.js"]),
        truncated: false,
        interpreter: None,
    };
    record(&mut g, 117 * SECOND, (200, 5_000), exec());
    assert_eq!(round_at(&mut inspector, &g, 118 * SECOND), [Some(1)]);
    assert_eq!(
        round_at(&mut inspector, &g, 119 * SECOND),
        [],
        "once per exec"
    );
    record(&mut g, 120 * SECOND, (200, 5_000), exec());
    assert_eq!(round_at(&mut inspector, &g, 121 * SECOND), [Some(2)]);
    assert_eq!(
        round_at(&mut inspector, &g, 122 * SECOND),
        [],
        "once per exec though its look read nothing"
    );
}

#[test]
fn the_stops_last_look_clears_what_ended_and_raises_nothing() {
    let mut g = a_zombie();
    let now = 10 * SECOND;
    assert_eq!(
        reasons(&inspector().clear_ended(&g)),
        [],
        "a zombie past --zombie-after is left to the scans"
    );
    let mut scans = inspector();
    assert_eq!(reasons(&scans.scan(&g, now)), [("flag", Reason::Zombie)]);
    record(&mut g, 2 * SECOND, (200, 5_000), What::Free);
    assert_eq!(
        reasons(&scans.clear_ended(&g)),
        [("cleared", Reason::Zombie)]
    );
    assert_eq!(reasons(&scans.clear_ended(&g)), [], "cleared once");
}
