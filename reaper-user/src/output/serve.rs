//! The `/metrics` endpoint on the address `--metrics` names, served by [`crate::serve`] on the
//! servers' thread: anything that can reach the address can connect, so it gets that server's
//! limits (idle connections closed, a cap on connections, backoff on accept errors).
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::{Method, Request, Response, StatusCode, body::Incoming};
use prometheus_client::registry::Registry;

use crate::output::metrics::{encode, to_prometheus_text};
use crate::serve::{self, Body};

/// What a scraper is allowed: a Prometheus or two, keeping their connections alive between
/// scrapes (closed after 10 s idle, so each scrape may reconnect).
const LIMITS: serve::Limits = serve::Limits {
    connections: 16,
    idle: Duration::from_secs(10),
};

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Binds `addr` now (so that a bad address fails before tracing starts, and a privileged
/// port is bound before privileges are dropped); serving starts with [`serve`].
pub fn bind(addr: SocketAddr) -> Result<TcpListener> {
    TcpListener::bind(addr).with_context(|| format!("--metrics {addr}: cannot listen there"))
}

/// Serves `/metrics` on `thread` until the run ends.
pub fn serve(
    thread: &serve::Thread,
    listener: TcpListener,
    registry: Arc<Registry>,
) -> std::io::Result<serve::Server> {
    let handler = move |req| respond(req, registry.clone());
    thread.serve(
        listener,
        LIMITS,
        |_: &tokio::net::TcpStream| Some(()),
        handler,
    )
}

async fn respond(req: Request<Incoming>, registry: Arc<Registry>) -> Response<Body> {
    let reply = |status: StatusCode, ctype: &str, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)).boxed_unsync());
        *r.status_mut() = status;
        if let Ok(v) = ctype.parse() {
            r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
        }
        r
    };
    match (req.method(), req.uri().path()) {
        (&Method::GET | &Method::HEAD, "/metrics") => {
            // OpenMetrics for a client that asks for it (Prometheus does); the classic text
            // format otherwise.
            let wants_openmetrics = req
                .headers()
                .get_all(hyper::header::ACCEPT)
                .iter()
                .any(|v| {
                    v.to_str()
                        .is_ok_and(|v| v.contains("application/openmetrics-text"))
                });
            match wants_openmetrics {
                true => reply(StatusCode::OK, OPENMETRICS, encode(&registry)),
                false => reply(
                    StatusCode::OK,
                    PROMETHEUS_TEXT,
                    to_prometheus_text(&encode(&registry)),
                ),
            }
        }
        (_, "/metrics") => reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "use GET\n".into(),
        ),
        _ => reply(
            StatusCode::NOT_FOUND,
            "text/plain",
            "reaper-trace serves /metrics only\n".into(),
        ),
    }
}
