//! The live one-line status on a terminal: tracked processes, events/s, flags now, lost,
//! elapsed. Drawn on stderr in place (carriage return + erase line), wiped before any other
//! line is written so the two never mix.
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use crate::output::metrics::StatusCounts;
use crate::stream::words::human_duration;

pub struct StatusLine {
    /// Standard error (an [`Outlet`](super::outlet::Outlet) handle: never the reader's wait).
    stderr: Box<dyn Write + Send>,
    shown: bool,
    started: Instant,
    /// Events counted at the last draw, and when.
    last: Option<(Instant, u64)>,
}

impl StatusLine {
    /// A status line written to `stderr` when standard error is a terminal and it is wanted.
    pub fn for_stderr(wanted: bool, stderr: Box<dyn Write + Send>) -> Option<StatusLine> {
        (wanted && std::io::stderr().is_terminal()).then(|| StatusLine {
            stderr,
            shown: false,
            started: Instant::now(),
            last: None,
        })
    }

    /// Wipes the line (before other output reaches the terminal).
    pub fn clear(&mut self) {
        if self.shown {
            let _ = self
                .stderr
                .write_all(b"\r\x1b[K")
                .and_then(|()| self.stderr.flush());
            self.shown = false;
        }
    }

    /// Redraws the line with `counts`.
    pub fn draw(&mut self, counts: StatusCounts) {
        let now = Instant::now();
        let rate = match self.last {
            Some((at, events)) if now > at => {
                counts.events.saturating_sub(events) as f64 / (now - at).as_secs_f64()
            }
            _ => 0.0,
        };
        self.last = Some((now, counts.events));
        let text = status_text(counts, rate, now - self.started);
        let line = format!("\r\x1b[K{text}");
        let _ = self
            .stderr
            .write_all(line.as_bytes())
            .and_then(|()| self.stderr.flush());
        self.shown = true;
    }
}

/// `reaper: 12 tracked · 340 events/s · 2 flagged · 0 lost · 1m 23s`.
pub fn status_text(c: StatusCounts, events_per_sec: f64, elapsed: Duration) -> String {
    format!(
        "reaper: {} tracked · {:.0} events/s · {} flagged · {} lost · {}",
        c.alive,
        events_per_sec,
        c.flagged,
        c.lost,
        human_duration(elapsed.as_nanos() as u64)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_reads_in_one_line() {
        let c = StatusCounts {
            alive: 12,
            events: 999,
            flagged: 2,
            lost: 0,
        };
        let s = status_text(c, 340.4, Duration::from_secs(83));
        assert!(
            s.starts_with("reaper: 12 tracked · 340 events/s · 2 flagged · 0 lost · "),
            "{s}"
        );
        assert!(!s.contains('\n'));
    }
}
