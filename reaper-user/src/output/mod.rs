//! Where events go: NDJSON for tools, one readable line per event for people.
pub mod follow;
pub mod human;
pub mod junit;
pub mod lines;
pub mod logfile;
pub mod metrics;
pub mod ndjson;
pub mod outlet;
pub mod serve;
pub mod status;
pub mod tree;
mod writer_thread;

use std::io::{self, Write};

use anyhow::{Context, Result};

use crate::output::follow::Follower;
use crate::output::human::{human_line, human_lines};
use crate::output::metrics::Metrics;
use crate::output::ndjson::NdjsonLines;
use crate::output::outlet::Outlet;
use crate::output::status::StatusLine;
use crate::procfs::boottime_now;
use crate::stream::events::{Counts, Event, Note};

/// Writes the event stream. NDJSON goes to each of `json` (stdout with `--json`, the file of
/// `--output`: made and written off the reader's thread once detached, see [`ndjson`]);
/// readable lines go to `human` (stdout by default, stderr with `--json`). Every event is also
/// counted in the metrics. Operator notes go to `notes` (standard error) and, as `note`
/// events, into the NDJSON stream.
pub struct Output {
    /// The NDJSON stream's lines, to its outlets and the API's followers.
    lines: NdjsonLines,
    human: Option<Box<dyn Write + Send>>,
    notes: Option<Box<dyn Write + Send>>,
    /// Notes told before `ready` (and when), for the stream: written right after it (see
    /// [`Output::ready_written`]), so that a tool reading the stream meets `ready` before
    /// them. A run that fails before `ready` has said them on stderr only.
    held_notes: Option<Vec<(u64, String)>>,
    pub metrics: Metrics,
    /// The lifecycle events written so far, for the summary.
    pub counts: Counts,
    status: Option<StatusLine>,
    seq: u64,
    /// Boot-time ns at start, for relative times in human lines.
    t0: u64,
    /// Readable lines only for findings (see [`Event::is_finding`]): `--check` in a CI log.
    findings_only: bool,
    /// The outlets written through (a handle of each): detached from the reader's thread
    /// once privileges are dropped, and asked at each flush what they dropped; with the
    /// lines each dropped in the stall under way (none: it keeps up).
    outlets: Vec<(Outlet, Option<u64>)>,
}

impl Output {
    pub fn new(
        json: Vec<Box<dyn Write + Send>>,
        human: Option<Box<dyn Write + Send>>,
        t0: u64,
    ) -> Self {
        Output {
            lines: NdjsonLines::new(json),
            human,
            notes: None,
            held_notes: Some(Vec::new()),
            metrics: Metrics::new(),
            counts: Counts::default(),
            status: None,
            seq: 0,
            t0,
            findings_only: false,
            outlets: Vec::new(),
        }
    }

    /// The outlets the writers given write to (see [`Output::detach_outlets`]).
    pub fn set_outlets(&mut self, outlets: Vec<Outlet>) {
        self.outlets = outlets.into_iter().map(|o| (o, None)).collect();
    }

    /// From now on the NDJSON lines are made by a thread of their own and each outlet is
    /// written by a thread of its own, never by the reader's (see [`ndjson`], [`outlet`]).
    /// Called once privileges are dropped: threads started before would keep them.
    pub fn detach_outlets(&mut self) -> Result<()> {
        self.lines
            .detach()
            .context("starting the thread that writes the NDJSON stream")?;
        for (outlet, _) in &self.outlets {
            outlet
                .detach()
                .with_context(|| format!("starting the thread that writes {}", outlet.name()))?;
        }
        Ok(())
    }

    /// The run's end: what is still written waits for room in a slow outlet rather than being
    /// dropped, and an outlet still behind says how many lines it dropped in its stall.
    pub fn end_stalls(&mut self) -> Result<()> {
        self.lines.catch_up().context("writing an NDJSON event")?;
        // Before the summary, which is the stream's last line.
        self.say_followers_dropped()?;
        let mut said = Vec::new();
        for (outlet, stall) in &mut self.outlets {
            outlet.wait_for_room();
            let dropped = stall.take().unwrap_or(0) + outlet.take_dropped();
            if dropped > 0 {
                said.push(format!(
                    "{} had not caught up at the end: {dropped} line(s) to it were dropped since \
                     it stopped keeping up",
                    outlet.name()
                ));
            }
        }
        for text in said {
            self.note(&text)?;
        }
        // The followers' count the summary gives includes what these notes cost them.
        self.lines.catch_up().context("writing an NDJSON event")
    }

