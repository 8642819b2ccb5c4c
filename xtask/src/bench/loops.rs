//! The loops the bench runs (fork+exit, fork+exec), who watches them, and what a watched run
//! reported: counts, completeness, latency, reaper-trace's CPU.
use std::{
    collections::HashSet,
    fs,
    io::{BufRead, BufReader, Read},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use super::*;

/// What one measured loop produced.
#[derive(Clone, Debug, Default)]
pub struct LoopRun {
    /// The loop's own duration (the slowest loop when two run at once).
    pub secs: f64,
    /// Processes created.
    pub created: usize,
    /// With reaper-trace tracking them: forks, execs, exits reported for them, and the
    /// summary's delivery and latency.
    pub forks: usize,
    pub execs: usize,
    pub exits: usize,
    pub lost_events: usize,
    pub dropped: u64,
    pub consistent: bool,
    pub latency_p50: u64,
    pub latency_p99: u64,
    /// reaper-trace's own CPU time (user + system) for the run, start-up included.
    pub reader_cpu: f64,
    /// The loops' own CPU time and their children's, in seconds.
    pub loop_cpu: f64,
    /// With reaper-trace tracking them: its CPU time from just before the loops started to
    /// just after they ended and it took in their last records (start-up and stop left out).
    pub storm_cpu: f64,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Loop {
    ForkExit,
    ForkExec,
}

impl Loop {
    pub(crate) fn shape(self) -> &'static str {
        match self {
            Loop::ForkExit => "storm",
            Loop::ForkExec => "storm-exec",
        }
    }
    pub fn label(self) -> &'static str {
        match self {
            Loop::ForkExit => "fork+exit",
            Loop::ForkExec => "fork+exec",
        }
    }
}

/// Who watches the loop.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Watcher {
    Nobody,
    /// reaper-trace traces an unrelated gateway.
    ReaperUntracked,
    /// the loop is the gateway: every process tracked.
    ReaperTracked,
    /// tracked, with reaper-trace stopped (SIGSTOP) for a second during the storm.
    ReaperStalled,
    Peer(Peer),
}

pub(crate) fn watcher_name(w: Watcher) -> &'static str {
    match w {
        Watcher::Nobody => "none",
        Watcher::ReaperUntracked => "reaper-trace, storm untracked",
        Watcher::ReaperTracked => "reaper-trace, storm tracked",
        Watcher::ReaperStalled => "reaper-trace tracked, reader stopped 1 s",
        Watcher::Peer(p) => p.name(),
    }
}

/// The shell command that runs `loops` copies of the loop and waits for them.
pub(crate) fn loop_script(
    bins: &Bins,
    lp: Loop,
    n: usize,
    loops: usize,
    tag: &str,
) -> (String, Vec<PathBuf>) {
    let truths: Vec<PathBuf> = (0..loops)
        .map(|i| bins.scratch.join(format!("{tag}-{i}.json")))
        .collect();
    let cmds: Vec<String> = truths
        .iter()
        .map(|t| {
            format!(
                "{} {} {} {n}",
                bins.shapes.display(),
                lp.shape(),
                t.display()
            )
        })
        .collect();
    (format!("{} & wait", cmds.join(" & ")), truths)
}

/// What the loops recorded themselves.
pub(crate) struct Truths {
    /// The slowest loop's duration.
    secs: f64,
    /// The pids the loops created.
    pids: HashSet<u64>,
    /// How many processes that was (more than the pids when pids were reused).
    pub(crate) created: usize,
    /// Their CPU time and their children's, in seconds.
    pub(crate) cpu: f64,
}

pub(crate) fn read_truths(truths: &[PathBuf]) -> Result<Truths> {
    let mut secs: f64 = 0.0;
    let mut pids = HashSet::new();
    let mut created = 0;
    let mut cpu = 0.0;
    for t in truths {
        let text = fs::read_to_string(t).with_context(|| format!("{}", t.display()))?;
        let v: Value = serde_json::from_str(&text)?;
        secs = secs.max(v["elapsed_ns"].as_u64().unwrap_or(0) as f64 / 1e9);
        let children = v["children"].as_array().cloned().unwrap_or_default();
        created += children.len();
        pids.extend(children.iter().filter_map(Value::as_u64));
        cpu += v["cpu_us"].as_u64().unwrap_or(0) as f64 / 1e6;
        let _ = fs::remove_file(t);
    }
    Ok(Truths {
        secs,
        pids,
        created,
        cpu,
    })
}

