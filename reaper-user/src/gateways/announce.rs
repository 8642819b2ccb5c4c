//! The `gateway` event: each gateway instance announced once, by the selector that found it,
//! under the name and arguments it runs with. A gateway matched at its exec (an executable
//! selector) and the `-- CMD` gateway (at its fork still a copy of reaper-trace) are
//! announced after their exec event, by their new program.
use reaper_common::MatchedAt;
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use super::Selectors;
use crate::capture::decode::MAX_ARGS;
use crate::lineage::graph::{Change, LineageGraph, NodeId};
use crate::procfs;
use crate::stream::Stamped;
use crate::stream::events::{Argv, Event, Gateway, ProcText};
use crate::text::Args;

/// Which gateways were announced, and which are still to be.
#[derive(Default)]
pub struct Announcer {
    /// The selectors' labels, by number.
    labels: Vec<String>,
    /// The `-- CMD` gateway's command line.
    command: Args,
    /// Gateways the stream has announced.
    announced: HashSet<NodeId>,
    /// Gateways matched at exec, announced after their exec event (with the new argv).
    at_exec: HashMap<NodeId, usize>,
}

impl Announcer {
    /// `labels`: the selectors' names (see [`Selectors::label`]), by number.
    pub fn new(labels: Vec<String>) -> Announcer {
        Announcer {
            labels,
            ..Announcer::default()
        }
    }

    /// The `-- CMD` gateway's command line (the graph expects its pid: see
    /// [`LineageGraph::expect_gateway`]).
    pub fn expect(&mut self, argv: Args) {
        self.command = argv;
    }

    /// What a record's change to `graph` means for the gateways: the `gateway` event it
    /// brings (to be written after the record's own), if any.
    pub fn on_change(&mut self, graph: &LineageGraph, change: &Change, ts: u64) -> Option<Stamped> {
        let (node, selector) = match *change {
            Change::Matched {
                node,
                selector,
                at: MatchedAt::Exec,
            } => {
                self.at_exec.insert(node, selector);
                return None;
            }
            Change::Matched { node, selector, .. } => (node, selector),
            Change::Execed { node, .. } => (node, self.at_exec.remove(&node)?),
            Change::Forked {
                node,
                command: true,
                ..
            } => {
                self.at_exec.insert(node, Selectors::COMMAND);
                return None;
            }
            _ => return None,
        };
        self.announce(graph, node, selector, ts)
    }

    /// The `gateway` event for node `id`, found by selector number `selector`, once.
    pub fn announce(
        &mut self,
        graph: &LineageGraph,
        id: NodeId,
        selector: usize,
        ts: u64,
    ) -> Option<Stamped> {
        let node = graph.node(id)?;
        if !self.announced.insert(id) {
            return None;
        }
        // Its own program's arguments: from its exec or /proc; the command's as given, if it
        // has not executed it yet.
        let argv = match (selector, node.argv.is_empty()) {
            (_, false) => node.argv.clone(),
            (Selectors::COMMAND, true) => self.command.clone(),
            (_, true) => procfs::read_cmdline(node.pid, MAX_ARGS)
                .map(|(a, _)| a)
                .unwrap_or_default(),
        };
        let ev = Event::Gateway(Gateway {
            pid: node.pid,
            start: node.start.boottime_ns(),
            selector: self
                .labels
                .get(selector)
                .map_or("unknown", String::as_str)
                .to_owned(),
            ppid: node.ppid,
            sid: node.sid,
            pgid: node.pgid,
            comm: ProcText::new("comm", node.comm),
            argv: Argv::new(argv),
        });
        Some(Stamped::new(ts, ev))
    }

    /// A gateway taken back from a lineage checkpoint: the run that found it announced it.
    pub fn adopted(&mut self, id: NodeId) {
        self.announced.insert(id);
    }

    /// The gateway pids alive, with the one not forked yet (for `ready` and the API's status).
    pub fn pids(&self, graph: &LineageGraph) -> Vec<u32> {
        let alive = graph.gateways().filter(|n| n.alive());
        let mut pids: Vec<u32> = alive.map(|n| n.pid).collect();
        pids.extend(graph.expected_gateway());
        pids.sort_unstable();
        pids
    }

    /// Every gateway has exited (or none is known yet to be alive): a count, asked at every
    /// turn of the event loop.
    pub fn all_exited(&self, graph: &LineageGraph) -> bool {
        graph.expected_gateway().is_none() && graph.live_gateways() == 0
    }

    /// Forgets the gateways the graph no longer holds.
    pub fn retain(&mut self, holds: impl Fn(NodeId) -> bool) {
        self.announced.retain(|&id| holds(id));
        self.at_exec.retain(|&id, _| holds(id));
    }
}
