//! Reads an audit (the NDJSON stream) in one streaming pass and keeps only what the report
//! shows: a downsampled timeline, the flags (up to a cap), the processes alive at the end and
//! counts by executable. Memory follows what is alive and flagged, not the number of lines.
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::io::BufRead;

use anyhow::{Context, Result};
use rustc_hash::FxHashMap as HashMap;
use serde::Deserialize;

use super::crowds::Crowds;
use super::timeline::{Point, Timeline};
use crate::stream::events::{KINDS, LeakDetail};

/// The fields of a line the pass needs; the rest is skipped by the parser.
#[derive(Deserialize)]
struct Line<'a> {
    #[serde(borrow)]
    event: Cow<'a, str>,
    ts: u64,
    pid: Option<u32>,
    spawner: Option<u32>,
    ppid: Option<u32>,
    new_ppid: Option<u32>,
    #[serde(borrow)]
    comm: Option<Cow<'a, str>>,
    #[serde(borrow)]
    filename: Option<Cow<'a, str>>,
    #[serde(borrow)]
    argv: Option<Vec<Cow<'a, str>>>,
    #[serde(borrow)]
    reason: Option<Cow<'a, str>>,
    #[serde(borrow)]
    because: Option<Cow<'a, str>>,
    #[serde(borrow)]
    result: Option<Cow<'a, str>>,
    #[serde(borrow)]
    signal: Option<Cow<'a, str>>,
    count: Option<u64>,
    gateway: Option<Vec<u32>>,
    #[serde(borrow)]
    kernel: Option<Cow<'a, str>>,
    #[serde(borrow)]
    selector: Option<Cow<'a, str>>,
    lineage: Option<Vec<u32>>,
}

/// What a `flag` line carries besides the common fields: the stream's own evidence type.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct FlagDetail {
    pub since: u64,
    pub idle_secs: Option<f64>,
    #[serde(flatten)]
    pub leak: LeakDetail,
}

/// One flag, as the leak table shows it.
#[derive(Clone, Debug)]
pub struct FlagRow {
    pub pid: u32,
    pub reason: String,
    pub ts: u64,
    pub detail: FlagDetail,
    /// When it stopped holding, and why.
    pub cleared: Option<(u64, String)>,
    /// The last `--kill` step for it: signal and result.
    pub kill: Option<(String, String)>,
    /// The gateway instance its lineage starts at (an index into [`Audit::instances`]).
    pub instance: Option<usize>,
}

/// One gateway instance (a `gateway` event) and what became of it.
#[derive(Clone, Debug)]
pub struct Instance {
    pub pid: u32,
    /// When it became a gateway.
    pub ts: u64,
    pub selector: String,
    pub comm: String,
    pub argv: String,
    pub exited: Option<u64>,
    /// Flags raised on what it spawned.
    pub flags: u64,
}

/// A process alive at the end of the audit.
#[derive(Clone, Debug)]
pub struct LiveProc {
    pub lineage: Vec<u32>,
    /// The program it runs: its last exec, or what its parent ran.
    pub exe: String,
    pub comm: String,
    pub argv: String,
    pub ppid: u32,
}

/// Per executable: execs seen, flags raised.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExeCounts {
    pub execs: u64,
    pub flags: u64,
}

/// At most this many flags are kept for the table (the rest are counted).
pub const MAX_FLAG_ROWS: usize = 5_000;
/// At most this many executables are counted by name (the rest as one).
pub const MAX_EXECUTABLES: usize = 5_000;
/// At most this many processes alive at once are followed for the tree (a real host holds at
/// most `pid_max` of them; an odd file could claim more).
pub const MAX_LIVE: usize = 200_000;
/// Lineages are kept to their last this many steps.
pub const MAX_DEPTH: usize = 64;
/// At most this many (reason, result) pairs of kill steps are counted by name.
pub const MAX_KILL_KINDS: usize = 64;
/// Longest argv kept for a live process.
pub const MAX_ARGV_CHARS: usize = 300;
/// At most this many gateway instances are listed (the rest are counted).
pub const MAX_INSTANCES: usize = 10_000;
/// Label of the executables past [`MAX_EXECUTABLES`].
pub const OTHER_EXECUTABLES: &str = "(other executables)";

/// Everything the report shows.
#[derive(Debug, Default)]
pub struct Audit {
    pub lines: u64,
    /// Lines that were not events (with the first one's number).
    pub unreadable: u64,
    pub first_unreadable: Option<u64>,
    pub first_ts: Option<u64>,
    pub last_ts: u64,
    pub kernel: Option<String>,
    pub gateways: Vec<u32>,
    /// Gateway instances in the order they appeared (restarts are the second and later of one
    /// selector).
    pub instances: Vec<Instance>,
    pub instances_omitted: u64,
    pub events: BTreeMap<String, u64>,
    pub lost: u64,
    /// Whether the audit ran to its `summary` (a tracer that was killed has none).
    pub complete: bool,
    pub flags: Vec<FlagRow>,
    pub flags_omitted: u64,
    /// Live processes past [`MAX_LIVE`], not followed.
    pub live_omitted: u64,
    pub kills: BTreeMap<(String, String), u64>,
    pub live: HashMap<u32, LiveProc>,
    pub executables: HashMap<String, ExeCounts>,
    pub timeline: Timeline,
    /// The kinds that accumulated, with their counts over time.
    pub crowds: Crowds,
    /// Flags holding now: (pid, reason) → row index or none, and RSS at flag time.
    holding: HashMap<(u32, String), (Option<usize>, u64)>,
    flagged_rss_kib: u64,
}

