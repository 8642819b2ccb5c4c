//! `why PID --from AUDIT` and `tree --from AUDIT`: an audit read back (its rotated files in
//! order, as `report` reads them) into the same lineage graph the running audit keeps, up to
//! a moment (`--at`), and asked what the running audit's API would have answered then.
//!
//! What a replay knows is what the stream says: every fork, exec, exit, free, setsid and
//! reparent (so the lineage, who was alive and who had each pid, exactly as the run knew
//! them), and the flags with the evidence each carried when it was raised. What the running
//! audit reads from /proc when asked (a process's channels and who holds their other ends
//! now, its RSS now) a replay gives as the process's last flag before the moment recorded it.
//!
//! An audit file holds every run that appended to it (`seq` 0 begins one). A run that took
//! the lineage of the run before back (`--state-dir`: its `ready` says `resumed`) goes on
//! from it; any other run starts from what it found in /proc. A run's flags are its own: each
//! run judges afresh.
pub mod at;

use std::path::PathBuf;

use anyhow::{Context, Result};
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use crate::leaks::answer::{self, Witness};
use crate::leaks::flags;
use crate::leaks::held::HeldFlags;
use crate::lineage::graph::{LineageGraph, Node, NodeId};
use crate::output::tree::TreeFilter;
use crate::output::tree::{Branch, picked_tree};
use crate::stream::answer::{Held, Kill, Process, Sessions};
use crate::stream::events::{Event, LeakDetail, ProcessLabel, Ready};
use crate::stream::reading::{self, Line, each_line};
pub use at::At;
use at::Clocks;

/// Reaped processes kept for lineage, as a run keeps them by default (`--retain-dead`).
const RETAIN_DEAD: usize = 10_000;

/// Lines are written in the order a run took their records in, which is not quite the order
/// of their times (a CPU's records can wait a batch): a line this long past the moment ends
/// the reading.
const REORDER: u64 = 60_000_000_000;

/// An answer of a replay, and the moment it stands for.
#[derive(Clone, Debug)]
pub struct Replayed<T> {
    pub answer: T,
    /// The moment, boot-time ns on its run's clock.
    pub now: u64,
    /// The run's `booted_at_unix_ns`: the wall-clock time of its boot-time 0.
    pub booted_at_unix_ns: Option<u64>,
}

impl<T> Replayed<T> {
    /// The moment, for people: its wall-clock time when the audit says it.
    pub fn moment(&self) -> String {
        match self.booted_at_unix_ns {
            Some(boot) => at::wall_text(boot.saturating_add(self.now)),
            None => format!("boot-time {:.3} s", self.now as f64 / 1e9),
        }
    }
}

/// What `why PID --from AUDIT` found: with `at`, the process that had the pid then (alive,
/// or the last one that had it: as the API answers); without, each process that had the pid
/// in the audit, oldest first, each as it stood at its exit (with the flags it held then)
/// or at the audit's end.
pub fn why(inputs: &[PathBuf], pid: u32, at: Option<At>) -> Result<Vec<Replayed<Process>>> {
    let mut replay = Replay::new(at, Some(pid));
    replay.read_all(inputs)?;
    let now = replay.moment();
    let asked = match at {
        Some(_) => replay.graph.current(pid).map(|n| n.id),
        None => replay.last_asked,
    };
    if let Some(id) = asked {
        replay.answer(id, now);
    }
    Ok(replay.answers)
}

/// What `tree --from AUDIT` draws: the live tree `filter` picks at `at` (or at the audit's
/// end); none for a `gateway` not tracked then.
pub fn tree(
    inputs: &[PathBuf],
    filter: &TreeFilter,
    at: Option<At>,
) -> Result<Replayed<Option<Vec<Branch>>>> {
    let mut replay = Replay::new(at, None);
    replay.read_all(inputs)?;
    Ok(Replayed {
        answer: picked_tree(&replay.graph, &replay.held.by_node(), filter),
        now: replay.moment(),
        booted_at_unix_ns: replay.boot,
    })
}

