//! The run's HTTP/1 server, for the API on its UNIX socket and `/metrics` on its address alike,
//! built so that what connects to it cannot starve it or the run:
//! - **Idle connections are closed.** One that has no request under way (waiting for its
//!   first request's head, or the next one's on a kept-alive connection) for
//!   [`Limits::idle`] is closed.
//! - **A cap on connections.** At most [`Limits::connections`] are open at once, far below the
//!   run's descriptor limit, so that its /proc reads, pidfds and kills always have theirs. A
//!   new one past the cap closes the one that has waited longest with no request under way (a
//!   flood of idle connections costs a new client nothing but its turn to be accepted); when
//!   every one has a request under way, the new one is closed unanswered.
//! - **Backoff on accept errors.** A failed accept (the whole run's descriptors or memory
//!   exhausted) waits before the next, 10 ms doubling to 1 s, never retried at once (which
//!   spins a core while the error lasts).
//! - **A thread of its own** ([`Thread`]): connections, requests and answers' bodies are handled
//!   off the ring's reader.
use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::BodyExt as _;
use http_body_util::combinators::UnsyncBoxBody;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::{Request, Response, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::oneshot;

/// An answer's body: a whole document, or lines as they come (a follower's).
pub type Body = UnsyncBoxBody<Bytes, Infallible>;

/// What a server allows its clients.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Connections open at once (see the module's documentation).
    pub connections: usize,
    /// How long a connection may have no request under way.
    pub idle: Duration,
}

/// The first wait after a failed accept, and the longest.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(10), Duration::from_secs(1));

/// Something that accepts connections: a TCP or a UNIX listener.
pub trait Listener: Send + 'static {
    type Io: AsyncRead + AsyncWrite + Send + Unpin + 'static;
    fn accept(&self) -> impl Future<Output = std::io::Result<Self::Io>> + Send;
}

impl Listener for tokio::net::TcpListener {
    type Io = tokio::net::TcpStream;
    async fn accept(&self) -> std::io::Result<Self::Io> {
        tokio::net::TcpListener::accept(self).await.map(|(s, _)| s)
    }
}

impl Listener for tokio::net::UnixListener {
    type Io = tokio::net::UnixStream;
    async fn accept(&self) -> std::io::Result<Self::Io> {
        tokio::net::UnixListener::accept(self).await.map(|(s, _)| s)
    }
}

/// A listener bound before serving starts (a privileged port, /run, before privileges are
/// dropped), not yet served: a std one, registered with the servers' runtime when handed to
/// [`Thread::serve`], so that its readiness is the servers' thread's to see and never waits
/// for the reader's.
pub trait Bound: Send + 'static {
    type Live: Listener;
    /// Registers the listener with the runtime entered.
    fn adopt(self) -> std::io::Result<Self::Live>;
}

impl Bound for std::net::TcpListener {
    type Live = tokio::net::TcpListener;
    fn adopt(self) -> std::io::Result<Self::Live> {
        self.set_nonblocking(true)?;
        tokio::net::TcpListener::from_std(self)
    }
}

impl Bound for std::os::unix::net::UnixListener {
    type Live = tokio::net::UnixListener;
    fn adopt(self) -> std::io::Result<Self::Live> {
        self.set_nonblocking(true)?;
        tokio::net::UnixListener::from_std(self)
    }
}

