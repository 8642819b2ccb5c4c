//! `reaper-trace kill`: ask the running audit that tracks them to end processes (root only):
//! by pid, an agent session's, or those holding a flag of a reason, through its kill protocol
//! (`POST /v1/kill`).
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use clap::Parser;
use hyper::StatusCode;

use super::{post, sockets};
use crate::api::{KillAnswer, KillRequest};
use crate::cli::parse_reason;
use crate::leaks::Reason;
use crate::text::escape_for_terminal;

/// End processes through the running audit that tracks them: each with its live
/// descendants, leaves first, SIGTERM then SIGKILL after its `--term-timeout`, each through a
/// pidfd after its identity is checked; never a gateway, pid 1, reaper-trace or its
/// ancestors, or a process outside a gateway's lineage. Root only. Each step is also written
/// to the run's stream as a `kill` event naming who asked.
#[derive(Debug, Parser)]
#[command(name = "reaper-trace kill", version = crate::cli::VERSION)]
#[command(group = clap::ArgGroup::new("narrowed").args(["session", "reason"]).multiple(true))]
pub struct KillCli {
    /// The tracked processes to end, by pid (a session's owner is ended only so).
    #[arg(value_name = "PID")]
    pub pids: Vec<u32>,
    /// The live processes of this agent session (`--session-env` or `--session-cgroup`), its
    /// owner apart, by its value (any bytes: one that is not UTF-8 is asked for as
    /// `session_b64`).
    #[arg(long, value_name = "SESSION")]
    pub session: Option<OsString>,
    /// The live processes holding a flag of this reason (`orphaned`, `idle`, ...).
    #[arg(long, value_name = "REASON", value_parser = parse_reason)]
    pub reason: Option<Reason>,
    /// With --session or --reason: only the processes descended from this one (a gateway).
    #[arg(long, value_name = "PID", requires = "narrowed")]
    pub gateway: Option<u32>,
    /// Say what would be signalled, and signal nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// The run's API socket (default: the one run serving in /run/reaper-trace).
    #[arg(long, value_name = "SOCKET")]
    pub api: Option<PathBuf>,
    /// The answer as JSON (`/v1/kill`: `now`, `dry_run`, `refused`, `steps`).
    #[arg(long)]
    pub json: bool,
}

/// What `kill` did: the text and the exit status (0: every process picked was signalled,
/// would be with --dry-run, or had exited already; 1: one was refused or not tracked; 2:
/// nothing could be picked).
pub async fn kill(cli: &KillCli) -> Result<(String, i32)> {
    if cli.pids.is_empty() && cli.session.is_none() && cli.reason.is_none() {
        bail!("name what to end: PIDs, --session or --reason");
    }
    let (session, session_b64) = super::session_named(cli.session.as_ref());
    let request = KillRequest {
        pids: (!cli.pids.is_empty()).then(|| {
            let pids: Vec<String> = cli.pids.iter().map(u32::to_string).collect();
            pids.join(",")
        }),
        session,
        session_b64,
        reason: cli.reason,
        gateway: cli.gateway,
        dry_run: cli.dry_run,
    };
    let sockets = sockets(cli.api.as_deref())?;
    let socket = match sockets.as_slice() {
        [one] => one,
        [] => bail!("no run serves its API here"),
        many => {
            let all: Vec<String> = many.iter().map(|s| s.display().to_string()).collect();
            bail!(
                "several runs serve their API ({}): choose one with --api",
                all.join(", ")
            )
        }
    };
    let (answer, body) = ask(socket, &request).await?;
    let code = exit_code(&answer);
    if cli.json {
        return Ok((String::from_utf8_lossy(&body).into_owned(), code));
    }
    Ok((readable(&answer), code))
}

/// Asks the run at `socket` for `request`: its answer, and the answer as it came.
pub async fn ask(socket: &Path, request: &KillRequest) -> Result<(KillAnswer, Bytes)> {
    let query = serde_urlencoded::to_string(request).context("writing the query")?;
    let (status, body) = post(socket, &format!("/v1/kill?{query}"))
        .await
        .with_context(|| format!("asking {}", socket.display()))?;
    if status != StatusCode::OK {
        let error: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        let text = error["error"].as_str().unwrap_or("no reason given");
        bail!("{} refused: {text}", socket.display());
    }
    let answer: KillAnswer = serde_json::from_slice(&body)
        .with_context(|| format!("reading {}'s answer", socket.display()))?;
    Ok((answer, body))
}

fn exit_code(answer: &KillAnswer) -> i32 {
    // A process that exited before its pidfd was opened is ended: what was asked for.
    let done = |r: &str| matches!(r, "signalled" | "dry_run" | "exited");
    match (
        &answer.refused,
        answer.steps.iter().all(|s| done(&s.result)),
    ) {
        (Some(_), _) => 2,
        (None, true) => 0,
        (None, false) => 1,
    }
}

/// A line a process: what was signalled, what would be, what was refused and why.
pub fn readable(answer: &KillAnswer) -> String {
    if let Some(why) = &answer.refused {
        return format!("nothing ended: {why}");
    }
    if answer.steps.is_empty() {
        return "nothing to end: no live process picked".into();
    }
    let lines: Vec<String> = answer
        .steps
        .iter()
        .map(|s| {
            let who = match s.comm.is_empty() {
                true => format!("pid {}", s.pid),
                false => format!("pid {} ({})", s.pid, escape_for_terminal(s.comm.as_bytes())),
            };
            let what = match s.result.as_str() {
                "signalled" => "SIGTERM sent; SIGKILL follows if it has not exited by the run's --term-timeout".into(),
                "dry_run" => "would be signalled (--dry-run: nothing sent)".into(),
                "exited" => "exited before it was signalled: nothing sent".into(),
                "not_tracked" => "refused: not tracked by this run".into(),
                "not_alive" => "refused: not alive".into(),
                "not_in_lineage" => "refused: a gateway, pid 1, reaper-trace, an ancestor of it, or outside a gateway's lineage: never killed".into(),
                "uncertain" => "refused: its lineage was repaired from /proc after a loss: never killed".into(),
                other => format!("refused: {other}"),
            };
            format!("{who}: {what}")
        })
        .collect();
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::KillStep;

    fn answer(results: &[&str]) -> KillAnswer {
        let steps = results.iter().enumerate();
        KillAnswer {
            now: 0,
            dry_run: false,
            refused: None,
            steps: steps
                .map(|(i, r)| KillStep {
                    pid: 100 + i as u32,
                    comm: "sleep".into(),
                    result: (*r).into(),
                })
                .collect(),
        }
    }

    #[test]
    fn a_process_that_exited_before_its_signal_is_ended_and_a_refusal_is_not() {
        assert_eq!(exit_code(&answer(&["signalled", "exited"])), 0);
        assert_eq!(exit_code(&answer(&["dry_run", "exited"])), 0);
        assert_eq!(exit_code(&answer(&["signalled", "not_in_lineage"])), 1);
        assert_eq!(exit_code(&answer(&["identity_changed"])), 1);
        let nothing = KillAnswer {
            refused: Some("nothing named".into()),
            ..answer(&[])
        };
        assert_eq!(exit_code(&nothing), 2);
        assert!(
            readable(&answer(&["exited"]))
                .ends_with("exited before it was signalled: nothing sent")
        );
    }
}
