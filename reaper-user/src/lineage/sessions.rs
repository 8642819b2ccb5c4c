//! Which agent session each process is in, read (`--session-env`, or `--session-cgroup`; see
//! `graph::session` for what a session is): the environment its last exec gave it, or the
//! cgroup it runs in, read from /proc on the slow side, never on the ring's reader. The
//! reader only notes each exec (and each process found in /proc at start-up, or taken back
//! from a checkpoint whose sessions were read elsewhere) here; the event loop hands what
//! waits to a thread of the slow side at the end of a turn ([`Sessions::take`]), which
//! reads each environment (or cgroup) as hostile input (capped, its identity checked after
//! the read, so a pid reused meanwhile is not read for it) and gives back the values found,
//! which the graph keeps ([`LineageGraph::set_session`]).
//!
//! A process gone before its read (a wrapper that exec'd on, a short-lived one) keeps what an
//! earlier read found (nothing, for one never read: it is in its spawner's session, as one
//! that named none), and what it spawned names its own.
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::graph::session::{SESSION_MAX, cut_session};
use super::graph::{Change, LineageGraph, NodeId};
use crate::identity::ProcessId;
use crate::procfs::{self, environ, placement};
use crate::text::hex;

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

/// While records stream, what waits is handed on once this many wait, or once the first has
/// waited [`GATHER_FOR`]: each hand-over costs the reader a wake-up of the slow side (its
/// result waits for the reader's next tick, see `daemon/session_reads`).
const BATCH: usize = 64;

/// The longest a read waits to be handed on while records stream, give or take a poll period
/// (the reader hands it on at the end of a turn), and the read under way, if any. A process
/// gone meanwhile is in its spawner's session, as one gone before any read; an agent
/// session's process lives longer.
const GATHER_FOR: Duration = Duration::from_millis(10);

/// Where a process's session is read.
#[derive(Clone)]
pub enum Source {
    /// The first of these variables (`--session-env`) that the environment its last exec gave
    /// it sets.
    Environment {
        names: Arc<[Vec<u8>]>,
        /// The values this run's own environment gives the names: the environment
        /// reaper-trace was started in (a CI job's, an agent shell's) is every traced
        /// process's too, not a session of theirs.
        ambient: Arc<[Vec<u8>]>,
    },
    /// The cgroup directly below its gateway's that it runs in (`--session-cgroup`: a
    /// gateway that makes a cgroup of its own for each session below its own), by its path
    /// (`/gateway.service/session-1`; by its end and digest where the path is longer than a
    /// session's cap); none in the gateway's own cgroup or outside it.
    Cgroup,
}

impl Source {
    /// What this source reads, as a checkpoint keeps it: values read from another source are
    /// another kind of value (see `Pipeline::resume_sessions`).
    pub fn describe(&self) -> String {
        match self {
            Source::Environment { names, .. } => {
                let names: Vec<_> = names.iter().map(|n| String::from_utf8_lossy(n)).collect();
                format!("environment {}", names.join(","))
            }
            Source::Cgroup => "cgroup".into(),
        }
    }

    /// The variables `names`, each naming a session, passing over the values this run's own
    /// environment gives them.
    pub fn environment(names: Vec<Vec<u8>>) -> Source {
        let ambient = names
            .iter()
            .filter_map(|n| std::env::var_os(OsStr::from_bytes(n)))
            .map(OsString::into_vec)
            .filter(|v| !v.is_empty())
            .collect();
        Source::Environment {
            names: names.into(),
            ambient,
        }
    }
}

/// A process whose session is to be read, and (with `--session-cgroup`) its gateway's.
#[derive(Clone, Copy)]
struct Waiting {
    id: NodeId,
    process: ProcessId,
    gateway: Option<ProcessId>,
}

