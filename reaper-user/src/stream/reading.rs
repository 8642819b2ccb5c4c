//! Reading an audit back: its lines, each as the stream's own event. Shared by the report and
//! by the replays of `why --from` and `tree --from`, so that both read a line the same way.
use std::borrow::Cow;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::Path;

use anyhow::{Context, Result};
use serde::Deserialize;

use super::events::Event;

/// What every line starts with: its kind, its place in its run's stream and when. The body is
/// read as the stream's own type of that kind ([`Event::read`]).
#[derive(Deserialize)]
pub struct Head<'a> {
    #[serde(borrow)]
    pub event: Cow<'a, str>,
    /// The line's position in its run's stream: 0 begins a run (an audit file holds every
    /// run that appended to it).
    #[serde(default)]
    pub seq: Option<u64>,
    #[serde(default)]
    pub ts: u64,
}

/// One line of an audit.
pub enum Line<'a> {
    /// Only whitespace.
    Blank,
    /// Not a line of the stream: not JSON, no `event`, or a body that does not read as its
    /// kind's.
    Unreadable,
    /// A kind this build does not know (a later version's): its head only.
    Unknown(Head<'a>),
    Event(Head<'a>, Event),
}

/// Reads `input` to its end, handing each line to `each`, in order. An unreadable line is
/// handed on, not fatal: an audit cut by a full disk or a crash is read as far as it goes.
pub fn each_line(mut input: impl BufRead, mut each: impl FnMut(Line<'_>)) -> Result<()> {
    let mut buf = Vec::with_capacity(4096);
    loop {
        buf.clear();
        let n = input
            .read_until(b'\n', &mut buf)
            .context("reading the audit")?;
        if n == 0 {
            return Ok(());
        }
        if buf.iter().all(u8::is_ascii_whitespace) {
            each(Line::Blank);
            continue;
        }
        let Ok(head) = serde_json::from_slice::<Head>(&buf) else {
            each(Line::Unreadable);
            continue;
        };
        match Event::read(&head.event, &buf) {
            Some(Ok(event)) => each(Line::Event(head, event)),
            Some(Err(_)) => each(Line::Unreadable),
            None => each(Line::Unknown(head)),
        }
    }
}

/// Opens one file of an audit for reading; `-` is standard input.
pub fn open(path: &Path) -> Result<Box<dyn BufRead>> {
    if path.as_os_str() == "-" {
        return Ok(Box::new(BufReader::new(std::io::stdin())));
    }
    let file = File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    Ok(Box::new(BufReader::with_capacity(1 << 20, file)))
}

/// What an audit (its first file `first`) that held no event of the stream is told: `lines`
/// were read, none of them ours.
pub fn no_events(first: &Path, lines: u64) -> anyhow::Error {
    anyhow::anyhow!(
        "{} holds no reaper-trace events ({lines} lines read): is it the output of --json or \
         --output?",
        first.display()
    )
}
