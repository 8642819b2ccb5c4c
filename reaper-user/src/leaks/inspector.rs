//! The leak inspector: when to look at which descendant, what a look reads from /proc, and the
//! flags that start and stop holding as the rules ([`super::rules`]) answer.
//!
//! Cost model (it runs for days): a live descendant is sampled when it is first seen and then
//! every `max(scan interval, idle-after / 4)`; a sample is a few small /proc reads. Only what
//! must react at once is sampled every scan: a process whose spawn chain just broke (the
//! `orphaned` check), and one flagged `idle` or `deaf` (to clear the flag when it moves data
//! or gets a writer). Zombies come from the lineage graph alone. Pipe peers (who holds the
//! other end) are looked up only as evidence for a new flag.
//!
//! Whether the other end of a pipe or socket is still open is asked of the fd itself: the
//! inspector duplicates it through a pidfd (`pidfd_getfd`) and polls the duplicate with a zero
//! timeout, which reads nothing and tells EOF-pending (no writers left) exactly, with no scan of
//! the machine.
use std::time::Duration;

use rustc_hash::FxHashMap as HashMap;

use super::peers::{Holder, PeerIndex};
use super::rules::{self, Observed};
use crate::identity::{PidRef, ProcessId};
use crate::procfs::facts::{self, Blocked, End, FdKind, OpenFd};

use crate::lineage::graph::{LineageGraph, Node, NodeId};

/// Why a process is flagged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    /// A process on its spawn chain (the gateway included) exited; it holds pipes or sockets.
    Orphaned,
    /// Waits for input on pipes or sockets whose other end is open, and moved no data for
    /// `--idle-after`.
    Idle,
    /// Holds the read end of a pipe with no writers left (EOF pending) for `--idle-after`.
    Deaf,
    /// Exited, and not reaped by its parent for `--zombie-after`.
    Zombie,
    /// Respawns what `--kill` killed (raised by the killer, not by a rule).
    Respawning,
}

impl Reason {
    pub const ALL: [Reason; 5] = [
        Reason::Orphaned,
        Reason::Idle,
        Reason::Deaf,
        Reason::Zombie,
        Reason::Respawning,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Reason::Orphaned => "orphaned",
            Reason::Idle => "idle",
            Reason::Deaf => "deaf",
            Reason::Zombie => "zombie",
            Reason::Respawning => "respawning",
        }
    }

    /// A `--kill-reasons` name: the rules a kill may follow (zombies cannot be killed).
    pub fn killable(name: &str) -> Option<Reason> {
        [Reason::Orphaned, Reason::Idle, Reason::Deaf]
            .into_iter()
            .find(|r| r.name() == name)
    }
}

/// The inspector's settings.
#[derive(Clone, Copy, Debug)]
pub struct InspectOptions {
    pub scan_interval: Duration,
    pub idle_after: Duration,
    pub zombie_after: Duration,
}

impl InspectOptions {
    fn sample_every(&self) -> u64 {
        nanos(self.scan_interval.max(self.idle_after / 4))
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// One pipe, socket or terminal fd of a sampled process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FdFact {
    pub fd: OpenFd,
    /// Whether the other end is open (see [`PidFd::other_end_open`]); `None`: unknown.
    pub other_end_open: Option<bool>,
}

/// What one sample of a process found.
#[derive(Clone, Debug, Default)]
pub struct Sample {
    pub pid: u32,
    /// `/proc/PID/stat` state letter (R, S, D, T, Z...).
    pub state: u8,
    pub rss_kib: Option<u64>,
    pub io: Option<[u64; 4]>,
    pub blocked: Option<Blocked>,
    pub fds: Vec<FdFact>,
}

impl Sample {
    pub fn holds_pipe_or_socket(&self) -> bool {
        self.fds
            .iter()
            .any(|f| matches!(f.fd.kind, FdKind::Pipe | FdKind::Socket))
    }

    pub fn waits_for_input(&self) -> bool {
        self.state == b'S' && matches!(self.blocked, Some(Blocked::WaitingForInput { .. }))
    }