impl Audit {
    /// Reads an audit; unreadable lines are counted, not fatal.
    pub fn read(input: impl BufRead) -> Result<Audit> {
        let mut audit = Audit::default();
        audit.add(input)?;
        Ok(audit)
    }

    /// Adds another part of the same audit (the rotated files, oldest first).
    pub fn add(&mut self, mut input: impl BufRead) -> Result<()> {
        let mut buf = Vec::with_capacity(4096);
        loop {
            buf.clear();
            let n = input
                .read_until(b'\n', &mut buf)
                .context("reading the audit")?;
            if n == 0 {
                return Ok(());
            }
            self.lines += 1;
            if buf.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            match serde_json::from_slice::<Line>(&buf) {
                Ok(line) => self.apply(&line, &buf),
                Err(_) => {
                    self.unreadable += 1;
                    self.first_unreadable.get_or_insert(self.lines);
                }
            }
        }
    }

    fn apply(&mut self, l: &Line, raw: &[u8]) {
        self.first_ts.get_or_insert(l.ts);
        self.last_ts = self.last_ts.max(l.ts);
        // Counted by name only for the stream's own events: an odd file cannot grow this.
        let name = match KINDS.iter().any(|k| k.name == l.event) {
            true => &*l.event,
            false => "(unknown)",
        };
        *self.events.entry(name.to_owned()).or_default() += 1;
        let pid = l.pid.unwrap_or(0);
        match &*l.event {
            "ready" => {
                self.gateways = l.gateway.clone().unwrap_or_default();
                self.kernel = l.kernel.as_ref().map(|k| k.to_string());
                for &g in &self.gateways {
                    self.live.entry(g).or_insert_with(|| LiveProc {
                        lineage: vec![g],
                        exe: String::new(),
                        comm: String::new(),
                        argv: String::new(),
                        ppid: 0,
                    });
                }
            }
            "gateway" => {
                // A root of lineage: what it spawns is listed under it.
                if self.live.len() < MAX_LIVE || self.live.contains_key(&pid) {
                    self.live.insert(
                        pid,
                        LiveProc {
                            lineage: vec![pid],
                            exe: String::new(),
                            comm: l.comm.as_deref().unwrap_or("").to_owned(),
                            argv: join_args(l.argv.as_deref()),
                            ppid: l.ppid.unwrap_or(0),
                        },
                    );
                }
                match self.instances.len() < MAX_INSTANCES {
                    true => self.instances.push(Instance {
                        pid,
                        ts: l.ts,
                        selector: l.selector.as_deref().unwrap_or("").to_owned(),
                        comm: l.comm.as_deref().unwrap_or("").to_owned(),
                        argv: join_args(l.argv.as_deref()),
                        exited: None,
                        flags: 0,
                    }),
                    false => self.instances_omitted += 1,
                }
            }
            "snapshot" | "fork" => {
                let parent = l.spawner.or(l.ppid).unwrap_or(0);
                let (mut lineage, exe) = match self.live.get(&parent) {
                    Some(p) => (p.lineage.clone(), p.exe.clone()),
                    None => (Vec::new(), String::new()),
                };
                if lineage.len() >= MAX_DEPTH {
                    lineage.drain(..lineage.len() + 1 - MAX_DEPTH);
                }
                lineage.push(pid);
                if self.live.len() >= MAX_LIVE && !self.live.contains_key(&pid) {
                    self.live_omitted += 1;
                    return self.sample(l.ts);
                }
                self.live.insert(
                    pid,
                    LiveProc {
                        lineage,
                        exe,
                        comm: l.comm.as_deref().unwrap_or("").to_owned(),
                        argv: join_args(l.argv.as_deref()),
                        ppid: l.ppid.unwrap_or(0),
                    },
                );
            }
            "exec" => {
                let exe = l.filename.as_deref().unwrap_or("?");
                self.exe(exe).execs += 1;
                if let Some(p) = self.live.get_mut(&pid) {
                    p.argv = join_args(l.argv.as_deref());
                    p.exe = exe.to_owned();
                    // What the kernel names it after an exec: the file's base name, 15 bytes.
                    let base = exe.rsplit('/').next().unwrap_or(exe);
                    p.comm = base
                        .chars()
                        .scan(0, |n, c| {
                            *n += c.len_utf8();
                            (*n <= 15).then_some(c)
                        })
                        .collect();
                }
            }
            "exit" => {
                self.live.remove(&pid);
                if let Some(i) = self.instance_of(pid, l.ts) {
                    self.instances[i].exited.get_or_insert(l.ts);
                }
            }
            // The tree shows each process under its lineage, with its real parent now.
            "reparent" => {
                if let (Some(p), Some(new_ppid)) = (self.live.get_mut(&pid), l.new_ppid) {
                    p.ppid = new_ppid;
                }
            }
            "lost" => self.lost += l.count.unwrap_or(0),
            "flag" => self.flag(l, raw),
            "cleared" => {
                let key = (pid, l.reason.as_deref().unwrap_or("").to_owned());
                if let Some((row, rss)) = self.holding.remove(&key) {
                    self.flagged_rss_kib = self.flagged_rss_kib.saturating_sub(rss);
                    if let Some(row) = row.and_then(|i| self.flags.get_mut(i)) {
                        row.cleared = Some((l.ts, l.because.as_deref().unwrap_or("").into()));
                    }
                }
            }
            "kill" => {
                let key = (
                    l.reason.as_deref().unwrap_or("").to_owned(),
                    l.result.as_deref().unwrap_or("").to_owned(),
                );
                let key = match self.kills.len() < MAX_KILL_KINDS || self.kills.contains_key(&key) {
                    true => key,
                    false => ("(other)".to_owned(), String::new()),
                };
                *self.kills.entry(key).or_default() += 1;
                let reason = l.reason.as_deref().unwrap_or("");
                if let Some(row) = self
                    .flags
                    .iter_mut()
                    .rev()
                    .find(|r| r.pid == pid && r.reason == reason)
                {
                    row.kill = Some((
                        l.signal.as_deref().unwrap_or("").into(),
                        l.result.as_deref().unwrap_or("").into(),
                    ));
                }
            }
            "summary" => self.complete = true,
            _ => {}
        }
        self.sample(l.ts);
    }