/// What `sessions --from AUDIT` lists: the agent sessions of the processes alive at `at`
/// (or at the audit's end), under `gateway` if given (none for a gateway not tracked then).
/// Their memory is not read back (0).
pub fn sessions(
    inputs: &[PathBuf],
    gateway: Option<u32>,
    at: Option<At>,
) -> Result<Replayed<Option<Sessions>>> {
    let mut replay = Replay::new(at, None);
    replay.read_all(inputs)?;
    let now = replay.moment();
    let under = match gateway {
        Some(pid) => replay.graph.current(pid).map(|n| Some(n.id)),
        None => Some(None),
    };
    let answer = under.map(|under| Sessions {
        now,
        sessions: answer::sessions(&replay.graph, &replay.held, under, |_| None),
    });
    Ok(Replayed {
        answer,
        now,
        booted_at_unix_ns: replay.boot,
    })
}

/// An audit being read back. See the module documentation.
struct Replay {
    graph: LineageGraph,
    /// The flags holding: raised by `flag` lines, ended by `cleared` lines and by the run's
    /// end.
    held: HeldFlags,
    /// The pid `why` asks about, and what only its processes need: each one's last flag's
    /// evidence; and the `--kill` steps taken on each process (an inner process's answer
    /// names its server's).
    asked: Option<u32>,
    recorded: HashMap<NodeId, Box<LeakDetail>>,
    kills: HashMap<NodeId, Vec<String>>,
    /// The server each of them was last flagged as an inner process of: its outermost
    /// process, and the server from it down (the flag's `chain`).
    part_of: HashMap<NodeId, (NodeId, Vec<ProcessLabel>)>,
    /// The process that had the asked pid at the last line, and those answered already.
    last_asked: Option<NodeId>,
    answered: HashSet<NodeId>,
    answers: Vec<Replayed<Process>>,
    at: Option<At>,
    clocks: Clocks,
    /// Runs started so far.
    runs: u64,
    /// The current run's lines before its `ready`, which says its clock and whether it took
    /// the lineage back. `None` once it is ready.
    waiting: Option<Vec<(u64, Event)>>,
    /// The current run's `booted_at_unix_ns`, and the moment on its clock.
    boot: Option<u64>,
    cutoff: u64,
    /// The last line applied: its `ts`.
    now: u64,
    /// A line past the moment was met (the audit goes on after it), and one well past it:
    /// the rest is not read.
    beyond: bool,
    past: bool,
    lines: u64,
    /// The first error a line's run gave (a moment it cannot place).
    failed: Option<anyhow::Error>,
}

impl Replay {
    fn new(at: Option<At>, asked: Option<u32>) -> Replay {
        Replay {
            graph: LineageGraph::new(RETAIN_DEAD),
            held: HeldFlags::default(),
            asked,
            recorded: HashMap::default(),
            kills: HashMap::default(),
            part_of: HashMap::default(),
            last_asked: None,
            answered: HashSet::default(),
            answers: Vec::new(),
            at,
            clocks: Clocks::default(),
            runs: 0,
            waiting: Some(Vec::new()),
            boot: None,
            cutoff: u64::MAX,
            now: 0,
            beyond: false,
            past: false,
            lines: 0,
            failed: None,
        }
    }

    fn read_all(&mut self, inputs: &[PathBuf]) -> Result<()> {
        for input in inputs {
            each_line(reading::open(input)?, |line| {
                self.lines += 1;
                if let Line::Event(head, event) = line {
                    self.line(head.seq, head.ts, event);
                }
            })
            .with_context(|| format!("reading {}", input.display()))?;
            if let Some(e) = self.failed.take() {
                return Err(e);
            }
            if self.past {
                break;
            }
        }
        // The lines of a run that never said `ready` (killed while starting).
        self.start_unready_run()?;
        if self.clocks.first_ts.is_none() {
            return Err(reading::no_events(&inputs[0], self.lines));
        }
        Ok(())
    }

