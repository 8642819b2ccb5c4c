//! `cargo xtask bench`: reaper-trace's cost and completeness, measured side by side with no
//! tracer and with its peers, in one run. Pairs are interleaved (A B A B ...) because these
//! machines are noisy; medians and min/max are printed, absolute rates are shown, nothing is
//! asserted.
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

use crate::debian;

/// Settings of one bench run.
pub struct BenchOptions {
    pub procs: usize,
    pub reps: usize,
    pub idle_secs: u64,
    pub sleepers: usize,
    /// The sections to run (all but `soak` when empty).
    pub only: Vec<String>,
    /// Minutes of churn for the soak section.
    pub soak_mins: u64,
    /// `--before REV`: this build's reader against REV's, side by side (bench_before.rs).
    pub before: Option<String>,
}

/// The bench's sections, in the order they run.
const SECTIONS: [&str; 9] = [
    "overhead", "reader", "hooks", "memory", "idle", "latency", "report", "before", "soak",
];

impl BenchOptions {
    pub fn parse(args: &[String]) -> Result<BenchOptions> {
        let mut o = BenchOptions {
            procs: 20_000,
            reps: 5,
            idle_secs: 60,
            sleepers: 10_000,
            only: Vec::new(),
            soak_mins: 30,
            before: None,
        };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut num = |name: &str| -> Result<usize> {
                it.next()
                    .and_then(|v| v.parse().ok())
                    .with_context(|| format!("{name} takes a number"))
            };
            match a.as_str() {
                "--procs" => o.procs = num("--procs")?,
                "--reps" => o.reps = num("--reps")?.max(1),
                "--idle-secs" => o.idle_secs = num("--idle-secs")? as u64,
                "--sleepers" => o.sleepers = num("--sleepers")?,
                "--soak-mins" => o.soak_mins = num("--soak-mins")?.max(1) as u64,
                "--quick" => {
                    o = BenchOptions {
                        procs: 3000,
                        reps: 3,
                        idle_secs: 10,
                        sleepers: 2000,
                        only: std::mem::take(&mut o.only),
                        soak_mins: o.soak_mins,
                        before: o.before.take(),
                    };
                }
                "--before" => {
                    o.before = Some(it.next().context("--before takes a git revision")?.clone())
                }
                "--only" => {
                    let list = it.next().context("--only takes a list like memory,idle")?;
                    for name in list.split(',') {
                        if !SECTIONS.contains(&name) {
                            bail!(
                                "bench: unknown section {name} (one of {})",
                                SECTIONS.join(", ")
                            );
                        }
                        o.only.push(name.to_owned());
                    }
                }
                other => bail!(
                    "bench: unknown option {other} (--procs N --reps N --idle-secs N --sleepers N --soak-mins N --quick --only LIST --before REV)"
                ),
            }
        }
        Ok(o)
    }
}

#[derive(Clone)]
pub struct Bins {
    pub reaper: PathBuf,
    pub shapes: PathBuf,
    pub scratch: PathBuf,
}

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
    fn shape(self) -> &'static str {
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

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Peer {
    Bpftrace,
    Forkstat,
    Perf,
}

impl Peer {
    fn name(self) -> &'static str {
        match self {
            Peer::Bpftrace => "bpftrace (printing fork/exec/exit)",
            Peer::Forkstat => "forkstat (proc connector)",
            Peer::Perf => "perf record (sched tracepoints)",
        }
    }
    fn package(self) -> (&'static str, &'static str) {
        match self {
            Peer::Bpftrace => ("bpftrace", "bpftrace"),
            Peer::Forkstat => ("forkstat", "forkstat"),
            Peer::Perf => ("perf", "linux-perf"),
        }
    }
}

