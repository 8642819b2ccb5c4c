//! The findings: a leak flag raised and cleared, a kill step, and `--check`'s verdict.
use serde::{Deserialize, Serialize};

use super::{LeakDetail, Name, ProcText};
use crate::leaks::Reason;

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