pub fn measure(bins: &Bins, lp: Loop, n: usize, loops: usize, w: Watcher) -> Result<LoopRun> {
    let (script, truths) = loop_script(bins, lp, n, loops, "loop");
    match w {
        Watcher::Nobody => {
            sh(&script)?;
        }
        Watcher::ReaperUntracked => {
            let bystander = Bystander::start(bins)?;
            sh(&script)?;
            bystander.stop()?;
        }
        Watcher::ReaperTracked => return measure_tracked(bins, &script, &truths),
        Watcher::ReaperStalled => {
            let script = if w == Watcher::ReaperStalled {
                // The gateway's parent is reaper-trace: stop it for a second mid-storm.
                format!("( sleep 0.3; kill -STOP $PPID; sleep 1; kill -CONT $PPID ) & {script}")
            } else {
                script
            };
            let out = bins.scratch.join("tracked.ndjson");
            let status = Command::new(&bins.reaper)
                .args(["--json", "--quiet", "--", "sh", "-c", &script])
                .stdout(fs::File::create(&out)?)
                .status()?;
            if !status.success() {
                bail!("reaper-trace failed: {status}");
            }
            let t = read_truths(&truths)?;
            let mut run = completeness(&out, &t.pids)?;
            run.secs = t.secs;
            run.created = t.created;
            run.loop_cpu = t.cpu;
            return Ok(run);
        }
        Watcher::Peer(p) => {
            let peer = PeerRun::start(p, &bins.scratch)?;
            sh(&script)?;
            peer.stop()?;
        }
    }
    let t = read_truths(&truths)?;
    Ok(LoopRun {
        secs: t.secs,
        created: t.created,
        loop_cpu: t.cpu,
        ..Default::default()
    })
}

pub(crate) fn sh(script: &str) -> Result<()> {
    let status = Command::new("sh").args(["-c", script]).status()?;
    if !status.success() {
        bail!("`{script}` failed: {status}");
    }
    Ok(())
}

/// A tracked run whose reaper-trace CPU is read around the loops alone: the gateway waits on a
/// FIFO before the loops and on another after them (a blocked `read`, which forks nothing the
/// run would trace), and reaper-trace's run time (`/proc/PID/schedstat`, ns) is read after
/// `ready`, then once the loops wrote their truth and the stream went quiet.
pub(crate) fn measure_tracked(bins: &Bins, script: &str, truths: &[PathBuf]) -> Result<LoopRun> {
    measure_tracked_with(bins, script, truths, &[], |_| Ok(()))
}

/// [`measure_tracked`], with `args` given to reaper-trace and `on_ready` run once it is ready
/// (before the loops start), with reaper-trace's pid.
pub(crate) fn measure_tracked_with(
    bins: &Bins,
    script: &str,
    truths: &[PathBuf],
    args: &[&str],
    on_ready: impl FnOnce(u32) -> Result<()>,
) -> Result<LoopRun> {
    let (go, done) = (bins.scratch.join("go"), bins.scratch.join("done"));
    for fifo in [&go, &done] {
        let _ = fs::remove_file(fifo);
        let made = Command::new("mkfifo").arg(fifo).status()?;
        if !made.success() {
            bail!("mkfifo {} failed ({made})", fifo.display());
        }
    }
    let wait_for = |f: &Path| format!("read _ < {}", f.display());
    let held = format!("{}; {script}; {}", wait_for(&go), wait_for(&done));
    let out = bins.scratch.join("tracked.ndjson");
    let mut tracer = Command::new(&bins.reaper)
        .args(["--json", "--quiet"])
        .args(args)
        .args(["--", "sh", "-c", &held])
        .stdout(fs::File::create(&out)?)
        .spawn()?;
    let pid = tracer.id();
    let patience = Instant::now() + Duration::from_secs(120);
    let ready = || fs::read_to_string(&out).is_ok_and(|t| t.contains("\"event\":\"ready\""));
    while !ready() {
        if Instant::now() > patience || tracer.try_wait()?.is_some() {
            bail!("reaper-trace never became ready");
        }
        thread::sleep(Duration::from_millis(10));
    }
    on_ready(pid)?;
    let before = run_time_ns(pid)?;
    // Opening a FIFO to write waits for its reader: the gateway, already waiting.
    fs::write(&go, "\n")?;
    while !truths.iter().all(|t| t.exists()) {
        if Instant::now() > patience + Duration::from_secs(600) {
            bail!("the loops never ended");
        }
        thread::sleep(Duration::from_millis(10));
    }
    // The last records are taken in within a poll period or two (16 ms at most while they
    // stream): wait until the stream stops growing.
    let mut size = 0;
    loop {
        thread::sleep(Duration::from_millis(100));
        let now = fs::metadata(&out)?.len();
        if now == size {
            break;
        }
        size = now;
    }
    let after = run_time_ns(pid)?;
    fs::write(&done, "\n")?;
    let status = tracer.wait()?;
    if !status.success() {
        bail!("reaper-trace failed: {status}");
    }
    let t = read_truths(truths)?;
    let mut run = completeness(&out, &t.pids)?;
    run.secs = t.secs;
    run.created = t.created;
    run.loop_cpu = t.cpu;
    run.storm_cpu = after.saturating_sub(before) as f64 / 1e9;
    Ok(run)
}