/// The processes whose session is to be read.
pub struct Sessions {
    source: Source,
    waiting: Vec<Waiting>,
    /// When the first of `waiting` was noted.
    waiting_since: Option<Instant>,
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
    source: Source,
    each: Vec<Waiting>,
}

impl Sessions {
    /// Reads each process's session from `source`.
    pub fn new(source: Source) -> Sessions {
        Sessions {
            source,
            waiting: Vec::new(),
            waiting_since: None,
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
        let gateway = match self.source {
            Source::Cgroup => graph.gateway_of(id).map(|g| g.process()),
            Source::Environment { .. } => None,
        };
        self.queued.insert(id);
        if self.waiting.is_empty() {
            self.waiting_since = Some(Instant::now());
        }
        self.waiting.push(Waiting {
            id,
            process: node.process(),
            gateway,
        });
        graph.session_asked(id);
    }

    /// What this reads (see [`Source::describe`]).
    pub fn source(&self) -> &Source {
        &self.source
    }

    /// What waits to be read, for the slow side; none when nothing does. While records
    /// `stream` (the reader comes round again within a poll period), what waits is gathered
    /// until [`BATCH`] wait or the first has waited [`GATHER_FOR`]; otherwise it all goes
    /// now: the reader may sleep next.
    pub fn take(&mut self, stream: bool) -> Option<ToRead> {
        let since = self.waiting_since?;
        if stream && self.waiting.len() < BATCH && since.elapsed() < GATHER_FOR {
            return None;
        }
        self.waiting_since = None;
        self.queued.clear();
        Some(ToRead {
            source: self.source.clone(),
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
            "session reads fell behind: {} processes' sessions were not read, {WAITING} \
             waiting already (and more may not be; each such process is in its spawner's \
             session); said once",
            self.unread
        ))
    }
}

impl ToRead {
    /// The processes to be read.
    pub fn ids(&self) -> Vec<NodeId> {
        self.each.iter().map(|w| w.id).collect()
    }

