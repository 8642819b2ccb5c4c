//! A flag's readable line: who, why in its rule's words, then its evidence in the words every
//! readable text shares (`stream::readable`). The stream's [`Flag`] names its reason; what the
//! reason says is its rule's, so the flag's [`Readable`] is here, above the stream, and the
//! table of event kinds still requires it (a missing one does not compile).
use super::{Reason, Rules, Why};
use crate::stream::events::{Flag, LeakDetail};
use crate::stream::evidence::ESCAPED_MEANING;
use crate::stream::kinds::Readable;
use crate::stream::readable::evidence_text;
use crate::stream::words::who;

impl Readable for Flag {
    fn readable(&self, ts: u64) -> String {
        flag_line(ts, self.pid, self.reason, self.since, &self.detail)
    }
}

/// One line a person can act on, for a flag raised at `ts`.
pub fn flag_line(ts: u64, pid: u32, reason: Reason, since: u64, detail: &LeakDetail) -> String {
    let me = who(pid, &detail.comm, &detail.argv);
    let why = reason.why(&Why { ts, since, detail });
    let mut line = format!("LEAK {reason} pid {me}: {why}");
    let spawner = detail.lineage.iter().rev().nth(1).copied();
    if reason != Reason::Zombie && spawner.is_some_and(|s| s != detail.ppid) {
        line.push_str(&format!(", now a child of {}", detail.ppid));
    }
    if detail.escaped {
        line.push_str(&format!(", escaped ({ESCAPED_MEANING})"));
    }
    evidence_text(&mut line, detail);
    line
}
