//! The public event stream: one JSON object per line (NDJSON), documented in the README.
//! Names and fields change only compatibly (new optional fields, new events).
use std::{borrow::Cow, collections::BTreeMap};

use serde::Serialize;

use crate::capture::decode::{KernelEvent, What};
use crate::procfs::placement::Placement;

pub use super::fields::{Argv, ProcBytes, ProcText};
use super::kinds::{
    CHECK, CLEARED, EXEC, EXIT, FLAG, FORK, GATEWAY, KILL, LOST, READY, REAPED, REPARENT, SETSID,
    SNAPSHOT, STOP_COMMAND, SUMMARY,
};
pub use super::kinds::{Counts, KINDS, Kind, Lifecycle};

pub use super::evidence::{
    Ancestor, ExecutableLeaks, KindEvidence, LeakDetail, LeakSummary, Peer, PipeInfo, ProcessLabel,
    SpawningThread,
};

/// One line of the stream: `seq` (position in this stream, from 0), `ts` (boot-time ns), the
/// `event` name, and the event's own fields.
#[derive(Serialize)]
pub struct Envelope<'a> {
    pub event: &'static str,
    pub seq: u64,
    pub ts: u64,
    #[serde(flatten)]
    pub body: &'a Event,
}

/// A live process in the closing summary.
#[derive(Clone, Debug, Serialize)]
pub struct AliveProcess {
    /// Its pid, its name at the end and its command line.
    #[serde(flatten)]
    pub process: ProcessLabel,
    /// Pids from the gateway to this process along spawner edges.
    pub lineage: Vec<u32>,
    /// Its pid namespace and cgroup, read at the end.
    #[serde(flatten)]
    pub placement: Placement,
    pub ppid: u32,
    /// Out of its gateway's session, process group or cgroup (as in a flag's evidence).
    pub escaped: bool,
    /// It called setsid() itself (schema 2; `escaped` meant this in schema 1).
    pub called_setsid: bool,
    pub uncertain: bool,
}

/// The closing summary's fields.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    pub counts: Counts,
    pub delivery: Delivery,
    pub alive: Vec<AliveProcess>,
    pub zombies: Vec<u32>,
    pub gateway_exit_code: Option<i32>,
    pub duration_ns: u64,
    pub latency_ns: Latency,
    /// CPU time reaper-trace itself used (user + system), start-up included.
    pub cpu_ns: u64,
    pub leaks: LeakSummary,
    /// `--kill`'s steps by reason, then by result.
    pub kills: BTreeMap<&'static str, BTreeMap<&'static str, u64>>,
}

/// How the event stream checked out against the kernel's own counters.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Delivery {
    /// Records the kernel produced (its sequence numbers used).
    pub kernel_events: u64,
    /// Records received.
    pub received: u64,
    /// Records the kernel could not reserve, by kind.
    pub dropped: BTreeMap<&'static str, u64>,
    /// Children not followed because the tracked map was full.
    pub tracked_full: u64,
    /// `kernel_events == received + dropped`: nothing vanished unaccounted for.
    pub consistent: bool,
}

/// From an event in the kernel to the end of the batch that applied it to the graph.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Latency {
    /// Events measured.
    pub count: u64,
    pub p50: u64,
    pub p99: u64,
    pub max: u64,
}

/// The version of the stream's schema (`schema/events.schema.json`), named by `ready`. It
/// goes up when a field's meaning changes (docs/events.md lists each version's changes);
/// added events and fields keep it.
pub const SCHEMA_VERSION: u32 = 2;

