//! The evidence a leak flag carries (`flag`, `check.leaked`, `summary.leaks`): written by the
//! tracer and read back by the audit report, one definition for both.
use std::{borrow::Cow, collections::BTreeMap, sync::Arc};

use serde::{Deserialize, Serialize};

use super::events::{Argv, ProcText};
use crate::procfs::placement::Placement;
use crate::text::file_name;

// The evidence types are read back by the audit report too: every field has a default, so an
// odd line loses only what it lacks.

/// What `escaped` says, in the words every readable output uses (the flag's line, the
/// report): the process is in another session, process group or cgroup than its gateway's
/// (by its own setsid() or an ancestor's, a setpgid(), a move). False when no gateway is on its
/// chain to compare with. Calling setsid() itself is `called_setsid`, a fact of its own.
pub const ESCAPED_MEANING: &str = "another session, group or cgroup than the gateway's";

/// How an event names a process: its pid, its name and its command line (`{pid, comm,
/// argv}`, with the `*_b64` twins when the bytes are not UTF-8). One type wherever an event
/// lists processes: a flag's `ancestors` and `chain`, the summary's `alive`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ProcessLabel {
    pub pid: u32,
    #[serde(flatten)]
    pub comm: ProcText,
    #[serde(flatten)]
    pub argv: Argv,
}

/// One process on a flagged process's spawn chain.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Ancestor {
    #[serde(flatten)]
    pub process: ProcessLabel,
    /// Boot-time ns of its exit; null while alive.
    pub exited: Option<u64>,
}

/// The thread of a spawner that forked a process, when it is not the spawner's main thread
/// (hermes starts its MCP servers from an event-loop thread, Node from its worker threads).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct SpawningThread {
    pub tid: u32,
    /// The thread's name when it forked.
    #[serde(flatten)]
    pub comm: ProcText,
}

impl SpawningThread {
    /// The spawning thread the graph keeps for a process.
    pub fn of(thread: Option<(u32, crate::text::Comm)>) -> Option<SpawningThread> {
        thread.map(|(tid, comm)| SpawningThread {
            tid,
            comm: ProcText::new("comm", comm),
        })
    }
}

/// A holder of a pipe's or socket's other end.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Peer {
    pub pid: u32,
    pub fd: u32,
    pub end: Cow<'static, str>,
    #[serde(flatten)]
    pub comm: ProcText,
}

/// A pipe, socket or terminal a flagged process holds.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct PipeInfo {
    pub fd: u32,
    pub kind: Cow<'static, str>,
    pub inode: Option<u64>,
    pub end: Cow<'static, str>,
    /// "open" (some process holds the other end), "closed" (none does: EOF or EPIPE is
    /// pending), or "unknown".
    pub other_end: Cow<'static, str>,
    /// A connected UNIX socket's peer: the inode of the other end (absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer_inode: Option<u64>,
    /// A socket's protocol: "unix", "tcp", "udp", "raw", "netlink" or "unknown" (in none of its
    /// network namespace's tables); absent for anything else. Only UNIX sockets and TCP
    /// connections within this host count as channels.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protocol: Option<Cow<'static, str>>,
    /// A TCP connection's remote address (`127.0.0.1:8080`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remote: Option<String>,
    /// A pty's index, `N` of `/dev/pts/N` (absent for anything else).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<u32>,
    /// Both ends are held by this process alone (its own plumbing, e.g. libuv's signal pipe);
    /// absent when false. Such a channel never makes a rule hold.
    #[serde(skip_serializing_if = "is_false")]
    pub internal: bool,
    pub peers: Vec<Peer>,
    /// Holders of the other end past the first [`PEERS_LISTED`], not listed (absent when
    /// none): a pipe may have thousands.
    #[serde(skip_serializing_if = "is_zero")]
    pub peers_omitted: u64,
}

/// The pipes, sockets and terminals a flag lists at most ([`LeakDetail::pipes`]): a process
/// may hold as many as its limit lets it; the rest are counted.
pub const PIPES_LISTED: usize = 64;

/// The holders of a channel's other end a flag lists at most ([`PipeInfo::peers`]).
pub const PEERS_LISTED: usize = 16;

fn is_false(b: &bool) -> bool {
    !b
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The agent session a process is in (`--session-env` or `--session-cgroup`), as its flag,
/// `why` and `sessions` name it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct SessionEvidence {
    /// The session's value (`id`, with an `id_b64` twin when it is not UTF-8).
    #[serde(flatten, deserialize_with = "ProcText::read_id")]
    pub id: ProcText,
    /// The process where it begins: the highest on the spawn chain whose environment names it.
    pub begins: u32,
    /// The process whose exit ends it, where that end is seen apart from the process's own (a
    /// per-session process above it); absent when it is a server whose own session it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<u32>,
    /// Boot-time ns its owner exited: the session ended then.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended: Option<u64>,
}

