//! What a flag carries about its process: a fresh look, who holds the other ends of its pipes
//! and sockets, its memory and where it runs.
//!
//! Evidence for one process (`--check`, the API's `why`) is taken in steps, so that its /proc
//! reads can be made away from the graph: what to look at ([`Inspector::to_sample`]) and who
//! may hold the other ends ([`Inspector::near`]) come from what the inspector remembers; the
//! sample and the peers' fds ([`Lookout`]) are read from /proc, wherever its owner runs it.
use std::sync::Arc;

use rustc_hash::FxHashSet as HashSet;

use super::{FULL_SCAN_EVERY, Inspector, Look};
use crate::identity::ProcessId;
use crate::leaks::sampler::{Sample, Sampler};
use crate::leaks::{
    channels,
    findings::Evidence,
    peers::{PeerIndex, PidSet},
};
use crate::lineage::graph::{LineageGraph, Node, NodeId};
use crate::procfs::{
    facts,
    placement::{self, Placement},
};
use crate::text::Comm;

/// The live processes that may hold the other ends of one process's channels: its spawn
/// chain and the holders the last samples saw, each pid with its name; and every live pid
/// the graph knows (a scan of all /proc skips them).
#[derive(Default)]
pub struct Near {
    among: Vec<(u32, Comm)>,
    known: PidSet,
}

impl Near {
    /// Every live process the graph holds (a round's new flags may have their other ends
    /// anywhere among them).
    pub fn every_live(graph: &LineageGraph) -> Near {
        let among: Vec<(u32, Comm)> = graph.alive().map(|n| (n.pid, n.comm)).collect();
        let known = among.iter().map(|&(pid, _)| pid).collect();
        Near { among, known }
    }
}

/// Every live pid the graph holds.
fn live_pids(graph: &LineageGraph) -> PidSet {
    graph.alive().map(|n| n.pid).collect()
}

/// Reads what evidence needs from /proc and the kernel's sockets: a process's sample, and the
/// fds of the processes near it. The rounds and the answers each have theirs, on their
/// thread of the slow side; the inspector has a sampler and an index of its own for what it
/// still reads itself (a `respawning` flag's evidence, `--check`'s).
#[derive(Default)]
pub struct Lookout {
    sampler: Sampler,
    peers: PeerIndex,
}

impl Lookout {
    /// Samples the process `id` while its pid still names it (see [`Sampler::sample`]).
    pub fn sample(&mut self, id: ProcessId, before: Option<&Sample>) -> Option<Sample> {
        self.sampler.sample(id, before, None)
    }

    /// Takes a round's `look` (see [`Look`]): its sample, and the program its process runs
    /// put in the look when it asks for it.
    pub fn look(&mut self, look: &mut Look) -> Option<Sample> {
        let exe = look.exe_for.is_some().then_some(&mut look.exe);
        self.sampler
            .sample(look.process, look.before.as_deref(), exe)
    }

    /// The evidence about process `id` from its `sample` (internal channels marked by
    /// [`Inspector::near`]): who holds the other ends, looked for among `near`, then,
    /// rate-limited, in all of /proc; its memory and placement.
    pub fn evidence(&mut self, id: NodeId, sample: Sample, near: &Near) -> Evidence {
        gather(&mut self.peers, id, sample, near)
    }

    /// Reads a round's new flags' evidence (see [`crate::leaks::Round::evidence`]): who holds
    /// the other ends of `with_peers`' channels, looked for among `near`, and the memory and
    /// placement of each.
    pub fn read_evidence(
        &mut self,
        mut with_peers: Vec<&mut Evidence>,
        without: Vec<&mut Evidence>,
        near: &Near,
    ) {
        let among = near.among.iter().copied();
        add_peers(&mut self.peers, among, &near.known, &mut with_peers);
        without.into_iter().for_each(add_process_facts);
    }

    /// What the operator is to be told (see [`Sampler::take_notes`]).
    pub fn take_notes(&mut self) -> Vec<String> {
        self.sampler.take_notes()
    }
}

