//! Serves the API on its UNIX socket: one hyper HTTP/1 connection per client, each request a
//! [`Query`] the event loop answers at its housekeeping tick. Only root and reaper-trace's own
//! user may ask (the socket is 0600, and each connection's peer credentials are checked too).
use std::convert::Infallible;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode, body::Incoming, service::service_fn};
use hyper_util::rt::TokioIo;
use tokio::net::UnixListener;
use tokio::sync::{mpsc, oneshot};

use super::{Asked, Query};

/// The API's socket file, removed when dropped (at the run's end).
pub struct SocketFile(PathBuf);

impl Drop for SocketFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Binds the socket at `path` (its directory made 0755 if missing; a socket left there by a
/// run that was killed is replaced, anything else is an error), mode 0600.
pub fn bind(path: &Path) -> Result<(UnixListener, SocketFile)> {
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
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("making {} 0600", path.display()))?;
    Ok((listener, file))
}

/// Serves until the runtime ends. A failed connection is that client's problem.
pub async fn serve(listener: UnixListener, queries: mpsc::Sender<Query>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        let allowed = stream
            .peer_cred()
            .is_ok_and(|c| c.uid() == 0 || c.uid() == me);
        if !allowed {
            continue; // dropped: closed without an answer
        }
        let queries = queries.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| respond(req, queries.clone()));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn respond(
    req: Request<Incoming>,
    queries: mpsc::Sender<Query>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if req.method() != Method::GET {
        return Ok(error(StatusCode::METHOD_NOT_ALLOWED, "use GET"));
    }
    let asked = match req.uri().path() {
        "/v1/status" => Asked::Status,
        path => match path.strip_prefix("/v1/process/").map(str::parse) {
            Some(Ok(pid)) => Asked::Process(pid),
            Some(Err(_)) => return Ok(error(StatusCode::BAD_REQUEST, "a pid is a number")),
            None => return Ok(error(StatusCode::NOT_FOUND, "no such path")),
        },
    };
    let (reply, answer) = oneshot::channel();
    if queries.send(Query { asked, reply }).await.is_err() {
        return Ok(error(StatusCode::SERVICE_UNAVAILABLE, "the run is ending"));
    }
    Ok(match answer.await {
        Ok(Some(body)) => json(StatusCode::OK, body),
        Ok(None) => error(StatusCode::NOT_FOUND, "not tracked by this run"),
        Err(_) => error(StatusCode::SERVICE_UNAVAILABLE, "the run is ending"),
    })
}

fn json(status: StatusCode, body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

fn error(status: StatusCode, text: &str) -> Response<Full<Bytes>> {
    let body = serde_json::json!({ "error": text }).to_string();
    json(status, body.into_bytes())
}
