//! `reaper-trace why PID` and `reaper-trace tree`: ask the running audits (each socket in
//! [`SOCKET_DIR`], or the one `--api` names) what they know of a process, or for their live
//! lineage tree, and say it in a few lines (or as JSON).
use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Empty};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;

use super::{Branch, FollowFilter, Process, SOCKET_DIR, TreeFilter, name_session};
use crate::leaks::Reason;
use crate::output::tree::render;
use crate::procfs;
use crate::stream::readable::evidence_text;
use crate::stream::words::{human_duration, who};
use crate::text::escape_for_terminal;

mod from_audit;
pub(super) mod kill;
pub(super) mod sessions;
pub use from_audit::ReplayArgs;
pub use kill::{KillCli, kill};
pub use sessions::{SessionsCli, sessions};

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
    /// The answer as one JSON object (the API's `/v1/process/PID`); with `--from`, one per
    /// line, a line for each process that had the pid.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub replay: ReplayArgs,
}

/// Draw the live lineage tree of the running audits, as the summary draws it, with flags.
#[derive(Debug, Parser)]
#[command(name = "reaper-trace tree", version = crate::cli::VERSION)]
pub struct TreeCli {
    /// Only the processes descended from this one (a gateway, or any tracked process).
    #[arg(long, value_name = "PID")]
    pub gateway: Option<u32>,
    /// Only the processes whose executable or command line contains TEXT.
    #[arg(long, value_name = "TEXT")]
    pub kind: Option<String>,
    /// Only the processes holding a flag for this rule (orphaned, accumulating, ...).
    #[arg(long, value_name = "RULE", value_parser = crate::cli::parse_reason)]
    pub reason: Option<Reason>,
    /// Only the processes in this agent session (`--session-env` or `--session-cgroup`), by
    /// its value (any bytes: one that is not UTF-8 is asked for as `session_b64`).
    #[arg(long, value_name = "SESSION")]
    pub session: Option<OsString>,
    /// The run's API socket to ask (default: every run's, in /run/reaper-trace).
    #[arg(long, value_name = "SOCKET")]
    pub api: Option<PathBuf>,
    /// The trees as JSON: an object of each run's socket (or the audit's file) and its tree's
    /// roots (`/v1/tree`).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub replay: ReplayArgs,
}

/// Follow a running audit's event stream: its NDJSON lines from now on, on standard output,
/// so that tools need not tail its file.
#[derive(Debug, Parser)]
#[command(name = "reaper-trace events", version = crate::cli::VERSION)]
pub struct EventsCli {
    /// Follow the live stream (the only way it is read here: an audit file is read by
    /// `reaper-trace report`).
    #[arg(long, required = true)]
    pub follow: bool,
    /// Only events about this process and what it spawns from now on (and the run's own:
    /// `lost`, `note`, `summary`).
    #[arg(long, value_name = "PID")]
    pub pid: Option<u32>,
    /// Only these events, by name (`fork,exec,flag`).
    #[arg(long, value_name = "NAMES")]
    pub event: Option<String>,
    /// Only flags, clears and kills for this rule.
    #[arg(long, value_name = "RULE", value_parser = crate::cli::parse_reason)]
    pub reason: Option<Reason>,
    /// The run's API socket (default: the one run in /run/reaper-trace, or with `--pid`
    /// the run that tracks it).
    #[arg(long, value_name = "SOCKET")]
    pub api: Option<PathBuf>,
}

/// Streams the lines to standard output until the run ends or drops this follower. Returns
/// the exit status: 0 when the run ended, 1 when it dropped this follower or none follows.
pub async fn events(cli: &EventsCli) -> Result<i32> {
    let filter = FollowFilter {
        follow: Some(String::new()),
        pid: cli.pid,
        event: cli.event.clone(),
        reason: cli.reason,
        queue: None,
    };
    let path = format!("/v1/events?{}", serde_urlencoded::to_string(&filter)?);
    let sockets = sockets(cli.api.as_deref())?;
    if cli.pid.is_none() && sockets.len() > 1 {
        let all: Vec<String> = sockets.iter().map(|s| s.display().to_string()).collect();
        bail!(
            "several runs serve their API ({}): choose one with --api or a process with --pid",
            all.join(", ")
        );
    }
    let mut runs = ask_runs(&sockets, &path).await?;
    if let Some((_, stream)) = runs.answered.drain(..).next() {
        return stream_lines(stream.into_body()).await;
    }
    let none = match cli.pid {
        Some(pid) => format!("pid {pid} is not tracked by"),
        None => "no answer from".into(),
    };
    eprintln!("reaper-trace: {}", runs.none_tracks(&none)?);
    Ok(1)
}

