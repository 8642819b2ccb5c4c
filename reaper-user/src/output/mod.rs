//! Where events go: NDJSON for tools, one readable line per event for people.
pub mod events;
pub mod logfile;
pub mod metrics;
pub mod serve;
pub mod status;
pub mod tree;

use std::io::{self, Write};

use anyhow::{Context, Result};

use crate::leaks::flags as leaks;
use crate::output::events::{Counts, Envelope, Event, wait_status};
use crate::output::metrics::Metrics;
use crate::output::status::StatusLine;

/// Writes the event stream. NDJSON goes to each of `json` (stdout with `--json`, the file of
/// `--output`); readable lines go to `human` (stdout by default, stderr with `--json`). Every
/// event is also counted in the metrics.
pub struct Output {
    json: Vec<Box<dyn Write + Send>>,
    human: Option<Box<dyn Write + Send>>,
    pub metrics: Metrics,
    /// The lifecycle events written so far, for the summary.
    pub counts: Counts,
    status: Option<StatusLine>,
    seq: u64,
    /// Boot-time ns at start, for relative times in human lines.
    t0: u64,
    /// One NDJSON line is built here, then written at once: serialising straight into the
    /// boxed writer costs a dynamic call per token.
    line: Vec<u8>,
}

impl Output {
    pub fn new(
        json: Vec<Box<dyn Write + Send>>,
        human: Option<Box<dyn Write + Send>>,
        t0: u64,
    ) -> Self {
        Output {
            json,
            human,
            metrics: Metrics::new(),
            counts: Counts::default(),
            status: None,
            seq: 0,
            t0,
            line: Vec::with_capacity(1024),
        }
    }

    /// Emits one event stamped `ts`.
    pub fn event(&mut self, ts: u64, body: &Event) -> Result<()> {
        self.metrics.observe(body);
        self.counts.observe(body);
        if !self.json.is_empty() {
            let env = Envelope {
                event: body.name(),
                seq: self.seq,
                ts,
                body,
            };
            self.line.clear();
            serde_json::to_writer(&mut self.line, &env).context("serialising an NDJSON event")?;
            self.line.push(b'\n');
            for w in &mut self.json {
                w.write_all(&self.line).context("writing an NDJSON event")?;
            }
        }
        self.seq += 1;
        if let Some(w) = self.human.as_mut() {
            if let Some(s) = self.status.as_mut() {
                s.clear();
            }
            let rel = ts.saturating_sub(self.t0) as f64 / 1e9;
            writeln!(w, "[{rel:>9.3}s] {}", human_line(ts, body)).context("writing output")?;
        }
        Ok(())
    }

    /// Shows the live status line (see [`StatusLine`]).
    pub fn set_status(&mut self, status: Option<StatusLine>) {
        self.status = status;
    }

    /// Redraws the status line, if there is one, after the lines written so far.
    pub fn draw_status(&mut self) -> io::Result<()> {
        if self.status.is_some() {
            self.flush()?;
        }
        let counts = self.metrics.status();
        if let Some(s) = self.status.as_mut() {
            s.draw(counts);
        }
        Ok(())
    }

    /// Removes the status line for good (at the end of the run).
    pub fn end_status(&mut self) {
        if let Some(mut s) = self.status.take() {
            s.clear();
        }
    }

    /// Starts the clock of the relative times in readable lines.
    pub fn set_t0(&mut self, t0: u64) {
        self.t0 = t0;
    }

    /// Writes a block of text for people only (the closing tree).
    pub fn human_block(&mut self, text: &str) -> Result<()> {
        if let Some(s) = self.status.as_mut() {
            s.clear();
        }
        if let Some(w) = self.human.as_mut() {
            w.write_all(text.as_bytes()).context("writing output")?;
        }
        Ok(())
    }

    /// Flushes both outlets (after every batch of events, so a reader sees them at once).
    pub fn flush(&mut self) -> io::Result<()> {
        for w in &mut self.json {
            w.flush()?;
        }
        if let Some(w) = self.human.as_mut() {
            w.flush()?;
        }
        Ok(())
    }
}

