//! The findings: a leak flag raised and cleared, a kill step, and `--check`'s verdict. A
//! flag's readable line is its rule's (`leaks::rules::line`).
use serde::{Deserialize, Serialize};

use super::{LeakDetail, Name, ProcText};
use crate::stream::kinds::Readable;
use crate::stream::readable::check_lines;
use crate::stream::reason::Reason;

/// A leak flag starts holding.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Flag {
    pub pid: u32,
    pub reason: Reason,
    /// Boot-time ns since when the condition holds.
    pub since: u64,
    /// For `idle`: seconds without I/O.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_secs: Option<f64>,
    #[serde(flatten)]
    pub detail: Box<LeakDetail>,
}

/// A leak flag stops holding.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Cleared {
    pub pid: u32,
    pub reason: Reason,
    pub because: Name,
}

/// A step of a kill sequence for one process: `--kill`'s, or one asked for through the API
/// (`reaper-trace kill`).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Kill {
    pub pid: u32,
    #[serde(flatten)]
    pub comm: ProcText,
    /// The flag it was killed for; absent for a kill asked for a process that holds none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<Reason>,
    /// "SIGCONT", "SIGTERM" or "SIGKILL".
    pub signal: Name,
    /// "sent", "exited", "identity_changed", "not_in_lineage", "permission_denied",
    /// "uncertain" or "dry_run".
    pub result: Name,
    /// At the end of a sequence: seconds from the first signal to the exit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secs: Option<f64>,
    /// Who asked for it through the API (its peer credentials); absent for `--kill`'s own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asked_by: Option<AskedBy>,
}

/// Who asked for a kill: the API client's user and process, as its socket's peer
/// credentials (`SO_PEERCRED`) give them. No default: a uid of 0 is never assumed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AskedBy {
    pub uid: u32,
    pub pid: u32,
}

impl Kill {
    /// Why it was killed, in a word: its flag's reason, or `asked`.
    pub fn cause(&self) -> &'static str {
        self.reason.map_or("asked", Reason::name)
    }
}

/// `--check`'s verdict, after the gateway command exited and the settle time passed.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Check {
    /// "clean", "leaked" or "gateway_failed".
    pub verdict: Name,
    pub gateway_exit_code: Option<i32>,
    /// Descendants still alive and zombies, with their evidence.
    pub leaked: Vec<LeakedProcess>,
}

/// A process `--check` found left behind.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct LeakedProcess {
    pub pid: u32,
    #[serde(flatten)]
    pub detail: LeakDetail,
}

impl Readable for Cleared {
    fn readable(&self, _: u64) -> String {
        format!(
            "cleared  {} pid {}: {}",
            self.reason, self.pid, self.because
        )
    }
}

impl Readable for Kill {
    fn readable(&self, _: u64) -> String {
        let Kill {
            pid,
            comm,
            signal,
            result,
            secs,
            asked_by,
            ..
        } = self;
        let cause = self.cause();
        let mut who = format!("KILL {cause} pid {pid} ({})", comm.for_terminal());
        if let Some(a) = asked_by {
            who.push_str(&format!(", asked by uid {} (pid {})", a.uid, a.pid));
        }
        match secs {
            Some(s) => format!("{who}: {signal} {result} after {s:.1}s"),
            None => format!("{who}: {signal} {result}"),
        }
    }
}

impl Readable for Check {
    fn readable(&self, _: u64) -> String {
        check_lines(&self.verdict, self.gateway_exit_code, &self.leaked)
    }
}
