//! What a process is, as `why` asks it: of a running audit (the API's `/v1/process/PID`) and
//! of an audit read back (`why --from`), answered by one function ([`process`]) from the
//! graph and the flags held ([`HeldFlags`]). What each knows beyond them (a run reads the
//! process's /proc and names its spawn site now; a replay has what the process's last flag
//! recorded) is its [`Witness`]. The agent sessions (`sessions`) likewise, from the graph
//! and the flags.
use rustc_hash::FxHashMap as HashMap;

use super::flags::evidence_of_session;
use super::held::HeldFlags;
use crate::lineage::graph::{LineageGraph, Node, NodeId};
use crate::stream::answer::{FlaggedIn, Held, Kill, Process, ServerOf, SessionRow};
use crate::stream::events::{LeakDetail, ProcessLabel};

/// What is known of a process beyond the graph and the flags held.
pub trait Witness {
    /// Its lineage, channels and who holds their other ends, RSS and spawn site: as a flag
    /// would show them.
    fn detail(&mut self, graph: &LineageGraph, node: &Node) -> LeakDetail;

    /// When it is an inner process of a server judged from its outermost process (a wrapper
    /// chain: `npm exec` > `sh -c` > `node server.js`): that process, and the server from it
    /// down to this one.
    fn server(&self, graph: &LineageGraph, node: &Node) -> Option<(NodeId, Vec<ProcessLabel>)>;

    /// What `--kill` could do to `node`, holding `flags`.
    fn kill(&self, graph: &LineageGraph, node: &Node, flags: &[Held]) -> Kill;
}

/// Process `id` as a flag would show it, with the flags it holds and what `--kill` could do
/// (an inner process without a flag of its own is killed with its server, from its outermost
/// process), at boot-time `now`; none when the graph does not hold it.
pub fn process(
    graph: &LineageGraph,
    held: &HeldFlags,
    id: NodeId,
    witness: &mut impl Witness,
    now: u64,
) -> Option<Process> {
    let node = graph.node(id)?;
    let mut detail = witness.detail(graph, node);
    // Its session as the graph holds it now (a replay's witness has its last flag's).
    detail.session = super::flags::session_evidence(graph, node);
    let flags = held.of(id).to_vec();
    let server = witness.server(graph, node);
    let kill = match &server {
        Some((top, _)) if flags.is_empty() => {
            let outer = graph.node(*top).unwrap_or(node);
            let kill = witness.kill(graph, outer, held.of(*top));
            Kill {
                why: format!("its server's outermost process {}: {}", outer.pid, kill.why),
                ..kill
            }
        }
        _ => witness.kill(graph, node, &flags),
    };
    let server = server.map(|(top, chain)| {
        detail.chain = chain;
        ServerOf {
            pid: graph.node(top).map_or(0, |n| n.pid),
            flags: held.of(top).to_vec(),
        }
    });
    Some(Process {
        pid: node.pid,
        start: node.start.boottime_ns(),
        alive: node.alive(),
        exited: node.exited.map(|e| e.ts),
        now,
        flags,
        kill,
        server,
        detail,
    })
}

/// The agent sessions of the live processes (those under `gateway`, if given), each with its
/// live processes, those flagged, and their memory as `rss_of` gives it (as last looked at:
/// nothing is read here), in the order they began.
pub fn sessions(
    graph: &LineageGraph,
    held: &HeldFlags,
    gateway: Option<NodeId>,
    rss_of: impl Fn(NodeId) -> Option<u64>,
) -> Vec<SessionRow> {
    let mut rows: Vec<SessionRow> = Vec::new();
    // Each session's row, by the process where it begins.
    let mut at: HashMap<NodeId, usize> = HashMap::default();
    let live = graph
        .alive()
        .filter(|n| gateway.is_none_or(|g| graph.descends_from(n.id, g)));
    let mut sessions = graph.sessions_of();
    for node in live {
        let Some(session) = sessions.of(node.id) else {
            continue;
        };
        let i = *at.entry(session.top).or_insert_with(|| {
            let top = graph.node(session.top);
            let owner = sessions.owner(&session);
            rows.push(SessionRow {
                session: evidence_of_session(graph, &session, owner),
                began: top.map_or(0, |n| n.start.boottime_ns()),
                gateway: graph.gateway_of(session.top).map(|g| g.pid),
                ..SessionRow::default()
            });
            rows.len() - 1
        });
        let row = &mut rows[i];
        row.alive.push(node.pid);
        row.rss_kib += rss_of(node.id).unwrap_or(0);
        let flags = held.of(node.id);
        if !flags.is_empty() {
            row.flagged.push(FlaggedIn {
                pid: node.pid,
                flags: flags.to_vec(),
            });
        }
    }
    for row in &mut rows {
        row.alive.sort_unstable();
    }
    // Sorted by key alone, the rows then taken in that order: a row is large, and ten
    // thousand of them moved about by a sort cost more than the rest of the answer.
    let mut order: Vec<(u64, u32, usize)> = (rows.iter().enumerate())
        .map(|(i, r)| (r.began, r.session.begins, i))
        .collect();
    order.sort_unstable();
    let mut rows: Vec<Option<SessionRow>> = rows.into_iter().map(Some).collect();
    order
        .into_iter()
        .filter_map(|(_, _, i)| rows[i].take())
        .collect()
}
