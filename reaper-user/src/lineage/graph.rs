//! The exact spawn-lineage graph of everything under the gateways.
//!
//! One node per process ever seen, identified by (pid, start time) so that a reused pid is a
//! new node. The lineage edge (spawner → child) is fixed when the fork is seen and never
//! re-derived from the parent pid, which changes when a process is reparented. Dead nodes are
//! kept while they have retained descendants (lineage must always resolve) and otherwise up to
//! a bounded number, oldest pruned first.
use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;

// Keys are kernel pids and internal ids, not attacker-chosen strings: a fast hash is safe,
// and hashing is a good part of the cost of every event.
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

pub use crate::capture::decode::SpawnStack;
pub use crate::identity::Start;
use crate::identity::{ProcessId, boottime_to_ticks};
use crate::text::{Args, Comm};
pub use change::Change;
use pids::PidIndex;
use slab::Nodes;

/// Internal handle of a node; never reused, and ordered by creation (see [`slab`]).
pub type NodeId = u64;

/// How a process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExitInfo {
    pub ts: u64,
    /// A wait(2) status; `None` when the exit was only learnt from /proc after a loss.
    pub status: Option<u32>,
}

/// One process.
#[derive(Clone, Debug)]
pub struct Node {
    pub id: NodeId,
    pub pid: u32,
    pub start: Start,
    /// The process that forked this one (the lineage edge), if it is in the graph.
    pub spawner: Option<NodeId>,
    /// The spawner's pid as reported, even when it is not in the graph.
    pub spawner_pid: Option<u32>,
    /// Current real parent.
    pub ppid: u32,
    pub sid: u32,
    pub pgid: u32,
    pub uid: Option<u32>,
    pub cgroup_id: Option<u64>,
    pub comm: Comm,
    /// Shared with the events and with children that have not exec'd: cloning is a count.
    pub filename: Option<Arc<[u8]>>,
    pub argv: Args,
    pub execs: u32,
    pub forked_at: Option<u64>,
    /// The thread of its spawner that forked it, when not the spawner's main thread: its tid
    /// and its name (an event loop's, a worker's).
    pub spawning_thread: Option<(u32, Comm)>,
    /// That thread's stacks at the fork (`--spawn-stacks`).
    pub spawn_stack: SpawnStack,
    pub exited: Option<ExitInfo>,
    pub reaped_at: Option<u64>,
    pub is_gateway: bool,
    /// Found in /proc at start-up or at a resync, not seen forking.
    pub seeded: bool,
    /// Called setsid() since it was first seen.
    pub called_setsid: bool,
    /// The agent session that begins here (`--session-env` or `--session-cgroup`): its
    /// environment (or cgroup) names it, and its spawner is in another or none (see
    /// [`session`]).
    pub session: Option<Arc<[u8]>>,
    /// Its environment waits to be read for its session: what it names is not known yet.
    pub session_pending: bool,
    /// Part of the graph after an event loss, until re-verified from /proc.
    pub uncertain: bool,
    /// Live processes whose real parent this is (to know, at its exit, who is orphaned).
    real_children: HashSet<NodeId>,
    /// How many retained nodes this one spawned: a node with any is kept (lineage must
    /// resolve). A count, not a set: a gateway's thousands of children would cost a hash
    /// insert and remove each, on the hottest path, for lists only the closing tree and a
    /// kill need (see [`LineageGraph::spawned_by`]).
    spawned: u32,
    /// Waiting in the retired queue to be pruned (so that it waits there once).
    retired: bool,
}

impl Node {
    /// Which process this node is (see [`ProcessId`]).
    pub fn process(&self) -> ProcessId {
        ProcessId {
            pid: self.pid,
            start: self.start,
        }
    }
    pub fn alive(&self) -> bool {
        self.exited.is_none()
    }
    pub fn zombie(&self) -> bool {
        self.exited.is_some() && self.reaped_at.is_none()
    }
}