    /// Reads each process's session (the slow side's work): what it names ([`Read`]),
    /// checked after the read to be still the process asked about (a pid is not reused while
    /// its process lives).
    pub fn read(self) -> Vec<(NodeId, Read)> {
        // Each gateway's cgroup as last read, for the next process below it.
        let mut gateways: HashMap<ProcessId, Option<Vec<u8>>> = HashMap::default();
        let mut read = |w: &Waiting| -> Result<Option<Vec<u8>>, ()> {
            match &self.source {
                Source::Environment { names, ambient } => {
                    let (environ, cut) = environ::read_environ(w.process.pid).map_err(|_| ())?;
                    let value = environ::first_of(&environ, cut, names, ambient);
                    Ok(value.map(|v| cut_session(v).to_vec()))
                }
                Source::Cgroup => {
                    let Some(gateway) = w.gateway else {
                        return Ok(None);
                    };
                    // A gateway is in its own cgroup, never in a session below it: nothing to
                    // read (one that puts itself in a cgroup before it execs, as
                    // `systemd-run --scope` does, is read at that exec).
                    if gateway == w.process {
                        return Ok(None);
                    }
                    // The process's cgroup read between two reads of its gateway's that agree
                    // (the first is the last one's, for the process before): a gateway that
                    // moved meanwhile (into a leaf of its own, as a delegated manager may)
                    // leaves this process's session unknown, not named against where it was.
                    let before = match gateways.get(&gateway) {
                        Some(last) => last.clone(),
                        None => cgroup_of(gateway),
                    };
                    let own = cgroup_of(w.process);
                    let after = cgroup_of(gateway);
                    gateways.insert(gateway, after.clone());
                    match (before, own) {
                        (Some(theirs), Some(own)) if after.as_ref() == Some(&theirs) => {
                            Ok(session_cgroup(&theirs, &own))
                        }
                        _ => Err(()),
                    }
                }
            }
        };
        let mut each = Vec::with_capacity(self.each.len());
        for w in &self.each {
            let value = read(w);
            // Gone, another process by now, or exiting (a zombie's environment reads empty):
            // what it names is not known.
            let gone = |stat: &procfs::Stat| stat.state == b'Z' || stat.state == b'X';
            let found = match (w.process.still_same().filter(|s| !gone(s)), value) {
                (None, _) | (_, Err(())) => Read::Unknown,
                (Some(_), Ok(Some(value))) => Read::Names(value),
                (Some(_), Ok(None)) => Read::NamesNone,
            };
            each.push((w.id, found));
        }
        each
    }
}

/// The cgroup v2 path of `process`, its exact bytes, read and checked to be still its own;
/// none when it cannot be (gone, a host without cgroup v2, or a file past its cap).
fn cgroup_of(process: ProcessId) -> Option<Vec<u8>> {
    let file = procfs::read_bytes(process.pid, "cgroup").ok()?;
    if file.cut {
        return None;
    }
    let path = placement::cgroup_path(&file.bytes)?.to_vec();
    process.still_same()?;
    Some(path)
}

/// The session a process in `cgroup` is in, below `gateway`'s cgroup: the path of the cgroup
/// directly below the gateway's that it is in or under; none in the gateway's own or outside
/// it. A path longer than a session's cap (a deep hierarchy, or a long name: cgroupfs sets no
/// limit to one) is named by [`digest_named`]: cutting it could give two sessions one value,
/// and `kill --session` would end both.
fn session_cgroup(gateway: &[u8], cgroup: &[u8]) -> Option<Vec<u8>> {
    let base = gateway.strip_suffix(b"/").unwrap_or(gateway);
    let rest = cgroup.strip_prefix(base)?.strip_prefix(b"/")?;
    let name = rest
        .split(|&b| b == b'/')
        .next()
        .filter(|c| !c.is_empty())?;
    let path = &cgroup[..base.len() + 1 + name.len()];
    Some(if path.len() <= SESSION_MAX {
        path.to_vec()
    } else {
        digest_named(path)
    })
}

/// How many hex digits of a long path's SHA-256 name it (the first 32 of 64): 128 bits, so
/// that no one who can name cgroups finds two paths of one value, let alone a second path
/// of another's.
const DIGEST_HEX: usize = 32;

/// A path longer than a session's cap, named in it: `…` and its end (as much of it as fits,
/// for the reader), then `#` and the first [`DIGEST_HEX`] hex digits of the whole path's
/// SHA-256, which tell two such paths apart. Never a path itself (a path starts with `/`).
fn digest_named(path: &[u8]) -> Vec<u8> {
    use sha2::{Digest, Sha256};
    const MARK: &str = "…";
    let digest = format!("#{}", hex(&Sha256::digest(path)[..DIGEST_HEX / 2]));
    let room = SESSION_MAX - MARK.len() - digest.len();
    let mut tail = &path[path.len() - room..];
    // Not from inside a character: the end starts at one's first byte.
    while let Some((&first, rest)) = tail.split_first() {
        if first & 0xC0 != 0x80 {
            break;
        }
        tail = rest;
    }
    let mut value = Vec::with_capacity(SESSION_MAX);
    value.extend_from_slice(MARK.as_bytes());
    value.extend_from_slice(tail);
    value.extend_from_slice(digest.as_bytes());
    value
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lineage::graph::testing::{fork, gateway, record};

    /// A gateway (100) and `n` children (pids 101 on), each noted as exec'd.
    fn noted(n: u32) -> Sessions {
        let mut g = LineageGraph::new(100);
        g.add_seed(gateway(100));
        let mut sessions = Sessions::new(Source::environment(vec![b"AGENT_SESSION_ID".to_vec()]));
        for pid in 101..101 + n {
            record(&mut g, u64::from(pid), (pid, u64::from(pid)), fork(100));
            let id = g.current(pid).unwrap().id;
            sessions.note(&mut g, id);
        }
        sessions
    }

    #[test]
    fn reads_go_at_once_when_the_reader_may_sleep_and_in_batches_while_records_stream() {
        let mut sessions = noted(3);
        assert!(sessions.take(true).is_none(), "streaming: gathered");
        let taken = sessions.take(false).expect("the reader may sleep: at once");
        assert_eq!(taken.ids().len(), 3);
        assert!(sessions.take(false).is_none(), "nothing left");

        let mut full = noted(BATCH as u32);
        assert_eq!(
            full.take(true).map(|t| t.ids().len()),
            Some(BATCH),
            "a full batch"
        );

        let mut old = noted(1);
        std::thread::sleep(GATHER_FOR);
        assert!(old.take(true).is_some(), "waited long enough");
    }

    fn below(gateway: &str, cgroup: &str) -> Option<String> {
        let found = session_cgroup(gateway.as_bytes(), cgroup.as_bytes())?;
        Some(String::from_utf8(found).unwrap())
    }

    #[test]
    fn a_session_cgroup_is_the_one_directly_below_the_gateways() {
        let some = |s: &str| Some(s.to_owned());
        assert_eq!(below("/gw", "/gw/s1"), some("/gw/s1"));
        assert_eq!(below("/gw", "/gw/s1/inner/x"), some("/gw/s1"));
        assert_eq!(below("/", "/a/b"), some("/a"));
        assert_eq!(below("/gw", "/gw"), None, "the gateway's own");
        assert_eq!(
            below("/gw", "/gw2/s1"),
            None,
            "a sibling that shares a prefix"
        );
        assert_eq!(below("/gw", "/other/s1"), None);
        assert_eq!(below("/gw", "/gw/"), None);
        // Bytes that are not UTF-8 are kept as they are.
        let odd = session_cgroup(b"/gw", b"/gw/s\xff\xfe/x");
        assert_eq!(odd.as_deref(), Some(&b"/gw/s\xff\xfe"[..]));
    }

    #[test]
    fn a_session_cgroup_path_past_the_cap_is_named_by_its_end_and_digest_never_cut() {
        // At the cap, the path whole.
        let gateway = format!("/{}", "g".repeat(SESSION_MAX - 5));
        let at_cap = format!("{gateway}/abc");
        assert_eq!(at_cap.len(), SESSION_MAX);
        assert_eq!(below(&gateway, &at_cap), Some(at_cap.clone()));
        // One past it; two long names alike in their first 300 bytes (cgroupfs takes names
        // of any length); each under two gateways: six values, none cut, all different.
        let long = |n: &str| format!("{}{n}", "s".repeat(300));
        let mut seen = std::collections::HashSet::new();
        for gateway in ["/a.service", "/b.service"] {
            let past_cap = format!("{}{}", "x".repeat(SESSION_MAX - gateway.len()), "y");
            for name in [long("1"), long("2"), past_cap] {
                let path = format!("{gateway}/{name}");
                let value = below(gateway, &format!("{path}/inner")).unwrap();
                assert_eq!(value.len(), SESSION_MAX, "{value}");
                assert!(value.starts_with('…'), "{value}");
                let (end, digest) = value.rsplit_once('#').unwrap();
                assert_eq!(digest.len(), 32, "{value}");
                let end = end.trim_start_matches('…');
                assert!(end.len() > 200 && path.ends_with(end), "{value}");
                assert!(
                    seen.insert(value.clone()),
                    "one value for two paths: {value}"
                );
            }
        }
        // The end starts at a character's first byte, never inside one: the two-byte `é`s
        // and the `z` after them put the cut inside one, which is passed over.
        let wide = format!("/gw/{}z", "é".repeat(200));
        let value = below("/gw", &wide).unwrap();
        assert_eq!(value.len(), SESSION_MAX - 1, "{value}");
        assert!(value.trim_start_matches('…').starts_with('é'), "{value}");
    }
}
