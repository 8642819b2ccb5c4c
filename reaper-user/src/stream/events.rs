//! The public event stream: one JSON object per line (NDJSON), documented in docs/events.md.
//! Names and fields change only compatibly (new optional fields, new events).
//!
//! Each kind of event is one struct with its readable line (a [`Readable`], beside it in
//! `events/`) and one row of [`events!`] below (its variant, its wire name, whether it is a
//! lifecycle event or a finding). The same structs are written by [`crate::output`] and read back by
//! [`crate::report`]: the stream has one schema. Read back, every field has a default, so an
//! odd line (an older build's, a hand-written one) loses only what it lacks.
use std::borrow::Cow;

use serde::Serialize;

use super::reason::Reason;

pub use super::fields::{Argv, ProcText};
pub use super::kinds::{Counts, Kind, Lifecycle};
use super::kinds::{Readable, lifecycle, other};

pub use super::evidence::{
    Ancestor, ExecutableLeaks, KindEvidence, LeakDetail, LeakSummary, Peer, PipeInfo, ProcessLabel,
    SessionEvidence, SpawningThread,
};

mod findings;
mod process;
mod run;
pub use findings::{AskedBy, Check, Cleared, Flag, Kill, LeakedProcess};
pub use process::{Exec, Exit, Fork, Reaped, Reparent, Session, Setsid, Snapshot};
pub use run::{
    AliveProcess, Delivery, Gateway, Latency, Lost, Name, Note, Ready, Resumed, StopCommand,
    Summary,
};

/// One line of the stream: `seq` (position in this stream, from 0), `ts` (boot-time ns), the
/// `event` name, and the event's own fields.
pub struct Envelope<'a> {
    pub event: &'static str,
    pub seq: u64,
    pub ts: u64,
    pub body: &'a Event,
}

impl Envelope<'_> {
    /// Appends the line's JSON object (no newline) to `line`: the envelope's fields first
    /// (by hand), then the body's. A process's lifecycle events are written by hand too
    /// (`members.rs`);
    /// any other body is written by serde as the object it is and joined on (its opening
    /// brace becomes the comma): serde's `flatten` went through a map serializer for every
    /// field and was a third of the cost of each line in a fork storm.
    pub fn write_json(&self, line: &mut Vec<u8>) -> serde_json::Result<()> {
        self.open(line);
        if self.body.write_members(line) {
            return Ok(());
        }
        let body = line.len();
        serde_json::to_writer(&mut *line, self.body)?;
        // Every body is a struct (see `events!`), so its JSON is an object.
        debug_assert_eq!(line.get(body), Some(&b'{'), "an event's body is an object");
        if line[body..] == *b"{}" {
            line.truncate(body);
            line.push(b'}');
        } else {
            line[body] = b',';
        }
        Ok(())
    }
}

/// The version of the stream's schema (`schema/events.schema.json`), named by `ready`. It
/// goes up when a field's meaning changes (docs/events.md lists each version's changes);
/// added events and fields keep it.
pub const SCHEMA_VERSION: u32 = 2;

