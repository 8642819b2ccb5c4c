//! What a run serves, on the servers' thread: the API and the metrics, started once
//! privileges are dropped.
use anyhow::{Context, Result};

use crate::api::server::{Access, Server, SocketFile};
use crate::output::serve as output_serve;
use crate::serve;

/// What the run serves, on the servers' thread: the API (its socket removed when closed) and
/// the metrics.
pub(super) struct Servers {
    api: Option<Server>,
    metrics: Option<serve::Server>,
    /// Last: the servers above run on it.
    thread: Option<serve::Thread>,
}

impl Servers {
    /// Starts serving what was bound: the metrics from `registry`, the API's questions sent to
    /// `queries`.
    pub(super) fn start(
        metrics: Option<std::net::TcpListener>,
        registry: std::sync::Arc<prometheus_client::registry::Registry>,
        api: Option<(std::os::unix::net::UnixListener, SocketFile)>,
        queries: Option<tokio::sync::mpsc::Sender<crate::api::Query>>,
        group: Option<u32>,
    ) -> Result<Servers> {
        if metrics.is_none() && api.is_none() {
            let (api, metrics, thread) = (None, None, None);
            return Ok(Servers {
                api,
                metrics,
                thread,
            });
        }
        let thread = serve::Thread::start().context("starting the servers' thread")?;
        let metrics = metrics
            .map(|listener| output_serve::serve(&thread, listener, registry))
            .transpose()
            .context("serving the metrics")?;
        let api = api
            .zip(queries)
            .map(|(bound, queries)| Server::start(&thread, bound, Access { group }, queries))
            .transpose()
            .context("serving the API")?;
        Ok(Servers {
            api,
            metrics,
            thread: Some(thread),
        })
    }

    /// Stops serving: the API's answers under way end (a follower's last lines), then the
    /// thread.
    pub(super) async fn close(self) {
        if let Some(api) = self.api {
            api.close().await;
        }
        if let Some(metrics) = self.metrics {
            metrics.close(std::time::Duration::ZERO).await;
        }
        drop(self.thread);
    }
}
