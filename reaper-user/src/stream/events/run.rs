//! The run's own events: a gateway found, tracing ready, records lost, the `-- CMD` gateway
//! stopped, and the closing summary.
use std::{borrow::Cow, collections::BTreeMap};

use serde::{Deserialize, Serialize};

use super::{Argv, Counts, Event, LeakSummary, ProcText, ProcessLabel};
use crate::procfs::placement::Placement;
use crate::stream::kinds::{Lifecycle, Readable};
use crate::text::escape_for_terminal;

/// A name the stream writes from a fixed set (a reason, a signal, a kind): borrowed when
/// written, owned when read back.
pub type Name = Cow<'static, str>;

/// A process became a gateway: found at start, matched by a selector later, or the
/// `-- CMD` gateway. Its spawned processes' `lineage` starts with it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Gateway {
    pub pid: u32,
    /// Boot-time ns when it started (to the clock tick for one found in /proc).
    pub start: u64,
    /// Which selector found it: "pid", "command", "exe:PATH", "cgroup:PATH",
    /// "unit:NAME" or "pidfile:PATH".
    pub selector: String,
    /// Its real parent, session and process group when it became a gateway (0 read back
    /// from a stream written before they were).
    pub ppid: u32,
    pub sid: u32,
    pub pgid: u32,
    #[serde(flatten)]
    pub comm: ProcText,
    #[serde(flatten)]
    pub argv: Argv,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Ready {
    /// The stream's schema version ([`super::SCHEMA_VERSION`]).
    pub schema: u32,
    pub gateway: Vec<u32>,
    pub tracked: usize,
    /// How setsid() is observed: "tracepoint", "raw_syscalls" or "none".
    pub setsid_hook: Name,
    /// The running kernel's release (`uname -r`).
    pub kernel: String,
    /// The wall-clock time of boot-time 0, ns since the UNIX epoch, as the run read both
    /// clocks at its start: a line's wall-clock time is this plus its `ts` (what `why --at`
    /// reads a wall-clock time with). Absent in an audit written before it was added.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub booted_at_unix_ns: Option<u64>,
    /// With `--state-dir`, when the run took back the lineage of the run before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed: Option<Resumed>,
}

/// A run that took back the lineage of the run before (`--state-dir`).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Resumed {
    /// The state directory.
    pub state_dir: String,
    /// Boot-time ns from the checkpoint to this run's start: no run read the ring in
    /// between.
    pub gap_ns: u64,
    /// Processes alive again, with their lineage.
    pub adopted: usize,
    /// Processes alive at the checkpoint and gone since, whose exits no record tells (only
    /// when the kernel side was not kept).
    pub gone: usize,
    /// The probes stayed attached through the gap: its events follow, from the ring, with
    /// their kernel times. False: the kernel side was not there, and /proc told what
    /// became of each process.
    pub kernel_kept: bool,
    /// Records the run before took in after its last checkpoint (it was killed or crashed):
    /// they are in its stream, not in the lineage taken back, which is re-read from /proc.
    pub unsaved: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Lost {
    pub count: u64,
    /// Lost records by kind ("fork", "exec", ...) and "tracked_full".
    pub kinds: BTreeMap<Name, u64>,
    /// Processes re-read from /proc because of the loss (marked uncertain until then).
    pub affected: Vec<u32>,
}

/// The run stopped while the `-- CMD` gateway ran: reaper-trace ends it as timeout(1)
/// does, SIGTERM then SIGKILL after `--term-timeout`; one event a signal.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct StopCommand {
    pub pid: u32,
    /// "SIGTERM" or "SIGKILL".
    pub signal: Name,
    /// Why the run stopped: "duration", "SIGINT" or "SIGTERM".
    pub because: Name,
}

/// Something the operator is told about the run that is no process's event: why a Python
/// spawner's frames will not be read, a checkpoint that cannot be written, a gateway's pid
/// file that names no process. People see it on standard error (unless `--quiet`).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Note {
    pub text: String,
}

impl Note {
    /// The `note` event telling `text`.
    pub fn event(text: &str) -> Event {
        Event::Note(Note {
            text: text.to_owned(),
        })
    }
}

/// The closing summary's fields.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
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
    pub kills: BTreeMap<Name, BTreeMap<Name, u64>>,
}

/// A live process in the closing summary.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
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