    /// Pipes and sockets whose other end some live process still holds.
    pub fn has_live_peer(&self) -> bool {
        self.fds.iter().any(|f| {
            matches!(f.fd.kind, FdKind::Pipe | FdKind::Socket) && f.other_end_open == Some(true)
        })
    }

    /// A pipe read end whose writers are all gone.
    pub fn eof_pending(&self) -> bool {
        self.fds.iter().any(|f| {
            f.fd.kind == FdKind::Pipe && f.fd.end == End::Read && f.other_end_open == Some(false)
        })
    }
}

/// Samples the process `id` while its pid still names it.
pub fn sample(id: ProcessId) -> Option<Sample> {
    let (handle, stat) = PidRef::open(id).ok()?;
    let (pid, pidfd) = (id.pid, handle.pidfd);
    let fds = facts::read_fds(pid)?
        .into_iter()
        .map(|fd| {
            let other_end_open = match fd.kind {
                FdKind::Pipe | FdKind::Socket => {
                    pidfd.other_end_open(fd.fd, fd.end, fd.kind == FdKind::Socket)
                }
                _ => None,
            };
            FdFact { fd, other_end_open }
        })
        .collect();
    let mut s = Sample {
        pid,
        state: stat.state,
        rss_kib: None, // read for evidence only
        io: facts::read_io(pid),
        blocked: None,
        fds,
    };
    // What its threads are blocked in matters only to `idle`: read it only then.
    if s.state == b'S' && s.has_live_peer() {
        s.blocked = facts::read_blocked(pid);
    }
    Some(s)
}

/// The /proc facts about a live process, and who holds the other ends of its pipes.
#[derive(Clone, Debug)]
pub struct Evidence {
    pub sample: Sample,
    /// The holders of each pipe and socket in `sample`, by fd.
    pub peers: Vec<(u32, Vec<Holder>)>,
}

/// A flag that starts holding.
#[derive(Clone, Debug)]
pub struct Flagged {
    pub node: NodeId,
    pub pid: u32,
    pub reason: Reason,
    /// Boot-time ns since when the condition holds.
    pub since: u64,
    /// The facts it was flagged on (none for a zombie: it has no fds left).
    pub evidence: Option<Evidence>,
}

/// A flag that starts or stops holding.
#[derive(Clone, Debug)]
pub enum Change {
    Flag(Box<Flagged>),
    Cleared {
        node: NodeId,
        pid: u32,
        reason: Reason,
        because: &'static str,
    },
}

/// What the inspector remembers of one live descendant.
#[derive(Default)]
struct Watch {
    pid: u32,
    next_sample: u64,
    io: Option<[u64; 4]>,
    /// When the I/O counters last changed (or were first read).
    io_since: u64,
    /// Since when a pipe read end has had no writers.
    eof_since: Option<u64>,
    /// Whether the spawn chain was broken at the last look.
    chain_broken: bool,
    /// Active flags and since when.
    flags: Vec<(Reason, u64)>,
}

impl Watch {
    fn has(&self, r: Reason) -> bool {
        self.flags.iter().any(|(f, _)| *f == r)
    }
}

/// Runs the rules over the graph's live descendants and zombies.
pub struct Inspector {
    opts: InspectOptions,
    watches: HashMap<NodeId, Watch>,
    /// Flagged zombies: pid and since.
    zombies: HashMap<NodeId, (u32, u64)>,
    peers: PeerIndex,
    /// Flags raised so far, by reason.
    raised: [u64; 5],
}

/// How often an unresolved pipe may send the peer lookup to every process in /proc.
const FULL_SCAN_EVERY: Duration = Duration::from_secs(10);

impl Inspector {
    pub fn new(opts: InspectOptions) -> Self {
        Inspector {
            opts,
            watches: HashMap::default(),
            zombies: HashMap::default(),
            peers: PeerIndex::default(),
            raised: [0; 5],
        }
    }

    /// Flags raised so far, by reason.
    pub fn raised(&self, reason: Reason) -> u64 {
        self.raised[reason as usize]
    }

