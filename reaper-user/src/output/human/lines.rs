//! Each kind of event's readable line: one [`Readable`] for each struct of the stream, so the
//! table of event kinds (`stream/events.rs`) cannot gain a kind without one.
use super::{check_lines, flag_line, thread_text};
use crate::stream::events::{
    Check, Cleared, Exec, Exit, Flag, Fork, Gateway, Kill, Lifecycle, Lost, Note, Ready, Reaped,
    Reparent, Resumed, Setsid, Snapshot, StopCommand, Summary,
};
use crate::stream::kinds::Readable;
use crate::text::escape_for_terminal;

impl Readable for Flag {
    fn readable(&self, ts: u64) -> String {
        flag_line(ts, self.pid, self.reason, self.since, &self.detail)
    }
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

impl Readable for StopCommand {
    fn readable(&self, _: u64) -> String {
        let StopCommand {
            pid,
            signal,
            because,
        } = self;
        format!("stop     the command {pid} with {signal}: the run ended ({because})")
    }
}

impl Readable for Note {
    fn readable(&self, _: u64) -> String {
        format!("note     {}", escape_for_terminal(self.text.as_bytes()))
    }
}

impl Readable for Snapshot {
    fn readable(&self, _: u64) -> String {
        format!(
            "found    {} ({}) parent {}: {}",
            self.pid,
            self.comm.for_terminal(),
            self.ppid,
            self.argv.for_terminal()
        )
    }
}

impl Readable for Gateway {
    fn readable(&self, _: u64) -> String {
        format!(
            "gateway  {} ({}) by {}: {}",
            self.pid,
            self.comm.for_terminal(),
            escape_for_terminal(self.selector.as_bytes()),
            self.argv.for_terminal()
        )
    }
}

impl Readable for Ready {
    fn readable(&self, _: u64) -> String {
        let gws: Vec<String> = self.gateway.iter().map(u32::to_string).collect();
        let gws = match gws.is_empty() {
            true => "no gateway yet (waiting for the selectors)".to_owned(),
            false => format!("gateway {}", gws.join(", ")),
        };
        let resumed = match &self.resumed {
            None => String::new(),
            Some(r) => resumed_text(r),
        };
        format!(
            "ready    tracing {gws} (tracked now: {}; setsid seen by {}; kernel {}){resumed}",
            self.tracked, self.setsid_hook, self.kernel
        )
    }
}

/// What a run took back from `--state-dir`, for the `ready` line.
fn resumed_text(r: &Resumed) -> String {
    let gap = r.gap_ns as f64 / 1e9;
    let how = match r.kernel_kept {
        true => "its events follow from the kept ring (negative times)".to_owned(),
        false => format!(
            "the kernel side was not kept: {} gone, read from /proc",
            r.gone
        ),
    };
    let unsaved = match r.unsaved {
        0 => String::new(),
        n => format!(
            "; the run before was killed after taking {n} records it did not save: re-read \
             from /proc"
        ),
    };
    format!(
        "; resumed {} processes from {} after a {gap:.1}s gap: {how}{unsaved}",
        r.adopted, r.state_dir
    )
}

impl Readable for Fork {
    fn readable(&self, _: u64) -> String {
        let parent = match self.ppid == self.spawner {
            true => String::new(),
            false => format!(" (parent {})", self.ppid),
        };
        let note = match self.untracked {
            true => "; NOT FOLLOWED: tracked map full",
            false => "",
        };
        format!(
            "fork     {} ({}) by {}{}{parent}{note}",
            self.pid,
            self.comm.for_terminal(),
            self.spawner,
            thread_text(self.thread.as_ref())
        )
    }
}

impl Readable for Exec {
    fn readable(&self, _: u64) -> String {
        format!(
            "exec     {} {}: {}{}",
            self.pid,
            self.filename.for_terminal(),
            self.argv.for_terminal(),
            if self.truncated { " [truncated]" } else { "" }
        )
    }
}

impl Readable for Exit {
    fn readable(&self, _: u64) -> String {
        let pid = self.pid;
        match (self.exit_code, &self.signal) {
            (Some(code), _) => format!("exit     {pid} code {code}"),
            (None, Some(sig)) => format!(
                "exit     {pid} killed by {sig}{}",
                if self.core { " (core dumped)" } else { "" }
            ),
            (None, None) => format!("exit     {pid}"),
        }
    }
}

impl Readable for Reaped {
    fn readable(&self, _: u64) -> String {
        match self.from_proc {
            false => format!("reaped   {}", self.pid),
            true => format!("reaped   {} (gone from /proc)", self.pid),
        }
    }
}

impl Readable for Setsid {
    fn readable(&self, _: u64) -> String {
        format!("setsid   {} now leads session {}", self.pid, self.sid)
    }
}

impl Readable for Reparent {
    fn readable(&self, _: u64) -> String {
        format!(
            "reparent {} parent {} exited; new parent {}",
            self.pid, self.old_ppid, self.new_ppid
        )
    }
}

impl Readable for Lost {
    fn readable(&self, _: u64) -> String {
        let kinds: Vec<String> = self.kinds.iter().map(|(k, n)| format!("{k} {n}")).collect();
        let pids: Vec<String> = self.affected.iter().map(u32::to_string).collect();
        format!(
            "LOST     {} records ({}); re-read from /proc: {}",
            self.count,
            kinds.join(", "),
            match pids.is_empty() {
                true => "nothing affected".into(),
                false => pids.join(", "),
            }
        )
    }
}

impl Readable for Summary {
    fn readable(&self, _: u64) -> String {
        let Summary {
            counts,
            delivery,
            alive,
            zombies,
            ..
        } = self;
        format!(
            "summary  {} forks, {} execs, {} exits; {} alive, {} zombies; {} of {} kernel records received, {} dropped{}",
            counts.get(Lifecycle::Fork),
            counts.get(Lifecycle::Exec),
            counts.get(Lifecycle::Exit),
            alive.len(),
            zombies.len(),
            delivery.received,
            delivery.kernel_events,
            delivery.dropped.values().sum::<u64>(),
            match delivery.consistent {
                true => "",
                false => " (INCONSISTENT)",
            }
        )
    }
}