/// The thread the servers run on, with a runtime of its own.
pub struct Thread {
    runtime: tokio::runtime::Handle,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Thread {
    /// Starts the thread. Capabilities are a thread's own: start it after they were dropped.
    pub fn start() -> std::io::Result<Thread> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("reaper-serve".into())
            .spawn(move || {
                runtime.block_on(async {
                    let _ = stopped.await;
                })
            })?;
        Ok(Thread {
            runtime: handle,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Serves `listener` with `handler`, each connection admitted by `admit` first (closed
    /// unanswered when it gives nothing; what it gives, who the peer is, goes in each of the
    /// connection's requests' extensions), within `limits`.
    pub fn serve<B, A, P, H, F>(
        &self,
        listener: B,
        limits: Limits,
        admit: A,
        handler: H,
    ) -> std::io::Result<Server>
    where
        B: Bound,
        A: Fn(&<B::Live as Listener>::Io) -> Option<P> + Send + 'static,
        P: Clone + Send + Sync + 'static,
        H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
        F: Future<Output = Response<Body>> + Send + 'static,
    {
        let listener = {
            let _servers = self.runtime.enter();
            listener.adopt()?
        };
        let (stop, stopped) = oneshot::channel();
        let serving = self
            .runtime
            .spawn(accept_loop(listener, limits, admit, handler, stopped));
        Ok(Server { stop, serving })
    }
}

impl Drop for Thread {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One listener being served: [`Server::close`] ends it.
pub struct Server {
    stop: oneshot::Sender<()>,
    serving: tokio::task::JoinHandle<()>,
}

impl Server {
    /// Stops accepting and lets the requests under way end, `finish` at most.
    pub async fn close(self, finish: Duration) {
        let _ = self.stop.send(());
        let _ = tokio::time::timeout(finish, self.serving).await;
    }
}

/// The open connections: since when each has had no request under way (`None`: one is), and
/// how to close it.
#[derive(Default)]
struct Open {
    next: u64,
    connections: HashMap<u64, Connection>,
}

struct Connection {
    idle_since: Option<Instant>,
    /// Requests under way (a kept-alive connection answers one at a time, but a body may
    /// still stream when the next head comes).
    busy: usize,
    close: Option<oneshot::Sender<()>>,
}

type Shared = Arc<Mutex<Open>>;

fn lock(open: &Shared) -> std::sync::MutexGuard<'_, Open> {
    // A panic while holding it leaves plain counts, still good to use.
    open.lock().unwrap_or_else(|e| e.into_inner())
}

impl Open {
    /// Makes room for one more connection within `cap`: closes the one idle longest. False
    /// when every open one has a request under way.
    fn make_room(&mut self, cap: usize) -> bool {
        if self.connections.len() < cap {
            return true;
        }
        let oldest = self
            .connections
            .iter()
            .filter_map(|(&id, c)| Some((c.idle_since?, id)))
            .min();
        let Some((_, id)) = oldest else {
            return false;
        };
        if let Some(mut c) = self.connections.remove(&id)
            && let Some(close) = c.close.take()
        {
            let _ = close.send(());
        }
        true
    }

    fn add(&mut self, close: oneshot::Sender<()>) -> u64 {
        let id = self.next;
        self.next += 1;
        let connection = Connection {
            idle_since: Some(Instant::now()),
            busy: 0,
            close: Some(close),
        };
        self.connections.insert(id, connection);
        id
    }

    fn request_began(&mut self, id: u64) {
        if let Some(c) = self.connections.get_mut(&id) {
            c.busy += 1;
            c.idle_since = None;
        }
    }

    fn request_ended(&mut self, id: u64) {
        if let Some(c) = self.connections.get_mut(&id) {
            c.busy = c.busy.saturating_sub(1);
            if c.busy == 0 {
                c.idle_since = Some(Instant::now());
            }
        }
    }
}

async fn accept_loop<L, A, P, H, F>(
    listener: L,
    limits: Limits,
    admit: A,
    handler: H,
    mut stop: oneshot::Receiver<()>,
) where
    L: Listener,
    A: Fn(&L::Io) -> Option<P>,
    P: Clone + Send + Sync + 'static,
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let graceful = GracefulShutdown::new();
    let open = Shared::default();
    let mut backoff = BACKOFF.0;
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = &mut stop => break,
        };
        let io = match accepted {
            Ok(io) => io,
            Err(_) => {
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = &mut stop => break,
                }
                backoff = (backoff * 2).min(BACKOFF.1);
                continue;
            }
        };
        backoff = BACKOFF.0;
        let Some(peer) = admit(&io) else {
            continue; // dropped: closed unanswered
        };
        if !lock(&open).make_room(limits.connections) {
            continue;
        }
        let (close, closed) = oneshot::channel();
        let id = lock(&open).add(close);
        let service = {
            let (open, handler) = (open.clone(), handler.clone());
            service_fn(move |mut req: Request<Incoming>| {
                req.extensions_mut().insert(peer.clone());
                lock(&open).request_began(id);
                let (open, answer) = (open.clone(), handler(req));
                async move {
                    let response = answer.await;
                    // Under way until its body is sent (a follower's lines: as long as it reads).
                    let ended = RequestEnded { open, id };
                    Ok::<_, Infallible>(response.map(|body| {
                        Tracked {
                            body,
                            _ended: ended,
                        }
                        .boxed_unsync()
                    }))
                }
            })
        };
        let connection = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.idle)
            .serve_connection(TokioIo::new(io), service);
        let connection = graceful.watch(connection);
        let open = open.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = connection => {}
                _ = closed => {}
            }
            lock(&open).connections.remove(&id);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// Marks its request ended when dropped: its body sent, or the connection gone.
struct RequestEnded {
    open: Shared,
    id: u64,
}

impl Drop for RequestEnded {
    fn drop(&mut self) {
        lock(&self.open).request_ended(self.id);
    }
}

/// An answer's body, with its request's end attached (held for its drop).
struct Tracked {
    body: Body,
    _ended: RequestEnded,
}

impl hyper::body::Body for Tracked {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn room_is_made_by_closing_the_connection_idle_longest_never_a_busy_one() {
        let mut open = Open::default();
        let mut closed = Vec::new();
        let mut ids = Vec::new();
        for _ in 0..3 {
            let (tx, rx) = oneshot::channel();
            ids.push(open.add(tx));
            closed.push(rx);
        }
        assert!(open.make_room(4), "under the cap");
        open.request_began(ids[0]);
        assert!(open.make_room(3));
        assert_eq!(open.connections.len(), 2);
        assert!(closed[1].try_recv().is_ok(), "the oldest idle one went");
        assert!(closed[0].try_recv().is_err(), "the busy one stays");
        open.request_began(ids[2]);
        assert!(!open.make_room(2), "every one busy: the new one is refused");
        open.request_ended(ids[2]);
        assert!(open.make_room(2));
        assert!(closed[2].try_recv().is_ok());
        assert!(open.connections.contains_key(&ids[0]));
    }
}
