//! `k`'s lines at the foot of `top`: the confirmation a dry run's answer gives (the question
//! first, then the processes it would signal) and what a kill did, each on one line.
use std::time::{Duration, Instant};

use crate::api::{KillAnswer, KillStep};
use crate::text::escape_for_terminal;

/// A kill named on the confirmation line, waiting for `y`: exactly the processes named, for
/// [`CONFIRM_FOR`] from when they were.
pub(super) struct Confirm {
    pub(super) pids: Vec<u32>,
    pub(super) named: Instant,
}

/// How long a confirmation line holds: past it, a `y` sends nothing (the pids it named may be
/// other processes by then).
pub(super) const CONFIRM_FOR: Duration = Duration::from_secs(10);

/// The processes a confirmation line names, at most; the rest are counted.
const NAMED: usize = 8;

/// The confirmation line for a dry run's `answer`, the question first (a long list is cut
/// at the foot's end), and the pids it names; none when it would signal nothing.
pub(super) fn confirmation(answer: &KillAnswer) -> Option<(Vec<u32>, String)> {
    let would: Vec<&KillStep> = (answer.steps.iter())
        .filter(|s| s.result == "dry_run")
        .collect();
    if would.is_empty() {
        return None;
    }
    let mut names: Vec<String> = (would.iter().take(NAMED))
        .map(|s| format!("{} ({})", s.pid, escape_for_terminal(s.comm.as_bytes())))
        .collect();
    if would.len() > NAMED {
        names.push(format!("+{} more", would.len() - NAMED));
    }
    let refused = answer.steps.len() - would.len();
    let also = match refused {
        0 => String::new(),
        n => format!(" ({n} not: see `reaper-trace kill --dry-run`)"),
    };
    let line = format!(
        "kill {} process{}{also}? y: SIGTERM now, SIGKILL after the run's --term-timeout; any other key: no. {}",
        would.len(),
        if would.len() == 1 { "" } else { "es" },
        names.join(", ")
    );
    Some((would.iter().map(|s| s.pid).collect(), line))
}

/// What a kill did, on one line: how many were signalled, had exited, and the others by pid
/// and why (the first few).
pub(super) fn outcome(answer: &KillAnswer) -> String {
    if let Some(why) = &answer.refused {
        return format!("nothing ended: {}", escape_for_terminal(why.as_bytes()));
    }
    if answer.steps.is_empty() {
        return "nothing to end: no live process picked".into();
    }
    let count = |r: &str| answer.steps.iter().filter(|s| s.result == r).count();
    let mut parts = Vec::new();
    for (result, said) in [
        (
            "signalled",
            "SIGTERM sent (SIGKILL after the run's --term-timeout)",
        ),
        ("dry_run", "would be signalled (the run is a dry run)"),
        ("exited", "had exited"),
    ] {
        match count(result) {
            0 => {}
            n => parts.push(format!("{n} {said}")),
        }
    }
    let not: Vec<String> = (answer.steps.iter())
        .filter(|s| !matches!(s.result.as_str(), "signalled" | "dry_run" | "exited"))
        .map(|s| format!("{} {}", s.pid, escape_for_terminal(s.result.as_bytes())))
        .collect();
    if !not.is_empty() {
        let more = match not.len() > NAMED {
            true => format!(", +{} more", not.len() - NAMED),
            false => String::new(),
        };
        parts.push(format!(
            "refused: {}{more}",
            not[..not.len().min(NAMED)].join(", ")
        ));
    }
    parts.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(steps: &[(u32, &str, &str)]) -> KillAnswer {
        KillAnswer {
            steps: (steps.iter())
                .map(|&(pid, comm, result)| KillStep {
                    pid,
                    comm: comm.into(),
                    result: result.into(),
                })
                .collect(),
            ..KillAnswer::default()
        }
    }

    #[test]
    fn a_confirmation_asks_first_names_what_it_will_signal_escaped_and_counts_the_rest() {
        let mut steps = vec![(10, "not\x1b[31mme", "not_in_lineage")];
        steps.extend((0..10).map(|i| (100 + i, "sleep\x1b[2J", "dry_run")));
        let (pids, line) = confirmation(&answer(&steps)).unwrap();
        assert_eq!(
            pids,
            (100..110).collect::<Vec<_>>(),
            "exactly those it would signal"
        );
        assert!(line.starts_with("kill 10 processes (1 not: "), "{line}");
        assert!(
            line.contains("100 (sleep\\x1b[2J)") && line.ends_with(", +2 more"),
            "{line}"
        );
        assert!(!line.contains('\x1b'), "{line}");
        assert_eq!(confirmation(&answer(&[(10, "sh", "not_tracked")])), None);
    }

    #[test]
    fn an_outcome_is_one_line_of_counts_and_the_refused_by_pid() {
        let done = answer(&[
            (1, "sleep", "signalled"),
            (2, "sleep", "signalled"),
            (3, "sh", "exited"),
            (4, "init", "not_in_lineage"),
        ]);
        assert_eq!(
            outcome(&done),
            "2 SIGTERM sent (SIGKILL after the run's --term-timeout); 1 had exited; \
             refused: 4 not_in_lineage"
        );
        let refused = KillAnswer {
            refused: Some("no session \x1b[2J".into()),
            ..KillAnswer::default()
        };
        assert_eq!(outcome(&refused), "nothing ended: no session \\x1b[2J");
    }
}
