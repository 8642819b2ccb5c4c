//! Leak flags as events: the evidence a person or a tool acts on, built from the inspector's
//! findings and the lineage graph.
use std::collections::BTreeMap;

use serde::Serialize;

use crate::leaks::{Change, Evidence, Flagged, Inspector, Reason};
use crate::lineage::graph::{LineageGraph, Node, NodeId};
use crate::output::events::{Argv, Event, ProcText};
use crate::procfs::facts::{FdKind, read_rss_kib};

/// One process on a flagged process's spawn chain.
#[derive(Clone, Debug, Serialize)]
pub struct Ancestor {
    pub pid: u32,
    #[serde(flatten)]
    pub comm: ProcText,
    #[serde(flatten)]
    pub argv: Argv,
    /// Boot-time ns of its exit; null while alive.
    pub exited: Option<u64>,
}

/// A holder of a pipe's or socket's other end.
#[derive(Clone, Debug, Serialize)]
pub struct Peer {
    pub pid: u32,
    pub fd: u32,
    pub end: &'static str,
    #[serde(flatten)]
    pub comm: ProcText,
}

/// A pipe, socket or terminal a flagged process holds.
#[derive(Clone, Debug, Serialize)]
pub struct PipeInfo {
    pub fd: u32,
    pub kind: &'static str,
    pub inode: Option<u64>,
    pub end: &'static str,
    /// "open" (some process holds the other end), "closed" (none does: EOF or EPIPE is
    /// pending), or "unknown".
    pub other_end: &'static str,
    pub peers: Vec<Peer>,
}

/// What a leak flag carries besides its reason.
#[derive(Clone, Debug, Serialize)]
pub struct LeakDetail {
    pub lineage: Vec<u32>,
    pub ancestors: Vec<Ancestor>,
    pub pipes: Vec<PipeInfo>,
    /// `/proc/PID/stat` state, e.g. "S (sleeping)"; "Z (zombie)" for a zombie.
    pub state: String,
    pub rss_kib: Option<u64>,
    /// Its real parent now: init or a subreaper once the one that forked it exited.
    pub ppid: u32,
    /// Out of its gateway's session, process group or cgroup (informational).
    pub escaped: bool,
    #[serde(flatten)]
    pub comm: ProcText,
    #[serde(flatten)]
    pub argv: Argv,
}

/// Leaks in the closing summary.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LeakSummary {
    /// Flags holding at the end, by reason.
    pub active: BTreeMap<&'static str, u64>,
    /// Flags raised during the run, by reason.
    pub raised: BTreeMap<&'static str, u64>,
    /// Resident memory of the flagged live processes (each counted once).
    pub rss_kib: u64,
    /// The flagged processes grouped by executable.
    pub by_executable: Vec<ExecutableLeaks>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ExecutableLeaks {
    #[serde(flatten)]
    pub executable: ProcText,
    pub pids: Vec<u32>,
    pub rss_kib: u64,
}

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

/// The detail of `node`: its chain, and its pipes from `evidence` (none for a zombie).
pub fn detail(graph: &LineageGraph, node: &Node, evidence: Option<&Evidence>) -> LeakDetail {
    let chain = graph.chain(node.id);
    let ancestors = chain
        .iter()
        .map(|n| Ancestor {
            pid: n.pid,
            comm: ProcText::new("comm", n.comm),
            argv: Argv::new(n.argv.clone()),
            exited: n.exited.map(|e| e.ts),
        })
        .collect();
    let pipes = evidence.map(pipes).unwrap_or_default();
    let (state, rss_kib) = match evidence {
        Some(e) => (state_text(e.sample.state), e.sample.rss_kib),
        None => (state_text(if node.zombie() { b'Z' } else { b'?' }), None),
    };
    // Out of the gateway's session, process group or cgroup: by its own setsid() or an
    // ancestor's (a session is inherited).
    let escaped = match chain.first().filter(|g| g.is_gateway && g.id != node.id) {
        Some(g) => {
            node.escaped
                || node.sid != g.sid
                || node.pgid != g.pgid
                || matches!((g.cgroup_id, node.cgroup_id), (Some(a), Some(b)) if a != b)
        }
        None => node.escaped,
    };
    LeakDetail {
        lineage: chain.iter().map(|n| n.pid).collect(),
        ancestors,
        pipes,
        state,
        rss_kib,
        ppid: node.ppid,
        escaped,
        comm: ProcText::new("comm", node.comm),
        argv: Argv::new(node.argv.clone()),
    }
}

