//! The live lineage tree: what is still alive (or a zombie), under whom it was spawned. Built
//! from the graph as [`Branch`]es (the summary's closing picture, and the API's
//! `/v1/tree` as JSON), drawn for people by [`render`] (the summary, `reaper-trace tree`).
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::leaks::Reason;
use crate::lineage::graph::{LineageGraph, Node, NodeId};
use crate::stream::events::{Argv, ProcText};
use crate::stream::readable::describe_status;

/// The processes `/v1/tree` draws: the live and zombie ones every given filter picks, each
/// with the spawners its lineage runs through.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TreeFilter {
    /// Those descended from this tracked process (a gateway, or any process of the tree),
    /// itself included.
    pub gateway: Option<u32>,
    /// Those whose executable or command line contains this text (an `accumulating` flag's
    /// kind names one: `node /srv/mcp.js`).
    pub kind: Option<String>,
    /// Those holding a flag for this reason.
    pub reason: Option<Reason>,
    /// Those in this agent session (`--session-env` or `--session-cgroup`), by its value.
    pub session: Option<String>,
    /// The same, the session's value in base64 (one that is not UTF-8: `id_b64`).
    pub session_b64: Option<String>,
}

impl TreeFilter {
    /// The session asked for, by its value's bytes; an error says why it cannot be read.
    pub fn session_value(&self) -> Result<Option<Vec<u8>>, String> {
        crate::lineage::graph::session::session_value(
            self.session.as_deref(),
            self.session_b64.as_deref(),
        )
    }
}

/// One process of the tree, with the processes it spawned that lead to a live one.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Branch {
    pub pid: u32,
    /// Boot-time ns it started (with `pid`, its identity).
    pub start: u64,
    #[serde(flatten)]
    pub comm: ProcText,
    #[serde(flatten)]
    pub argv: Argv,
    pub gateway: bool,
    /// Its parent now (not its spawner, once reparented).
    pub ppid: u32,
    /// `alive`, `zombie` or `exited` (an exited spawner the lineage runs through).
    pub state: State,
    /// Its wait(2) status, once it exited (`null` when only /proc told of the exit).
    pub status: Option<u32>,
    pub called_setsid: bool,
    /// Learnt from /proc after a loss: its lineage may be incomplete.
    pub uncertain: bool,
    /// The flags it holds.
    pub flags: Vec<Reason>,
    /// What it spawned, in the order it forked them.
    pub spawned: Vec<Branch>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    #[default]
    Alive,
    Zombie,
    Exited,
}

/// The tree of the live (and zombie) processes `filter` picks, as `/v1/tree` and
/// `tree --from` answer; none for a `gateway` the graph does not know. A session that
/// cannot be read (see [`TreeFilter::session_value`], checked where the filter is taken)
/// picks nothing.
pub fn picked_tree(
    graph: &LineageGraph,
    flags: &BTreeMap<NodeId, Vec<Reason>>,
    filter: &TreeFilter,
) -> Option<Vec<Branch>> {
    let under = match filter.gateway {
        Some(pid) => Some(graph.current(pid)?.id),
        None => None,
    };
    let session = filter.session_value();
    let sessions = std::cell::RefCell::new(graph.sessions_of());
    let wanted = |n: &Node| {
        under.is_none_or(|u| graph.descends_from(n.id, u))
            && filter
                .reason
                .is_none_or(|r| flags.get(&n.id).is_some_and(|held| held.contains(&r)))
            && filter.kind.as_deref().is_none_or(|k| runs(n, k))
            && match &session {
                Ok(None) => true,
                Ok(Some(value)) => {
                    (sessions.borrow_mut().of(n.id)).is_some_and(|of| *of.value == **value)
                }
                Err(_) => false,
            }
    };
    Some(alive_tree(graph, flags, wanted))
}

/// Whether `n`'s executable or command line contains `text`.
fn runs(n: &Node, text: &str) -> bool {
    let text = text.as_bytes();
    if text.is_empty() {
        return true;
    }
    let has = |hay: &[u8]| hay.windows(text.len()).any(|w| w == text);
    n.filename.as_deref().is_some_and(has) || has(&n.argv.iter().collect::<Vec<_>>().join(&b' '))
}

