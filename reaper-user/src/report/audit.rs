//! Reads an audit (the NDJSON stream) in one streaming pass and keeps only what the report
//! shows: a downsampled timeline, the flags (up to a cap), the processes alive at the end and
//! counts by executable. Memory follows what is alive and flagged, not the number of lines.
use crate::leaks::rules::Rules;
use std::collections::BTreeMap;
use std::io::BufRead;

use anyhow::Result;
use rustc_hash::FxHashMap as HashMap;

use super::crowds::Crowds;
use super::leak_sites::LeakSites;
use super::timeline::{Point, Timeline};
use crate::leaks::Reason;
use crate::stream::events::{
    Argv, Cleared, Event, Exec, Flag, Fork, Gateway, KINDS, Kill, Lost, ProcText, Ready, Reparent,
    Snapshot,
};
use crate::stream::reading::{Head, Line, each_line};
use crate::text::{Comm, lossy};

/// One flag, as the leak table shows it.
#[derive(Clone, Debug)]
pub struct FlagRow {
    pub pid: u32,
    pub reason: Reason,
    pub ts: u64,
    /// The flag as the stream carried it.
    pub flag: Flag,
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
    /// Where the flagged processes were spawned (`spawned_at`).
    pub leak_sites: LeakSites,
    /// Flags holding now: (pid, reason) → row index or none, and RSS at flag time.
    holding: HashMap<(u32, Reason), (Option<usize>, u64)>,
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
    pub fn add(&mut self, input: impl BufRead) -> Result<()> {
        each_line(input, |line| {
            self.lines += 1;
            match line {
                Line::Blank => {}
                Line::Unreadable => self.unreadable(),
                Line::Unknown(head) => {
                    self.count(&head);
                    self.sample(head.ts);
                }
                Line::Event(head, event) => {
                    self.count(&head);
                    self.apply(head.ts, event);
                }
            }
        })
    }

    /// Counts a line that is not an event of the stream's schema.
    fn unreadable(&mut self) {
        self.unreadable += 1;
        self.first_unreadable.get_or_insert(self.lines);
    }

    /// Counts a line by its kind, and its time.
    fn count(&mut self, head: &Head) {
        self.first_ts.get_or_insert(head.ts);
        self.last_ts = self.last_ts.max(head.ts);
        // Counted by name only for the stream's own events: an odd file cannot grow this.
        let name = match KINDS.iter().any(|k| k.name == head.event) {
            true => &*head.event,
            false => "(unknown)",
        };
        *self.events.entry(name.to_owned()).or_default() += 1;
    }

    fn apply(&mut self, ts: u64, event: Event) {
        match event {
            Event::Ready(Ready {
                gateway, kernel, ..
            }) => {
                self.kernel = Some(kernel);
                for &g in &gateway {
                    self.live.entry(g).or_insert_with(|| LiveProc {
                        lineage: vec![g],
                        exe: String::new(),
                        comm: String::new(),
                        argv: String::new(),
                        ppid: 0,
                    });
                }
                self.gateways = gateway;
            }
            Event::Gateway(g) => self.gateway(ts, g),
            Event::Snapshot(Snapshot {
                pid,
                ppid,
                spawner,
                comm,
                argv,
                ..
            }) => self.spawned(ts, pid, spawner.unwrap_or(ppid), ppid, &comm, Some(&argv)),
            Event::Fork(Fork {
                pid,
                ppid,
                spawner,
                comm,
                ..
            }) => self.spawned(ts, pid, spawner, ppid, &comm, None),
            Event::Exec(exec) => self.exec(exec),
            Event::Exit(exit) => {
                self.live.remove(&exit.pid);
                if let Some(i) = self.instance_of(exit.pid, ts) {
                    self.instances[i].exited.get_or_insert(ts);
                }
            }
            // The tree shows each process under its lineage, with its real parent now.
            Event::Reparent(Reparent { pid, new_ppid, .. }) => {
                if let Some(p) = self.live.get_mut(&pid) {
                    p.ppid = new_ppid;
                }
            }
            Event::Lost(Lost { count, .. }) => self.lost += count,
            Event::Flag(flag) => self.flag(ts, flag),
            Event::Cleared(Cleared {
                pid,
                reason,
                because,
            }) => {
                if let Some((row, rss)) = self.holding.remove(&(pid, reason)) {
                    self.flagged_rss_kib = self.flagged_rss_kib.saturating_sub(rss);
                    if let Some(row) = row.and_then(|i| self.flags.get_mut(i)) {
                        row.cleared = Some((ts, because.into_owned()));
                    }
                }
            }
            Event::Kill(kill) => self.kill(kill),
            Event::Summary(_) => self.complete = true,
            _ => {}
        }
        self.sample(ts);
    }

