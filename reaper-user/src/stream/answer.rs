//! What the API answers of one process (`GET /v1/process/PID`, `why`): wire types, as the
//! events are, so that the live run ([`crate::api`]) and an audit read back
//! ([`crate::replay`]) answer in the same words.
use serde::{Deserialize, Serialize};

use crate::stream::events::{LeakDetail, SessionEvidence};
use crate::stream::reason::Reason;

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

/// `GET /v1/sessions`: the agent sessions of the live processes, at boot-time `now`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Sessions {
    pub now: u64,
    pub sessions: Vec<SessionRow>,
}

/// An agent session (`--session-env` or `--session-cgroup`) and what of it is alive.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct SessionRow {
    /// Its value and where it begins, its owner and when it ended, as a flag gives them.
    #[serde(flatten)]
    pub session: SessionEvidence,
    /// Boot-time ns the process where it begins started.
    pub began: u64,
    /// The gateway whose lineage it is in.
    pub gateway: Option<u32>,
    /// Its live processes.
    pub alive: Vec<u32>,
    /// Those of them holding a flag, and which.
    pub flagged: Vec<FlaggedIn>,
    /// The live processes' memory as they were last looked at, KiB.
    pub rss_kib: u64,
}

/// A process of a session holding flags.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct FlaggedIn {
    pub pid: u32,
    pub flags: Vec<Held>,
}

/// What `POST /v1/kill` did at once: the sequences started and what was refused (each step
/// then comes in the stream as a `kill` event).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct KillAnswer {
    /// Boot-time ns of the answer.
    pub now: u64,
    pub dry_run: bool,
    /// Why nothing was done: the request picks nothing this run could know (no selector, an
    /// unknown reason or gateway); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
    /// Each process picked, with its live descendants: those refused (or not sent, a dry
    /// run) first, then those signalled, each part leaves first.
    pub steps: Vec<KillStep>,
}

/// One process of a kill asked for.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct KillStep {
    pub pid: u32,
    pub comm: String,
    /// `signalled` (SIGTERM sent, SIGKILL after `--term-timeout`), `dry_run`, or why not:
    /// `not_tracked`, `not_alive`, `not_in_lineage` (a gateway, pid 1, reaper-trace, an
    /// ancestor of it, or outside a gateway's lineage), `uncertain`, `identity_changed`,
    /// `exited`, `permission_denied`.
    pub result: String,
}