fn pipes(e: &Evidence) -> Vec<PipeInfo> {
    e.sample
        .fds
        .iter()
        .filter(|f| f.fd.kind != FdKind::Other)
        .map(|f| {
            let peers = e
                .peers
                .iter()
                .find(|(fd, _)| *fd == f.fd.fd)
                .map(|(_, holders)| {
                    holders
                        .iter()
                        .map(|h| Peer {
                            pid: h.pid,
                            fd: h.fd,
                            end: h.end.name(),
                            comm: ProcText::new("comm", h.comm),
                        })
                        .collect()
                })
                .unwrap_or_default();
            PipeInfo {
                fd: f.fd.fd,
                kind: f.fd.kind.name(),
                inode: f.fd.inode,
                end: f.fd.end.name(),
                other_end: match f.other_end_open {
                    Some(true) => "open",
                    Some(false) => "closed",
                    None => "unknown",
                },
                peers,
            }
        })
        .collect()
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
        } => Event::Cleared {
            pid: *pid,
            reason: reason.name(),
            because,
        },
    })
}

fn flag_event(graph: &LineageGraph, f: &Flagged, now: u64) -> Option<Event> {
    let node = graph.node(f.node)?;
    let idle_secs = (f.reason == Reason::Idle).then(|| now.saturating_sub(f.since) as f64 / 1e9);
    Some(Event::Flag {
        pid: f.pid,
        reason: f.reason.name(),
        since: f.since,
        idle_secs,
        detail: Box::new(detail(graph, node, f.evidence.as_ref())),
    })
}

/// The flags holding now, by node.
pub fn active_by_node(inspector: &Inspector) -> BTreeMap<NodeId, Vec<Reason>> {
    let mut marks: BTreeMap<NodeId, Vec<Reason>> = BTreeMap::new();
    for (id, reason, _) in inspector.active() {
        marks.entry(id).or_default().push(reason);
    }
    for reasons in marks.values_mut() {
        reasons.sort();
    }
    marks
}

/// The flags holding now: by reason, the RSS of the flagged live processes (each once), and
/// each flagged node with its RSS.
pub struct FlaggedNow {
    pub active: BTreeMap<&'static str, u64>,
    pub rss_kib: u64,
    pub nodes: Vec<(NodeId, u64)>,
}

/// Reads what [`FlaggedNow`] holds (a statm read per flagged live process).
pub fn flagged_now(graph: &LineageGraph, inspector: &Inspector) -> FlaggedNow {
    let mut now = FlaggedNow {
        active: Reason::ALL.iter().map(|r| (r.name(), 0)).collect(),
        rss_kib: 0,
        nodes: Vec::new(),
    };
    for (id, reasons) in active_by_node(inspector) {
        for r in reasons {
            *now.active.entry(r.name()).or_default() += 1;
        }
        let Some(node) = graph.node(id) else {
            continue;
        };
        let rss = match node.alive() {
            true => read_rss_kib(node.pid).unwrap_or(0),
            false => 0,
        };
        now.rss_kib = now.rss_kib.saturating_add(rss);
        now.nodes.push((id, rss));
    }
    now
}