/// A process found in /proc, for seeding and resyncs.
#[derive(Clone, Debug)]
pub struct Seed {
    pub pid: u32,
    pub start_ticks: u64,
    pub ppid: u32,
    pub sid: u32,
    pub pgid: u32,
    pub comm: Comm,
    pub argv: Args,
    pub is_gateway: bool,
    pub uncertain: bool,
}

/// The graph. See the module documentation.
pub struct LineageGraph {
    nodes: Nodes,
    /// The newest node of each pid.
    current: PidIndex,
    /// Nodes with an exact start time that are no longer their pid's newest: for the events
    /// (a late free) about a process whose pid was reused meanwhile.
    by_identity: HashMap<(u32, u64), NodeId>,
    /// Reaped nodes, oldest first, waiting to be pruned.
    retired: VecDeque<NodeId>,
    retain_dead: usize,
    /// Counts kept as nodes change state, so "is anything left?" never walks the graph.
    live: usize,
    zombies: usize,
    /// The zombies in the order their exits were recorded, among entries of processes reaped
    /// or pruned since (let go of when an exit finds them more than twice the zombies: see
    /// [`LineageGraph::set_exited`]): a walk of the zombies is about as long as they are, not
    /// as the graph (10,000 live processes and one zombie).
    exit_order: VecDeque<NodeId>,
    /// Gateway nodes, oldest first: pruned like any node, once reaped with no retained
    /// descendant (a gateway that restarts every second is a node a second).
    gateways: BTreeSet<NodeId>,
    /// How many of them are alive.
    live_gateways: usize,
    /// How many nodes keep a session value (`--session-env` or `--session-cgroup`): none, and
    /// no walk looks for one.
    session_values: usize,
    /// How many nodes' environments wait to be read for their session.
    sessions_pending: usize,
    /// The argv of a process whose program is not known yet: one shared empty list.
    no_argv: Args,
    /// The pid that is a gateway once its fork is seen (the `-- CMD` gateway: one a run).
    expected_gateway: Option<u32>,
}

impl LineageGraph {
    /// `retain_dead`: how many reaped processes without retained descendants to keep for
    /// reporting.
    pub fn new(retain_dead: usize) -> Self {
        LineageGraph {
            nodes: Nodes::default(),
            current: PidIndex::default(),
            by_identity: HashMap::default(),
            retired: VecDeque::new(),
            retain_dead,
            live: 0,
            zombies: 0,
            exit_order: VecDeque::new(),
            gateways: BTreeSet::new(),
            live_gateways: 0,
            session_values: 0,
            sessions_pending: 0,
            no_argv: Args::none(),
            expected_gateway: None,
        }
    }

    /// `pid` becomes a gateway when its fork is seen (the `-- CMD` gateway, forked by the run
    /// itself before its record comes).
    pub fn expect_gateway(&mut self, pid: u32) {
        self.expected_gateway = Some(pid);
    }

    /// The gateway expected whose fork was not seen yet.
    pub fn expected_gateway(&self) -> Option<u32> {
        self.expected_gateway
    }

    /// The live processes that run `spawner`'s code: itself, then each spawner up the lineage
    /// that it shares its code with (none of them exec'd since its fork).
    pub fn code_holders(&self, spawner: NodeId) -> Vec<u32> {
        let mut holders = Vec::new();
        let mut node = self.node(spawner);
        while let Some(n) = node {
            if n.alive() {
                holders.push(n.pid);
            }
            if n.execs > 0 || n.seeded {
                break;
            }
            node = n.spawner.and_then(|s| self.node(s));
        }
        holders
    }