    fn line(&mut self, seq: Option<u64>, ts: u64, event: Event) {
        if self.past || self.failed.is_some() {
            return;
        }
        if self.clocks.first_ts.is_none() && seq != Some(0) {
            // The file begins mid-run (its older parts rotated away): no `ready` to wait for.
            if let Err(e) = self.apply_waiting(true) {
                self.failed = Some(e);
                return;
            }
        }
        self.clocks.first_ts.get_or_insert(ts);
        if seq == Some(0) {
            if let Err(e) = self.start_unready_run() {
                self.failed = Some(e);
                return;
            }
            self.waiting = Some(Vec::new());
        }
        match (&mut self.waiting, event) {
            (Some(_), Event::Ready(ready)) => {
                if let Err(e) = self.start_run(&ready) {
                    self.failed = Some(e);
                }
            }
            (Some(waiting), event) => waiting.push((ts, event)),
            (None, event) => self.timed(ts, event),
        }
    }

    /// A run's `ready`: its clock is known, and whether it goes on from the run before.
    fn start_run(&mut self, ready: &Ready) -> Result<()> {
        self.boot = ready.booted_at_unix_ns;
        if self.runs == 0 {
            self.clocks.first_boot = self.boot;
        }
        let fresh = ready.resumed.is_none();
        self.apply_waiting(fresh)
    }

    /// The lines of a run that never said `ready` (killed while starting; or the file begins
    /// mid-run), applied on what is known of its clock.
    fn start_unready_run(&mut self) -> Result<()> {
        if self.waiting.as_ref().is_none_or(Vec::is_empty) {
            return Ok(());
        }
        self.boot = None;
        self.apply_waiting(true)
    }

    fn apply_waiting(&mut self, fresh: bool) -> Result<()> {
        self.cutoff = match self.at {
            Some(at) => at.on_run_clock(self.clocks, self.boot)?,
            None => u64::MAX,
        };
        if fresh && self.runs > 0 {
            // A run that took nothing back knows only what it finds: the graph of the run
            // before ends here.
            if let Some(id) = self.last_asked.take().filter(|_| self.at.is_none()) {
                self.answer(id, self.now);
            }
            // What is kept by node is the old graph's: its ids start again in the new one.
            self.graph = LineageGraph::new(RETAIN_DEAD);
            self.answered.clear();
            self.recorded.clear();
            self.kills.clear();
            self.part_of.clear();
        }
        // The run before's flags ended with it: each run judges afresh.
        self.held.clear_everything();
        self.runs += 1;
        for (ts, event) in self.waiting.take().unwrap_or_default() {
            self.timed(ts, event);
        }
        Ok(())
    }

    /// A line of a ready run: applied when it is not past the moment.
    fn timed(&mut self, ts: u64, event: Event) {
        if ts > self.cutoff {
            self.beyond = true;
            self.past |= ts - self.cutoff > REORDER;
            return;
        }
        self.now = self.now.max(ts);
        let exit = matches!(&event, Event::Exit(e) if Some(e.pid) == self.asked);
        self.apply(ts, event);
        self.follow_asked(ts, exit);
    }

    /// Without a moment, each process that had the asked pid is answered as it stood at its
    /// exit (still holding its flags), or when the next one took the pid.
    fn follow_asked(&mut self, ts: u64, exited: bool) {
        let Some(pid) = self.asked.filter(|_| self.at.is_none()) else {
            return;
        };
        let current = self.graph.current(pid).map(|n| n.id);
        if current != self.last_asked {
            if let Some(old) = self.last_asked {
                self.answer(old, ts);
            }
            self.last_asked = current;
        }
        if exited && let Some(id) = current {
            self.answer(id, ts);
        }
    }

    /// Answers for process `id` as at `now`, once.
    fn answer(&mut self, id: NodeId, now: u64) {
        if !self.answered.insert(id) {
            return;
        }
        if let Some(process) = self.process(id, now) {
            self.answers.push(Replayed {
                answer: process,
                now,
                booted_at_unix_ns: self.boot,
            });
        }
    }

