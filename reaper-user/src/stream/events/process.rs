//! The lifecycle events: what the kernel said about one process (and `snapshot`, what /proc
//! said about it at start). Each is counted by kind in `summary.counts` and the metrics.
use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use super::{Argv, ProcText, SpawningThread};
use crate::procfs::placement::Placement;
use crate::stream::kinds::Readable;
use crate::stream::words::thread_text;

/// A process found in /proc at start (or re-read after a loss).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Snapshot {
    pub pid: u32,
    /// Boot-time ns when it started, to the clock tick (/proc's precision); 0 in an audit
    /// written before the field was added.
    pub start: u64,
    pub ppid: u32,
    pub spawner: Option<u32>,
    #[serde(flatten)]
    pub comm: ProcText,
    #[serde(flatten)]
    pub argv: Argv,
    pub sid: u32,
    pub pgid: u32,
    #[serde(flatten)]
    pub placement: Placement,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Fork {
    pub pid: u32,
    pub ppid: u32,
    pub spawner: u32,
    #[serde(flatten)]
    pub comm: ProcText,
    pub start: u64,
    pub sid: u32,
    pub pgid: u32,
    pub uid: u32,
    pub cgroup_id: u64,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub untracked: bool,
    /// The spawner's thread that forked it, when not its main thread.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread: Option<SpawningThread>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Exec {
    pub pid: u32,
    #[serde(flatten, deserialize_with = "ProcText::read_filename")]
    pub filename: ProcText,
    #[serde(flatten)]
    pub argv: Argv,
    pub truncated: bool,
    pub tid: u32,
    /// The interpreter it now runs, when its frames are read at forks (`--spawn-stacks auto`):
    /// `python3.12`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interpreter: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Exit {
    pub pid: u32,
    pub exit_code: Option<i32>,
    pub signal: Option<Cow<'static, str>>,
    pub core: bool,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Reaped {
    pub pid: u32,
    /// Only when true: learnt from /proc (the process is gone) because the kernel's own
    /// free, which comes after an RCU grace period, was late; `ts` is when it was noticed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub from_proc: bool,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Setsid {
    pub pid: u32,
    pub sid: u32,
}

/// An agent session begins at a process (`--session-env` or `--session-cgroup`): its
/// environment (or cgroup) names a session that its spawner is not in. Every process it
/// spawns is in it, unless it names another. Written when its environment was read, after
/// its exec: `start` says which process of that pid it is.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Session {
    pub pid: u32,
    /// Boot-time ns when the process started (to the clock tick for one found in /proc).
    pub start: u64,
    /// The session's value, as the variable gives it (cut at 256 bytes) or the session
    /// cgroup's path (a long one by its end and digest, never cut); empty when an exec
    /// dropped the value that began a session here (the process is in its spawner's again),
    /// or a restart reads sessions elsewhere than its checkpoint.
    #[serde(flatten, deserialize_with = "ProcText::read_session")]
    pub session: ProcText,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Reparent {
    pub pid: u32,
    pub old_ppid: u32,
    pub new_ppid: u32,
}

impl Readable for Snapshot {
    fn readable(&self, _: u64) -> String {
        format!(
            "found    {} ({}) parent {}: {}",
            self.pid,
            self.comm.for_terminal(),
            self.ppid,
            self.argv.for_terminal()
        )
    }
}

impl Readable for Fork {
    fn readable(&self, _: u64) -> String {
        let parent = match self.ppid == self.spawner {
            true => String::new(),
            false => format!(" (parent {})", self.ppid),
        };
        let note = match self.untracked {
            true => "; NOT FOLLOWED: tracked map full",
            false => "",
        };
        format!(
            "fork     {} ({}) by {}{}{parent}{note}",
            self.pid,
            self.comm.for_terminal(),
            self.spawner,
            thread_text(self.thread.as_ref())
        )
    }
}

impl Readable for Exec {
    fn readable(&self, _: u64) -> String {
        format!(
            "exec     {} {}: {}{}",
            self.pid,
            self.filename.for_terminal(),
            self.argv.for_terminal(),
            if self.truncated { " [truncated]" } else { "" }
        )
    }
}

impl Readable for Exit {
    fn readable(&self, _: u64) -> String {
        let pid = self.pid;
        match (self.exit_code, &self.signal) {
            (Some(code), _) => format!("exit     {pid} code {code}"),
            (None, Some(sig)) => format!(
                "exit     {pid} killed by {sig}{}",
                if self.core { " (core dumped)" } else { "" }
            ),
            (None, None) => format!("exit     {pid}"),
        }
    }
}

impl Readable for Reaped {
    fn readable(&self, _: u64) -> String {
        match self.from_proc {
            false => format!("reaped   {}", self.pid),
            true => format!("reaped   {} (gone from /proc)", self.pid),
        }
    }
}

impl Readable for Setsid {
    fn readable(&self, _: u64) -> String {
        format!("setsid   {} now leads session {}", self.pid, self.sid)
    }
}

impl Readable for Session {
    fn readable(&self, _: u64) -> String {
        format!(
            "session  {} begins session {}",
            self.pid,
            self.session.for_terminal()
        )
    }
}

impl Readable for Reparent {
    fn readable(&self, _: u64) -> String {
        format!(
            "reparent {} parent {} exited; new parent {}",
            self.pid, self.old_ppid, self.new_ppid
        )
    }
}
