//! What a run says as it ends: `--check`'s verdict (every descendant left, with evidence, and
//! the exit status it stands for) and the closing summary (counts, delivery, what is alive,
//! latency, reaper-trace's own CPU, flags and kills). Both are built from the parts' final
//! state, after the probes were detached and the ring drained.
use std::collections::BTreeMap;

use crate::exit_status;
use crate::leaks::{Inspector, flags};
use crate::lineage::graph::{LineageGraph, NodeId};
use crate::procfs::placement;
use crate::stream::events::{
    AliveProcess, Check, Counts, Delivery, Event, Latency, LeakedProcess, Summary,
};

/// The parts a closing event is read from.
pub struct Closing<'a> {
    pub graph: &'a LineageGraph,
    pub inspector: &'a mut Inspector,
}

/// What the summary takes from outside the graph and the rules.
pub struct RunFigures {
    /// The lifecycle events written.
    pub counts: Counts,
    pub delivery: Delivery,
    pub latency: Latency,
    /// `--kill`'s steps by reason, then by result.
    pub kills: BTreeMap<&'static str, BTreeMap<&'static str, u64>>,
    /// Boot-time ns the run started at.
    pub started: u64,
    pub gateway_exit_code: Option<i32>,
}

impl Closing<'_> {
    /// The closing summary.
    pub fn summary(&self, figures: RunFigures) -> Event {
        let graph = self.graph;
        let mut alive: Vec<AliveProcess> = graph
            .alive()
            .map(|n| AliveProcess {
                process: flags::label(n, flags::current_name(n)),
                lineage: graph.lineage(n.id),
                placement: placement::read(n.pid),
                ppid: n.ppid,
                escaped: graph.escaped(n.id),
                called_setsid: n.called_setsid,
                uncertain: n.uncertain,
            })
            .collect();
        alive.sort_by_key(|a| a.process.pid);
        let mut zombies: Vec<u32> = graph.zombies().map(|n| n.pid).collect();
        zombies.sort_unstable();
        Event::Summary(Box::new(Summary {
            counts: figures.counts,
            delivery: figures.delivery,
            alive,
            zombies,
            gateway_exit_code: figures.gateway_exit_code,
            duration_ns: crate::procfs::boottime_now().saturating_sub(figures.started),
            latency_ns: figures.latency,
            cpu_ns: own_cpu_ns(),
            leaks: flags::summary(graph, self.inspector),
            kills: figures
                .kills
                .into_iter()
                .map(|(reason, results)| {
                    let results = results.into_iter().map(|(r, n)| (r.into(), n));
                    (reason.into(), results.collect())
                })
                .collect(),
        }))
    }

    /// `--check`'s verdict: every descendant still alive and every zombie, with evidence.
    /// Returns the event and the exit status it stands for.
    pub fn check_verdict(&mut self, gateway_exit_code: Option<i32>) -> (Event, i32) {
        let graph = self.graph;
        // A zombie /proc no longer shows was reaped; only its `reaped` event is late.
        let left: Vec<NodeId> = graph
            .alive()
            .chain(
                graph
                    .zombies()
                    .filter(|n| n.process().still_same().is_some()),
            )
            .filter(|n| !n.is_gateway)
            .map(|n| n.id)
            .collect();
        let mut leaked: Vec<LeakedProcess> = left
            .into_iter()
            .filter_map(|id| {
                let node = graph.node(id)?;
                let evidence = match node.alive() {
                    true => self.inspector.evidence(graph, node),
                    false => None,
                };
                Some(LeakedProcess {
                    pid: node.pid,
                    detail: flags::detail(graph, node, evidence.as_ref()),
                })
            })
            .collect();
        leaked.sort_by_key(|p| p.pid);
        let (verdict, code) = match (leaked.is_empty(), gateway_exit_code) {
            (false, _) => ("leaked", exit_status::LEAKED),
            (true, Some(0)) => ("clean", 0),
            (true, _) => ("gateway_failed", exit_status::GATEWAY_FAILED),
        };
        let ev = Event::Check(Check {
            verdict: verdict.into(),
            gateway_exit_code,
            leaked,
        });
        (ev, code)
    }
}

/// CPU time this process used so far (user + system; its children excluded).
fn own_cpu_ns() -> u64 {
    // SAFETY: zeroed rusage is valid; getrusage fills it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let ns = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1000;
    ns(usage.ru_utime) + ns(usage.ru_stime)
}
