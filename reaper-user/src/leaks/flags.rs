//! Leak flags as events: the evidence a person or a tool acts on, built from the inspector's
//! findings and the lineage graph.
use std::collections::BTreeMap;

use crate::identity::ProcessId;
use crate::leaks::{Change, Crowd, Evidence, Flagged, Inspector, Reason};
use crate::lineage::graph::session::SessionOf;
use crate::lineage::graph::{LineageGraph, Node, NodeId};
use crate::procfs::facts::{FdKind, read_rss_kib};
use crate::procfs::sockets::SocketKind;
use crate::stream::events::{
    Ancestor, Argv, Cleared, Event, ExecutableLeaks, Flag, KindEvidence, LeakDetail, LeakSummary,
    Peer, PipeInfo, ProcText, ProcessLabel, SessionEvidence, SpawningThread,
};
use crate::stream::evidence::{PEERS_LISTED, PIPES_LISTED};

fn state_text(state: u8) -> String {
    let name = match state {
        b'R' => "running",
        b'S' => "sleeping",
        b'D' => "disk sleep",
        b'T' => "stopped",
        b't' => "tracing stop",
        b'Z' => "zombie",
        b'X' => "dead",
        b'I' => "idle",
        _ => "unknown",
    };
    format!("{} ({name})", char::from(state))
}

/// A process's name as it is now (prctl(PR_SET_NAME), a write to /proc/PID/comm), not at its
/// exec: the one name an event gives a process. A dead one keeps its last known name.
pub fn current_name(n: &Node) -> crate::text::Comm {
    match n.alive() {
        true => n.process().still_same().map_or(n.comm, |stat| stat.comm),
        false => n.comm,
    }
}

/// How an event names `n`, by the name `comm`.
pub fn label(n: &Node, comm: crate::text::Comm) -> ProcessLabel {
    ProcessLabel {
        pid: n.pid,
        comm: ProcText::new("comm", comm),
        argv: Argv::new(n.argv.clone()),
    }
}

/// The detail of `node`: its chain, and its pipes from `evidence` (none for a zombie).
pub fn detail(graph: &LineageGraph, node: &Node, evidence: Option<&Evidence>) -> LeakDetail {
    detail_named(graph, node, evidence, current_name)
}

/// [`detail`], each process named by `name` (a replay names them as the stream did, not as
/// /proc does now).
pub fn detail_named(
    graph: &LineageGraph,
    node: &Node,
    evidence: Option<&Evidence>,
    name: impl Fn(&Node) -> crate::text::Comm,
) -> LeakDetail {
    let chain = graph.chain(node.id);
    // Its name now, from the look that flagged it, or from /proc.
    let comm = evidence.map_or_else(|| name(node), |e| e.sample.comm);
    let name_of = |n: &Node| match n.id == node.id {
        true => comm,
        false => name(n),
    };
    let ancestors = chain
        .iter()
        .map(|n| Ancestor {
            process: label(n, name_of(n)),
            exited: n.exited.map(|e| e.ts),
        })
        .collect();
    let (pipes, pipes_omitted) = evidence.map(pipes).unwrap_or_default();
    let member = |n: &Node| label(n, name_of(n));
    let server = match evidence {
        Some(e) => e
            .server
            .iter()
            .filter_map(|id| graph.node(*id))
            .map(member)
            .collect(),
        None => vec![member(node)],
    };
    let (state, rss_kib) = match evidence {
        Some(e) => (state_text(e.sample.state), e.sample.rss_kib),
        None => (state_text(if node.zombie() { b'Z' } else { b'?' }), None),
    };
    LeakDetail {
        lineage: chain.iter().map(|n| n.pid).collect(),
        ancestors,
        chain: server,
        pipes,
        pipes_omitted,
        state,
        rss_kib,
        ppid: node.ppid,
        escaped: graph.escaped(node.id),
        placement: evidence.map(|e| e.placement.clone()).unwrap_or_default(),
        comm: ProcText::new("comm", comm),
        argv: Argv::new(node.argv.clone()),
        thread: SpawningThread::of(node.spawning_thread),
        session: session_evidence(graph, node),
        kind: None,
        instances: None,
        newest: None,
        spawned_at: Default::default(),
        spawned_at_truncated: false,
    }
}

/// The agent session `node` is in, when it is in one: where it begins, and its owner's exit
/// once it ended (the owner named only when it is not `node` itself: see `graph::session`).
pub fn session_evidence(graph: &LineageGraph, node: &Node) -> Option<SessionEvidence> {
    let mut sessions = graph.sessions_of();
    let session = sessions.of(node.id)?;
    let owner = sessions.owner(&session).filter(|o| o.id != node.id);
    Some(evidence_of_session(graph, &session, owner))
}

/// Session `session`: its value, where it begins, its owner as given (none: not named) and
/// the owner's exit.
pub fn evidence_of_session(
    graph: &LineageGraph,
    session: &SessionOf,
    owner: Option<&Node>,
) -> SessionEvidence {
    SessionEvidence {
        id: ProcText::new("id", session.value.clone()),
        begins: graph.node(session.top).map_or(0, |n| n.pid),
        owner: owner.map(|o| o.pid),
        ended: owner.and_then(|o| o.exited).map(|e| e.ts),
    }
}