impl Inspector {
    /// Fills in who holds the other ends of the pipes and sockets in `evidence`, looked for
    /// among the processes `among` (their fds read now), then, rate-limited, in all of /proc
    /// (the tests' [`Inspector::scan`]; a run's rounds read them with a [`Lookout`]).
    #[cfg(test)]
    pub(super) fn add_peers<'g>(
        &mut self,
        graph: &LineageGraph,
        among: impl Iterator<Item = &'g Node>,
        evidence: &mut [&mut Evidence],
    ) {
        if evidence.is_empty() {
            return;
        }
        let known = live_pids(graph);
        let among = among.map(|n| (n.pid, n.comm));
        add_peers(&mut self.peers, among, &known, evidence);
    }

    /// The first step of evidence about the live process `node`: what to sample, and its last
    /// sample (a socket's peer is taken from it when the socket is the same).
    pub fn to_sample(&self, node: &Node) -> (ProcessId, Option<Arc<Sample>>) {
        let before = self.watches.get(&node.id).and_then(|w| w.last.clone());
        (node.process(), before)
    }

    /// The second step: `sample`'s internal channels marked, and the live processes that may
    /// hold its other ends.
    pub fn near(&self, graph: &LineageGraph, id: NodeId, sample: &mut Sample) -> Near {
        channels::mark_internal(id, &mut sample.fds, &self.holders);
        let mut near: HashSet<NodeId> = graph.chain(id).iter().map(|n| n.id).collect();
        for end in sample.fds.iter().filter_map(|f| f.other_end()) {
            near.extend(self.holders.holding(end));
        }
        let among = near
            .iter()
            .filter_map(|&id| graph.node(id))
            .filter(|n| n.alive())
            .map(|n| (n.pid, n.comm))
            .collect();
        let known = live_pids(graph);
        Near { among, known }
    }

    /// Evidence about a live process now (`--check`), all its steps taken here: a fresh sample
    /// and who holds the other ends of its channels, looked for in its spawn chain and among
    /// the watched processes whose last samples held them. Bounded: a handful of processes'
    /// fds, where every tracked process's (a scan's flags) took 400 ms with 10,000 tracked.
    pub fn evidence(&mut self, graph: &LineageGraph, node: &Node) -> Option<Evidence> {
        let (process, before) = self.to_sample(node);
        let mut sample = self.sampler.sample(process, before.as_deref(), None)?;
        let near = self.near(graph, node.id, &mut sample);
        Some(gather(&mut self.peers, node.id, sample, &near))
    }
}

/// The evidence about process `id` from its `sample` and the processes `near` it.
fn gather(peers: &mut PeerIndex, id: NodeId, sample: Sample, near: &Near) -> Evidence {
    let mut found = Evidence {
        sample,
        peers: Vec::new(),
        server: vec![id],
        placement: Placement::default(),
    };
    let among = near.among.iter().copied();
    add_peers(peers, among, &near.known, &mut [&mut found]);
    found
}

/// Fills in who holds the other ends of the pipes and sockets in `evidence`, looked for among
/// the processes `among` (their fds read now), then, rate-limited, in all of /proc but the
/// `known` pids; and each one's memory and placement.
fn add_peers(
    peers: &mut PeerIndex,
    among: impl Iterator<Item = (u32, Comm)>,
    known: &PidSet,
    evidence: &mut [&mut Evidence],
) {
    if evidence.is_empty() {
        return;
    }
    peers.clear();
    for (pid, comm) in among {
        if let Some(fds) = facts::read_fds(pid) {
            peers.add(pid, comm, &fds);
        }
    }
    let mut unresolved = HashSet::default();
    for e in evidence.iter() {
        for fact in e.sample.fds.iter().filter(|f| f.is_channel()) {
            if fact.other_end_open == Some(true)
                && let Some(key) = PeerIndex::other_key(fact)
                && peers.peers(fact, e.sample.pid).is_empty()
            {
                unresolved.insert(key);
            }
        }
    }
    peers.full_scan(&unresolved, known, FULL_SCAN_EVERY);
    for e in evidence.iter_mut() {
        let pid = e.sample.pid;
        add_process_facts(e);
        e.peers = e
            .sample
            .fds
            .iter()
            .filter(|f| f.is_channel())
            .map(|f| (f.fd.fd, peers.peers(f, pid)))
            .collect();
    }
}

/// What evidence reads of the process itself when it is flagged: its RSS and placement.
pub(super) fn add_process_facts(e: &mut Evidence) {
    e.sample.rss_kib = facts::read_rss_kib(e.sample.pid);
    e.placement = placement::read(e.sample.pid);
}
