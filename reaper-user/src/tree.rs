//! The closing picture for people: what is still alive, under whom it was spawned.
use std::collections::HashSet;
use std::fmt::Write as _;

use crate::graph::{LineageGraph, Node, NodeId};
use crate::output::describe_status;
use crate::text::{escape_args, escape_for_terminal};

/// Renders every live (or zombie) process with its lineage, from the gateways down along
/// spawner edges; exited ancestors are shown because the lineage runs through them.
pub fn render_alive_tree(graph: &LineageGraph) -> String {
    let mut keep: HashSet<NodeId> = HashSet::new();
    for node in graph.alive().chain(graph.zombies()) {
        let mut at = Some(node);
        while let Some(n) = at {
            if !keep.insert(n.id) {
                break;
            }
            at = n.spawner.and_then(|s| graph.node(s));
        }
    }
    if keep.is_empty() {
        return "no tracked process is alive\n".to_owned();
    }
    let mut roots: Vec<&Node> = keep
        .iter()
        .filter_map(|&id| graph.node(id))
        .filter(|n| n.spawner.is_none_or(|s| !keep.contains(&s)))
        .collect();
    roots.sort_by_key(|n| (!n.is_gateway, n.id));
    let mut out = String::from("still alive, by lineage (spawner edges):\n");
    for root in roots {
        render(graph, root, &keep, "", true, true, &mut out);
    }
    out
}

fn render(
    graph: &LineageGraph,
    node: &Node,
    keep: &HashSet<NodeId>,
    prefix: &str,
    last: bool,
    root: bool,
    out: &mut String,
) {
    let branch = if root {
        ""
    } else if last {
        "└─ "
    } else {
        "├─ "
    };
    let _ = writeln!(out, "{prefix}{branch}{}", describe(node));
    let kids: Vec<&Node> = graph
        .spawned_by(node.id)
        .into_iter()
        .filter(|k| keep.contains(&k.id))
        .collect();
    let child_prefix = if root {
        prefix.to_owned()
    } else {
        format!("{prefix}{}", if last { "   " } else { "│  " })
    };
    for (i, kid) in kids.iter().enumerate() {
        render(
            graph,
            kid,
            keep,
            &child_prefix,
            i + 1 == kids.len(),
            false,
            out,
        );
    }
}

fn describe(n: &Node) -> String {
    let mut s = format!("{} ({})", n.pid, escape_for_terminal(n.comm.as_bytes()));
    if n.is_gateway {
        s.push_str(" gateway");
    }
    if !n.argv.is_empty() {
        let _ = write!(s, " `{}`", escape_args(&n.argv));
    }
    match (n.exited, n.reaped_at) {
        (Some(e), Some(_)) => {
            let _ = write!(s, " [{}]", describe_status(e.status));
        }
        (Some(e), None) => {
            let _ = write!(
                s,
                " [ZOMBIE, {}, not reaped by {}]",
                describe_status(e.status),
                n.ppid
            );
        }
        (None, _) => {
            let _ = write!(s, " [alive, parent {}", n.ppid);
            if n.escaped {
                s.push_str(", called setsid");
            }
            if n.uncertain {
                s.push_str(", uncertain");
            }
            s.push(']');
        }
    }
    s
}