/// The pipes, sockets and terminals evidence `e` found, the first [`PIPES_LISTED`] each with
/// the first [`PEERS_LISTED`] holders of its other end, and how many more were not listed.
fn pipes(e: &Evidence) -> (Vec<PipeInfo>, u64) {
    let held = e.sample.fds.iter().filter(|f| f.fd.kind != FdKind::Other);
    let omitted = held.clone().count().saturating_sub(PIPES_LISTED) as u64;
    let listed = held
        .take(PIPES_LISTED)
        .map(|f| {
            let holders = e
                .peers
                .iter()
                .find(|(fd, _)| *fd == f.fd.fd)
                .map_or(&[][..], |(_, holders)| holders.as_slice());
            let peers = holders
                .iter()
                .take(PEERS_LISTED)
                .map(|h| Peer {
                    pid: h.pid,
                    fd: h.fd,
                    end: h.end.name().into(),
                    comm: ProcText::new("comm", h.comm),
                })
                .collect();
            PipeInfo {
                fd: f.fd.fd,
                kind: f.fd.kind.name().into(),
                inode: f.fd.inode,
                end: f.fd.end.name().into(),
                other_end: match f.other_end_open {
                    Some(true) => "open",
                    Some(false) => "closed",
                    None => "unknown",
                }
                .into(),
                peer_inode: f.peer_inode,
                protocol: f.socket.map(|k| k.name().into()),
                remote: match f.socket {
                    Some(SocketKind::Tcp {
                        remote: Some(addr), ..
                    }) => Some(addr.to_string()),
                    _ => None,
                },
                index: f.fd.pty,
                internal: f.internal,
                peers,
                peers_omitted: holders.len().saturating_sub(PEERS_LISTED) as u64,
            }
        })
        .collect();
    (listed, omitted)
}

/// The event for an inspector finding.
pub fn change_event(graph: &LineageGraph, change: &Change, now: u64) -> Option<Event> {
    Some(match change {
        Change::Flag(f) => flag_event(graph, f, now)?,
        Change::Cleared {
            pid,
            reason,
            because,
            ..
        } => Event::Cleared(Cleared {
            pid: *pid,
            reason: *reason,
            because: (*because).into(),
        }),
    })
}

/// A kind's evidence: its executable and pattern, its live instances and the newest one.
pub fn add_crowd(detail: &mut LeakDetail, c: &Crowd) {
    detail.kind = Some(KindEvidence {
        exe: String::from_utf8_lossy(&c.exe).into_owned(),
        pattern: c.pattern.clone(),
    });
    detail.instances = Some(c.instances as u64);
    detail.newest = Some(c.newest);
}

fn flag_event(graph: &LineageGraph, f: &Flagged, now: u64) -> Option<Event> {
    let node = graph.node(f.node)?;
    let idle_secs = (f.reason == Reason::Idle).then(|| now.saturating_sub(f.since) as f64 / 1e9);
    let mut detail = detail(graph, node, f.evidence.as_ref());
    if let Some(c) = &f.crowd {
        add_crowd(&mut detail, c);
    }
    Some(Event::Flag(Flag {
        pid: f.pid,
        reason: f.reason,
        since: f.since,
        idle_secs,
        detail: Box::new(detail),
    }))
}

/// The flags holding now: by reason, the RSS of the flagged live processes (each once), and
/// each flagged node with its RSS.
pub struct FlaggedNow {
    pub active: BTreeMap<&'static str, u64>,
    pub rss_kib: u64,
    pub nodes: Vec<(NodeId, u64)>,
}

/// The resident memory of flagged processes, each read at most every [`RssCache::EVERY`]: a
/// thousand flagged instances of an accumulating kind must not cost a thousand statm reads a
/// scan (that was 3% of a core). A process's memory up to 10 s and a round old is what the
/// gauge shows: a new flag's as its evidence found it (0 until the next round when its evidence
/// could not be read), then as read wherever the caller has the stale ones read ([`RssCache::stale`], [`RssCache::read`]: the run reads them on the slow side at the
/// start of each round, not on the reader's thread, where 10,000 flagged instances would be
/// 10,000 reads in one piece every 10 s).
#[derive(Default)]
pub struct RssCache {
    kib: rustc_hash::FxHashMap<NodeId, (u64, std::time::Instant)>,
}

impl RssCache {
    pub const EVERY: std::time::Duration = std::time::Duration::from_secs(10);

    /// Process `id`'s memory as last read (0 before it is).
    fn of(&self, id: NodeId) -> u64 {
        self.kib.get(&id).map_or(0, |(kib, _)| *kib)
    }

