//! The closing picture for people: what is still alive, under whom it was spawned.
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;

use crate::leaks::Reason;
use crate::lineage::graph::{LineageGraph, Node, NodeId};
use crate::output::human::describe_status;
use crate::text::escape_for_terminal;

/// Renders every live (or zombie) process with its lineage, from the gateways down along
/// spawner edges; exited ancestors are shown because the lineage runs through them.
pub fn render_alive_tree(graph: &LineageGraph, flags: &BTreeMap<NodeId, Vec<Reason>>) -> String {
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
    // Who spawned whom among the nodes drawn, in one pass.
    let mut kids: HashMap<NodeId, Vec<&Node>> = HashMap::new();
    for n in keep.iter().filter_map(|&id| graph.node(id)) {
        if let Some(s) = n.spawner.filter(|s| keep.contains(s)) {
            kids.entry(s).or_default().push(n);
        }
    }
    for list in kids.values_mut() {
        list.sort_by_key(|n| (n.forked_at.unwrap_or(0), n.id));
    }
    let tree = Tree { flags, kids };
    let mut out = String::from("still alive, by lineage (spawner edges):\n");
    for root in roots {
        tree.render(root, "", Branch::Root, &mut out);
    }
    out
}

/// What is drawn: the nodes kept, by spawner, and the flags to mark them with.
struct Tree<'a> {
    flags: &'a BTreeMap<NodeId, Vec<Reason>>,
    kids: HashMap<NodeId, Vec<&'a Node>>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Branch {
    Root,
    Middle,
    Last,
}

impl Tree<'_> {
    fn render(&self, node: &Node, prefix: &str, branch: Branch, out: &mut String) {
        let glyph = match branch {
            Branch::Root => "",
            Branch::Middle => "├─ ",
            Branch::Last => "└─ ",
        };
        let mut line = describe(node);
        if let Some(reasons) = self.flags.get(&node.id) {
            let names: Vec<&str> = reasons.iter().map(|r| r.name()).collect();
            let _ = write!(line, " LEAK: {}", names.join(", "));
        }
        let _ = writeln!(out, "{prefix}{glyph}{line}");
        let kids: &[&Node] = self.kids.get(&node.id).map_or(&[], Vec::as_slice);
        let child_prefix = match branch {
            Branch::Root => prefix.to_owned(),
            Branch::Middle => format!("{prefix}│  "),
            Branch::Last => format!("{prefix}   "),
        };
        for (i, kid) in kids.iter().enumerate() {
            let b = if i + 1 == kids.len() {
                Branch::Last
            } else {
                Branch::Middle
            };
            self.render(kid, &child_prefix, b, out);
        }
    }
}

fn describe(n: &Node) -> String {
    let mut s = format!("{} ({})", n.pid, escape_for_terminal(n.comm.as_bytes()));
    if n.is_gateway {
        s.push_str(" gateway");
    }
    if !n.argv.is_empty() {
        let _ = write!(s, " `{}`", n.argv.for_terminal());
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
            if n.called_setsid {
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