    /// The latest instance with pid `pid` that became a gateway by `ts` (a pid can be reused
    /// by a later instance).
    fn instance_of(&self, pid: u32, ts: u64) -> Option<usize> {
        self.instances
            .iter()
            .rposition(|i| i.pid == pid && i.ts <= ts)
    }

    fn flag(&mut self, l: &Line, raw: &[u8]) {
        let pid = l.pid.unwrap_or(0);
        let detail: FlagDetail = serde_json::from_slice(raw).unwrap_or_default();
        let reason = l.reason.as_deref().unwrap_or("").to_owned();
        if reason == "accumulating" {
            self.crowds.flag(l.ts, &detail.leak);
        }
        let rss = detail.leak.rss_kib.unwrap_or(0);
        let exe = match self.live.get(&pid) {
            Some(p) if !p.exe.is_empty() => p.exe.clone(),
            _ => detail.leak.comm.text().into_owned(),
        };
        self.exe(&exe).flags += 1;
        let root = l.lineage.as_ref().and_then(|l| l.first().copied());
        let instance = root.and_then(|root| self.instance_of(root, l.ts));
        if let Some(i) = instance {
            self.instances[i].flags += 1;
        }
        let row = match self.flags.len() < MAX_FLAG_ROWS {
            true => {
                self.flags.push(FlagRow {
                    pid,
                    reason: reason.clone(),
                    ts: l.ts,
                    detail,
                    cleared: None,
                    kill: None,
                    instance,
                });
                Some(self.flags.len() - 1)
            }
            false => {
                self.flags_omitted += 1;
                None
            }
        };
        let key = (pid, reason);
        if self.holding.len() >= MAX_LIVE && !self.holding.contains_key(&key) {
            return;
        }
        if let Some((_, old)) = self.holding.insert(key, (row, rss)) {
            self.flagged_rss_kib = self.flagged_rss_kib.saturating_sub(old);
        }
        self.flagged_rss_kib = self.flagged_rss_kib.saturating_add(rss);
    }

    fn exe(&mut self, name: &str) -> &mut ExeCounts {
        let key =
            match self.executables.contains_key(name) || self.executables.len() < MAX_EXECUTABLES {
                true => name,
                false => OTHER_EXECUTABLES,
            };
        self.executables.entry(key.to_owned()).or_default()
    }

    /// Folds the state after an event into the timeline.
    fn sample(&mut self, ts: u64) {
        let now = Point {
            ts,
            alive: self.live.len() as u64,
            flagged: self.holding.len() as u64,
            flagged_rss_kib: self.flagged_rss_kib,
        };
        self.timeline.add(self.first_ts.unwrap_or(ts), now);
    }
}

/// The arguments joined by spaces, at most [`MAX_ARGV_CHARS`] characters (a page shows no more).
fn join_args(argv: Option<&[Cow<str>]>) -> String {
    let mut out = String::new();
    for (i, a) in argv.unwrap_or_default().iter().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(a);
        if out.len() > MAX_ARGV_CHARS {
            let cut = (0..=MAX_ARGV_CHARS)
                .rev()
                .find(|&i| out.is_char_boundary(i))
                .unwrap_or(0);
            out.truncate(cut);
            out.push('…');
            break;
        }
    }
    out
}

#[cfg(test)]
mod tests;