/// The table of event kinds: `Variant(Body) = kind row`. It makes [`Event`] (untagged on the
/// wire: a line is its envelope and its body's fields), [`KINDS`], [`Event::kind`],
/// [`Event::read`] and a `From<Body>` for each.
macro_rules! events {
    ($($(#[$doc:meta])* $variant:ident($body:ty) = $row:expr;)*) => {
        /// Every event of the stream.
        #[derive(Clone, Debug, Serialize)]
        #[serde(untagged)]
        pub enum Event {
            $($(#[$doc])* $variant($body),)*
        }

        #[allow(non_upper_case_globals)]
        mod rows {
            use super::*;
            $(pub const $variant: Kind = $row;)*
        }

        /// Every kind of event the stream carries.
        pub const KINDS: &[&Kind] = &[$(&rows::$variant),*];

        impl Event {
            /// What this kind of event is: its wire name, whether it is a lifecycle event,
            /// whether it is a finding.
            pub fn kind(&self) -> &'static Kind {
                match self {
                    $(Event::$variant(_) => &rows::$variant,)*
                }
            }

            /// Its readable line (see [`Readable`]).
            pub fn readable(&self, ts: u64) -> String {
                match self {
                    $(Event::$variant(body) => body.readable(ts),)*
                }
            }

            /// Reads a line back: the body of the event named `name` (the line's `event`),
            /// from the whole line. `None` for a name the stream does not have.
            pub fn read(name: &str, line: &[u8]) -> Option<serde_json::Result<Event>> {
                $(if name == rows::$variant.name {
                    return Some(serde_json::from_slice::<$body>(line).map(Event::$variant));
                })*
                None
            }
        }

        $(impl From<$body> for Event {
            fn from(body: $body) -> Event {
                Event::$variant(body)
            }
        })*
    };
}

events! {
    Snapshot(Snapshot) = lifecycle("snapshot", Lifecycle::Snapshot);
    Gateway(Gateway) = other("gateway", false);
    Ready(Ready) = other("ready", false);
    Fork(Fork) = lifecycle("fork", Lifecycle::Fork);
    Exec(Exec) = lifecycle("exec", Lifecycle::Exec);
    Exit(Exit) = lifecycle("exit", Lifecycle::Exit);
    Reaped(Reaped) = lifecycle("reaped", Lifecycle::Reaped);
    Setsid(Setsid) = lifecycle("setsid", Lifecycle::Setsid);
    Reparent(Reparent) = lifecycle("reparent", Lifecycle::Reparent);
    Session(Session) = other("session", false);
    // A loss, a flag raised or cleared, a kill step, the verdict and the summary are findings.
    Lost(Lost) = other("lost", true);
    /// Boxed: the biggest event by far, written once, would otherwise make every event as
    /// big (each record's event is built and moved on the hottest path).
    Summary(Box<Summary>) = other("summary", true);
    Flag(Flag) = other("flag", true);
    Kill(Kill) = other("kill", true);
    Cleared(Cleared) = other("cleared", true);
    Check(Check) = other("check", true);
    StopCommand(StopCommand) = other("stop_command", false);
    Note(Note) = other("note", false);
}

impl Event {
    /// The process the event is about; none for the run's own (`ready`, `lost`, `note`,
    /// `summary`, the verdict).
    pub fn pid(&self) -> Option<u32> {
        Some(match self {
            Event::Snapshot(e) => e.pid,
            Event::Gateway(e) => e.pid,
            Event::Fork(e) => e.pid,
            Event::Exec(e) => e.pid,
            Event::Exit(e) => e.pid,
            Event::Reaped(e) => e.pid,
            Event::Setsid(e) => e.pid,
            Event::Reparent(e) => e.pid,
            Event::Session(e) => e.pid,
            Event::Flag(e) => e.pid,
            Event::Kill(e) => e.pid,
            Event::Cleared(e) => e.pid,
            Event::StopCommand(e) => e.pid,
            Event::Ready(_)
            | Event::Lost(_)
            | Event::Summary(_)
            | Event::Check(_)
            | Event::Note(_) => return None,
        })
    }

    /// The rule of a flag, a flag cleared or a kill.
    pub fn reason(&self) -> Option<Reason> {
        match self {
            Event::Flag(e) => Some(e.reason),
            Event::Kill(e) => e.reason,
            Event::Cleared(e) => Some(e.reason),
            _ => None,
        }
    }

    /// The `event` name on the wire.
    pub fn name(&self) -> &'static str {
        self.kind().name
    }

    /// Whether the event is a finding or the verdict (what `--check` shows people by
    /// default).
    pub fn is_finding(&self) -> bool {
        self.kind().finding
    }

    /// The lifecycle kind of this event, if it is one.
    pub fn lifecycle(&self) -> Option<Lifecycle> {
        self.kind().lifecycle
    }
}

/// Splits a wait(2) status into (exit code, signal name, core dumped).
pub fn wait_status(status: u32) -> (Option<i32>, Option<Cow<'static, str>>, bool) {
    let sig = (status & 0x7f) as i32;
    if sig == 0 {
        (Some(((status >> 8) & 0xff) as i32), None, false)
    } else {
        (None, Some(signal_name(sig)), status & 0x80 != 0)
    }
}

/// A wait(2) status back from what [`wait_status`] split it into; `None` when the line gives
/// neither a code nor a signal (an exit learnt from /proc).
pub fn wait_status_of(exit_code: Option<i32>, signal: Option<&str>, core: bool) -> Option<u32> {
    if let Some(name) = signal {
        let number = match name.parse::<nix::sys::signal::Signal>() {
            Ok(s) => s as i32,
            Err(_) => name.strip_prefix("SIG")?.parse().ok()?,
        };
        return Some((number as u32 & 0x7f) | if core { 0x80 } else { 0 });
    }
    exit_code.map(|code| (code as u32 & 0xff) << 8)
}

/// `SIGKILL` for 9; `SIG41` for a number without a name (real-time signals). A named one is
/// borrowed: the ingest path allocates nothing for a killed process.
pub fn signal_name(sig: i32) -> Cow<'static, str> {
    match nix::sys::signal::Signal::try_from(sig) {
        Ok(s) => Cow::Borrowed(s.as_str()),
        Err(_) => Cow::Owned(format!("SIG{sig}")),
    }
}

#[cfg(test)]
mod tests;

/// Events are serialised off the reader's thread (see `crate::output::ndjson`).
const _: fn() = || {
    fn sent<T: Send + 'static>() {}
    sent::<Event>();
};
