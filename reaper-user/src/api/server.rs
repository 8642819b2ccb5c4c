//! Serves the API on its UNIX socket (through [`crate::serve`], on the servers' thread): each
//! request a [`Query`] the run answers as it comes (`daemon/answers.rs`). Only root,
//! reaper-trace's own user and the members of `--api-group` may ask (the socket is 0600, or 0660 and the group's;
//! each connection's peer credentials are checked too).
use std::convert::Infallible;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Frame;
use hyper::{Method, Request, Response, StatusCode, body::Incoming};
use std::os::unix::net::UnixListener;
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot};

use super::{Asked, AskedBy, FollowFilter, KillRequest, Query, TreeFilter};
use crate::output::follow::{self, FollowStream};
use crate::serve::{self, Body};

/// The API's socket file, removed when dropped (at the run's end).
pub struct SocketFile(PathBuf);

impl Drop for SocketFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Who may ask: root, reaper-trace's own user, and the members of `--api-group`.
#[derive(Clone, Copy, Debug)]
pub struct Access {
    pub group: Option<u32>,
}

impl Access {
    /// Whether the peer `cred` may ask. A member of the group by a supplementary group is
    /// found in its /proc status (the credentials carry the primary one only).
    fn allows(&self, cred: &tokio::net::unix::UCred) -> bool {
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        if cred.uid() == 0 || cred.uid() == me {
            return true;
        }
        let Some(group) = self.group else {
            return false;
        };
        let supplementary = || {
            let pid = cred.pid().and_then(|p| u32::try_from(p).ok())?;
            let status = crate::procfs::read_text(pid, "status").ok()?;
            let groups = status.lines().find_map(|l| l.strip_prefix("Groups:"))?;
            Some(groups.split_whitespace().any(|g| g.parse() == Ok(group)))
        };
        cred.gid() == group || supplementary() == Some(true)
    }
}

/// Binds the socket at `path` (its directory made 0755 if missing; a socket left there by a
/// run that was killed is replaced, anything else is an error), mode 0600, or 0660 and owned
/// by `access`'s group.
pub fn bind(path: &Path, access: Access) -> Result<(UnixListener, SocketFile)> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir)
            .with_context(|| format!("making {}", dir.display()))?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()) => {
            std::fs::remove_file(path).with_context(|| format!("replacing {}", path.display()))?
        }
        Ok(_) => anyhow::bail!("{} exists and is not a socket", path.display()),
        Err(_) => {}
    }
    let listener =
        UnixListener::bind(path).with_context(|| format!("listening on {}", path.display()))?;
    let file = SocketFile(path.to_owned());
    let mode = match access.group {
        Some(gid) => {
            let gid = Some(nix::unistd::Gid::from_raw(gid));
            nix::unistd::chown(path, None, gid)
                .with_context(|| format!("giving {} to --api-group", path.display()))?;
            0o660
        }
        None => 0o600,
    };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("making {} {mode:o}", path.display()))?;
    Ok((listener, file))
}

/// The API being served: [`Server::close`] at the run's end.
pub struct Server {
    _file: SocketFile,
    serving: serve::Server,
}

/// What the API allows its clients (see [`serve`]): a client of `top` holds one connection,
/// a follower one for as long as it follows.
const LIMITS: serve::Limits = serve::Limits {
    connections: 64,
    idle: Duration::from_secs(10),
};

/// How long the run's end waits for the answers under way (a follower's last lines).
const FINISH: Duration = Duration::from_secs(1);

impl Server {
    /// Serves on `listener` (its socket file `file`) on the servers' thread, asking the event
    /// loop through `queries`; a peer `access` does not allow is closed unanswered.
    pub fn start(
        thread: &serve::Thread,
        (listener, file): (UnixListener, SocketFile),
        access: Access,
        queries: mpsc::Sender<Query>,
    ) -> std::io::Result<Server> {
        let admit = move |stream: &UnixStream| {
            let cred = stream.peer_cred().ok().filter(|c| access.allows(c))?;
            Some(AskedBy {
                uid: cred.uid(),
                pid: cred.pid().and_then(|p| u32::try_from(p).ok()).unwrap_or(0),
            })
        };
        let handler = move |req| respond(req, queries.clone());
        Ok(Server {
            _file: file,
            serving: thread.serve(listener, LIMITS, admit, handler)?,
        })
    }

    /// Stops taking connections and lets the answers under way end (a follower's stream ends
    /// once the run dropped its queue), waiting [`FINISH`] at most; then the socket goes.
    pub async fn close(self) {
        self.serving.close(FINISH).await;
    }
}

