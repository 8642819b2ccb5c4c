//! What a flag's evidence and `--check`'s verdict say to people (the `why` answer, the
//! JUnit report and a flag's readable line share them), with every string that came from a
//! process escaped for a terminal (in the words of [`crate::stream::words`]). A flag's own
//! line says why in its rule's words: it is the rules' (`leaks::rules::line`).
use crate::stream::events::{LeakDetail, LeakedProcess, PipeInfo, ProcessLabel, wait_status};
use crate::stream::evidence::Frame;
use crate::text::{escape_for_terminal, file_name};

use crate::stream::words::{human_rss, who};

/// Exit status in words, for the tree.
pub fn describe_status(status: Option<u32>) -> String {
    let Some(status) = status else {
        return "exited, status unknown".into();
    };
    match wait_status(status) {
        (Some(code), _, _) => format!("exited {code}"),
        (None, Some(sig), core) => format!("killed by {sig}{}", if core { ", core" } else { "" }),
        _ => "exited".into(),
    }
}

/// What the pipes and sockets show, for people: `fd 0 pipe:[88123] read end, other end held
/// by 4705 (sleep) fd 5 write end`; a socket's end is not named (it reads and writes); the
/// process's internal channels are counted, not listed; what the flag did not list is counted.
fn pipes_text(pipes: &[PipeInfo], omitted: u64) -> String {
    let mut parts: Vec<String> = pipes
        .iter()
        .filter(|p| p.kind != "tty" && !p.internal)
        .map(|p| {
            let socket = p.kind == "socket";
            let end = |end: &str| match socket {
                true => String::new(),
                false => format!(" {end} end"),
            };
            let mut what = match (p.inode, p.index) {
                (Some(i), _) => format!("fd {} {}:[{i}]{}", p.fd, p.kind, end(&p.end)),
                (None, Some(n)) => format!("fd {} {} {n}{}", p.fd, p.kind, end(&p.end)),
                (None, None) => format!("fd {} {}{}", p.fd, p.kind, end(&p.end)),
            };
            // A UNIX socket is the usual case: only other protocols are named.
            match (p.protocol.as_deref(), &p.remote) {
                (Some(proto), Some(remote)) => what.push_str(&format!(" {proto} to {remote}")),
                (Some(proto), None) if proto != "unix" => what.push_str(&format!(" {proto}")),
                _ => {}
            }
            let holders: Vec<String> = p
                .peers
                .iter()
                .map(|h| {
                    format!(
                        "{} ({}) fd {}{}",
                        h.pid,
                        h.comm.for_terminal(),
                        h.fd,
                        end(&h.end)
                    )
                })
                .collect();
            let more = match p.peers_omitted {
                0 => String::new(),
                n => format!(" and {n} more"),
            };
            match (p.other_end.as_ref(), holders.is_empty()) {
                (_, false) => format!("{what}, other end held by {}{more}", holders.join(", ")),
                ("closed", true) => format!("{what}, other end closed"),
                ("open", true) => format!("{what}, other end open (holder not found)"),
                _ => what,
            }
        })
        .collect();
    let internal = pipes.iter().filter(|p| p.internal).count();
    if internal > 0 {
        parts.push(format!("{internal} fds of its own internal channels"));
    }
    if omitted > 0 {
        parts.push(format!("{omitted} more fds of pipes, sockets or terminals"));
    }
    parts.join("; ")
}

/// `server 4701 > 4702 (-c x) > 4703 (server.js)` for a server of more than one process: the
/// first is the flagged process, already named at the start of the line.
fn chain_text(chain: &[ProcessLabel]) -> Option<String> {
    (chain.len() > 1).then(|| {
        let mut members = vec![chain[0].pid.to_string()];
        members.extend(chain[1..].iter().map(|m| who(m.pid, &m.comm, &m.argv)));
        format!("server {}", members.join(" > "))
    })
}

/// The evidence after the reason: where it runs, the server's processes, channels, RSS.
pub fn evidence_text(out: &mut String, detail: &LeakDetail) {
    let place = &detail.placement;
    if let Some(ns) = place.nspid {
        out.push_str(&format!(", pid {ns} in its pid namespace"));
    }
    if let Some(c) = &place.container {
        // Twelve digits, as `docker ps` and `podman ps` show an id.
        let id: String = escape_for_terminal(c.id.as_bytes())
            .chars()
            .take(12)
            .collect();
        out.push_str(&format!(", in {} container {id}", c.runtime));
        if let Some(pod) = &c.pod_uid {
            out.push_str(&format!(" of pod {}", escape_for_terminal(pod.as_bytes())));
        }
    }
    if let Some(session) = &detail.session {
        out.push_str(&format!("; in session {}", session.id.for_terminal()));
        if session.begins != detail.lineage.last().copied().unwrap_or(0) {
            out.push_str(&format!(" (begins at {})", session.begins));
        }
    }
    if let Some(chain) = chain_text(&detail.chain) {
        out.push_str("; ");
        out.push_str(&chain);
    }
    let pipes = pipes_text(&detail.pipes, detail.pipes_omitted);
    if !pipes.is_empty() {
        out.push_str("; ");
        out.push_str(&pipes);
    }
    if let Some(kib) = detail.rss_kib {
        out.push_str(&format!("; RSS {}", human_rss(kib)));
    }
    if let Some(site) = spawn_site_text(&detail.spawned_at) {
        out.push_str("; spawned at ");
        out.push_str(&site);
    }
}

/// Up to three innermost frames of the spawner's own code (not its language's spawning
/// library, nor libc's fork wrapper), each as `function (file:line)`, innermost first; a
/// frame its object names no function for (a stripped program) as `object+0xOFFSET`.
pub fn spawn_site_text(frames: &[Frame]) -> Option<String> {
    let own = frames.iter().filter(|f| !f.in_spawning_library());
    let named: Vec<String> = own
        .take(3)
        .map(|f| {
            let function = match (&f.function, &f.object) {
                (Some(function), _) => function.clone(),
                (None, Some(object)) => {
                    format!("{}+{:#x}", file_name(object), f.offset)
                }
                (None, None) => "?".into(),
            };
            let place = match (&f.file, f.line) {
                (Some(file), Some(line)) => {
                    format!(" ({}:{line})", file_name(file))
                }
                _ => String::new(),
            };
            escape_for_terminal(format!("{function}{place}").as_bytes())
        })
        .collect();
    (!named.is_empty()).then(|| named.join(" < "))
}

/// `--check`'s verdict for people: one line, then one per leaked process.
pub fn check_lines(
    verdict: &str,
    gateway_exit_code: Option<i32>,
    leaked: &[LeakedProcess],
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
        evidence_text(&mut out, &p.detail);
    }
    out
}

#[cfg(test)]
mod tests;