    /// Active flags: node, reason, since.
    pub fn active(&self) -> impl Iterator<Item = (NodeId, Reason, u64)> + '_ {
        let live = self
            .watches
            .iter()
            .flat_map(|(id, w)| w.flags.iter().map(move |(r, s)| (*id, *r, *s)));
        let zombies = self
            .zombies
            .iter()
            .map(|(id, (_, since))| (*id, Reason::Zombie, *since));
        live.chain(zombies)
    }

    /// One round at boot-time `now`: samples what is due, applies the rules, and returns the
    /// flags that started or stopped holding.
    pub fn scan(&mut self, graph: &LineageGraph, now: u64) -> Vec<Change> {
        let mut changes = Vec::new();
        self.forget_the_dead(graph, &mut changes);
        let live: Vec<&Node> = graph.alive().filter(|n| !n.is_gateway).collect();
        for node in live {
            self.look_at(graph, node, now, &mut changes);
        }
        self.check_zombies(graph, now, &mut changes);
        let mut evidence: Vec<&mut Evidence> = changes
            .iter_mut()
            .filter_map(|c| match c {
                Change::Flag(f) => f.evidence.as_mut(),
                _ => None,
            })
            .collect();
        self.add_peers(graph, &mut evidence);
        for c in &changes {
            if let Change::Flag(f) = c {
                self.raised[f.reason as usize] += 1;
            }
        }
        changes
    }

    /// Clears the flags of descendants that exited.
    fn forget_the_dead(&mut self, graph: &LineageGraph, changes: &mut Vec<Change>) {
        self.watches.retain(|id, w| {
            let alive = graph.node(*id).is_some_and(Node::alive);
            if !alive {
                for (reason, _) in &w.flags {
                    changes.push(Change::Cleared {
                        node: *id,
                        pid: w.pid,
                        reason: *reason,
                        because: "exited",
                    });
                }
            }
            alive
        });
    }

    fn look_at(&mut self, graph: &LineageGraph, node: &Node, now: u64, changes: &mut Vec<Change>) {
        let opts = self.opts;
        let broken = graph.exited_spawner(node.id).is_some();
        let w = self.watches.entry(node.id).or_insert_with(|| Watch {
            pid: node.pid,
            // First looks are spread over a sample period, so that a thousand processes
            // appearing at once are not read in one burst; a short-lived one is never read.
            next_sample: now + first_look_delay(node.id, opts.sample_every()),
            io_since: now,
            ..Watch::default()
        });
        let urgent = (broken && !w.chain_broken) || w.has(Reason::Idle) || w.has(Reason::Deaf);
        w.chain_broken = broken;
        if !urgent && now < w.next_sample {
            return;
        }
        w.next_sample = now.saturating_add(opts.sample_every());
        let Some(s) = sample(node.process()) else {
            return; // gone meanwhile: its exit event is on its way
        };
        if s.io != w.io {
            let first = w.io.is_none();
            w.io = s.io;
            if !first {
                w.io_since = now;
            }
        }
        w.eof_since = match s.eof_pending() {
            true => w.eof_since.or(Some(now)),
            false => None,
        };
        let seen = Observed {
            sample: &s,
            chain_broken: broken,
            io_since: w.io_since,
            eof_since: w.eof_since,
            now,
            idle_after: nanos(opts.idle_after),
        };
        for (reason, rule) in rules::LIVE {
            match (rule(&seen), w.has(reason)) {
                (Some(since), false) => {
                    w.flags.push((reason, since));
                    changes.push(Change::Flag(Box::new(Flagged {
                        node: node.id,
                        pid: node.pid,
                        reason,
                        since,
                        evidence: Some(Evidence {
                            sample: s.clone(),
                            peers: Vec::new(),
                        }),
                    })));
                }
                (None, true) => {
                    w.flags.retain(|(r, _)| *r != reason);
                    changes.push(Change::Cleared {
                        node: node.id,
                        pid: node.pid,
                        reason,
                        because: rules::cleared_because(reason, &seen),
                    });
                }
                _ => {}
            }
        }
    }

