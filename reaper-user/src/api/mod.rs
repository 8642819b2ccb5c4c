//! The running audit's local API: HTTP/1.1 with JSON bodies on a UNIX socket (`--api`),
//! asked by `reaper-trace why PID`. The answers are built as the questions come (see
//! [`Query`]), from what the run holds: the lineage graph, the flags, the spawn sites, and a
//! fresh look at the process asked about. Nothing on it changes what is traced; one path
//! kills, for root alone (`POST /v1/kill`).
//!
//! Paths (`/v1/...`; a later version adds paths, never changes these):
//! - `GET /v1/status`: the run ([`Status`]).
//! - `GET /v1/process/PID`: what the run knows of the live process PID, or of the last one
//!   that had the pid ([`Process`]); 404 with `{"error": ...}` for a pid it does not track.
//! - `GET /v1/tree[?gateway=PID][&kind=TEXT][&reason=R][&session=S|&session_b64=B]`: the
//!   live lineage tree, its roots ([`Branch`]es), of the processes each given filter picks
//!   ([`TreeFilter`]); 404 for a `gateway` it does not track. A session is named by its
//!   value, or in base64 (`session_b64`, percent-encoded as any query value) when it is not
//!   UTF-8; both, or base64 that is not, is 400.
//! - `GET /v1/kinds`: the kinds with the most live instances under one gateway instance at
//!   the last count, most first ([`KindCount`]; the rest as `other`, as the metrics name them).
//! - `GET /v1/events?follow[&pid=PID][&event=NAMES][&reason=R]`: the stream's lines from now
//!   on, as long as the client reads them ([`FollowFilter`]; `application/x-ndjson`); 404 for
//!   a `pid` it does not track. A follower that does not keep up is dropped (see
//!   [`crate::output::follow`]).
//! - `POST /v1/kill?[pids=PID,PID][&session=S|&session_b64=B][&reason=R][&gateway=PID]`
//!   `[&dry_run=true]`:
//!   ends the processes picked ([`KillRequest`]) through the kill protocol; root only (the
//!   connection's peer credentials: 403 for anyone else); answers what was started and what
//!   refused ([`KillAnswer`]), each step then written to the stream as a `kill` event with
//!   `asked_by`.
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

pub use crate::lineage::graph::session::{name_session, session_value};
use crate::stream::reason::Reason;

pub use crate::output::follow::{FollowFilter, FollowQueue};
pub use crate::output::tree::{Branch, TreeFilter};
pub use crate::stream::answer::{Held, Kill, KillAnswer, KillStep, Process, Sessions};
pub use crate::stream::events::AskedBy;

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
    /// The agent sessions, those under a gateway if one is given.
    Sessions(SessionsFilter),
    Kinds,
    /// The stream from now on, what `filter` picks, sent to `lines`.
    Follow {
        filter: FollowFilter,
        lines: FollowQueue,
    },
    /// End the processes `request` picks; `asked_by` is root (the server checked).
    Kill {
        request: KillRequest,
        asked_by: AskedBy,
    },
}

impl Asked {
    /// Whether the question names a process (by pid, or a gateway): its answer depends on
    /// the run having taken the records that made it.
    pub fn names_a_process(&self) -> bool {
        match self {
            Asked::Process(_) | Asked::Kill { .. } => true,
            Asked::Tree(filter) => filter.gateway.is_some(),
            Asked::Sessions(filter) => filter.gateway.is_some(),
            Asked::Follow { filter, .. } => filter.pid.is_some(),
            Asked::Status | Asked::Kinds => false,
        }
    }
}

/// What `POST /v1/kill` is asked to end: the processes each given selector picks (at least
/// one is given). A session's owner is picked only by its pid.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KillRequest {
    /// Tracked processes by pid, comma-separated.
    pub pids: Option<String>,
    /// The live processes of this agent session (`--session-env` or `--session-cgroup`), its
    /// owner apart.
    pub session: Option<String>,
    /// The same, the session's value in base64 (one that is not UTF-8, as the answers give
    /// it: `id_b64`).
    pub session_b64: Option<String>,
    /// The live processes holding a flag of this reason.
    pub reason: Option<Reason>,
    /// Only those descended from this tracked process (with a session or `reason`).
    pub gateway: Option<u32>,
    /// Decide and answer, send nothing.
    pub dry_run: bool,
}

impl KillRequest {
    /// The pids asked for by number; an error names what is not one.
    pub fn pid_list(&self) -> Result<Vec<u32>, String> {
        let Some(pids) = &self.pids else {
            return Ok(Vec::new());
        };
        (pids.split(',').filter(|p| !p.is_empty()))
            .map(|p| p.parse().map_err(|_| format!("`{p}` is not a pid")))
            .collect()
    }

    /// The session asked for, by its value's bytes; an error says why it cannot be read.
    pub fn session_value(&self) -> Result<Option<Vec<u8>>, String> {
        session_value(self.session.as_deref(), self.session_b64.as_deref())
    }
}

/// What `/v1/sessions` is asked for.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SessionsFilter {
    /// Only the sessions of processes descended from this tracked process.
    pub gateway: Option<u32>,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_is_named_as_text_or_as_base64_and_read_back_exact() {
        for value in [&b"sess-a"[..], b"bad\xff\xfeend", b""] {
            let (text, b64) = name_session(value);
            assert_eq!(
                session_value(text.as_deref(), b64.as_deref()),
                Ok(Some(value.to_vec()))
            );
        }
        assert_eq!(name_session(b"bad\xff").0, None, "not UTF-8: base64 alone");
        let whole = "x".repeat(1000);
        assert_eq!(
            session_value(Some(&whole), None),
            Ok(Some(vec![b'x'; 256])),
            "cut as the run cuts a value"
        );
    }

    #[test]
    fn a_session_named_twice_or_in_bad_base64_is_an_error() {
        assert!(session_value(Some("a"), Some("YQ==")).is_err());
        let bad = session_value(None, Some("not base64!")).unwrap_err();
        assert!(bad.contains("session_b64 is not base64"), "{bad}");
        assert_eq!(session_value(None, None), Ok(None));
        let request = KillRequest {
            session_b64: Some("%%".into()),
            ..KillRequest::default()
        };
        assert!(request.session_value().is_err());
    }
}