/// How the event stream checked out against the kernel's own counters.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Delivery {
    /// Records the kernel produced (its sequence numbers used).
    pub kernel_events: u64,
    /// Records received.
    pub received: u64,
    /// The ring's bytes this run's received records took (each with its 8-byte header, as
    /// the ring lays them out): what a run asks of `--ring-size`.
    pub received_bytes: u64,
    /// Records the kernel could not reserve, by kind.
    pub dropped: BTreeMap<Name, u64>,
    /// Children not followed because the tracked map was full.
    pub tracked_full: u64,
    /// `kernel_events == received + dropped`: nothing vanished unaccounted for.
    pub consistent: bool,
    /// Followers of the API's event stream (`/v1/events?follow`) dropped because they did
    /// not keep up; the stream itself lost nothing for them.
    pub followers_dropped: u64,
}

/// From an event in the kernel to the end of the batch that applied it to the graph.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Latency {
    /// Events measured.
    pub count: u64,
    pub p50: u64,
    pub p99: u64,
    pub max: u64,
}

impl Readable for StopCommand {
    fn readable(&self, _: u64) -> String {
        let StopCommand {
            pid,
            signal,
            because,
        } = self;
        format!("stop     the command {pid} with {signal}: the run ended ({because})")
    }
}

impl Readable for Note {
    fn readable(&self, _: u64) -> String {
        format!("note     {}", escape_for_terminal(self.text.as_bytes()))
    }
}

impl Readable for Gateway {
    fn readable(&self, _: u64) -> String {
        format!(
            "gateway  {} ({}) by {}: {}",
            self.pid,
            self.comm.for_terminal(),
            escape_for_terminal(self.selector.as_bytes()),
            self.argv.for_terminal()
        )
    }
}

impl Readable for Ready {
    fn readable(&self, _: u64) -> String {
        let gws: Vec<String> = self.gateway.iter().map(u32::to_string).collect();
        let gws = match gws.is_empty() {
            true => "no gateway yet (waiting for the selectors)".to_owned(),
            false => format!("gateway {}", gws.join(", ")),
        };
        let resumed = match &self.resumed {
            None => String::new(),
            Some(r) => resumed_text(r),
        };
        format!(
            "ready    tracing {gws} (tracked now: {}; setsid seen by {}; kernel {}){resumed}",
            self.tracked, self.setsid_hook, self.kernel
        )
    }
}

impl Readable for Lost {
    fn readable(&self, _: u64) -> String {
        let kinds: Vec<String> = self.kinds.iter().map(|(k, n)| format!("{k} {n}")).collect();
        let pids: Vec<String> = self.affected.iter().map(u32::to_string).collect();
        format!(
            "LOST     {} records ({}); re-read from /proc: {}",
            self.count,
            kinds.join(", "),
            match pids.is_empty() {
                true => "nothing affected".into(),
                false => pids.join(", "),
            }
        )
    }
}

impl Readable for Summary {
    fn readable(&self, _: u64) -> String {
        let Summary {
            counts,
            delivery,
            alive,
            zombies,
            ..
        } = self;
        format!(
            "summary  {} forks, {} execs, {} exits; {} alive, {} zombies; {} of {} kernel records received, {} dropped{}",
            counts.get(Lifecycle::Fork),
            counts.get(Lifecycle::Exec),
            counts.get(Lifecycle::Exit),
            alive.len(),
            zombies.len(),
            delivery.received,
            delivery.kernel_events,
            delivery.dropped.values().sum::<u64>(),
            match delivery.consistent {
                true => "",
                false => " (INCONSISTENT)",
            }
        )
    }
}

/// What a run took back from `--state-dir`, for the `ready` line.
fn resumed_text(r: &Resumed) -> String {
    let gap = r.gap_ns as f64 / 1e9;
    let how = match r.kernel_kept {
        true => "its events follow from the kept ring (negative times)".to_owned(),
        false => format!(
            "the kernel side was not kept: {} gone, read from /proc",
            r.gone
        ),
    };
    let unsaved = match r.unsaved {
        0 => String::new(),
        n => format!(
            "; the run before was killed after taking {n} records it did not save: re-read \
             from /proc"
        ),
    };
    format!(
        "; resumed {} processes from {} after a {gap:.1}s gap: {how}{unsaved}",
        r.adopted, r.state_dir
    )
}
