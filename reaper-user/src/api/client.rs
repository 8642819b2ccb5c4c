//! `reaper-trace why PID`: asks the running audits (each socket in [`SOCKET_DIR`], or the one
//! `--api` names) what they know of a process, and says it in a few lines (or as JSON).
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Empty};
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;

use super::{Process, SOCKET_DIR};
use crate::output::human::{evidence_text, human_duration, who};
use crate::procfs;
use crate::text::escape_for_terminal;

/// Ask the running audits about one process: who spawned it, through whom, from which code,
/// what it holds and who holds the other ends, and the flags it holds.
#[derive(Debug, Parser)]
#[command(name = "reaper-trace why", version = crate::cli::VERSION)]
pub struct WhyCli {
    /// The process.
    pub pid: u32,
    /// The run's API socket to ask (default: every run's, in /run/reaper-trace).
    #[arg(long, value_name = "SOCKET")]
    pub api: Option<PathBuf>,
    /// The answer as one JSON object (the API's `/v1/process/PID`).
    #[arg(long)]
    pub json: bool,
}

/// What `why` found: the answer's text and the exit status (0: a run tracks the process; 1:
/// none does).
pub async fn why(cli: &WhyCli) -> Result<(String, i32)> {
    let sockets = match &cli.api {
        Some(path) => vec![path.clone()],
        None => run_sockets()?,
    };
    let path = format!("/v1/process/{}", cli.pid);
    let (mut asked, mut denied) = (Vec::new(), Vec::new());
    for socket in &sockets {
        let (status, body) = match get(socket, &path).await {
            Ok(answer) => answer,
            Err(e) if permission_denied(&e) => {
                denied.push(socket.display().to_string());
                continue;
            }
            Err(_) => continue, // a socket left by a run that ended
        };
        asked.push(socket.display().to_string());
        if status == StatusCode::NOT_FOUND {
            continue;
        }
        if status != StatusCode::OK {
            bail!("{} answered {status}", socket.display());
        }
        if cli.json {
            return Ok((String::from_utf8_lossy(&body).into_owned(), 0));
        }
        let process: Process = serde_json::from_slice(&body)
            .with_context(|| format!("reading {}'s answer", socket.display()))?;
        return Ok((readable(&process), 0));
    }
    let by = match (asked.is_empty(), denied.is_empty()) {
        (true, true) => format!("no reaper-trace run serves its API in {SOCKET_DIR}"),
        (true, false) => format!(
            "{} may be asked by root only (or the run's own user)",
            denied.join(", ")
        ),
        (false, _) => format!(
            "not a descendant of any gateway traced by {}",
            asked.join(", ")
        ),
    };
    let proc = match procfs::read_stat(cli.pid) {
        Ok(s) => {
            let comm = escape_for_terminal(s.comm.as_bytes());
            format!("{} ({comm}), parent {}", s.pid, s.ppid)
        }
        Err(_) => "no such process".into(),
    };
    Ok((format!("pid {}: {by}; what /proc says: {proc}", cli.pid), 1))
}

/// The runs' sockets, oldest name first.
fn run_sockets() -> Result<Vec<PathBuf>> {
    let mut found: Vec<PathBuf> = match std::fs::read_dir(SOCKET_DIR) {
        Ok(entries) => entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "sock"))
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {SOCKET_DIR}")),
    };
    found.sort();
    Ok(found)
}

/// Whether `e` is the socket refusing this user.
fn permission_denied(e: &anyhow::Error) -> bool {
    e.downcast_ref::<std::io::Error>()
        .is_some_and(|io| io.kind() == std::io::ErrorKind::PermissionDenied)
}

/// `GET path` on the API at `socket`.
async fn get(socket: &Path, path: &str) -> Result<(StatusCode, Bytes)> {
    let stream = UnixStream::connect(socket).await?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .context("HTTP handshake")?;
    tokio::spawn(connection);
    let request = Request::get(path)
        .header(hyper::header::HOST, "localhost")
        .body(Empty::<Bytes>::new())?;
    let response = sender.send_request(request).await?;
    let status = response.status();
    let body = response.into_body().collect().await?.to_bytes();
    Ok((status, body))
}

/// The answer for people: the process and its flags; its lineage from the gateway down, each
/// member alive or when it exited; then the evidence a flag would give.
fn readable(p: &Process) -> String {
    let d = &p.detail;
    let me = who(p.pid, &d.comm, &d.argv);
    let ago = |ts: u64| human_duration(p.now.saturating_sub(ts));
    let state = match p.exited {
        Some(t) => format!("exited {} ago", ago(t)),
        None => "alive".into(),
    };
    let flags: Vec<String> = p
        .flags
        .iter()
        .map(|f| format!("{} for {}", f.reason, ago(f.since)))
        .collect();
    let flags = match flags.is_empty() {
        true => "no flag".into(),
        false => format!("flagged {}", flags.join(", ")),
    };
    let lineage: Vec<String> = d
        .ancestors
        .iter()
        .map(|a| {
            let member = who(a.process.pid, &a.process.comm, &a.process.argv);
            match a.exited {
                Some(t) => format!("{member} [exited {} ago]", ago(t)),
                None => member,
            }
        })
        .collect();
    let mut facts = format!("parent now {}", d.ppid);
    if d.escaped {
        facts.push_str(", escaped its gateway's session, group or cgroup");
    }
    evidence_text(&mut facts, d);
    let kill = match (p.kill.enabled, p.kill.could) {
        (true, true) => format!("--kill will act: {}", p.kill.why),
        (false, true) => format!("--kill would act (this run does not kill): {}", p.kill.why),
        (_, false) => format!("--kill would not act: {}", p.kill.why),
    };
    format!(
        "pid {me}: {state}, {flags}\n  lineage: {}\n  {facts}\n  {kill}",
        lineage.join(" > ")
    )
}