    fn check_zombies(&mut self, graph: &LineageGraph, now: u64, changes: &mut Vec<Change>) {
        let after = nanos(self.opts.zombie_after);
        self.zombies.retain(|id, (pid, _)| {
            let still = graph.node(*id).is_some_and(Node::zombie);
            if !still {
                changes.push(Change::Cleared {
                    node: *id,
                    pid: *pid,
                    reason: Reason::Zombie,
                    because: "reaped",
                });
            }
            still
        });
        if graph.zombie_count() == 0 {
            return;
        }
        for node in graph.zombies().filter(|n| !n.is_gateway) {
            let Some(exited) = rules::zombie(node, now, after) else {
                continue;
            };
            if self.zombies.contains_key(&node.id) {
                continue;
            }
            self.zombies.insert(node.id, (node.pid, exited));
            changes.push(Change::Flag(Box::new(Flagged {
                node: node.id,
                pid: node.pid,
                reason: Reason::Zombie,
                since: exited,
                evidence: None,
            })));
        }
    }

    /// Fills in who holds the other ends of the pipes and sockets in `evidence`.
    fn add_peers(&mut self, graph: &LineageGraph, evidence: &mut [&mut Evidence]) {
        if evidence.is_empty() {
            return;
        }
        self.peers.clear();
        index_tracked(&mut self.peers, graph);
        let mut unresolved = rustc_hash::FxHashSet::default();
        for e in evidence.iter() {
            for fact in &e.sample.fds {
                if let Some(inode) = fact.fd.inode
                    && fact.fd.kind == FdKind::Pipe
                    && fact.other_end_open == Some(true)
                    && self
                        .peers
                        .peers(inode, e.sample.pid, fact.fd.end)
                        .is_empty()
                {
                    unresolved.insert(inode);
                }
            }
        }
        let known = graph.alive().map(|n| n.pid).collect();
        self.peers.full_scan(&unresolved, &known, FULL_SCAN_EVERY);
        for e in evidence.iter_mut() {
            let pid = e.sample.pid;
            e.sample.rss_kib = facts::read_rss_kib(pid);
            e.peers = e
                .sample
                .fds
                .iter()
                .filter(|fact| fact.fd.kind == FdKind::Pipe)
                .filter_map(|fact| {
                    let holders = self.peers.peers(fact.fd.inode?, pid, fact.fd.end);
                    Some((fact.fd.fd, holders))
                })
                .collect();
        }
    }

    /// Raises a flag no rule raises (the killer's `respawning`), held until the process exits.
    pub fn raise(
        &mut self,
        graph: &LineageGraph,
        id: NodeId,
        reason: Reason,
        now: u64,
    ) -> Option<Change> {
        let node = graph.node(id).filter(|n| n.alive())?;
        let evidence = self.evidence(graph, node);
        let w = self.watches.entry(id).or_insert_with(|| Watch {
            pid: node.pid,
            next_sample: now,
            io_since: now,
            ..Watch::default()
        });
        if w.has(reason) {
            return None;
        }
        w.flags.push((reason, now));
        self.raised[reason as usize] += 1;
        Some(Change::Flag(Box::new(Flagged {
            node: id,
            pid: node.pid,
            reason,
            since: now,
            evidence,
        })))
    }

    /// Evidence about a live process now (for `--check`): a fresh sample and its pipe peers.
    pub fn evidence(&mut self, graph: &LineageGraph, node: &Node) -> Option<Evidence> {
        let mut found = Evidence {
            sample: sample(node.process())?,
            peers: Vec::new(),
        };
        self.add_peers(graph, &mut [&mut found]);
        Some(found)
    }
}

/// A fixed spread of `id` over `[0, period)` ns (Fibonacci hashing).
fn first_look_delay(id: NodeId, period: u64) -> u64 {
    let spread = id.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32;
    ((u128::from(spread) * u128::from(period)) >> 32) as u64
}

/// Indexes the pipes and sockets of every live tracked process (gateways included).
fn index_tracked(index: &mut PeerIndex, graph: &LineageGraph) {
    for node in graph.alive() {
        if let Some(fds) = facts::read_fds(node.pid) {
            index.add(node.pid, node.comm, &fds);
        }
    }
}
