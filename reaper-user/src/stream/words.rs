//! The few formats every readable text shares (a line of the stream, `why`, `top`, the
//! report): durations, sizes, a process by what it runs, the spawner's thread.
use crate::stream::events::{Argv, ProcText, SpawningThread};
use crate::stream::label::command_label;

/// ` thread 4702 (asyncio_0)`: the spawner's thread that forked a process, if not its main one.
pub fn thread_text(thread: Option<&SpawningThread>) -> String {
    thread.map_or_else(String::new, |t| {
        format!(" thread {} ({})", t.tid, t.comm.for_terminal())
    })
}

/// "3m12s": a duration for people, to the second.
pub fn human_duration(ns: u64) -> String {
    let secs = ns / 1_000_000_000;
    match secs {
        0..60 => format!("{secs}s"),
        60..3600 => format!("{}m{:02}s", secs / 60, secs % 60),
        _ => format!("{}h{:02}m", secs / 3600, secs % 3600 / 60),
    }
}

/// "512 KiB", "312.4 MiB": resident memory for people.
pub fn human_rss(kib: u64) -> String {
    match kib {
        0..1024 => format!("{kib} KiB"),
        _ => format!("{:.1} MiB", kib as f64 / 1024.0),
    }
}

/// `1234 (bridge.cjs --agent=hermes)`: a pid and what it runs (see [`command_label`]),
/// escaped for a terminal; its name when its command line is not known.
pub fn who(pid: u32, comm: &ProcText, argv: &Argv) -> String {
    let label = command_label(argv.args());
    match label.is_empty() {
        true => format!("{pid} ({})", comm.for_terminal()),
        false => format!("{pid} ({label})"),
    }
}