/// Writes each line as it comes; 1 when the last says this follower was dropped.
async fn stream_lines(mut body: hyper::body::Incoming) -> Result<i32> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    let mut last = Bytes::new();
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.context("reading the stream")?.into_data() else {
            continue;
        };
        out.write_all(&data)
            .and_then(|()| out.flush())
            .context("writing to standard output")?;
        last = data;
    }
    if last.ends_with(crate::output::follow::DROPPED) {
        eprintln!("reaper-trace: the run dropped this follower: it did not keep up");
        return Ok(1);
    }
    Ok(0)
}

/// What `why` found: the answer's text and the exit status (0: a run tracks the process; 1:
/// none does).
pub async fn why(cli: &WhyCli) -> Result<(String, i32)> {
    if !cli.replay.from.is_empty() {
        return from_audit::why_from(cli);
    }
    let sockets = sockets(cli.api.as_deref())?;
    let mut runs = ask_runs(&sockets, &format!("/v1/process/{}", cli.pid)).await?;
    if let Some((socket, body)) = runs.bodies().await?.first() {
        if cli.json {
            return Ok((String::from_utf8_lossy(body).into_owned(), 0));
        }
        let process: Process = serde_json::from_slice(body)
            .with_context(|| format!("reading {}'s answer", socket.display()))?;
        return Ok((readable(&process), 0));
    }
    let proc = match procfs::read_stat(cli.pid) {
        Ok(s) => {
            let comm = escape_for_terminal(s.comm.as_bytes());
            format!("{} ({comm}), parent {}", s.pid, s.ppid)
        }
        Err(_) => "no such process".into(),
    };
    let by = runs.none_tracks("not a descendant of any gateway traced by")?;
    Ok((format!("pid {}: {by}; what /proc says: {proc}", cli.pid), 1))
}

/// The filters of `tree`.
fn tree_filter(cli: &TreeCli) -> TreeFilter {
    let (session, session_b64) = session_named(cli.session.as_ref());
    TreeFilter {
        gateway: cli.gateway,
        kind: cli.kind.clone(),
        reason: cli.reason,
        session,
        session_b64,
    }
}

/// A session's value as given on the command line, as a request names it (see
/// [`name_session`]).
pub(super) fn session_named(value: Option<&OsString>) -> (Option<String>, Option<String>) {
    value.map_or((None, None), |v| name_session(v.as_bytes()))
}

/// The words `tree` says when no process is drawn.
fn nothing_alive(filter: &TreeFilter) -> &'static str {
    match *filter != TreeFilter::default() {
        true => "no tracked process is alive that these filters pick",
        false => "no tracked process is alive",
    }
}

/// What `tree` found: the trees' text and the exit status (0: a run answered; 1: none
/// tracks `--gateway`, or no run serves its API).
pub async fn tree(cli: &TreeCli) -> Result<(String, i32)> {
    if !cli.replay.from.is_empty() {
        return from_audit::tree_from(cli);
    }
    let filter = tree_filter(cli);
    let query = serde_urlencoded::to_string(&filter).context("writing the query")?;
    let sockets = sockets(cli.api.as_deref())?;
    let answered = match answers_of(&sockets, &format!("/v1/tree?{query}"), cli.gateway).await? {
        Ok(answered) => answered,
        Err(none) => return Ok(none),
    };
    if cli.json {
        return Ok((by_socket(&answered)?, 0));
    }
    let many = answered.len() > 1;
    let mut text = String::new();
    for (socket, body) in &answered {
        let roots: Vec<Branch> = serde_json::from_slice(body)
            .with_context(|| format!("reading {}'s answer", socket.display()))?;
        let title = match many {
            true => format!(
                "the run at {}: alive, by lineage (spawner edges):",
                socket.display()
            ),
            false => "alive, by lineage (spawner edges):".to_owned(),
        };
        text.push_str(&render(&roots, &title, nothing_alive(&filter)));
    }
    Ok((text.trim_end().to_owned(), 0))
}