/// Every event of the stream.
#[derive(Clone, Debug, Serialize)]
#[serde(untagged)]
pub enum Event {
    Snapshot {
        pid: u32,
        ppid: u32,
        spawner: Option<u32>,
        #[serde(flatten)]
        comm: ProcText,
        #[serde(flatten)]
        argv: Argv,
        sid: u32,
        pgid: u32,
        #[serde(flatten)]
        placement: Placement,
    },
    /// A process became a gateway: found at start, matched by a selector later, or the
    /// `-- CMD` gateway. Its spawned processes' `lineage` starts with it.
    Gateway {
        pid: u32,
        /// Boot-time ns when it started (to the clock tick for one found in /proc).
        start: u64,
        /// Which selector found it: "pid", "command", "exe:PATH", "cgroup:PATH",
        /// "unit:NAME" or "pidfile:PATH".
        selector: String,
        #[serde(flatten)]
        comm: ProcText,
        #[serde(flatten)]
        argv: Argv,
    },
    Ready {
        /// The stream's schema version ([`SCHEMA_VERSION`]).
        schema: u32,
        gateway: Vec<u32>,
        tracked: usize,
        /// How setsid() is observed: "tracepoint", "raw_syscalls" or "none".
        setsid_hook: &'static str,
        /// The running kernel's release (`uname -r`).
        kernel: String,
    },
    Fork {
        pid: u32,
        ppid: u32,
        spawner: u32,
        #[serde(flatten)]
        comm: ProcText,
        start: u64,
        sid: u32,
        pgid: u32,
        uid: u32,
        cgroup_id: u64,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        untracked: bool,
        /// The spawner's thread that forked it, when not its main thread.
        #[serde(skip_serializing_if = "Option::is_none")]
        thread: Option<SpawningThread>,
    },
    Exec {
        pid: u32,
        #[serde(flatten)]
        filename: ProcText,
        #[serde(flatten)]
        argv: Argv,
        truncated: bool,
        tid: u32,
    },
    Exit {
        pid: u32,
        exit_code: Option<i32>,
        signal: Option<Cow<'static, str>>,
        core: bool,
    },
    Reaped {
        pid: u32,
        /// Only when true: learnt from /proc (the process is gone) because the kernel's own
        /// free, which comes after an RCU grace period, was late; `ts` is when it was noticed.
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        from_proc: bool,
    },
    Setsid {
        pid: u32,
        sid: u32,
    },
    Reparent {
        pid: u32,
        old_ppid: u32,
        new_ppid: u32,
    },
    Lost {
        count: u64,
        /// Lost records by kind ("fork", "exec", ...) and "tracked_full".
        kinds: BTreeMap<&'static str, u64>,
        /// Processes re-read from /proc because of the loss (marked uncertain until then).
        affected: Vec<u32>,
    },
    /// Boxed: the biggest event by far, written once, would otherwise make every event as
    /// big (each record's event is built and moved on the hottest path).
    Summary(Box<Summary>),
    /// A leak flag starts holding.
    Flag {
        pid: u32,
        reason: &'static str,
        /// Boot-time ns since when the condition holds.
        since: u64,
        /// For `idle`: seconds without I/O.
        #[serde(skip_serializing_if = "Option::is_none")]
        idle_secs: Option<f64>,
        #[serde(flatten)]
        detail: Box<LeakDetail>,
    },
    /// A step of `--kill`'s sequence for one process.
    Kill {
        pid: u32,
        #[serde(flatten)]
        comm: ProcText,
        reason: &'static str,
        /// "SIGCONT", "SIGTERM" or "SIGKILL".
        signal: &'static str,
        /// "sent", "exited", "identity_changed", "not_in_lineage", "permission_denied" or
        /// "dry_run".
        result: &'static str,
        /// At the end of a sequence: seconds from the first signal to the exit.
        #[serde(skip_serializing_if = "Option::is_none")]
        secs: Option<f64>,
    },
    /// A leak flag stops holding.
    Cleared {
        pid: u32,
        reason: &'static str,
        because: &'static str,
    },
    /// The run stopped while the `-- CMD` gateway ran: reaper-trace ends it as timeout(1)
    /// does, SIGTERM then SIGKILL after `--term-timeout`; one event a signal.
    StopCommand {
        pid: u32,
        /// "SIGTERM" or "SIGKILL".
        signal: &'static str,
        /// Why the run stopped: "duration", "SIGINT" or "SIGTERM".
        because: &'static str,
    },
    /// `--check`'s verdict, after the gateway command exited and the settle time passed.
    Check {
        /// "clean", "leaked" or "gateway_failed".
        verdict: &'static str,
        gateway_exit_code: Option<i32>,
        /// Descendants still alive and zombies, with their evidence.
        leaked: Vec<LeakedProcess>,
    },
}

