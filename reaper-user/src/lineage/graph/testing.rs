//! What unit tests build a graph from: a gateway's seed and the kernel's records.
use super::{Change, LineageGraph, Seed};
use crate::capture::decode::{KernelEvent, What};
use crate::text::{Args, Comm};

/// A gateway found in /proc: `pid`, its own session and group, named `gw`.
pub fn gateway(pid: u32) -> Seed {
    Seed {
        pid,
        start_ticks: 1,
        ppid: 1,
        sid: pid,
        pgid: pid,
        comm: Comm::from_c(b"gw"),
        argv: Args::none(),
        is_gateway: true,
        uncertain: false,
    }
}

/// A fork by `spawner` (its main thread; its child's parent too), in its session and group.
pub fn fork(spawner: u32) -> What {
    fork_under(spawner, spawner)
}

/// A fork by `spawner` whose child's parent is `ppid` (`CLONE_PARENT`, a thread of another).
pub fn fork_under(spawner: u32, ppid: u32) -> What {
    What::Fork {
        spawner,
        ppid,
        sid: spawner,
        pgid: spawner,
        uid: 0,
        cgroup_id: 1,
        comm: Comm::from_c(b"c"),
        spawner_tid: spawner,
        stack: Default::default(),
        copy: None,
        untracked: false,
    }
}

/// Applies the record of `what` happening to process `pid` (started at `start`) at `ts`.
pub fn record(g: &mut LineageGraph, ts: u64, (pid, start): (u32, u64), what: What) -> Change {
    g.apply(&KernelEvent {
        seq: ts,
        generation: 1,
        ts,
        pid,
        start,
        what,
    })
}

/// The gateway that runs a supervisor, as the killer's tests meet them: gateway 40,000 (pids
/// above `pid_max`, so none is a real process), supervisor 40,001 forked by it at 1 s, and
/// `children` forked by the supervisor, each `(pid, boot-time ns)`.
pub fn supervised(children: &[(u32, u64)]) -> LineageGraph {
    const SEC: u64 = 1_000_000_000;
    let mut graph = LineageGraph::new(16);
    graph.add_seed(gateway(40_000));
    record(&mut graph, SEC, (40_001, 1), fork(40_000));
    for (start, &(pid, at)) in (2..).zip(children) {
        record(&mut graph, at, (pid, start), fork(40_001));
    }
    graph
}
