//! What a flag carries about its process: a fresh look, who holds the other ends of its pipes
//! and sockets, its memory and where it runs.
use rustc_hash::FxHashSet as HashSet;

use super::{FULL_SCAN_EVERY, Inspector};
use crate::leaks::{channels, findings::Evidence, peers::PeerIndex};
use crate::lineage::graph::{LineageGraph, Node};
use crate::procfs::{
    facts,
    placement::{self, Placement},
};

impl Inspector {
    /// Fills in who holds the other ends of the pipes and sockets in `evidence`.
    pub(super) fn add_peers(&mut self, graph: &LineageGraph, evidence: &mut [&mut Evidence]) {
        if evidence.is_empty() {
            return;
        }
        self.peers.clear();
        index_tracked(&mut self.peers, graph);
        let mut unresolved = HashSet::default();
        for e in evidence.iter() {
            for fact in e.sample.fds.iter().filter(|f| f.is_channel()) {
                if fact.other_end_open == Some(true)
                    && let Some(key) = PeerIndex::other_key(fact)
                    && self.peers.peers(fact, e.sample.pid).is_empty()
                {
                    unresolved.insert(key);
                }
            }
        }
        let known = graph.alive().map(|n| n.pid).collect();
        self.peers.full_scan(&unresolved, &known, FULL_SCAN_EVERY);
        for e in evidence.iter_mut() {
            let pid = e.sample.pid;
            add_process_facts(e);
            e.peers = e
                .sample
                .fds
                .iter()
                .filter(|f| f.is_channel())
                .map(|f| (f.fd.fd, self.peers.peers(f, pid)))
                .collect();
        }
    }

    /// Evidence about a live process now (for `--check`): a fresh sample and its pipe peers.
    pub fn evidence(&mut self, graph: &LineageGraph, node: &Node) -> Option<Evidence> {
        let before = self.watches.get(&node.id).and_then(|w| w.last.as_ref());
        let mut sample = self.sampler.sample(node.process(), before)?;
        channels::mark_internal(node.id, &mut sample.fds, &self.holders);
        let mut found = Evidence {
            sample,
            peers: Vec::new(),
            server: vec![node.id],
            placement: Placement::default(),
        };
        self.add_peers(graph, &mut [&mut found]);
        Some(found)
    }
}

/// What evidence reads of the process itself when it is flagged: its RSS and placement.
pub(super) fn add_process_facts(e: &mut Evidence) {
    e.sample.rss_kib = facts::read_rss_kib(e.sample.pid);
    e.placement = placement::read(e.sample.pid);
}

/// Indexes the pipes and sockets of every live tracked process (gateways included).
fn index_tracked(index: &mut PeerIndex, graph: &LineageGraph) {
    for node in graph.alive() {
        if let Some(fds) = facts::read_fds(node.pid) {
            index.add(node.pid, node.comm, &fds);
        }
    }
}