    pub fn node(&self, id: NodeId) -> Option<&Node> {
        self.nodes.get(id)
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The newest process with this pid.
    pub fn current(&self, pid: u32) -> Option<&Node> {
        self.current_id(pid).and_then(|id| self.nodes.get(id))
    }

    /// Whether the graph still holds node `id` (it was not pruned).
    pub fn holds(&self, id: NodeId) -> bool {
        self.nodes.contains(id)
    }

    /// Live processes (not exited), in no particular order.
    pub fn alive(&self) -> impl Iterator<Item = &Node> {
        self.nodes.alive()
    }

    /// The processes that keep a session value (where a session begins, or a gateway's own),
    /// in no particular order.
    pub fn session_values(&self) -> Vec<NodeId> {
        if self.session_values == 0 {
            return Vec::new();
        }
        (self.nodes.values())
            .filter(|n| n.session.is_some())
            .map(|n| n.id)
            .collect()
    }

    /// Exited processes not yet reaped, in the order their exits were recorded (for exits read
    /// from the ring, the kernel's order, but for exits on two CPUs a few microseconds apart).
    pub fn zombies(&self) -> impl Iterator<Item = &Node> {
        (self.exit_order.iter())
            .filter_map(|&id| self.nodes.get(id))
            .filter(|n| n.zombie())
    }

    /// The gateways the graph holds, alive or not, oldest first.
    pub fn gateways(&self) -> impl Iterator<Item = &Node> {
        self.gateways.iter().filter_map(|&id| self.nodes.get(id))
    }

    /// How many gateways are alive.
    pub fn live_gateways(&self) -> usize {
        self.live_gateways
    }

    /// How many processes are alive (not exited).
    pub fn live_count(&self) -> usize {
        self.live
    }

    /// How many processes have exited and are not reaped yet.
    pub fn zombie_count(&self) -> usize {
        self.zombies
    }

    /// Retained children of `id` along lineage edges, oldest first. One pass over the graph:
    /// for a kill's few processes, not for a walk of the whole tree.
    pub fn spawned_by(&self, id: NodeId) -> Vec<&Node> {
        let Some(node) = self.nodes.get(id) else {
            return Vec::new();
        };
        if node.spawned == 0 {
            return Vec::new();
        }
        let mut kids: Vec<&Node> = self
            .nodes
            .values()
            .filter(|n| n.spawner == Some(id))
            .collect();
        kids.sort_by_key(|n| (n.forked_at.unwrap_or(0), n.id));
        kids
    }

    /// The node an event about (pid, start) refers to; a tick-precision node is upgraded to
    /// the exact start time on first match.
    ///
    /// (For a lookup that changes nothing, see [`LineageGraph::identified`].)
    fn find(&mut self, pid: u32, start: u64) -> Option<NodeId> {
        if let Some(id) = self.current_id(pid) {
            let node = self.nodes.get_mut(id)?;
            match node.start {
                Start::Exact(ns) if ns == start => return Some(id),
                Start::Ticks(t) if t == boottime_to_ticks(start) => {
                    node.start = Start::Exact(start);
                    return Some(id);
                }
                _ => {}
            }
        }
        self.by_identity.get(&(pid, start)).copied()
    }

    /// The node of the process `pid` that started at boot-time `start` ns (to the clock tick
    /// for one found in /proc), whether or not its pid was reused since.
    pub fn identified(&self, pid: u32, start: u64) -> Option<NodeId> {
        match self.current(pid) {
            Some(n) if n.start.matches_exact(start) => Some(n.id),
            _ => self.by_identity.get(&(pid, start)).copied(),
        }
    }

    fn insert(&mut self, node: Node) -> NodeId {
        let id = node.id;
        // The pid's previous node, if any, is found by its identity from now on.
        if let Some(old) = self.current_id(node.pid)
            && let Some(Start::Exact(ns)) = self.nodes.get(old).map(|n| n.start)
        {
            self.by_identity.insert((node.pid, ns), old);
        }
        if let Some(parent) = self.current_id(node.ppid) {
            self.nodes.get_mut(parent).unwrap().real_children.insert(id);
        }
        if let Some(s) = node.spawner {
            self.nodes.get_mut(s).unwrap().spawned += 1;
        }
        self.current.insert(node.pid, id);
        self.session_values += usize::from(node.session.is_some());
        let gateway = node.is_gateway;
        self.nodes.insert(node);
        self.live += 1;
        if gateway {
            self.gateways.insert(id);
            self.live_gateways += 1;
        }
        id
    }

    fn current_id(&self, pid: u32) -> Option<NodeId> {
        self.current.get(pid).filter(|&id| self.nodes.contains(id))
    }

    /// A node for `pid` with nothing known yet, carrying the id it will be inserted under.
    fn blank(&mut self, pid: u32, start: Start) -> Node {
        let id = self.nodes.next_id();
        self.blank_with(id, pid, start)
    }

    /// A blank node with id `id`, for the slab's own tests.
    #[cfg(test)]
    pub(super) fn blank_for_test(&mut self, id: NodeId, pid: u32) -> Node {
        self.blank_with(id, pid, Start::Ticks(1))
    }

    fn blank_with(&self, id: NodeId, pid: u32, start: Start) -> Node {
        Node {
            id,
            pid,
            start,
            spawner: None,
            spawner_pid: None,
            ppid: 0,
            sid: 0,
            pgid: 0,
            uid: None,
            cgroup_id: None,
            comm: Comm::default(),
            filename: None,
            argv: self.no_argv.clone(),
            execs: 0,
            forked_at: None,
            spawning_thread: None,
            spawn_stack: SpawnStack::default(),
            exited: None,
            reaped_at: None,
            is_gateway: false,
            seeded: false,
            called_setsid: false,
            session: None,
            session_pending: false,
            uncertain: false,
            real_children: HashSet::default(),
            spawned: 0,
            retired: false,
        }
    }

    /// Adds (or refreshes) a process found in /proc. Its lineage edge is its parent at that
    /// moment, the best fact /proc has. Returns the node and whether it is new.
    pub fn add_seed(&mut self, seed: Seed) -> (NodeId, bool) {
        if let Some(id) = self.current_id(seed.pid) {
            let node = self.nodes.get_mut(id).unwrap();
            let same = match node.start {
                Start::Exact(ns) => boottime_to_ticks(ns) == seed.start_ticks,
                Start::Ticks(t) => t == seed.start_ticks,
            };
            if same && node.alive() {
                node.uncertain = seed.uncertain;
                if seed.is_gateway {
                    self.set_gateway(id);
                }
                return (id, false);
            }
        }
        let spawner = if seed.is_gateway {
            None
        } else {
            self.current_id(seed.ppid)
        };
        let mut node = self.blank(seed.pid, Start::Ticks(seed.start_ticks));
        node.spawner = spawner;
        node.ppid = seed.ppid;
        node.sid = seed.sid;
        node.pgid = seed.pgid;
        node.comm = seed.comm;
        node.argv = seed.argv;
        node.is_gateway = seed.is_gateway;
        node.seeded = true;
        node.uncertain = seed.uncertain;
        (self.insert(node), true)
    }

    /// Marks a node as a gateway (a root of lineage).
    pub fn set_gateway(&mut self, id: NodeId) {
        if let Some(n) = self.nodes.get_mut(id)
            && !n.is_gateway
        {
            n.is_gateway = true;
            self.gateways.insert(id);
            if n.alive() {
                self.live_gateways += 1;
            }
        }
    }

    /// Records that `id` now has real parent `new_ppid` (read from /proc after its parent
    /// exited). Returns the previous parent.
    pub fn reparent(&mut self, id: NodeId, new_ppid: u32) -> Option<u32> {
        let old = self
            .nodes
            .get_mut(id)
            .map(|n| std::mem::replace(&mut n.ppid, new_ppid))?;
        if let Some(parent) = self.current_id(new_ppid) {
            self.nodes.get_mut(parent).unwrap().real_children.insert(id);
        }
        Some(old)
    }

    /// Marks a node whose facts are incomplete (the kernel does not follow it, or it was
    /// re-read from /proc after a loss).
    fn mark_uncertain(&mut self, id: NodeId) {
        if let Some(n) = self.nodes.get_mut(id) {
            n.uncertain = true;
        }
    }

    /// Records an exit learnt from /proc (the process is gone and its exit event was lost).
    pub fn mark_gone(&mut self, id: NodeId, ts: u64) {
        if let Some(n) = self.nodes.get_mut(id)
            && n.exited.is_none()
        {
            n.uncertain = true;
            self.set_exited(id, ExitInfo { ts, status: None });
        }
        self.mark_reaped(id, ts);
    }

    /// Records an exit, keeping the live and zombie counts.
    fn set_exited(&mut self, id: NodeId, info: ExitInfo) {
        let Some(node) = self.nodes.get_mut(id) else {
            return;
        };
        let becomes_zombie = node.exited.is_none() && node.reaped_at.is_none();
        if becomes_zombie {
            self.live -= 1;
            self.zombies += 1;
            if node.is_gateway {
                self.live_gateways -= 1;
            }
        }
        node.exited = Some(info);
        let ppid = node.ppid;
        self.nodes.exited(id);
        // An exited process is nobody's orphan to be: its real parent stops listing it now,
        // so that a parent's list holds its live children only (a gateway's thousands of
        // retained dead children would make every fork's insert a big, cold table's).
        if let Some(parent) = self.current_id(ppid).and_then(|p| self.nodes.get_mut(p)) {
            parent.real_children.remove(&id);
        }
        if becomes_zombie {
            self.exit_order.push_back(id);
            // Most are reaped within milliseconds; what they leave is let go once it
            // outnumbers the zombies, and such a walk lets go of at least half of what it
            // walks: a constant work an exit, amortized.
            if self.exit_order.len() > 2 * self.zombies + 64 {
                let nodes = &self.nodes;
                (self.exit_order).retain(|&id| nodes.get(id).is_some_and(Node::zombie));
            }
        }
    }

    fn mark_reaped(&mut self, id: NodeId, ts: u64) {
        let Some(node) = self.nodes.get(id) else {
            return;
        };
        if node.reaped_at.is_some() {
            return;
        }
        if node.exited.is_none() {
            self.set_exited(id, ExitInfo { ts, status: None });
        }
        self.zombies -= 1;
        self.nodes.get_mut(id).unwrap().reaped_at = Some(ts);
        self.retire(id);
        self.prune();
    }

    /// Queues reaped node `id` to be pruned, once.
    fn retire(&mut self, id: NodeId) {
        if let Some(node) = self.nodes.get_mut(id)
            && !node.retired
        {
            node.retired = true;
            self.retired.push_back(id);
        }
    }

    /// Queues node `id` to be pruned if it was reaped and holds no retained descendant any
    /// more (its last one was pruned, or moved to another spawner).
    fn retire_if_done(&mut self, id: NodeId) {
        if self
            .nodes
            .get(id)
            .is_some_and(|n| n.spawned == 0 && n.reaped_at.is_some())
        {
            self.retire(id);
        }
    }

    /// Drops the oldest reaped leaves beyond the retention bound. A reaped node with retained
    /// descendants stays (lineage must resolve); it is queued again when its last one goes.
    fn prune(&mut self) {
        while self.retired.len() > self.retain_dead {
            let Some(id) = self.retired.pop_front() else {
                break;
            };
            let Some(node) = self.nodes.get_mut(id) else {
                continue;
            };
            node.retired = false;
            if node.spawned > 0 {
                continue;
            }
            let (pid, start, spawner) = (node.pid, node.start, node.spawner);
            self.session_values -= usize::from(node.session.is_some());
            self.sessions_pending -= usize::from(node.session_pending);
            self.nodes.remove(id);
            self.gateways.remove(&id);
            match self.current.get(pid) {
                Some(newest) if newest == id => {
                    self.current.remove(pid);
                }
                _ => {
                    if let Start::Exact(ns) = start {
                        self.by_identity.remove(&(pid, ns));
                    }
                }
            }
            if let Some(parent) = spawner.and_then(|s| self.nodes.get_mut(s)) {
                parent.spawned = parent.spawned.saturating_sub(1);
                let id = parent.id;
                self.retire_if_done(id);
            }
        }
    }
}

mod chain;
mod change;
mod events;
mod pids;
pub mod saved;
pub mod session;
pub mod slab;
#[cfg(test)]
pub mod testing;
#[cfg(test)]
mod tests;