/// The runs asked, and what they said.
#[derive(Default)]
pub(super) struct Runs {
    /// The sockets that answered 200, each with its answer, its body still to be read (a
    /// follower's stream goes on).
    answered: Vec<(PathBuf, hyper::Response<hyper::body::Incoming>)>,
    /// The sockets that answered 404.
    asked: Vec<String>,
    /// The sockets that refused this user.
    denied: Vec<String>,
    /// The sockets no run answered on (a run that ended, or a path where none serves).
    silent: Vec<String>,
}

impl Runs {
    /// Why no run answered: `none` and the runs asked; an error when none could be asked
    /// (no run serves its API, or none lets this user ask).
    pub(super) fn none_tracks(&self, none: &str) -> Result<String> {
        match (self.asked.is_empty(), self.denied.is_empty()) {
            (true, true) if self.silent.is_empty() => {
                bail!("no reaper-trace run serves its API in {SOCKET_DIR}")
            }
            (true, true) => bail!(
                "no reaper-trace run serves its API at {}",
                self.silent.join(", ")
            ),
            (true, false) => bail!(
                "{} may be asked by root only (or the run's own user or group)",
                self.denied.join(", ")
            ),
            (false, _) => Ok(format!("{none} {}", self.asked.join(", "))),
        }
    }

    /// The answers' bodies, read whole.
    pub(super) async fn bodies(&mut self) -> Result<Vec<(PathBuf, Bytes)>> {
        let mut bodies = Vec::new();
        for (socket, response) in self.answered.drain(..) {
            let body = response.into_body().collect().await?.to_bytes();
            bodies.push((socket, body));
        }
        Ok(bodies)
    }
}

/// The run at `api`, or the socket of every run that may answer.
pub(super) fn sockets(api: Option<&Path>) -> Result<Vec<PathBuf>> {
    match api {
        Some(path) => Ok(vec![path.to_owned()]),
        None => super::sockets::live(),
    }
}

/// `GET path` of each run at `sockets`.
pub(super) async fn ask_runs(sockets: &[PathBuf], path: &str) -> Result<Runs> {
    let mut runs = Runs::default();
    for socket in sockets {
        let response = match request(socket, path).await {
            Ok(r) => r,
            Err(e) if permission_denied(&e) => {
                runs.denied.push(socket.display().to_string());
                continue;
            }
            Err(_) => {
                // A socket left by a run that ended, or a path where none serves.
                runs.silent.push(socket.display().to_string());
                continue;
            }
        };
        match response.status() {
            StatusCode::OK => runs.answered.push((socket.clone(), response)),
            StatusCode::NOT_FOUND => runs.asked.push(socket.display().to_string()),
            // A run that is ending: as a socket left by one that ended.
            StatusCode::SERVICE_UNAVAILABLE => runs.silent.push(socket.display().to_string()),
            status => {
                let body = response.into_body().collect().await?.to_bytes();
                bail!(
                    "{} answered {status}: {}",
                    socket.display(),
                    String::from_utf8_lossy(&body)
                )
            }
        }
    }
    Ok(runs)
}

/// `GET path` of each run at `sockets`, each answer's body whole; or, when none answered,
/// why (`gateway`: the process asked about, if any) with the exit status 1.
pub(super) async fn answers_of(
    sockets: &[PathBuf],
    path: &str,
    gateway: Option<u32>,
) -> Result<Result<Vec<(PathBuf, Bytes)>, (String, i32)>> {
    let mut runs = ask_runs(sockets, path).await?;
    let answered = runs.bodies().await?;
    if !answered.is_empty() {
        return Ok(Ok(answered));
    }
    let by = match gateway {
        Some(pid) => runs.none_tracks(&format!("pid {pid} is not tracked by"))?,
        None => runs.none_tracks("no answer from")?,
    };
    Ok(Err((by, 1)))
}