    /// Process `id` as `/v1/process` would show it (see [`answer::process`]): its lineage
    /// and state from the graph, its channels and spawn site as its last flag recorded them.
    fn process(&self, id: NodeId, now: u64) -> Option<Process> {
        let mut recorded = Recorded {
            flagged: &self.recorded,
            part_of: &self.part_of,
            kills: &self.kills,
        };
        answer::process(&self.graph, &self.held, id, &mut recorded, now)
    }

    /// The moment the replay stands at: the one asked for when the audit goes on after it,
    /// else its last line.
    fn moment(&self) -> u64 {
        match self.beyond {
            true => self.cutoff,
            false => self.now,
        }
    }

    /// What one line does to the graph and the flags, as its record did to the run's.
    fn apply(&mut self, ts: u64, event: Event) {
        match event {
            Event::Flag(flag) => {
                let Some(id) = self.graph.current(flag.pid).map(|n| n.id) else {
                    return;
                };
                // Raised again, it holds from the new line's `since`.
                self.held.clear(id, flag.reason);
                self.held.raise(id, flag.pid, flag.reason, flag.since);
                let Some(asked) = self.asked else { return };
                if asked == flag.pid {
                    self.recorded.insert(id, flag.detail);
                } else if let Some(at) = flag.detail.chain.iter().position(|m| m.pid == asked)
                    && let Some(inner) = self.graph.current(asked).map(|n| n.id)
                {
                    let mut chain = flag.detail.chain;
                    chain.truncate(at + 1);
                    self.part_of.insert(inner, (id, chain));
                }
            }
            Event::Cleared(c) => {
                let Some(id) = self.graph.current(c.pid).map(|n| n.id) else {
                    return;
                };
                self.held.clear(id, c.reason);
            }
            Event::Kill(k) => {
                if let Some(id) = self.graph.current(k.pid).map(|n| n.id) {
                    let step = format!("sent {} for {} ({})", k.signal, k.cause(), k.result);
                    self.kills.entry(id).or_default().push(step);
                }
            }
            // Every other line is the lineage's, or the run's own (see
            // `LineageGraph::replay`, which names each kind).
            lineage => {
                self.graph.replay(ts, &lineage);
            }
        }
    }
}

/// What an audit read back knows of a process beyond the graph and the flags: its last
/// flag's evidence, the server a flag named it part of, the `--kill` steps the run took.
struct Recorded<'a> {
    flagged: &'a HashMap<NodeId, Box<LeakDetail>>,
    part_of: &'a HashMap<NodeId, (NodeId, Vec<ProcessLabel>)>,
    kills: &'a HashMap<NodeId, Vec<String>>,
}

impl Witness for Recorded<'_> {
    fn detail(&mut self, graph: &LineageGraph, node: &Node) -> LeakDetail {
        // Named as the stream named them, not as /proc does now.
        let known = flags::detail_named(graph, node, None, |n| n.comm);
        match self.flagged.get(&node.id) {
            Some(flagged) => LeakDetail {
                lineage: known.lineage,
                ancestors: known.ancestors,
                ppid: known.ppid,
                escaped: known.escaped,
                argv: known.argv,
                thread: known.thread,
                state: match node.alive() {
                    true => flagged.state.clone(),
                    false => known.state,
                },
                ..(**flagged).clone()
            },
            None => known,
        }
    }

    fn server(&self, _: &LineageGraph, node: &Node) -> Option<(NodeId, Vec<ProcessLabel>)> {
        self.part_of.get(&node.id).cloned()
    }

    fn kill(&self, _: &LineageGraph, node: &Node, _: &[Held]) -> Kill {
        let steps = self.kills.get(&node.id);
        Kill {
            enabled: steps.is_some(),
            could: false,
            why: match steps {
                Some(steps) => format!("the run {}", steps.join(", ")),
                None => "what it would do is judged by a running audit, not read back".into(),
            },
        }
    }
}

#[cfg(test)]
mod tests;