    /// A gateway instance: a root of lineage, what it spawns is listed under it.
    fn gateway(&mut self, ts: u64, g: Gateway) {
        let (comm, argv) = (g.comm.text().into_owned(), join_args(&g.argv));
        if self.live.len() < MAX_LIVE || self.live.contains_key(&g.pid) {
            let live = LiveProc {
                lineage: vec![g.pid],
                exe: String::new(),
                comm: comm.clone(),
                argv: argv.clone(),
                ppid: 0,
            };
            self.live.insert(g.pid, live);
        }
        match self.instances.len() < MAX_INSTANCES {
            true => self.instances.push(Instance {
                pid: g.pid,
                ts,
                selector: g.selector,
                comm,
                argv,
                exited: None,
                flags: 0,
            }),
            false => self.instances_omitted += 1,
        }
    }

    /// A process found or forked: listed under its spawner's lineage.
    fn spawned(
        &mut self,
        ts: u64,
        pid: u32,
        spawner: u32,
        ppid: u32,
        comm: &ProcText,
        argv: Option<&Argv>,
    ) {
        let (mut lineage, exe) = match self.live.get(&spawner) {
            Some(p) => (p.lineage.clone(), p.exe.clone()),
            None => (Vec::new(), String::new()),
        };
        if lineage.len() >= MAX_DEPTH {
            lineage.drain(..lineage.len() + 1 - MAX_DEPTH);
        }
        lineage.push(pid);
        if self.live.len() >= MAX_LIVE && !self.live.contains_key(&pid) {
            self.live_omitted += 1;
            return self.sample(ts);
        }
        let live = LiveProc {
            lineage,
            exe,
            comm: comm.text().into_owned(),
            argv: argv.map(join_args).unwrap_or_default(),
            ppid,
        };
        self.live.insert(pid, live);
    }

    fn exec(&mut self, exec: Exec) {
        let exe = exec.filename.text();
        let exe = match exe.is_empty() {
            true => "?",
            false => &*exe,
        };
        self.exe(exe).execs += 1;
        if let Some(p) = self.live.get_mut(&exec.pid) {
            p.argv = join_args(&exec.argv);
            p.exe = exe.to_owned();
            // What the kernel names it after an exec, as the run names it (the file's base
            // name, 15 bytes).
            p.comm = match exec.filename.bytes() {
                [] => "?".to_owned(),
                path => lossy(Comm::of_program(path).as_bytes()).into_owned(),
            };
        }
    }

    fn kill(&mut self, kill: Kill) {
        let key = (kill.cause().to_owned(), kill.result.to_string());
        let key = match self.kills.len() < MAX_KILL_KINDS || self.kills.contains_key(&key) {
            true => key,
            false => ("(other)".to_owned(), String::new()),
        };
        *self.kills.entry(key).or_default() += 1;
        if let Some(row) = self
            .flags
            .iter_mut()
            .rev()
            .find(|r| r.pid == kill.pid && Some(r.reason) == kill.reason)
        {
            row.kill = Some((kill.signal.into_owned(), kill.result.into_owned()));
        }
    }

    /// The latest instance with pid `pid` that became a gateway by `ts` (a pid can be reused
    /// by a later instance).
    fn instance_of(&self, pid: u32, ts: u64) -> Option<usize> {
        self.instances
            .iter()
            .rposition(|i| i.pid == pid && i.ts <= ts)
    }

    fn flag(&mut self, ts: u64, flag: Flag) {
        let (pid, reason) = (flag.pid, flag.reason);
        if reason.counts_a_kind() {
            self.crowds.flag(ts, &flag.detail);
        }
        self.leak_sites
            .flag(pid, reason.name(), &flag.detail.spawned_at);
        let rss = flag.detail.rss_kib.unwrap_or(0);
        let exe = match self.live.get(&pid) {
            Some(p) if !p.exe.is_empty() => p.exe.clone(),
            _ => flag.detail.comm.text().into_owned(),
        };
        self.exe(&exe).flags += 1;
        let root = flag.detail.lineage.first().copied();
        let instance = root.and_then(|root| self.instance_of(root, ts));
        if let Some(i) = instance {
            self.instances[i].flags += 1;
        }
        let row = match self.flags.len() < MAX_FLAG_ROWS {
            true => {
                self.flags.push(FlagRow {
                    pid,
                    reason,
                    ts,
                    flag,
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
fn join_args(argv: &Argv) -> String {
    let mut out = String::new();
    for (i, a) in argv.args().iter().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(&String::from_utf8_lossy(a));
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