/// The tree of the live (and zombie) processes `wanted` picks, each with the spawners its
/// lineage runs through (exited ones too), from the gateways down; `flags` marks them.
pub fn alive_tree(
    graph: &LineageGraph,
    flags: &BTreeMap<NodeId, Vec<Reason>>,
    wanted: impl Fn(&Node) -> bool,
) -> Vec<Branch> {
    let mut keep: HashSet<NodeId> = HashSet::new();
    for node in graph.alive().chain(graph.zombies()).filter(|n| wanted(n)) {
        let mut at = Some(node);
        while let Some(n) = at {
            if !keep.insert(n.id) {
                break;
            }
            at = n.spawner.and_then(|s| graph.node(s));
        }
    }
    let mut roots: Vec<&Node> = keep
        .iter()
        .filter_map(|&id| graph.node(id))
        .filter(|n| n.spawner.is_none_or(|s| !keep.contains(&s)))
        .collect();
    roots.sort_by_key(|n| (!n.is_gateway, n.id));
    // Who spawned whom among the nodes kept, in one pass.
    let mut kids: HashMap<NodeId, Vec<&Node>> = HashMap::new();
    for n in keep.iter().filter_map(|&id| graph.node(id)) {
        if let Some(s) = n.spawner.filter(|s| keep.contains(s)) {
            kids.entry(s).or_default().push(n);
        }
    }
    for list in kids.values_mut() {
        list.sort_by_key(|n| (n.forked_at.unwrap_or(0), n.id));
    }
    let build = Build { flags, kids };
    roots.into_iter().map(|r| build.branch(r)).collect()
}

/// What a tree is built from: the nodes kept, by spawner, and their flags.
struct Build<'a> {
    flags: &'a BTreeMap<NodeId, Vec<Reason>>,
    kids: HashMap<NodeId, Vec<&'a Node>>,
}

impl Build<'_> {
    fn branch(&self, n: &Node) -> Branch {
        let state = match (n.exited, n.reaped_at) {
            (None, _) => State::Alive,
            (Some(_), None) => State::Zombie,
            (Some(_), Some(_)) => State::Exited,
        };
        let kids: &[&Node] = self.kids.get(&n.id).map_or(&[], Vec::as_slice);
        Branch {
            pid: n.pid,
            start: n.start.boottime_ns(),
            comm: ProcText::new("comm", n.comm),
            argv: Argv::new(n.argv.clone()),
            gateway: n.is_gateway,
            ppid: n.ppid,
            state,
            status: n.exited.and_then(|e| e.status),
            called_setsid: n.called_setsid,
            uncertain: n.uncertain,
            flags: self.flags.get(&n.id).cloned().unwrap_or_default(),
            spawned: kids.iter().map(|k| self.branch(k)).collect(),
        }
    }
}

/// The tree drawn for people, under `title`; `empty` when there is nothing to draw.
pub fn render(roots: &[Branch], title: &str, empty: &str) -> String {
    if roots.is_empty() {
        return format!("{empty}\n");
    }
    let mut out = format!("{title}\n");
    for root in roots {
        draw(root, "", Glyph::Root, &mut out);
    }
    out
}

/// The summary's closing picture: every live process, by lineage.
pub fn render_alive_tree(graph: &LineageGraph, flags: &BTreeMap<NodeId, Vec<Reason>>) -> String {
    render(
        &alive_tree(graph, flags, |_| true),
        "still alive, by lineage (spawner edges):",
        "no tracked process is alive",
    )
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Glyph {
    Root,
    Middle,
    Last,
}

fn draw(b: &Branch, prefix: &str, glyph: Glyph, out: &mut String) {
    let mark = match glyph {
        Glyph::Root => "",
        Glyph::Middle => "├─ ",
        Glyph::Last => "└─ ",
    };
    let mut line = describe(b);
    if !b.flags.is_empty() {
        let names: Vec<&str> = b.flags.iter().map(|r| r.name()).collect();
        let _ = write!(line, " LEAK: {}", names.join(", "));
    }
    let _ = writeln!(out, "{prefix}{mark}{line}");
    let child_prefix = match glyph {
        Glyph::Root => prefix.to_owned(),
        Glyph::Middle => format!("{prefix}│  "),
        Glyph::Last => format!("{prefix}   "),
    };
    for (i, kid) in b.spawned.iter().enumerate() {
        let g = match i + 1 == b.spawned.len() {
            true => Glyph::Last,
            false => Glyph::Middle,
        };
        draw(kid, &child_prefix, g, out);
    }
}

fn describe(b: &Branch) -> String {
    let mut s = format!("{} ({})", b.pid, b.comm.for_terminal());
    if b.gateway {
        s.push_str(" gateway");
    }
    if !b.argv.args().is_empty() {
        let _ = write!(s, " `{}`", b.argv.for_terminal());
    }
    match b.state {
        State::Exited => {
            let _ = write!(s, " [{}]", describe_status(b.status));
        }
        State::Zombie => {
            let _ = write!(
                s,
                " [ZOMBIE, {}, not reaped by {}]",
                describe_status(b.status),
                b.ppid
            );
        }
        State::Alive => {
            let _ = write!(s, " [alive, parent {}", b.ppid);
            if b.called_setsid {
                s.push_str(", called setsid");
            }
            if b.uncertain {
                s.push_str(", uncertain");
            }
            s.push(']');
        }
    }
    s
}
