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

/// A step of `--kill`'s sequence for one process.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Kill {
    pub pid: u32,
    #[serde(flatten)]
    pub comm: ProcText,
    pub reason: Reason,
    /// "SIGCONT", "SIGTERM" or "SIGKILL".
    pub signal: Name,
    /// "sent", "exited", "identity_changed", "not_in_lineage", "permission_denied" or
    /// "dry_run".
    pub result: Name,
    /// At the end of a sequence: seconds from the first signal to the exit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secs: Option<f64>,
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
            reason,
            signal,
            result,
            secs,
        } = self;
        let who = format!("KILL {reason} pid {pid} ({})", comm.for_terminal());
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
