//! `why PID --from AUDIT` and `tree --from AUDIT`: the same questions as of a running audit,
//! asked of an audit file read back (see [`crate::replay`]), and said the same way.
use std::path::PathBuf;

use anyhow::Result;

use super::{TreeCli, WhyCli, nothing_alive, readable_with, tree_filter};
use crate::output::tree::render;
use crate::replay::{self, At};

/// Ask an audit file instead of a running audit.
#[derive(Debug, clap::Args)]
pub struct ReplayArgs {
    /// Read the audit (the NDJSON of `--json` or `--output`) back and answer as the running
    /// audit would have: one file, or a rotated set oldest first, `--from` each
    /// (`--from audit.ndjson.1 --from audit.ndjson`).
    #[arg(long, value_name = "AUDIT", conflicts_with = "api")]
    pub from: Vec<PathBuf>,
    /// With `--from`: the moment to answer at: a wall-clock time in UTC
    /// (`2026-11-29T14:02:00Z`), a time into the audit (`+90s`, `+1h 30m`), or the stream's
    /// boot-time ns (a line's `ts`, an answer's `now`). Default: the audit's end (`why`: each
    /// process that had the pid, at its exit).
    #[arg(long, value_name = "TIME", requires = "from")]
    pub at: Option<At>,
}

/// `why --from`: the audit read back (see [`crate::replay`]).
pub(super) fn why_from(cli: &WhyCli) -> Result<(String, i32)> {
    let audit = audit_name(&cli.replay.from);
    let answers = replay::why(&cli.replay.from, cli.pid, cli.replay.at)?;
    if answers.is_empty() {
        let until = match cli.replay.at {
            Some(_) => " up to that moment",
            None => "",
        };
        let none = format!(
            "pid {}: not a descendant of any gateway traced in {audit}{until}",
            cli.pid
        );
        return Ok((none, 1));
    }
    if cli.json {
        let lines: Vec<String> = answers
            .iter()
            .map(|a| serde_json::to_string(&a.answer))
            .collect::<serde_json::Result<_>>()?;
        return Ok((lines.join("\n"), 0));
    }
    let mut text = match answers.len() {
        1 => String::new(),
        n => format!(
            "pid {} was {n} processes in {audit}, oldest first; each as at its exit or the \
             audit's end:\n\n",
            cli.pid
        ),
    };
    let blocks: Vec<String> = answers
        .iter()
        .map(|a| {
            format!(
                "as at {} (read back from {audit}):\n{}",
                a.moment(),
                readable_with(&a.answer, &format!("--kill: {}", a.answer.kill.why))
            )
        })
        .collect();
    text.push_str(&blocks.join("\n\n"));
    Ok((text, 0))
}

/// The audit as messages name it: its newest file.
fn audit_name(inputs: &[PathBuf]) -> String {
    inputs
        .last()
        .map(|p| p.display().to_string())
        .unwrap_or_default()
}

/// `tree --from`: the audit read back (see [`crate::replay`]).
pub(super) fn tree_from(cli: &TreeCli) -> Result<(String, i32)> {
    let audit = audit_name(&cli.replay.from);
    let filter = tree_filter(cli);
    let replayed = replay::tree(&cli.replay.from, &filter, cli.replay.at)?;
    let moment = replayed.moment();
    let Some(roots) = replayed.answer else {
        let pid = cli.gateway.unwrap_or_default();
        return Ok((
            format!("pid {pid} is not tracked in {audit} at {moment}"),
            1,
        ));
    };
    if cli.json {
        let key = serde_json::to_string(&audit)?;
        return Ok((format!("{{{key}:{}}}", serde_json::to_string(&roots)?), 0));
    }
    let title = format!("alive at {moment} (read back from {audit}), by lineage (spawner edges):");
    let text = render(&roots, &title, nothing_alive(&filter));
    Ok((text.trim_end().to_owned(), 0))
}
