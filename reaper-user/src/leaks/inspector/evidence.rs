//! What a flag carries about its process: a fresh look, who holds the other ends of its pipes
//! and sockets, its memory and where it runs.
use rustc_hash::FxHashSet as HashSet;

use super::{FULL_SCAN_EVERY, Inspector};
use crate::leaks::{channels, findings::Evidence, peers::PeerIndex};
use crate::lineage::graph::{LineageGraph, Node, NodeId};
use crate::procfs::{
    facts,
    placement::{self, Placement},
};

impl Inspector {
    /// Fills in who holds the other ends of the pipes and sockets in `evidence`, looked for
    /// among the processes `among` (their fds read now), then, rate-limited, in all of /proc.
    pub(super) fn add_peers<'g>(
        &mut self,
        graph: &LineageGraph,
        among: impl Iterator<Item = &'g Node>,
        evidence: &mut [&mut Evidence],
    ) {
        if evidence.is_empty() {
            return;
        }
        self.peers.clear();
        for node in among {
            if let Some(fds) = facts::read_fds(node.pid) {
                self.peers.add(node.pid, node.comm, &fds);
            }
        }
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

    /// Evidence about a live process now (`--check`, the API's `why`): a fresh sample and who
    /// holds the other ends of its channels, looked for in its spawn chain and among the
    /// watched processes whose last samples held them. Bounded: a handful of processes' fds,
    /// where every tracked process's (a scan's flags) took 400 ms with 10,000 tracked.
    pub fn evidence(&mut self, graph: &LineageGraph, node: &Node) -> Option<Evidence> {
        let before = self.watches.get(&node.id).and_then(|w| w.last.as_ref());
        let mut sample = self.sampler.sample(node.process(), before)?;
        channels::mark_internal(node.id, &mut sample.fds, &self.holders);
        let mut near: HashSet<NodeId> = graph.chain(node.id).iter().map(|n| n.id).collect();
        for end in sample.fds.iter().filter_map(|f| f.other_end()) {
            near.extend(self.holders.holding(end));
        }
        let mut found = Evidence {
            sample,
            peers: Vec::new(),
            server: vec![node.id],
            placement: Placement::default(),
        };
        let among = near
            .iter()
            .filter_map(|&id| graph.node(id))
            .filter(|n| n.alive());
        self.add_peers(graph, among, &mut [&mut found]);
        Some(found)
    }
}

/// What evidence reads of the process itself when it is flagged: its RSS and placement.
pub(super) fn add_process_facts(e: &mut Evidence) {
    e.sample.rss_kib = facts::read_rss_kib(e.sample.pid);
    e.placement = placement::read(e.sample.pid);
}