pub fn run(root: &Path, opts: &BenchOptions) -> Result<()> {
    let bins = Bins {
        reaper: root.join("target/release/reaper-trace"),
        shapes: root.join("target/release/reaper-shapes"),
        scratch: root.join("target/bench"),
    };
    let _ = fs::remove_dir_all(&bins.scratch);
    fs::create_dir_all(&bins.scratch)?;
    let peers = install_peers();
    println!(
        "# reaper bench: {} processes a loop, {} interleaved runs of each, {} cores, kernel {}",
        opts.procs,
        opts.reps,
        thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
    );
    let wanted = |section: &str| opts.only.is_empty() || opts.only.iter().any(|s| s == section);
    if wanted("overhead") {
        overhead(&bins, opts, &peers)?;
    }
    if wanted("reader") {
        reader_cpu(&bins, opts)?;
    }
    if wanted("hooks") {
        hook_costs(&bins, opts)?;
    }
    if wanted("memory") {
        memory(&bins, opts)?;
    }
    if wanted("idle") {
        idle(&bins, opts)?;
    }
    if wanted("latency") {
        lone_latency(&bins)?;
    }
    if wanted("report") {
        crate::report_bench::run(&bins.reaper, &bins.scratch)?;
    }
    match (&opts.before, wanted("before")) {
        (Some(rev), true) => crate::bench_before::run(root, opts, rev)?,
        (None, true) if !opts.only.is_empty() => bail!("--only before needs --before REV"),
        _ => {}
    }
    // Half an hour at least: only when asked for by name.
    if opts.only.iter().any(|s| s == "soak") {
        crate::soak::run(&bins.reaper, opts.soak_mins)?;
    }
    Ok(())
}

/// Loop overhead and completeness against no tracer and the peers.
fn overhead(bins: &Bins, opts: &BenchOptions, peers: &[Peer]) -> Result<()> {
    let mut report = Vec::new();
    for lp in [Loop::ForkExit, Loop::ForkExec] {
        let mut watchers = vec![Watcher::ReaperUntracked, Watcher::ReaperTracked];
        watchers.extend(peers.iter().map(|&p| Watcher::Peer(p)));
        report.extend(compare(bins, lp, opts, 1, &watchers)?);
        report.extend(compare(
            bins,
            lp,
            opts,
            2,
            &[Watcher::ReaperTracked, Watcher::ReaperStalled],
        )?);
    }
    println!("\n## Overhead and completeness (ratio = loop time with the watcher / without)\n");
    println!(
        "| loop | loops at once | watcher | ratio median | min | max | rate without (/s) | forks / execs / exits reported | lost | consistent | latency p50 / p99 (worst run) | reaper-trace CPU (median, start-up incl.) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for line in &report {
        println!("{line}");
    }
    Ok(())
}

/// The reader's CPU per traced process: its CPU around a tracked loop of N processes (start-up,
/// BTF, seeding and the stop left out; see `measure_tracked`), divided by N, `reps` times.
fn reader_cpu(bins: &Bins, opts: &BenchOptions) -> Result<()> {
    let mut rows = Vec::new();
    for (lp, target_us) in [(Loop::ForkExit, 3.0), (Loop::ForkExec, 4.0)] {
        let mut per_proc = Vec::new();
        for rep in 0..opts.reps {
            eprintln!(
                "bench: reader CPU, {}, round {}/{}",
                lp.label(),
                rep + 1,
                opts.reps
            );
            let run = measure(bins, lp, opts.procs, 1, Watcher::ReaperTracked)?;
            per_proc.push(run.storm_cpu / run.created.max(1) as f64 * 1e6);
        }
        let (min, max) = (
            per_proc.iter().cloned().fold(f64::MAX, f64::min),
            per_proc.iter().cloned().fold(0.0, f64::max),
        );
        let med = median(&mut per_proc);
        rows.push(format!(
            "| {} | {med:.2} µs | {min:.2} µs | {max:.2} µs | ≤ {target_us:.0} µs | {} |",
            lp.label(),
            if med <= target_us { "met" } else { "not met" }
        ));
    }
    println!(
        "\n## Reader CPU per traced process (around a tracked loop of {})\n",
        opts.procs
    );
    println!("| loop | median | min | max | target | |");
    println!("|---|---|---|---|---|---|");
    for row in rows {
        println!("{row}");
    }
    Ok(())
}

pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() { 0.0 } else { v[v.len() / 2] }
}

/// Runs baseline and each watcher interleaved, `reps` times, and returns table rows.
fn compare(
    bins: &Bins,
    lp: Loop,
    opts: &BenchOptions,
    loops: usize,
    watchers: &[Watcher],
) -> Result<Vec<String>> {
    let mut base = Vec::new();
    let mut runs: Vec<Vec<LoopRun>> = vec![Vec::new(); watchers.len()];
    for rep in 0..opts.reps {
        eprintln!(
            "bench: {} x{loops}, round {}/{}",
            lp.label(),
            rep + 1,
            opts.reps
        );
        base.push(measure(bins, lp, opts.procs, loops, Watcher::Nobody)?);
        for (i, &w) in watchers.iter().enumerate() {
            runs[i].push(measure(bins, lp, opts.procs, loops, w)?);
        }
    }
    let base_secs: Vec<f64> = base.iter().map(|r| r.secs).collect();
    let base_median = median(&mut base_secs.clone());
    let mut rows = Vec::new();
    for (w, rs) in watchers.iter().zip(&runs) {
        let mut ratios: Vec<f64> = rs.iter().zip(&base_secs).map(|(r, b)| r.secs / b).collect();
        let mut secs: Vec<f64> = rs.iter().map(|r| r.secs).collect();
        let ratio = median(&mut secs) / base_median;
        let (min, max) = (
            ratios.iter().cloned().fold(f64::MAX, f64::min),
            ratios.iter().cloned().fold(0.0, f64::max),
        );
        let _ = median(&mut ratios);
        let traced = matches!(w, Watcher::ReaperTracked | Watcher::ReaperStalled);
        let worst = rs
            .iter()
            .min_by_key(|r| r.forks.min(r.exits))
            .cloned()
            .unwrap_or_default();
        let complete = if traced {
            let pct = |n: usize| 100.0 * n as f64 / worst.created.max(1) as f64;
            let execs = if lp == Loop::ForkExec {
                format!("{:.1}%", pct(worst.execs))
            } else {
                "—".into()
            };
            format!(
                "{:.1}% / {execs} / {:.1}% (worst run)",
                pct(worst.forks),
                pct(worst.exits)
            )
        } else {
            "—".into()
        };
        let (lost, consistent, latency, cpu) = if traced {
            let lost: u64 = rs.iter().map(|r| r.dropped + r.lost_events as u64).sum();
            let consistent = rs.iter().all(|r| r.consistent);
            let p99 = rs.iter().map(|r| r.latency_p99).max().unwrap_or(0);
            let p50 = rs.iter().map(|r| r.latency_p50).max().unwrap_or(0);
            let cpu = median(&mut rs.iter().map(|r| r.reader_cpu).collect::<Vec<_>>());
            (
                lost.to_string(),
                consistent.to_string(),
                format!("{} / {}", ms(p50), ms(p99)),
                format!("{cpu:.2} s"),
            )
        } else {
            ("—".into(), "—".into(), "—".into(), "—".into())
        };
        rows.push(format!(
            "| {} | {loops} | {} | {ratio:.3}x | {min:.3}x | {max:.3}x | {:.0} | {complete} | {lost} | {consistent} | {latency} | {cpu} |",
            lp.label(),
            watcher_name(*w),
            (opts.procs * loops) as f64 / base_median,
        ));
    }
    Ok(rows)
}

pub fn ms(ns: u64) -> String {
    format!("{:.2} ms", ns as f64 / 1e6)
}

fn watcher_name(w: Watcher) -> &'static str {
    match w {
        Watcher::Nobody => "none",
        Watcher::ReaperUntracked => "reaper-trace, storm untracked",
        Watcher::ReaperTracked => "reaper-trace, storm tracked",
        Watcher::ReaperStalled => "reaper-trace tracked, reader stopped 1 s",
        Watcher::Peer(p) => p.name(),
    }
}

