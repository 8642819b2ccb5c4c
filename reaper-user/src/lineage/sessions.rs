//! Which agent session each process is in, read (`--session-env`; see `graph::session` for
//! what a session is): the environment its last exec gave it, read from /proc on the slow
//! side, never on the ring's reader. The reader only notes each exec (and each process found
//! in /proc at start-up) here; the event loop hands what waits to a thread of the slow side
//! at the end of its turn ([`Sessions::take`]), which reads each environment as hostile input (capped, its
//! identity checked after the read, so a pid reused meanwhile is not read for it) and gives
//! back the values found, which the graph keeps ([`LineageGraph::set_session`]).
//!
//! A process gone before its read (a wrapper that exec'd on, a short-lived one) keeps what an
//! earlier read found (nothing, for one never read: it is in its spawner's session, as one
//! that named none), and what it spawned names its own.
use rustc_hash::FxHashSet as HashSet;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::sync::Arc;

use super::graph::session::cut_session;
use super::graph::{Change, LineageGraph, NodeId};
use crate::identity::ProcessId;
use crate::procfs::environ;

/// The variables hosts set to say which session a child is for (`--session-env`'s default),
/// the first one found in a process's environment naming its session.
pub const DEFAULT_NAMES: [&str; 6] = [
    "AGENT_SESSION_ID",
    "CLAUDE_CODE_SESSION_ID",
    "OPENCLAW_SESSION_ID",
    "VK_SESSION_ID",
    "HERMES_SESSION_ID",
    "RUNNER_TRACKING_ID",
];

/// Processes whose environment waits to be read: past this, an exec is not read (counted),
/// and its process is in its spawner's session.
const WAITING: usize = 32_768;

/// The processes whose environment is to be read.
pub struct Sessions {
    names: Arc<[Vec<u8>]>,
    /// The values this run's own environment gives the names: the environment reaper-trace
    /// was started in (a CI job's, an agent shell's) is every traced process's too, not a
    /// session of theirs.
    ambient: Arc<[Vec<u8>]>,
    waiting: Vec<(NodeId, ProcessId)>,
    /// The nodes in `waiting`, each read once however many times it exec'd meanwhile.
    queued: HashSet<NodeId>,
    /// Execs not read: the queue was full.
    unread: u64,
    /// Whether that was said.
    said: bool,
}

/// What a process's environment said.
pub enum Read {
    /// This session's value.
    Names(Vec<u8>),
    /// No value of its own (none of the names, or only the run's own values).
    NamesNone,
    /// Not read: gone before or during the read. What it names stays as it was.
    Unknown,
}

/// What one read of the slow side is to read.
pub struct ToRead {
    names: Arc<[Vec<u8>]>,
    ambient: Arc<[Vec<u8>]>,
    each: Vec<(NodeId, ProcessId)>,
}

impl Sessions {
    /// Reads the variables `names`, each naming a session, passing over the values this
    /// run's own environment gives them.
    pub fn new(names: Vec<Vec<u8>>) -> Sessions {
        let ambient = names
            .iter()
            .filter_map(|n| std::env::var_os(OsStr::from_bytes(n)))
            .map(OsString::into_vec)
            .filter(|v| !v.is_empty())
            .collect();
        Sessions {
            names: names.into(),
            ambient,
            waiting: Vec::new(),
            queued: HashSet::default(),
            unread: 0,
            said: false,
        }
    }

    /// A record's change: an exec gave its process a new environment, to be read.
    pub fn on_change(&mut self, graph: &mut LineageGraph, change: &Change) {
        if let Change::Execed { node, .. } = *change {
            self.note(graph, node);
        }
    }

    /// Process `id` (found in /proc, or exec'd) is to be read; the graph knows it waits.
    pub fn note(&mut self, graph: &mut LineageGraph, id: NodeId) {
        let Some(node) = graph.node(id) else {
            return;
        };
        if self.queued.contains(&id) {
            return;
        }
        if self.waiting.len() >= WAITING {
            self.unread += 1;
            return;
        }
        self.queued.insert(id);
        self.waiting.push((id, node.process()));
        graph.session_asked(id);
    }

    /// What waits to be read, for the slow side; none when nothing does.
    pub fn take(&mut self) -> Option<ToRead> {
        if self.waiting.is_empty() {
            return None;
        }
        self.queued.clear();
        Some(ToRead {
            names: self.names.clone(),
            ambient: self.ambient.clone(),
            each: std::mem::take(&mut self.waiting),
        })
    }

    /// What the operator is to know, once: execs whose environment was not read (the queue
    /// was full).
    pub fn take_note(&mut self) -> Option<String> {
        if self.unread == 0 || self.said {
            return None;
        }
        self.said = true;
        Some(format!(
            "session reads fell behind a storm of execs: {} environments were not read (and \
             more may not be; each such process is in its spawner's session); said once",
            self.unread
        ))
    }
}

impl ToRead {
    /// The processes to be read.
    pub fn ids(&self) -> Vec<NodeId> {
        self.each.iter().map(|&(id, _)| id).collect()
    }

    /// Reads each environment (the slow side's work): what each process's names
    /// ([`Read`]), checked after the read to be still the process asked about (a pid is not
    /// reused while its process lives).
    pub fn read(self) -> Vec<(NodeId, Read)> {
        let read = |process: ProcessId| {
            let Ok((environ, cut)) = environ::read_environ(process.pid) else {
                return Read::Unknown;
            };
            let value = environ::first_of(&environ, cut, &self.names, &self.ambient)
                .map(|v| cut_session(v).to_vec());
            // Gone, another process by now, or exiting (a zombie's environment reads empty):
            // what it names is not known.
            let gone = |stat: &crate::procfs::Stat| stat.state == b'Z' || stat.state == b'X';
            match (process.still_same().filter(|s| !gone(s)), value) {
                (None, _) => Read::Unknown,
                (Some(_), Some(value)) => Read::Names(value),
                (Some(_), None) => Read::NamesNone,
            }
        };
        (self.each.iter())
            .map(|&(id, process)| (id, read(process)))
            .collect()
    }
}