/// A process `--check` found left behind.
#[derive(Clone, Debug, Serialize)]
pub struct LeakedProcess {
    pub pid: u32,
    #[serde(flatten)]
    pub detail: LeakDetail,
}

impl Event {
    /// The stream's event for a kernel record. A gateway match has none of its own: the tracer
    /// announces the gateway with its selector's name.
    pub fn from_kernel(ev: &KernelEvent) -> Option<Event> {
        let pid = ev.pid;
        Some(match &ev.what {
            What::Fork {
                spawner,
                ppid,
                sid,
                pgid,
                uid,
                cgroup_id,
                comm,
                spawner_tid,
                untracked,
            } => Event::Fork {
                pid,
                ppid: *ppid,
                spawner: *spawner,
                comm: ProcText::new("comm", *comm),
                start: ev.start,
                sid: *sid,
                pgid: *pgid,
                uid: *uid,
                cgroup_id: *cgroup_id,
                untracked: *untracked,
                thread: SpawningThread::of(
                    (spawner_tid != spawner).then_some((*spawner_tid, *comm)),
                ),
            },
            What::Exec {
                old_tid,
                filename,
                argv,
                truncated,
                ..
            } => Event::Exec {
                pid,
                filename: ProcText::new("filename", filename.clone()),
                argv: Argv::new(argv.clone()),
                truncated: *truncated,
                tid: *old_tid,
            },
            What::Exit { status } => {
                let (exit_code, signal, core) = wait_status(*status);
                Event::Exit {
                    pid,
                    exit_code,
                    signal,
                    core,
                }
            }
            What::Free => Event::Reaped {
                pid,
                from_proc: false,
            },
            What::Setsid { sid } => Event::Setsid { pid, sid: *sid },
            What::Gateway { .. } => return None,
        })
    }

    /// What this kind of event is (see [`KINDS`]): one place for its name, whether it is a
    /// lifecycle event and whether it is a finding.
    pub fn kind(&self) -> &'static Kind {
        match self {
            Event::Snapshot { .. } => &SNAPSHOT,
            Event::Gateway { .. } => &GATEWAY,
            Event::Ready { .. } => &READY,
            Event::Fork { .. } => &FORK,
            Event::Exec { .. } => &EXEC,
            Event::Exit { .. } => &EXIT,
            Event::Reaped { .. } => &REAPED,
            Event::Setsid { .. } => &SETSID,
            Event::Reparent { .. } => &REPARENT,
            Event::Lost { .. } => &LOST,
            Event::Summary(_) => &SUMMARY,
            Event::Flag { .. } => &FLAG,
            Event::Kill { .. } => &KILL,
            Event::Cleared { .. } => &CLEARED,
            Event::Check { .. } => &CHECK,
            Event::StopCommand { .. } => &STOP_COMMAND,
        }
    }

    /// The `event` name on the wire.
    pub fn name(&self) -> &'static str {
        self.kind().name
    }

    /// Whether the event is a finding or the verdict (what `--check` shows people by
    /// default).
    pub fn is_finding(&self) -> bool {
        self.kind().finding
    }

    /// The lifecycle kind of this event, if it is one.
    pub fn lifecycle(&self) -> Option<Lifecycle> {
        self.kind().lifecycle
    }
}

// The evidence of a leak flag (`flag`, `check`, `summary.leaks`).

/// Splits a wait(2) status into (exit code, signal name, core dumped).
pub fn wait_status(status: u32) -> (Option<i32>, Option<Cow<'static, str>>, bool) {
    let sig = (status & 0x7f) as i32;
    if sig == 0 {
        (Some(((status >> 8) & 0xff) as i32), None, false)
    } else {
        (None, Some(signal_name(sig)), status & 0x80 != 0)
    }
}

/// `SIGKILL` for 9; `SIG41` for a number without a name (real-time signals). A named one is
/// borrowed: the ingest path allocates nothing for a killed process.
pub fn signal_name(sig: i32) -> Cow<'static, str> {
    match nix::sys::signal::Signal::try_from(sig) {
        Ok(s) => Cow::Borrowed(s.as_str()),
        Err(_) => Cow::Owned(format!("SIG{sig}")),
    }
}

#[cfg(test)]
mod tests;