async fn respond(req: Request<Incoming>, queries: mpsc::Sender<Query>) -> Response<Body> {
    let query = req.uri().query().unwrap_or_default();
    let path = req.uri().path();
    match (req.method(), path) {
        (&Method::POST, "/v1/kill") => {}
        (&Method::GET, "/v1/kill") => return error(StatusCode::METHOD_NOT_ALLOWED, "use POST"),
        (&Method::GET, _) => {}
        _ => return error(StatusCode::METHOD_NOT_ALLOWED, "use GET"),
    }
    let mut follower = None;
    let asked = match path {
        "/v1/kill" => {
            // Who asks is always known (the connection's admission put it there); were it
            // not, nobody is taken for root.
            let Some(asked_by) = req.extensions().get::<AskedBy>().copied() else {
                let text = "who asks is not known: only root may kill";
                return error(StatusCode::FORBIDDEN, text);
            };
            if asked_by.uid != 0 {
                let text = format!(
                    "only root may kill (uid {} may ask questions of this run)",
                    asked_by.uid
                );
                return error(StatusCode::FORBIDDEN, &text);
            }
            match serde_urlencoded::from_str::<KillRequest>(query)
                .map_err(|e| e.to_string())
                .and_then(|r| r.session_value().map(|_| r))
            {
                Ok(request) => Asked::Kill { request, asked_by },
                Err(e) => return error(StatusCode::BAD_REQUEST, &format!("/v1/kill: {e}")),
            }
        }
        "/v1/status" => Asked::Status,
        "/v1/kinds" => Asked::Kinds,
        "/v1/sessions" => match serde_urlencoded::from_str(query) {
            Ok(filter) => Asked::Sessions(filter),
            Err(e) => return error(StatusCode::BAD_REQUEST, &format!("/v1/sessions: {e}")),
        },
        "/v1/tree" => match serde_urlencoded::from_str::<TreeFilter>(query)
            .map_err(|e| e.to_string())
            .and_then(|f| f.session_value().map(|_| f))
        {
            Ok(filter) => Asked::Tree(filter),
            Err(e) => return error(StatusCode::BAD_REQUEST, &format!("/v1/tree: {e}")),
        },
        "/v1/events" => match serde_urlencoded::from_str::<FollowFilter>(query)
            .map_err(|e| format!("/v1/events: {e}"))
            .and_then(|f| f.check().map(|()| f))
        {
            Ok(filter) if filter.follow.is_some() => {
                let (lines, stream) = follow::queue(filter.queue());
                follower = Some(stream);
                Asked::Follow { filter, lines }
            }
            Ok(_) => {
                let text = "/v1/events streams from now on: ask /v1/events?follow";
                return error(StatusCode::BAD_REQUEST, text);
            }
            Err(text) => return error(StatusCode::BAD_REQUEST, &text),
        },
        path => match path.strip_prefix("/v1/process/").map(str::parse) {
            Some(Ok(pid)) => Asked::Process(pid),
            Some(Err(_)) => return error(StatusCode::BAD_REQUEST, "a pid is a number"),
            None => return error(StatusCode::NOT_FOUND, "no such path"),
        },
    };
    let (reply, answer) = oneshot::channel();
    if queries.send(Query { asked, reply }).await.is_err() {
        return error(StatusCode::SERVICE_UNAVAILABLE, "the run is ending");
    }
    match (answer.await, follower) {
        (Ok(Some(_)), Some(lines)) => {
            let mut r = Response::new(Lines(lines).boxed_unsync());
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("application/x-ndjson"),
            );
            r
        }
        (Ok(Some(body)), None) => json(StatusCode::OK, body),
        (Ok(None), _) => error(StatusCode::NOT_FOUND, "not tracked by this run"),
        (Err(_), _) => error(StatusCode::SERVICE_UNAVAILABLE, "the run is ending"),
    }
}

/// A follower's lines, as the event loop sends them; the body ends when the run drops the
/// follower or ends.
struct Lines(FollowStream);

impl hyper::body::Body for Lines {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0
            .poll_chunk(cx)
            .map(|lines| lines.map(|l| Ok(Frame::data(l))))
    }
}

fn json(status: StatusCode, body: Vec<u8>) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(body)).boxed_unsync());
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

fn error(status: StatusCode, text: &str) -> Response<Body> {
    let body = serde_json::json!({ "error": text }).to_string();
    json(status, body.into_bytes())
}