/// What a leak flag carries besides its reason.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct LeakDetail {
    pub lineage: Vec<u32>,
    pub ancestors: Vec<Ancestor>,
    /// The processes of the flagged server, outermost (the flagged one) first: a process and
    /// the ones it started that share its channel (`npm exec` > `sh -c` > `node server.js`).
    /// Just the flagged process when it is a server by itself.
    pub chain: Vec<ProcessLabel>,
    /// Its pipes, sockets and terminals, the first [`PIPES_LISTED`] by fd.
    pub pipes: Vec<PipeInfo>,
    /// Those it held past the first [`PIPES_LISTED`], not listed (absent when none).
    #[serde(skip_serializing_if = "is_zero")]
    pub pipes_omitted: u64,
    /// `/proc/PID/stat` state, e.g. "S (sleeping)"; "Z (zombie)" for a zombie.
    pub state: String,
    pub rss_kib: Option<u64>,
    /// Its real parent now: init or a subreaper once the one that forked it exited.
    pub ppid: u32,
    /// Out of its gateway's session, process group or cgroup (informational): see
    /// [`ESCAPED_MEANING`].
    pub escaped: bool,
    /// Its pid inside its pid namespace (`nspid`, when it differs), cgroup and container.
    #[serde(flatten)]
    pub placement: Placement,
    /// Its name now (it may have renamed itself since its exec).
    #[serde(flatten)]
    pub comm: ProcText,
    #[serde(flatten)]
    pub argv: Argv,
    /// The thread of its spawner that forked it, when not the spawner's main thread.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thread: Option<SpawningThread>,
    /// The agent session it is in (`--session-env` or `--session-cgroup`), when it is in one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<SessionEvidence>,
    /// For `accumulating`: the kind of which it is one instance too many.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<KindEvidence>,
    /// For `accumulating`: the instances of its kind alive under its gateway instance.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instances: Option<u64>,
    /// For `accumulating`: the newest instance's pid.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub newest: Option<u32>,
    /// The code that spawned it (`--spawn-stacks`): its spawner's frames at the fork,
    /// innermost first. Shared: the flags of one site's instances (thousands, in a scan that
    /// flags an accumulating kind) hold one copy.
    #[serde(skip_serializing_if = "no_frames")]
    pub spawned_at: Arc<[Frame]>,
    /// `spawned_at` ends before the spawner's outermost frame: the walk ran into what is no
    /// code (a frame pointer into data, an object no build id names), or reached the cap.
    /// Absent when false.
    #[serde(skip_serializing_if = "is_false")]
    pub spawned_at_truncated: bool,
}

fn no_frames(frames: &Arc<[Frame]>) -> bool {
    frames.is_empty()
}

/// A frame of the code that spawned a process.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct Frame {
    /// The function (demangled); none when its object names none there.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub function: Option<String>,
    /// Its source file and line, from the object's debug information.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
    /// The executable or library the frame is in; none when its file was not found (by its
    /// build id, or for an address, in a mapping of a process running the spawner's code),
    /// and for a Python or JavaScript frame.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub object: Option<String>,
    /// The object's build id (hex), when the kernel could read it: with `offset`, what names
    /// the frame offline (`debuginfod`, `eu-addr2line`) when `object` is not there. At its own
    /// length when the file was found; else the kernel's 20 bytes (a shorter id padded).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub build_id: Option<String>,
    /// The offset in `object`; for a Python frame, the instruction's offset in its code
    /// object's bytecode; for a JavaScript frame, its address in the host.
    pub offset: u64,
    /// `python` for a frame of the spawner's Python code (read from its interpreter),
    /// `javascript` for a Node host's (named from its perf map: `line` is where the function
    /// begins); absent for machine code. Such a frame with no function: its spawner was
    /// gone before the flag (or, for JavaScript, ran without `--perf-basic-prof`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
}

/// The libraries whose own frames say only "it forked": the C library and the loader.
const SPAWNING_LIBRARIES: [&str; 3] = ["libc.so", "libpthread.so", "ld-linux"];

/// The sources of the languages' own process-spawning libraries and the async plumbing they
/// are reached through: Python's `subprocess`, `asyncio`, `anyio` and `contextlib` (an
/// `async with` around a spawn), Node's `child_process` and `cross-spawn` (the npm package
/// most Node code spawns through, the MCP SDK's included).
const SPAWNING_SOURCES: [&str; 6] = [
    "/subprocess.py",
    "/asyncio/",
    "/anyio/",
    "/contextlib.py",
    "child_process",
    "/cross-spawn/",
];

/// The functions of Rust's process-spawning libraries (demangled), which a Rust host's binary
/// holds itself: std's `Command` and tokio's.
const SPAWNING_FUNCTIONS: [&str; 4] = [
    "<std::process::Command>::",
    "<std::sys::process::",
    "<tokio::process::Command>::",
    "tokio::process::",
];

impl Frame {
    /// Whether the frame is a spawning library's (libc's fork wrapper, Python's `subprocess`,
    /// Rust's `Command`) rather than the spawner's own code: a spawn site is named past these.
    pub fn in_spawning_library(&self) -> bool {
        let name = file_name(self.object.as_deref().unwrap_or(""));
        let file = self.file.as_deref().unwrap_or("");
        let function = self.function.as_deref().unwrap_or("");
        SPAWNING_LIBRARIES.iter().any(|lib| name.starts_with(lib))
            || SPAWNING_SOURCES.iter().any(|src| file.contains(src))
            || SPAWNING_FUNCTIONS.iter().any(|f| function.starts_with(f))
    }
}

/// A kind of process (`accumulating`): its executable and its instances' command line, each
/// option value they differ in shown as `*`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct KindEvidence {
    pub exe: String,
    pub pattern: String,
}

/// Leaks in the closing summary.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct LeakSummary {
    /// Flags holding at the end, by reason.
    pub active: BTreeMap<Cow<'static, str>, u64>,
    /// Flags raised during the run, by reason.
    pub raised: BTreeMap<Cow<'static, str>, u64>,
    /// Resident memory of the flagged live processes (each counted once).
    pub rss_kib: u64,
    /// The flagged processes grouped by executable.
    pub by_executable: Vec<ExecutableLeaks>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ExecutableLeaks {
    #[serde(flatten, deserialize_with = "ProcText::read_executable")]
    pub executable: ProcText,
    pub pids: Vec<u32>,
    pub rss_kib: u64,
}