    /// Says when an outlet stops keeping up (its lines are dropped from then on) and when it
    /// has caught up again, with how many it dropped: twice a stall, however long (the note
    /// itself may be one of the lines a stalled stderr drops).
    fn say_dropped(&mut self) -> Result<()> {
        let mut said = Vec::new();
        for (outlet, stall) in &mut self.outlets {
            let dropped = outlet.take_dropped();
            match *stall {
                None if dropped > 0 => {
                    *stall = Some(dropped);
                    said.push(format!(
                        "{} does not keep up: lines to it are dropped and counted while more \
                         than {} MiB wait for it; tracing goes on, and the other outlets lose \
                         nothing",
                        outlet.name(),
                        outlet::WAITING >> 20
                    ));
                }
                None => {}
                Some(total) if dropped == 0 && outlet.caught_up() => {
                    *stall = None;
                    said.push(format!(
                        "{} keeps up again: {total} line(s) to it were dropped",
                        outlet.name()
                    ));
                }
                Some(total) => *stall = Some(total + dropped),
            }
        }
        for text in said {
            self.note(&text)?;
        }
        Ok(())
    }

    /// Readable lines for findings only (flags, kills, the verdict, the summary); the NDJSON
    /// stream keeps every event.
    pub fn set_findings_only(&mut self, on: bool) {
        self.findings_only = on;
    }

    /// Where people read operator notes (whole lines; standard error), if anywhere.
    pub fn set_notes(&mut self, notes: Option<Box<dyn Write + Send>>) {
        self.notes = notes;
    }

    /// Tells the operator something about the run that is no process's event: a line for
    /// people (`reaper-trace: TEXT`, on the notes' outlet at once) and a `note` event in the
    /// NDJSON stream.
    pub fn note(&mut self, text: &str) -> Result<()> {
        if let Some(w) = self.notes.as_mut() {
            if let Some(s) = self.status.as_mut() {
                s.clear();
            }
            writeln!(w, "reaper-trace: {text}")
                .and_then(|()| w.flush())
                .context("writing a note")?;
        }
        match self.held_notes.as_mut() {
            Some(held) => {
                held.push((boottime_now(), text.to_owned()));
                Ok(())
            }
            None => self.record(boottime_now(), Note::event(text)),
        }
    }

    /// `ready` is written: the notes told before it go into the stream now, and later ones
    /// as they are told.
    pub fn ready_written(&mut self) -> Result<()> {
        for (ts, text) in self.held_notes.take().unwrap_or_default() {
            self.record(ts, Note::event(&text))?;
        }
        Ok(())
    }

    /// Emits one event stamped `ts`.
    pub fn event(&mut self, ts: u64, body: Event) -> Result<()> {
        if self.shows(&body) {
            self.write_human(ts, &human_line(ts, &body))?;
        }
        self.record(ts, body)
    }

    /// Emits a batch of findings stamped `ts` (one leak scan's): every event in the NDJSON
    /// stream, and the readable lines folded (see [`human_lines`]).
    pub fn events(&mut self, ts: u64, bodies: Vec<Event>) -> Result<()> {
        if self.human.is_some() {
            let shown: Vec<&Event> = bodies.iter().filter(|b| self.shows(b)).collect();
            for line in human_lines(ts, &shown) {
                self.write_human(ts, &line)?;
            }
        }
        for body in bodies {
            self.record(ts, body)?;
        }
        Ok(())
    }

    /// Counts one event and hands it on for its NDJSON line.
    fn record(&mut self, ts: u64, body: Event) -> Result<()> {
        self.metrics.observe(&body);
        self.counts.observe(&body);
        if self.lines.wanted() {
            self.lines
                .push(self.seq, ts, body)
                .context("writing an NDJSON event")?;
        }
        self.seq += 1;
        Ok(())
    }

    /// Says how many of the API's followers were dropped for not keeping up since it was last
    /// said.
    fn say_followers_dropped(&mut self) -> Result<()> {
        let dropped = self.lines.take_followers_dropped();
        if dropped > 0 {
            self.note(&format!(
                "dropped {dropped} follower(s) of the API's event stream: they did not keep up \
                 (their queue of lines was full); the stream itself lost nothing"
            ))?;
        }
        Ok(())
    }

    /// Sends the stream's lines from now on to `follower` too.
    pub fn follow(&mut self, follower: Follower) {
        self.lines.follow(follower);
    }

    /// Ends every follower's stream (the run's end, after the summary), once the NDJSON
    /// thread has written everything: the error it met writing the last lines, if any.
    pub fn end_followers(&mut self) -> Result<()> {
        self.lines
            .end_followers()
            .context("writing an NDJSON event")
    }

    /// The API's followers now.
    pub fn followers(&self) -> usize {
        self.lines.followers()
    }

    /// The API's followers dropped so far because they did not keep up.
    pub fn followers_dropped(&self) -> u64 {
        self.lines.followers_dropped()
    }

    /// How many events were written so far: every change to the lineage is one, so a
    /// checkpoint is due only when this moved.
    pub fn written(&self) -> u64 {
        self.seq
    }

    /// Whether people see a line for this event.
    fn shows(&self, body: &Event) -> bool {
        self.human.is_some() && (!self.findings_only || body.is_finding())
    }

