//! What a process is, as `why` asks it: of a running audit (the API's `/v1/process/PID`) and
//! of an audit read back (`why --from`), answered by one function ([`process`]) from the
//! graph and the flags held ([`HeldFlags`]). What each knows beyond them (a run reads the
//! process's /proc and names its spawn site now; a replay has what the process's last flag
//! recorded) is its [`Witness`].
use super::held::HeldFlags;
use crate::lineage::graph::{LineageGraph, Node, NodeId};
use crate::stream::answer::{Held, Kill, Process, ServerOf};
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
