//! `reaper-trace sessions`: the agent sessions (`--session-env` or `--session-cgroup`) of the
//! running audits, or of an audit read back (`--from`): each one's value, where it begins, its
//! owner and whether it ended, its live processes, those flagged and their memory.
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Parser;

use super::{ReplayArgs, answers_of, by_socket, sockets};
use crate::api::{Sessions, SessionsFilter};
use crate::procfs::boottime_now;
use crate::replay;
use crate::stream::words::{human_duration, human_rss};

/// List the agent sessions of the running audits: each session's value, the process where it
/// begins and its owner, whether it ended, its live processes, those flagged, and their memory.
#[derive(Debug, Parser)]
#[command(name = "reaper-trace sessions", version = crate::cli::VERSION)]
pub struct SessionsCli {
    /// Only the sessions of the processes descended from this one (a gateway).
    #[arg(long, value_name = "PID")]
    pub gateway: Option<u32>,
    /// The run's API socket to ask (default: every run's, in /run/reaper-trace).
    #[arg(long, value_name = "SOCKET", conflicts_with = "from")]
    pub api: Option<PathBuf>,
    /// The sessions as JSON: an object of each run's socket (or the audit's file) and its
    /// answer (`/v1/sessions`: `now` and `sessions`).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub replay: ReplayArgs,
}

/// What `sessions` found: the text and the exit status (0: a run answered; 1: none tracks
/// `--gateway`).
pub async fn sessions(cli: &SessionsCli) -> Result<(String, i32)> {
    let filter = SessionsFilter {
        gateway: cli.gateway,
    };
    if !cli.replay.from.is_empty() {
        let audit = cli.replay.from.last().map(|p| p.display().to_string());
        let audit = audit.unwrap_or_default();
        let read = replay::sessions(&cli.replay.from, cli.gateway, cli.replay.at)?;
        let moment = read.moment();
        let Some(answer) = read.answer else {
            let pid = cli.gateway.unwrap_or(0);
            return Ok((format!("pid {pid} is not tracked in {audit} then"), 1));
        };
        if cli.json {
            let key = serde_json::to_string(&audit)?;
            return Ok((format!("{{{key}:{}}}", serde_json::to_string(&answer)?), 0));
        }
        let title = format!("as at {} (read back from {audit}):", moment);
        return Ok((render(&answer, &title, None), 0));
    }
    let query = serde_urlencoded::to_string(&filter).context("writing the query")?;
    let sockets = sockets(cli.api.as_deref())?;
    let path = format!("/v1/sessions?{query}");
    let answered = match answers_of(&sockets, &path, cli.gateway).await? {
        Ok(answered) => answered,
        Err(none) => return Ok(none),
    };
    if cli.json {
        return Ok((by_socket(&answered)?, 0));
    }
    let many = answered.len() > 1;
    let mut blocks = Vec::new();
    for (socket, body) in &answered {
        let answer: Sessions = serde_json::from_slice(body)
            .with_context(|| format!("reading {}'s answer", socket.display()))?;
        let title = match many {
            true => format!("the run at {}:", socket.display()),
            false => String::new(),
        };
        blocks.push(render(&answer, &title, Some(boottime_now())));
    }
    Ok((blocks.join("\n\n"), 0))
}

/// The sessions for people: a line each, then its live processes; `clock` the boot-time ns
/// of now on this machine (none for an audit read back: its answer's `now` is the moment).
pub(in crate::api) fn render(answer: &Sessions, title: &str, clock: Option<u64>) -> String {
    let now = clock.unwrap_or(answer.now).max(answer.now);
    let ago = |ts: u64| human_duration(now.saturating_sub(ts));
    let mut lines: Vec<String> = Vec::new();
    if !title.is_empty() {
        lines.push(title.to_owned());
    }
    if answer.sessions.is_empty() {
        lines.push("no live process is in an agent session".into());
    }
    for s in &answer.sessions {
        let e = &s.session;
        let mut line = format!(
            "session {}: begins at {}, {} ago",
            e.id.for_terminal(),
            e.begins,
            ago(s.began)
        );
        if let Some(gateway) = s.gateway {
            line.push_str(&format!(", under gateway {gateway}"));
        }
        match (e.owner, e.ended) {
            (Some(owner), Some(ended)) => line.push_str(&format!(
                "; ENDED {} ago (its owner {owner} exited)",
                ago(ended)
            )),
            (Some(owner), None) if owner != e.begins => {
                line.push_str(&format!("; running (its owner {owner})"))
            }
            _ => line.push_str("; running"),
        }
        let pids: Vec<String> = s.alive.iter().map(u32::to_string).collect();
        // Memory as last looked at: a process is looked at within a sample period of its start.
        let rss = match s.rss_kib {
            0 => "not looked at yet".to_owned(),
            kib => human_rss(kib),
        };
        line.push_str(&format!(
            "\n  {} alive: {}; RSS {rss}",
            s.alive.len(),
            pids.join(" ")
        ));
        for f in &s.flagged {
            let reasons: Vec<String> = f.flags.iter().map(|h| h.reason.to_string()).collect();
            line.push_str(&format!("\n  flagged {}: {}", f.pid, reasons.join(", ")));
        }
        lines.push(line);
    }
    lines.join("\n")
}