    fn write_human(&mut self, ts: u64, line: &str) -> Result<()> {
        let Some(w) = self.human.as_mut() else {
            return Ok(());
        };
        if let Some(s) = self.status.as_mut() {
            s.clear();
        }
        // Signed: a restart's gap events (`--state-dir`) come after `ready` but happened
        // before it, and say so.
        let rel = (i128::from(ts) - i128::from(self.t0)) as f64 / 1e9;
        writeln!(w, "[{rel:>9.3}s] {line}").context("writing output")
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

    /// The run's last flush, after the summary: it says nothing more (the summary is the
    /// stream's last line).
    pub fn last_flush(&mut self) -> io::Result<()> {
        self.lines.flush()?;
        match self.human.as_mut() {
            Some(w) => w.flush(),
            None => Ok(()),
        }
    }

    /// Flushes both outlets and the followers' lines (after every batch of events, so a
    /// reader sees them at once), and says what an outlet or the followers that did not keep
    /// up dropped.
    pub fn flush(&mut self) -> io::Result<()> {
        self.lines.flush()?;
        if let Some(w) = self.human.as_mut() {
            w.flush()?;
        }
        self.say_followers_dropped()
            .and_then(|()| self.say_dropped())
            .map_err(io::Error::other)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::stream::events::{Ready, Setsid};

    /// A writer whose bytes the test reads back (the NDJSON lines' tests use it too).
    #[derive(Clone, Default)]
    pub(super) struct Kept(pub(super) Arc<Mutex<Vec<u8>>>);

    impl Write for Kept {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Kept {
        /// The `event` names written so far, and each note's text.
        fn events(&self) -> Vec<String> {
            let bytes = self.0.lock().unwrap().clone();
            String::from_utf8(bytes)
                .unwrap()
                .lines()
                .map(|l| {
                    let v: serde_json::Value = serde_json::from_str(l).unwrap();
                    match v["event"].as_str().unwrap() {
                        "note" => format!("note: {}", v["text"].as_str().unwrap()),
                        name => name.to_owned(),
                    }
                })
                .collect()
        }
    }

    /// A writer that takes each write only when the gate lets it.
    struct Gated(std::sync::mpsc::Receiver<()>);

    impl Write for Gated {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.recv().map_err(|_| io::ErrorKind::BrokenPipe)?;
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn an_outlet_that_stalls_is_said_once_and_once_more_when_it_catches_up_with_the_count() {
        let (open, gate) = std::sync::mpsc::sync_channel(0);
        let stalled = Outlet::with_limit("stdout", Box::new(Gated(gate)), 200);
        let stream = Kept::default();
        let mut out = Output::new(
            vec![Box::new(stream.clone())],
            Some(Box::new(stalled.handle())),
            0,
        );
        out.set_outlets(vec![stalled.handle()]);
        out.detach_outlets().unwrap();
        out.event(0, Event::Ready(Ready::default())).unwrap();
        out.ready_written().unwrap();
        for pid in 0..50 {
            out.event(1, Event::Setsid(Setsid { pid, sid: pid }))
                .unwrap();
            out.flush().unwrap();
        }
        let notes = |out: &mut Output, stream: &Kept| -> Vec<String> {
            // The NDJSON thread has written what it was handed.
            out.lines.catch_up().unwrap();
            let all = stream.events();
            all.into_iter()
                .filter(|e| e.starts_with("note: "))
                .collect()
        };
        let said = notes(&mut out, &stream);
        assert_eq!(said.len(), 1, "{said:?}");
        assert!(said[0].contains("stdout does not keep up"), "{said:?}");
        // The reader comes back: what waited is taken, and the count is said.
        let feeder = std::thread::spawn(move || while open.send(()).is_ok() {});
        let cap = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !stalled.caught_up() {
            assert!(
                std::time::Instant::now() < cap,
                "the outlet never caught up"
            );
            std::thread::yield_now();
        }
        out.flush().unwrap();
        let said = notes(&mut out, &stream);
        assert_eq!(said.len(), 2, "{said:?}");
        assert!(said[1].contains("stdout keeps up again: "), "{said:?}");
        let dropped: u64 = said[1]
            .split(": ")
            .nth(2)
            .and_then(|t| t.split(' ').next())
            .and_then(|n| n.parse().ok())
            .expect("a count");
        assert!(dropped > 0 && dropped < 50, "{said:?}");
        drop((out, stalled));
        feeder.join().unwrap();
    }

    #[test]
    fn a_note_is_a_line_on_stderr_at_once_and_an_event_after_ready() {
        let (stream, stderr) = (Kept::default(), Kept::default());
        let mut out = Output::new(vec![Box::new(stream.clone())], None, 0);
        out.set_notes(Some(Box::new(stderr.clone())));
        out.note("at start-up").unwrap();
        assert_eq!(stream.events(), Vec::<String>::new(), "held until ready");
        out.event(1, Event::Ready(Ready::default())).unwrap();
        out.ready_written().unwrap();
        out.note("later").unwrap();
        out.event(2, Event::Setsid(Setsid { pid: 7, sid: 7 }))
            .unwrap();
        assert_eq!(
            stream.events(),
            ["ready", "note: at start-up", "note: later", "setsid"]
        );
        let said = String::from_utf8(stderr.0.lock().unwrap().clone()).unwrap();
        assert_eq!(said, "reaper-trace: at start-up\nreaper-trace: later\n");
    }
}
