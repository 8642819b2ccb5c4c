//! The `/metrics` endpoint: a minimal HTTP/1 server (hyper) on the address `--metrics` names.
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode, body::Incoming, service::service_fn};
use hyper_util::rt::TokioIo;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

use crate::output::metrics::{encode, to_prometheus_text};

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Binds `addr` now (so that a bad address fails before tracing starts, and a privileged
/// port is bound before privileges are dropped); serving starts with [`serve`].
pub async fn bind(addr: SocketAddr) -> Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("--metrics {addr}: cannot listen there"))
}

/// Serves `/metrics` until the runtime ends. A failed connection is that client's problem.
pub async fn serve(listener: TcpListener, registry: Arc<Registry>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let registry = registry.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| respond(req, registry.clone()));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn respond(
    req: Request<Incoming>,
    registry: Arc<Registry>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let reply = |status: StatusCode, ctype: &str, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = status;
        if let Ok(v) = ctype.parse() {
            r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
        }
        Ok(r)
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