/// One line a person reads. Every string that came from a process is escaped.
pub fn human_line(ts: u64, ev: &Event) -> String {
    match ev {
        Event::Flag {
            pid,
            reason,
            since,
            detail,
            ..
        } => leaks::flag_line(ts, *pid, reason, *since, detail),
        Event::Cleared {
            pid,
            reason,
            because,
        } => format!("cleared  {reason} pid {pid}: {because}"),
        Event::Kill {
            pid,
            comm,
            reason,
            signal,
            result,
            secs,
        } => {
            let who = format!("KILL {reason} pid {pid} ({})", comm.for_terminal());
            match secs {
                Some(s) => format!("{who}: {signal} {result} after {s:.1}s"),
                None => format!("{who}: {signal} {result}"),
            }
        }
        Event::Check {
            verdict,
            gateway_exit_code,
            leaked,
        } => leaks::check_lines(verdict, *gateway_exit_code, leaked),
        Event::Snapshot {
            pid,
            ppid,
            comm,
            argv,
            ..
        } => format!(
            "found    {pid} ({}) parent {ppid}: {}",
            comm.for_terminal(),
            argv.for_terminal()
        ),
        Event::Ready {
            gateway,
            tracked,
            setsid_hook,
            kernel,
        } => {
            let gws: Vec<String> = gateway.iter().map(u32::to_string).collect();
            format!(
                "ready    tracing gateway {} (tracked now: {tracked}; setsid seen by \
                 {setsid_hook}; kernel {kernel})",
                gws.join(", ")
            )
        }
        Event::Fork {
            pid,
            ppid,
            spawner,
            comm,
            untracked,
            ..
        } => {
            let parent = if ppid == spawner {
                String::new()
            } else {
                format!(" (parent {ppid})")
            };
            let note = if *untracked {
                "; NOT FOLLOWED: tracked map full"
            } else {
                ""
            };
            format!(
                "fork     {pid} ({}) by {spawner}{parent}{note}",
                comm.for_terminal()
            )
        }
        Event::Exec {
            pid,
            filename,
            argv,
            truncated,
            ..
        } => format!(
            "exec     {pid} {}: {}{}",
            filename.for_terminal(),
            argv.for_terminal(),
            if *truncated { " [truncated]" } else { "" }
        ),
        Event::Exit {
            pid,
            exit_code,
            signal,
            core,
        } => match (exit_code, signal) {
            (Some(code), _) => format!("exit     {pid} code {code}"),
            (None, Some(sig)) => {
                format!(
                    "exit     {pid} killed by {sig}{}",
                    if *core { " (core dumped)" } else { "" }
                )
            }
            (None, None) => format!("exit     {pid}"),
        },
        Event::Reaped {
            pid,
            from_proc: false,
        } => format!("reaped   {pid}"),
        Event::Reaped {
            pid,
            from_proc: true,
        } => format!("reaped   {pid} (gone from /proc)"),
        Event::Setsid { pid, sid } => format!("setsid   {pid} now leads session {sid}"),
        Event::Reparent {
            pid,
            old_ppid,
            new_ppid,
        } => {
            format!("reparent {pid} parent {old_ppid} exited; new parent {new_ppid}")
        }
        Event::Lost {
            count,
            kinds,
            affected,
        } => {
            let kinds: Vec<String> = kinds.iter().map(|(k, n)| format!("{k} {n}")).collect();
            let pids: Vec<String> = affected.iter().map(u32::to_string).collect();
            format!(
                "LOST     {count} records ({}); re-read from /proc: {}",
                kinds.join(", "),
                if pids.is_empty() {
                    "nothing affected".into()
                } else {
                    pids.join(", ")
                }
            )
        }
        Event::Summary {
            counts,
            delivery,
            alive,
            zombies,
            ..
        } => format!(
            "summary  {} forks, {} execs, {} exits; {} alive, {} zombies; {} of {} kernel records received, {} dropped{}",
            counts.fork,
            counts.exec,
            counts.exit,
            alive.len(),
            zombies.len(),
            delivery.received,
            delivery.kernel_events,
            delivery.dropped.values().sum::<u64>(),
            if delivery.consistent {
                ""
            } else {
                " (INCONSISTENT)"
            }
        ),
    }
}

/// Exit status in words, for the tree.
pub fn describe_status(status: Option<u32>) -> String {
    let Some(status) = status else {
        return "exited, status unknown".into();
    };
    match wait_status(status) {
        (Some(code), _, _) => format!("exited {code}"),
        (None, Some(sig), core) => format!("killed by {sig}{}", if core { ", core" } else { "" }),
        _ => "exited".into(),
    }
}

#[cfg(test)]
mod tests {
    use std::rc::Rc;

    use super::*;
    use crate::output::events::{Argv, ProcText};

    #[test]
    fn human_lines_escape_the_exact_bytes() {
        let line = human_line(
            0,
            &Event::Exec {
                pid: 7,
                filename: ProcText::new("filename", &b"/bin/\xff\x1b[31m"[..]),
                argv: Argv::new(Rc::from(vec![b"a\nb".to_vec(), b"\xfe".to_vec()])),
                truncated: false,
                tid: 7,
            },
        );
        assert_eq!(line, "exec     7 /bin/\\xff\\x1b[31m: a\\x0ab \\xfe");
    }
}
