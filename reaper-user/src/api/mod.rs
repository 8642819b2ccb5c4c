//! The running audit's local, read-only API: HTTP/1.1 with JSON bodies on a UNIX socket
//! (`--api`), asked by `reaper-trace why PID`. The answers are built as the questions come
//! (see [`Query`]), from what the run holds: the lineage graph, the flags, the spawn sites,
//! and a fresh look at the process asked about. Nothing on it changes what is traced or kills anything.
//!
//! Paths (`/v1/...`; a later version adds paths, never changes these):
//! - `GET /v1/status`: the run ([`Status`]).
//! - `GET /v1/process/PID`: what the run knows of the live process PID, or of the last one
//!   that had the pid ([`Process`]); 404 with `{"error": ...}` for a pid it does not track.
//! - `GET /v1/tree[?gateway=PID][&kind=TEXT][&reason=R]`: the live lineage tree, its roots
//!   ([`Branch`]es), of the processes each given filter picks ([`TreeFilter`]); 404 for a
//!   `gateway` it does not track.
//! - `GET /v1/kinds`: the kinds with the most live instances under one gateway instance at
//!   the last count, most first ([`KindCount`]; the rest as `other`, as the metrics name them).
//! - `GET /v1/events?follow[&pid=PID][&event=NAMES][&reason=R]`: the stream's lines from now
//!   on, as long as the client reads them ([`FollowFilter`]; `application/x-ndjson`); 404 for
//!   a `pid` it does not track. A follower that does not keep up is dropped (see
//!   [`crate::output::follow`]).
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use crate::leaks::Reason;
use crate::stream::events::LeakDetail;

pub use crate::output::follow::{FollowFilter, FollowQueue};
pub use crate::output::tree::Branch;

pub mod client;
pub mod server;
pub mod sockets;
pub mod top;

/// Where the runs' sockets are: `PID.sock` for each run (see [`default_path`]).
pub const SOCKET_DIR: &str = "/run/reaper-trace";

/// The socket a run serves on when `--api` does not say: `/run/reaper-trace/PID.sock`.
pub fn default_path(pid: u32) -> PathBuf {
    Path::new(SOCKET_DIR).join(format!("{pid}.sock"))
}

/// A question for the run (`daemon/answers.rs`), with where its answer goes.
pub struct Query {
    pub asked: Asked,
    pub reply: oneshot::Sender<Answer>,
}

/// What a client asked.
#[derive(Debug)]
pub enum Asked {
    Status,
    Process(u32),
    Tree(TreeFilter),
    Kinds,
    /// The stream from now on, what `filter` picks, sent to `lines`.
    Follow {
        filter: FollowFilter,
        lines: FollowQueue,
    },
}

/// The processes `/v1/tree` draws: the live and zombie ones every given filter picks, each
/// with the spawners its lineage runs through.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TreeFilter {
    /// Those descended from this tracked process (a gateway, or any process of the tree),
    /// itself included.
    pub gateway: Option<u32>,
    /// Those whose executable or command line contains this text (an `accumulating` flag's
    /// kind names one: `node /srv/mcp.js`).
    pub kind: Option<String>,
    /// Those holding a flag for this reason.
    pub reason: Option<Reason>,
}

/// A kind and its live instances (`/v1/kinds`).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct KindCount {
    /// The instances' command line, with the values they differ in as `*`.
    pub kind: String,
    pub instances: u64,
}

/// What the run answered: the body's JSON, or `None` for a process it does not track (the
/// answer crosses to the connection's task as bytes: the stream's types share their strings
/// within the reader's thread).
pub type Answer = Option<Vec<u8>>;

/// `GET /v1/status`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Status {
    /// reaper-trace's own pid.
    pub pid: u32,
    /// The gateways alive now.
    pub gateways: Vec<u32>,
    /// Processes tracked (alive) now.
    pub tracked: usize,
    /// Seconds since the run started.
    pub uptime_secs: u64,
    /// Clients following the event stream now (`/v1/events?follow`).
    pub followers: usize,
}

/// `GET /v1/process/PID`: a tracked process, as a flag would show it, with the flags it holds.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Process {
    pub pid: u32,
    /// Boot-time ns it started (with `pid`, its identity).
    pub start: u64,
    pub alive: bool,
    /// Boot-time ns of its exit, once it exited.
    pub exited: Option<u64>,
    /// Boot-time ns the answer was made at (what `since` and `exited` are measured against).
    pub now: u64,
    /// The flags it holds now.
    pub flags: Vec<Held>,
    /// Whether `--kill` could act on it, and why or why not (on the outermost process of
    /// its `server`, when it is an inner one without a flag of its own).
    pub kill: Kill,
    /// When it is an inner process of a server judged as one from its outermost process (a
    /// wrapper chain: `npm exec` > `sh -c` > `node server.js`): that process, whose flags
    /// stand for the whole server (`chain` lists the server from it down to this one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server: Option<ServerOf>,
    /// Its lineage, spawner's thread, channels and who holds their other ends, RSS, spawn
    /// site: as a flag's.
    #[serde(flatten)]
    pub detail: LeakDetail,
}

/// The outermost process of the server a process is part of.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ServerOf {
    pub pid: u32,
    /// The flags it holds now.
    pub flags: Vec<Held>,
}

/// What `--kill` could do to a process (with the run's `--kill-reasons`).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Kill {
    /// The run kills (`--kill`).
    pub enabled: bool,
    /// A kill would follow one of its flags, once held for `--grace`.
    pub could: bool,
    pub why: String,
}

/// A flag held.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Held {
    pub reason: Reason,
    /// Boot-time ns since when it holds.
    pub since: u64,
}