    /// The flagged live processes whose memory was not read within [`RssCache::EVERY`].
    pub fn stale(&self, graph: &LineageGraph, inspector: &Inspector) -> Vec<(NodeId, ProcessId)> {
        let fresh = |id: &NodeId| {
            let at = self.kib.get(id).map(|(_, at)| at);
            at.is_some_and(|at| at.elapsed() < Self::EVERY)
        };
        // (A process's flags come one after another.)
        let mut ids: Vec<NodeId> = inspector.active().map(|(id, _, _)| id).collect();
        ids.dedup();
        (ids.into_iter().filter(|id| !fresh(id)))
            .filter_map(|id| graph.node(id).filter(|n| n.alive()))
            .map(|n| (n.id, n.process()))
            .collect()
    }

    /// Reads the memory of the `stale` processes (each none unless its pid still names it).
    pub fn read(stale: Vec<(NodeId, ProcessId)>) -> Vec<(NodeId, Option<u64>)> {
        (stale.into_iter())
            .map(|(id, process)| {
                let kib = read_rss_kib(process.pid);
                (id, kib.filter(|_| process.still_same().is_some()))
            })
            .collect()
    }

    /// Keeps what [`RssCache::read`] found, as of now (where it could read nothing, the
    /// process gone or /proc refusing, what it had, else 0).
    pub fn fill(&mut self, read: Vec<(NodeId, Option<u64>)>) {
        let now = std::time::Instant::now();
        for (id, kib) in read {
            let kept = self.kib.entry(id).or_insert((0, now));
            *kept = (kib.unwrap_or(kept.0), now);
        }
    }

    /// Keeps process `id`'s memory as the evidence of a flag it was just given found it.
    pub fn flagged(&mut self, id: NodeId, kib: u64) {
        self.kib.insert(id, (kib, std::time::Instant::now()));
    }
}

/// What [`FlaggedNow`] holds, each flagged process's memory as `rss` last found it.
pub fn flagged_now(graph: &LineageGraph, inspector: &Inspector, rss: &mut RssCache) -> FlaggedNow {
    let mut now = FlaggedNow {
        active: Reason::ALL.iter().map(|r| (r.name(), 0)).collect(),
        rss_kib: 0,
        nodes: Vec::new(),
    };
    let flagged = inspector.held().by_node();
    rss.kib.retain(|id, _| flagged.contains_key(id));
    for (id, reasons) in flagged {
        for r in reasons {
            *now.active.entry(r.name()).or_default() += 1;
        }
        let Some(node) = graph.node(id) else {
            continue;
        };
        let kib = match node.alive() {
            true => rss.of(id),
            false => 0,
        };
        now.rss_kib = now.rss_kib.saturating_add(kib);
        now.nodes.push((id, kib));
    }
    now
}

/// The summary's leak section.
pub fn summary(graph: &LineageGraph, inspector: &Inspector) -> LeakSummary {
    // At the run's end: read here.
    let mut rss = RssCache::default();
    rss.fill(RssCache::read(rss.stale(graph, inspector)));
    let now = flagged_now(graph, inspector, &mut rss);
    let mut by_exe: BTreeMap<Vec<u8>, (Vec<u32>, u64)> = BTreeMap::new();
    for (id, rss) in &now.nodes {
        let Some(node) = graph.node(*id) else {
            continue;
        };
        let exe = match &node.filename {
            Some(f) => f.to_vec(),
            None => node.comm.as_bytes().to_vec(),
        };
        let entry = by_exe.entry(exe).or_default();
        entry.0.push(node.pid);
        entry.1 = entry.1.saturating_add(*rss);
    }
    let mut out = LeakSummary {
        active: now.active.into_iter().map(|(r, n)| (r.into(), n)).collect(),
        raised: Reason::ALL
            .iter()
            .map(|r| (r.name().into(), inspector.raised(*r)))
            .collect(),
        rss_kib: now.rss_kib,
        by_executable: Vec::new(),
    };
    out.by_executable = by_exe
        .into_iter()
        .map(|(exe, (mut pids, rss_kib))| {
            pids.sort_unstable();
            ExecutableLeaks {
                executable: ProcText::new("executable", &exe[..]),
                pids,
                rss_kib,
            }
        })
        .collect();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::Start;
    use crate::procfs::read_stat;

    /// The memory of a process read while its pid names it, none once it names another.
    #[test]
    fn a_flagged_processs_memory_is_read_only_while_its_pid_names_it() {
        let me = ProcessId::of_stat(&read_stat(std::process::id()).unwrap());
        let Start::Ticks(ticks) = me.start else {
            unreachable!("read from /proc")
        };
        let reused = ProcessId {
            start: Start::Ticks(ticks + 1),
            ..me
        };
        let read = RssCache::read(vec![(1, me), (2, reused)]);
        assert!(read[0].1.is_some_and(|kib| kib > 0), "{read:?}");
        assert_eq!(read[1], (2, None));
        let mut cache = RssCache::default();
        cache.fill(read);
        cache.flagged(3, 42);
        assert!(cache.of(1) > 0);
        assert_eq!((cache.of(2), cache.of(3), cache.of(4)), (0, 42, 0));
        cache.fill(vec![(3, None)]);
        assert_eq!(cache.of(3), 42, "kept where nothing could be read");
    }
}
