//! Folding for people: one scan's `accumulating` findings of one kind under one gateway make
//! one readable line, not one per instance (27 older instances, one line). The NDJSON stream
//! keeps one event per instance.
use super::human_line;
use crate::leaks::rules::Rules;
use crate::stream::events::{Cleared, Event, Flag};
use crate::stream::words::human_rss;
use crate::text::escape_for_terminal;

/// The readable lines of a batch of findings (one scan's): the `accumulating` flags of one
/// kind under one gateway fold into one line, and so do their `cleared` events with one cause,
/// so 27 older instances make one line, not 27. Every other event is its own line.
pub fn human_lines(ts: u64, events: &[&Event]) -> Vec<String> {
    let mut lines = Vec::new();
    let mut i = 0;
    while i < events.len() {
        let run = events[i..]
            .iter()
            .take_while(|e| same_fold(events[i], e))
            .count();
        lines.push(match run {
            0 => human_line(ts, events[i]),
            n => folded_line(&events[i..i + n]),
        });
        i += run.max(1);
    }
    lines
}

/// What an `accumulating` finding folds by: (flag or cleared, gateway, pattern or cause).
fn fold_key(ev: &Event) -> Option<(bool, u32, &str)> {
    match ev {
        Event::Flag(Flag { reason, detail, .. }) if reason.counts_a_kind() => Some((
            true,
            detail.lineage.first().copied().unwrap_or(0),
            detail.kind.as_ref().map_or("", |k| k.pattern.as_str()),
        )),
        Event::Cleared(Cleared {
            reason, because, ..
        }) if reason.counts_a_kind() => Some((false, 0, because)),
        _ => None,
    }
}

fn same_fold(first: &Event, ev: &Event) -> bool {
    fold_key(first).is_some() && fold_key(first) == fold_key(ev)
}

/// One line for a run of `accumulating` findings with one [`fold_key`], named by their rule as
/// every other line is.
fn folded_line(run: &[&Event]) -> String {
    /// Pids listed in one line; the rest are counted.
    const SHOWN: usize = 20;
    let pids: Vec<u32> = run
        .iter()
        .map(|e| match e {
            Event::Flag(Flag { pid, .. }) | Event::Cleared(Cleared { pid, .. }) => *pid,
            _ => 0,
        })
        .collect();
    let mut list: Vec<String> = pids.iter().take(SHOWN).map(u32::to_string).collect();
    if pids.len() > SHOWN {
        list.push(format!("and {} more", pids.len() - SHOWN));
    }
    let list = list.join(", ");
    let older = match pids.len() {
        1 => "1 older instance".to_owned(),
        n => format!("{n} older instances"),
    };
    match run[0] {
        Event::Flag(Flag { reason, detail, .. }) => {
            let rss: u64 = run
                .iter()
                .filter_map(|e| match e {
                    Event::Flag(Flag { detail, .. }) => detail.rss_kib,
                    _ => None,
                })
                .sum();
            let pattern = detail.kind.as_ref().map_or("", |k| k.pattern.as_str());
            format!(
                "{} {older} of `{}` under gateway {} ({} alive, older ones {}): {list}",
                reason.name().to_uppercase(),
                escape_for_terminal(pattern.as_bytes()),
                detail.lineage.first().copied().unwrap_or(0),
                detail.instances.unwrap_or(0),
                human_rss(rss),
            )
        }
        Event::Cleared(Cleared {
            reason, because, ..
        }) => format!("cleared  {} pid {list}: {because}", reason.name()),
        other => human_line(0, other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::leaks::Reason;
    use crate::stream::events::{
        Ancestor, Argv, Cleared, Exit, Flag, LeakDetail, ProcText, ProcessLabel,
    };
    use crate::text::{Args, Comm};

    fn detail(gateway: u32) -> LeakDetail {
        LeakDetail {
            lineage: vec![gateway],
            ancestors: vec![Ancestor {
                process: ProcessLabel {
                    pid: gateway,
                    comm: ProcText::new("comm", Comm::from_c(b"x")),
                    argv: Argv::new(Args::from_list(["gw"])),
                },
                exited: None,
            }],
            ..LeakDetail::default()
        }
    }

    #[test]
    fn the_older_instances_of_one_kind_fold_into_one_line() {
        let flag = |pid: u32, rss: u64| {
            let mut d = detail(11745);
            d.kind = Some(crate::stream::evidence::KindEvidence {
                exe: "/usr/bin/stdio-mcp-binary".into(),
                pattern: "stdio-mcp-binary serve".into(),
            });
            d.instances = Some(28);
            d.newest = Some(9);
            d.rss_kib = Some(rss);
            Event::Flag(Flag {
                pid,
                reason: Reason::Accumulating,
                since: 0,
                idle_secs: None,
                detail: Box::new(d),
            })
        };
        let exit = Event::Exit(Exit {
            pid: 5,
            exit_code: Some(0),
            signal: None,
            core: false,
        });
        let (a, b, c) = (flag(4262, 1024), flag(16169, 2048), flag(7, 0));
        let lines = human_lines(0, &[&a, &b, &exit, &c]);
        assert_eq!(
            lines,
            [
                "ACCUMULATING 2 older instances of `stdio-mcp-binary serve` under gateway 11745 \
                 (28 alive, older ones 3.0 MiB): 4262, 16169",
                "exit     5 code 0",
                "ACCUMULATING 1 older instance of `stdio-mcp-binary serve` under gateway 11745 \
                 (28 alive, older ones 0 KiB): 7",
            ]
        );
        let cleared = |pid| {
            Event::Cleared(Cleared {
                pid,
                reason: Reason::Accumulating,
                because: "exited".into(),
            })
        };
        let (x, y) = (cleared(1), cleared(2));
        assert_eq!(
            human_lines(0, &[&x, &y]),
            ["cleared  accumulating pid 1, 2: exited"]
        );
    }
}
