//! The leak tests' helpers: a leak shape held until its flags arrived, and the flags and
//! clearings a run holds.
use serde_json::Value;

use crate::*;

/// The options the `leak-accumulate` shape is judged under: three instances of a kind
/// allowed (its six session servers are three too many), looked at every 250 ms.
pub const ACCUMULATING: [&str; 6] = [
    "--max-instances",
    "3",
    "--idle-after",
    "2s",
    "--scan-interval",
    "250ms",
];

/// Runs a leak shape that holds its leak until `n` flags of `reason` arrived, unless the test
/// must be skipped.
pub fn run_leak(
    test: &str,
    opts: &[&str],
    shape: &str,
    (n, reason): (usize, &str),
) -> Option<(Run, Value)> {
    if !require_root(test) {
        return None;
    }
    let what = format!("{n} {reason} flags");
    Some(run_shape_until(
        opts,
        shape,
        &[],
        (&what, Then::Release),
        |events| flags_for(events, reason) >= n,
    ))
}

/// How many flags of `reason` the stream holds so far.
pub fn flags_for(events: &[Value], reason: &str) -> usize {
    events
        .iter()
        .filter(|e| e["event"] == "flag" && e["reason"] == reason)
        .count()
}

/// The one flag of `reason` about `pid`.
pub fn flag<'a>(run: &'a Run, pid: u64, reason: &str) -> &'a Value {
    let found: Vec<&Value> = run
        .flags_of(pid)
        .into_iter()
        .filter(|f| f["reason"] == reason)
        .collect();
    assert_eq!(
        found.len(),
        1,
        "one {reason} flag for {pid}; flags: {:?}\n{}",
        run.all("flag"),
        run.stderr
    );
    found[0]
}

pub fn cleared(run: &Run, pid: u64, reason: &str) -> Value {
    let found: Vec<&Value> = run
        .all("cleared")
        .into_iter()
        .filter(|c| c["pid"].as_u64() == Some(pid) && c["reason"] == reason)
        .collect();
    assert_eq!(
        found.len(),
        1,
        "one {reason} cleared for {pid}: {:?}",
        run.all("cleared")
    );
    found[0].clone()
}

/// The pids in a truth list.
pub fn pids(v: &Value) -> Vec<u64> {
    v.as_array().unwrap().iter().map(pid).collect()
}