/// A process's time on a CPU so far, in ns (the first field of `/proc/PID/schedstat`).
pub(crate) fn run_time_ns(pid: u32) -> Result<u64> {
    let text = fs::read_to_string(format!("/proc/{pid}/schedstat"))?;
    text.split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .context("reading /proc/PID/schedstat")
}

/// What reaper-trace reported about the processes `pids`.
pub(crate) fn completeness(ndjson: &Path, pids: &HashSet<u64>) -> Result<LoopRun> {
    let mut run = LoopRun {
        created: pids.len(),
        ..Default::default()
    };
    for line in BufReader::new(fs::File::open(ndjson)?).lines() {
        let v: Value = serde_json::from_str(&line?)?;
        let about = v["pid"].as_u64().is_some_and(|p| pids.contains(&p));
        match v["event"].as_str() {
            Some("fork") if about => run.forks += 1,
            Some("exec") if about => run.execs += 1,
            Some("exit") if about => run.exits += 1,
            Some("lost") => run.lost_events += 1,
            Some("summary") => {
                let d = &v["delivery"];
                run.dropped = d["dropped"]
                    .as_object()
                    .map(|o| o.values().filter_map(Value::as_u64).sum())
                    .unwrap_or(0);
                run.consistent = d["consistent"] == true;
                run.latency_p50 = v["latency_ns"]["p50"].as_u64().unwrap_or(0);
                run.latency_p99 = v["latency_ns"]["p99"].as_u64().unwrap_or(0);
                run.reader_cpu = v["cpu_ns"].as_u64().unwrap_or(0) as f64 / 1e9;
            }
            _ => {}
        }
    }
    Ok(run)
}

/// reaper-trace tracing an unrelated, idle gateway.
pub(crate) struct Bystander {
    tracer: Child,
    gateway: u32,
}

impl Bystander {
    pub(crate) fn start(bins: &Bins) -> Result<Bystander> {
        Self::start_with(bins, &["--json", "--quiet", "--", "sleep", "3600"])
    }

    pub(crate) fn start_with(bins: &Bins, args: &[&str]) -> Result<Bystander> {
        let mut tracer = Command::new(&bins.reaper)
            .args(args)
            .stdout(Stdio::piped())
            .spawn()?;
        let mut out = BufReader::new(tracer.stdout.take().context("stdout")?);
        let gateway = loop {
            let mut line = String::new();
            if out.read_line(&mut line)? == 0 {
                bail!("reaper-trace ended before ready");
            }
            let v: Value = serde_json::from_str(&line)?;
            if v["event"] == "ready" {
                break v["gateway"][0].as_u64().unwrap_or(0) as u32;
            }
        };
        // Keep draining its output so it never blocks on a full pipe.
        thread::spawn(move || {
            let mut sink = Vec::new();
            let _ = out.read_to_end(&mut sink);
        });
        Ok(Bystander { tracer, gateway })
    }

    pub(crate) fn pid(&self) -> u32 {
        self.tracer.id()
    }

    pub(crate) fn stop(mut self) -> Result<()> {
        // SAFETY: signals processes this bench started.
        unsafe {
            libc::kill(self.gateway as i32, libc::SIGKILL);
        }
        self.tracer.wait()?;
        Ok(())
    }
}