/// The shell command that runs `loops` copies of the loop and waits for them.
fn loop_script(bins: &Bins, lp: Loop, n: usize, loops: usize, tag: &str) -> (String, Vec<PathBuf>) {
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
struct Truths {
    /// The slowest loop's duration.
    secs: f64,
    /// The pids the loops created.
    pids: HashSet<u64>,
    /// How many processes that was (more than the pids when pids were reused).
    created: usize,
    /// Their CPU time and their children's, in seconds.
    cpu: f64,
}

fn read_truths(truths: &[PathBuf]) -> Result<Truths> {
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

fn sh(script: &str) -> Result<()> {
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
fn measure_tracked(bins: &Bins, script: &str, truths: &[PathBuf]) -> Result<LoopRun> {
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
        .args(["--json", "--quiet", "--", "sh", "-c", &held])
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
fn run_time_ns(pid: u32) -> Result<u64> {
    let text = fs::read_to_string(format!("/proc/{pid}/schedstat"))?;
    text.split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .context("reading /proc/PID/schedstat")
}

/// What reaper-trace reported about the processes `pids`.
fn completeness(ndjson: &Path, pids: &HashSet<u64>) -> Result<LoopRun> {
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
struct Bystander {
    tracer: Child,
    gateway: u32,
}

impl Bystander {
    fn start(bins: &Bins) -> Result<Bystander> {
        Self::start_with(bins, &["--json", "--quiet", "--", "sleep", "3600"])
    }

    fn start_with(bins: &Bins, args: &[&str]) -> Result<Bystander> {
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

    fn pid(&self) -> u32 {
        self.tracer.id()
    }

    fn stop(mut self) -> Result<()> {
        // SAFETY: signals processes this bench started.
        unsafe {
            libc::kill(self.gateway as i32, libc::SIGKILL);
        }
        self.tracer.wait()?;
        Ok(())
    }
}

struct PeerRun {
    child: Child,
}

impl PeerRun {
    fn start(peer: Peer, scratch: &Path) -> Result<PeerRun> {
        let mut cmd = match peer {
            Peer::Bpftrace => {
                let mut c = Command::new("bpftrace");
                c.arg("-e").arg(
                    "tracepoint:sched:sched_process_fork { printf(\"fork %d %d\\n\", args->parent_pid, args->child_pid); } \
                     tracepoint:sched:sched_process_exec { printf(\"exec %d\\n\", pid); } \
                     tracepoint:sched:sched_process_exit { printf(\"exit %d\\n\", pid); }",
                );
                c
            }
            Peer::Forkstat => {
                let mut c = Command::new("forkstat");
                c.args(["-e", "fork,exec,exit"]);
                c
            }
            Peer::Perf => {
                let mut c = Command::new("perf");
                c.args(["record", "-a", "-q", "-o"])
                    .arg(scratch.join("perf.data"))
                    .args([
                        "-e",
                        "sched:sched_process_fork",
                        "-e",
                        "sched:sched_process_exec",
                        "-e",
                        "sched:sched_process_exit",
                    ]);
                c
            }
        };
        let child = cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn()?;
        // No reliable readiness line across the three: give them time to attach.
        thread::sleep(Duration::from_secs(2));
        Ok(PeerRun { child })
    }

    fn stop(mut self) -> Result<()> {
        // SAFETY: signals a process this bench started.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        self.child.wait()?;
        Ok(())
    }
}

/// Installs the peers from Debian when missing; returns those that are there.
fn install_peers() -> Vec<Peer> {
    // bpftool only names the programs in the hook-cost table.
    debian::ensure("bpftool", "bpftool", "the bench");
    let mut have = Vec::new();
    for peer in [Peer::Perf, Peer::Forkstat, Peer::Bpftrace] {
        let (bin, pkg) = peer.package();
        if debian::ensure(bin, pkg, "the bench") {
            have.push(peer);
        } else {
            println!("(peer {bin} unavailable: `apt-get install {pkg}` failed)");
        }
    }
    have
}

/// Per-hook kernel cost from the kernel's own BPF run-time statistics.
fn hook_costs(bins: &Bins, opts: &BenchOptions) -> Result<()> {
    let sysctl = Path::new("/proc/sys/kernel/bpf_stats_enabled");
    let before = fs::read_to_string(sysctl).unwrap_or_else(|_| "0".into());
    fs::write(sysctl, "1").context("enabling kernel.bpf_stats_enabled")?;
    let result = (|| -> Result<()> {
        println!("\n## Kernel cost per hook (kernel.bpf_stats_enabled: run_time_ns / run_cnt)\n");
        println!("| storm | program | runs | ns per run |");
        println!("|---|---|---|---|");
        // Untracked: reaper-trace watches an idle gateway while a storm runs beside it.
        let bystander = Bystander::start(bins)?;
        let (script, truths) = loop_script(bins, Loop::ForkExec, opts.procs, 1, "stats");
        sh(&script)?;
        read_truths(&truths)?;
        for (name, runs, ns) in prog_stats(bystander.pid())? {
            println!(
                "| untracked fork+exec | {name} | {runs} | {:.0} |",
                ns as f64 / runs.max(1) as f64
            );
        }
        bystander.stop()?;
        // Tracked: the storm is the gateway; stats are read while it lingers at the end.
        let (script, truths) = loop_script(bins, Loop::ForkExec, opts.procs, 1, "stats");
        let gateway = format!("{script}; sleep 3");
        let mut tracer = Command::new(&bins.reaper)
            .args(["--json", "--quiet", "--", "sh", "-c", &gateway])
            .stdout(Stdio::null())
            .spawn()?;
        while !truths[0].exists() {
            thread::sleep(Duration::from_millis(50));
        }
        thread::sleep(Duration::from_millis(500));
        for (name, runs, ns) in prog_stats(tracer.id())? {
            println!(
                "| tracked fork+exec | {name} | {runs} | {:.0} |",
                ns as f64 / runs.max(1) as f64
            );
        }
        tracer.wait()?;
        read_truths(&truths)?;
        Ok(())
    })();
    let _ = fs::write(sysctl, before.trim());
    result
}

/// (program name, run count, run time ns) of every BPF program reaper-trace holds.
fn prog_stats(pid: u32) -> Result<Vec<(String, u64, u64)>> {
    let mut out = Vec::new();
    for entry in fs::read_dir(format!("/proc/{pid}/fdinfo"))? {
        let text = fs::read_to_string(entry?.path()).unwrap_or_default();
        let field = |k: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(k))
                .map(|v| v.trim().to_owned())
        };
        let (Some(id), Some(runs), Some(ns)) =
            (field("prog_id:"), field("run_cnt:"), field("run_time_ns:"))
        else {
            continue;
        };
        let name = prog_name(&id);
        out.push((name, runs.parse().unwrap_or(0), ns.parse().unwrap_or(0)));
    }
    out.sort();
    Ok(out)
}

/// The program's name from the kernel's listing, via bpftool when present, else its id.
fn prog_name(id: &str) -> String {
    Command::new("bpftool")
        .args(["prog", "show", "id", id])
        .output()
        .ok()
        .and_then(|o| {
            let s = String::from_utf8_lossy(&o.stdout).into_owned();
            s.split_whitespace()
                .skip_while(|w| *w != "name")
                .nth(1)
                .map(str::to_owned)
        })
        .unwrap_or_else(|| format!("prog {id}"))
}

/// A `kB` field of /proc/PID/status (`VmRSS:`, `VmHWM:`, ...).
pub fn rss_kib(pid: u32, key: &str) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// reaper-trace with `n` quiet tracked sleepers as its gateway's children, once all of them
/// are forked; they exit after `secs` seconds, and so does the run.
fn start_sleepers(bins: &Bins, name: &str, n: usize, secs: f64) -> Result<Child> {
    let truth = bins.scratch.join(format!("{name}.json"));
    let ready = bins.scratch.join(format!("{name}.json.ready"));
    let gateway = format!(
        "{} sleepers {} {n} {secs}",
        bins.shapes.display(),
        truth.display()
    );
    let tracer = Command::new(&bins.reaper)
        .args(["--json", "--quiet", "--", "sh", "-c", &gateway])
        .stdout(Stdio::null())
        .spawn()?;
    while !ready.exists() {
        thread::sleep(Duration::from_millis(50));
    }
    Ok(tracer)
}

/// Peak RSS with many live tracked processes.
fn memory(bins: &Bins, opts: &BenchOptions) -> Result<()> {
    let idle = Bystander::start(bins)?;
    thread::sleep(Duration::from_millis(300));
    let empty = rss_kib(idle.pid(), "VmRSS:");
    idle.stop()?;
    let mut tracer = start_sleepers(bins, "sleepers", opts.sleepers, 3.0)?;
    thread::sleep(Duration::from_millis(1500));
    let peak = rss_kib(tracer.id(), "VmHWM:");
    let steady = rss_kib(tracer.id(), "VmRSS:");
    let anon = rss_kib(tracer.id(), "RssAnon:");
    tracer.wait()?;
    let mib = |kib: u64| kib as f64 / 1024.0;
    println!("\n## Memory\n");
    println!("| reaper-trace | RSS |\n|---|---|");
    println!("| tracking one idle process | {:.1} MiB |", mib(empty));
    println!(
        "| tracking {} live processes | {:.1} MiB (anonymous: {:.1} MiB) |",
        opts.sleepers,
        mib(steady),
        mib(anon)
    );
    println!("| peak (VmHWM), start-up included | {:.1} MiB |", mib(peak));
    println!(
        "| per tracked process | {:.0} bytes |",
        (steady.saturating_sub(empty) * 1024) as f64 / opts.sleepers as f64
    );
    Ok(())
}

fn cpu_ticks(pid: u32) -> u64 {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15; `rest` starts at field 3.
    f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
}

/// CPU used while 1,000 quiet tracked processes do nothing.
fn idle(bins: &Bins, opts: &BenchOptions) -> Result<()> {
    let secs = opts.idle_secs as f64;
    let mut tracer = start_sleepers(bins, "idle", 1000, secs + 2.0)?;
    thread::sleep(Duration::from_millis(500));
    let t0 = cpu_ticks(tracer.id());
    let start = Instant::now();
    thread::sleep(Duration::from_secs(opts.idle_secs));
    let used = (cpu_ticks(tracer.id()) - t0) as f64 / 100.0;
    let wall = start.elapsed().as_secs_f64();
    tracer.wait()?;
    println!("\n## Idle cost\n");
    println!(
        "reaper-trace CPU over {wall:.0} s with 1000 quiet tracked processes: {used:.2} s = {:.3}% of one core",
        100.0 * used / wall
    );
    Ok(())
}

/// Latency of a lone fork on a quiet system.
fn lone_latency(bins: &Bins) -> Result<()> {
    let l = quiet_latency(bins)?;
    println!("\n## Latency on a quiet system\n");
    println!(
        "kernel event → applied to the graph, {} records of lone processes: p50 {}, p99 {}, max {}",
        l["count"],
        ms(l["p50"].as_u64().unwrap_or(0)),
        ms(l["p99"].as_u64().unwrap_or(0)),
        ms(l["max"].as_u64().unwrap_or(0))
    );
    Ok(())
}

/// The summary's `latency_ns` of a run whose records come a process at a time, 50 ms apart
/// (a hundred lone `/bin/true`s: about 800 records).
pub fn quiet_latency(bins: &Bins) -> Result<Value> {
    let out = bins.scratch.join("lone.ndjson");
    Command::new(&bins.reaper)
        .args([
            "--json",
            "--quiet",
            "--",
            "sh",
            "-c",
            "for i in $(seq 100); do /bin/true; sleep 0.05; done",
        ])
        .stdout(fs::File::create(&out)?)
        .status()?;
    let summary: Value = fs::read_to_string(&out)?
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["event"] == "summary")
        .context("no summary")?;
    Ok(summary["latency_ns"].clone())
}