/// The summary's leak section.
pub fn summary(graph: &LineageGraph, inspector: &Inspector) -> LeakSummary {
    let now = flagged_now(graph, inspector);
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
        active: now.active,
        raised: Reason::ALL
            .iter()
            .map(|r| (r.name(), inspector.raised(*r)))
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

/// "3m12s": a duration for people, to the second.
pub fn human_duration(ns: u64) -> String {
    let secs = ns / 1_000_000_000;
    match secs {
        0..60 => format!("{secs}s"),
        60..3600 => format!("{}m{:02}s", secs / 60, secs % 60),
        _ => format!("{}h{:02}m", secs / 3600, secs % 3600 / 60),
    }
}

fn human_rss(kib: u64) -> String {
    match kib {
        0..1024 => format!("{kib} KiB"),
        _ => format!("{} MiB", kib / 1024),
    }
}

/// `1234 (node bridge.cjs)`: a pid and what it runs, escaped for a terminal.
fn who(pid: u32, comm: &ProcText, argv: &Argv) -> String {
    let args = argv.for_terminal();
    match args.is_empty() {
        true => format!("{pid} ({})", comm.for_terminal()),
        false => format!("{pid} ({args})"),
    }
}

/// What the pipes show, for people: `fd 0 pipe:[88123] read end, other end held by 4705 (sleep)
/// fd 5`.
fn pipes_text(pipes: &[PipeInfo]) -> String {
    let parts: Vec<String> = pipes
        .iter()
        .filter(|p| p.kind != "tty")
        .map(|p| {
            let what = match p.inode {
                Some(i) => format!("fd {} {}:[{i}] {} end", p.fd, p.kind, p.end),
                None => format!("fd {} {} {} end", p.fd, p.kind, p.end),
            };
            let holders: Vec<String> = p
                .peers
                .iter()
                .map(|h| {
                    format!(
                        "{} ({}) fd {} {} end",
                        h.pid,
                        h.comm.for_terminal(),
                        h.fd,
                        h.end
                    )
                })
                .collect();
            match (p.other_end, holders.is_empty()) {
                (_, false) => format!("{what}, other end held by {}", holders.join(", ")),
                ("closed", true) => format!("{what}, other end closed"),
                ("open", true) => format!("{what}, other end open (holder not found)"),
                _ => what,
            }
        })
        .collect();
    parts.join("; ")
}

/// One line a person can act on, for a flag raised at `ts`.
pub fn flag_line(ts: u64, pid: u32, reason: &str, since: u64, detail: &LeakDetail) -> String {
    let me = who(pid, &detail.comm, &detail.argv);
    let ago = human_duration(ts.saturating_sub(since));
    let why = match reason {
        "orphaned" => detail
            .ancestors
            .iter()
            .rev()
            .skip(1)
            .enumerate()
            .find_map(|(up, a)| {
                let exited = a.exited?;
                Some(format!(
                    "{} {} exited {} ago",
                    if up == 0 { "spawner" } else { "ancestor" },
                    who(a.pid, &a.comm, &a.argv),
                    human_duration(ts.saturating_sub(exited))
                ))
            })
            .unwrap_or_else(|| "its spawner exited".into()),
        "idle" => format!("waiting for input, no I/O for {ago}"),
        "deaf" => format!("a pipe it reads has had no writers for {ago} (EOF ignored)"),
        "zombie" => format!("exited {ago} ago, not reaped by its parent {}", detail.ppid),
        other => other.to_owned(),
    };
    let mut line = format!("LEAK {reason} pid {me}: {why}");
    let spawner = detail.lineage.iter().rev().nth(1).copied();
    if reason != "zombie" && spawner.is_some_and(|s| s != detail.ppid) {
        line.push_str(&format!(", now a child of {}", detail.ppid));
    }
    if detail.escaped {
        line.push_str(", escaped (another session, group or cgroup than the gateway's)");
    }
    let pipes = pipes_text(&detail.pipes);
    if !pipes.is_empty() {
        line.push_str("; ");
        line.push_str(&pipes);
    }
    if let Some(kib) = detail.rss_kib {
        line.push_str(&format!("; RSS {}", human_rss(kib)));
    }
    line
}

/// `--check`'s verdict for people: one line, then one per leaked process.
pub fn check_lines(
    verdict: &str,
    gateway_exit_code: Option<i32>,
    leaked: &[crate::output::events::LeakedProcess],
) -> String {
    let gateway = match gateway_exit_code {
        Some(c) => format!("the command exited {c}"),
        None => "the command's status is unknown".into(),
    };
    let mut out = format!("CHECK {verdict}: {gateway}; {} left behind", leaked.len());
    for p in leaked {
        let lineage: Vec<String> = p.detail.lineage.iter().map(u32::to_string).collect();
        out.push_str(&format!(
            "\n  pid {} {}, lineage {}",
            who(p.pid, &p.detail.comm, &p.detail.argv),
            p.detail.state,
            lineage.join(" > ")
        ));
        let pipes = pipes_text(&p.detail.pipes);
        if !pipes.is_empty() {
            out.push_str("; ");
            out.push_str(&pipes);
        }
        if let Some(kib) = p.detail.rss_kib {
            out.push_str(&format!("; RSS {}", human_rss(kib)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::rc::Rc;

    use super::*;
    use crate::text::Comm;

    fn ancestor(pid: u32, argv: &[&str], exited: Option<u64>) -> Ancestor {
        Ancestor {
            pid,
            comm: ProcText::new("comm", Comm::from_c(b"x")),
            argv: Argv::new(Rc::from(
                argv.iter()
                    .map(|a| a.as_bytes().to_vec())
                    .collect::<Vec<_>>(),
            )),
            exited,
        }
    }

    fn detail(ancestors: Vec<Ancestor>, ppid: u32, escaped: bool) -> LeakDetail {
        LeakDetail {
            lineage: ancestors.iter().map(|a| a.pid).collect(),
            pipes: vec![PipeInfo {
                fd: 0,
                kind: "pipe",
                inode: Some(88123),
                end: "read",
                other_end: "open",
                peers: vec![Peer {
                    pid: 4705,
                    fd: 5,
                    end: "write",
                    comm: ProcText::new("comm", Comm::from_c(b"sleep\x1b")),
                }],
            }],
            ancestors,
            state: "S (sleeping)".into(),
            rss_kib: Some(312 * 1024),
            ppid,
            escaped,
            comm: ProcText::new("comm", Comm::from_c(b"node")),
            argv: Argv::new(Rc::from(vec![b"node".to_vec(), b"bridge.cjs".to_vec()])),
        }
    }

    const SEC: u64 = 1_000_000_000;

    #[test]
    fn orphaned_line_names_the_exited_spawner_the_peer_and_the_rss() {
        let d = detail(
            vec![
                ancestor(4700, &["hermes", "--tui"], Some(10 * SEC)),
                ancestor(4711, &["node", "bridge.cjs"], None),
            ],
            1,
            true,
        );
        let line = flag_line(202 * SEC, 4711, "orphaned", 10 * SEC, &d);
        assert_eq!(
            line,
            "LEAK orphaned pid 4711 (node bridge.cjs): spawner 4700 (hermes --tui) exited 3m12s \
             ago, now a child of 1, escaped (another session, group or cgroup than the \
             gateway's); fd 0 pipe:[88123] read end, other end held by 4705 (sleep\\x1b) fd 5 \
             write end; RSS 312 MiB"
        );
    }

    #[test]
    fn an_exited_grandparent_is_an_ancestor_and_zombies_say_how_long() {
        let d = detail(
            vec![
                ancestor(1, &["gw"], Some(SEC)),
                ancestor(2, &["sh"], None),
                ancestor(3, &["sleep"], None),
            ],
            2,
            false,
        );
        let line = flag_line(5 * SEC, 3, "orphaned", SEC, &d);
        assert!(line.contains(": ancestor 1 (gw) exited 4s ago;"), "{line}");
        assert!(!line.contains("now a child"), "{line}");
        let line = flag_line(65 * SEC, 3, "zombie", 4 * SEC, &d);
        assert!(
            line.contains("exited 1m01s ago, not reaped by its parent 2"),
            "{line}"
        );
        assert_eq!(human_duration(7300 * SEC), "2h01m");
    }
}