/// The runs' answers as one JSON object: each as it came (its fields in their order), under
/// its socket.
pub(super) fn by_socket(answered: &[(PathBuf, Bytes)]) -> Result<String> {
    let members: Vec<String> = answered
        .iter()
        .map(|(socket, body)| {
            let key = serde_json::to_string(&socket.display().to_string())?;
            Ok(format!("{key}:{}", String::from_utf8_lossy(body)))
        })
        .collect::<serde_json::Result<_>>()?;
    Ok(format!("{{{}}}", members.join(",")))
}

/// Whether `e` is the socket refusing this user.
fn permission_denied(e: &anyhow::Error) -> bool {
    e.downcast_ref::<std::io::Error>()
        .is_some_and(|io| io.kind() == std::io::ErrorKind::PermissionDenied)
}

/// `GET path` on the API at `socket`: the status and the whole body.
pub(super) async fn get(socket: &Path, path: &str) -> Result<(StatusCode, Bytes)> {
    let response = request(socket, path).await?;
    let status = response.status();
    let body = response.into_body().collect().await?.to_bytes();
    Ok((status, body))
}

/// `POST path` on the API at `socket`: the status and the whole body.
pub(super) async fn post(socket: &Path, path: &str) -> Result<(StatusCode, Bytes)> {
    let response = send(socket, Method::POST, path).await?;
    let status = response.status();
    let body = response.into_body().collect().await?.to_bytes();
    Ok((status, body))
}

/// `GET path` on the API at `socket`: the response, its body still to be read.
async fn request(socket: &Path, path: &str) -> Result<hyper::Response<hyper::body::Incoming>> {
    send(socket, Method::GET, path).await
}

/// `method path` on the API at `socket`, with no body.
async fn send(
    socket: &Path,
    method: Method,
    path: &str,
) -> Result<hyper::Response<hyper::body::Incoming>> {
    let stream = UnixStream::connect(socket).await?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .context("HTTP handshake")?;
    tokio::spawn(connection);
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header(hyper::header::HOST, "localhost")
        .body(Empty::<Bytes>::new())?;
    Ok(sender.send_request(request).await?)
}

/// The answer for people: the process and its flags; its lineage from the gateway down, each
/// member alive or when it exited; then the evidence a flag would give.
pub(super) fn readable(p: &Process) -> String {
    let kill = match (p.kill.enabled, p.kill.could) {
        (true, true) => format!("--kill will act: {}", p.kill.why),
        (false, true) => format!("--kill would act (this run does not kill): {}", p.kill.why),
        (_, false) => format!("--kill would not act: {}", p.kill.why),
    };
    readable_with(p, &kill)
}

/// [`readable`], its last line `kill`.
fn readable_with(p: &Process, kill: &str) -> String {
    let d = &p.detail;
    let me = who(p.pid, &d.comm, &d.argv);
    let ago = |ts: u64| human_duration(p.now.saturating_sub(ts));
    let state = match p.exited {
        Some(t) => format!("exited {} ago", ago(t)),
        None => "alive".into(),
    };
    let flagged = |held: &[super::Held], none: &str| match held.is_empty() {
        true => none.to_owned(),
        false => {
            let each: Vec<String> = held
                .iter()
                .map(|f| format!("{} for {}", f.reason, ago(f.since)))
                .collect();
            format!("flagged {}", each.join(", "))
        }
    };
    let mut flags = flagged(&p.flags, "no flag");
    if let Some(server) = &p.server {
        let theirs = flagged(&server.flags, "not flagged");
        flags.push_str(&format!(
            "; an inner process of the server from {}, which is {theirs}",
            server.pid
        ));
    }
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
    let kind = match (&d.kind, d.instances) {
        (Some(k), Some(n)) => format!(
            "\n  kind `{}`: {n} alive under its gateway instance (the newest {})",
            escape_for_terminal(k.pattern.as_bytes()),
            d.newest.unwrap_or_default()
        ),
        _ => String::new(),
    };
    format!(
        "pid {me}: {state}, {flags}\n  lineage: {}\n  {facts}{kind}\n  {kill}",
        lineage.join(" > ")
    )
}
