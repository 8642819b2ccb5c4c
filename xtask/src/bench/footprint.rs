//! What reaper-trace costs apart from the loops: its reader's CPU per process, its memory,
//! its CPU while idle, and a lone record's latency.
use std::{
    fs,
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use serde_json::Value;

use super::*;

/// The reader's CPU per traced process: its CPU around a tracked loop of N processes (start-up,
/// BTF, seeding and the stop left out; see `measure_tracked`), divided by N, `reps` times.
pub(crate) fn reader_cpu(bins: &Bins, opts: &BenchOptions) -> Result<()> {
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

/// A `kB` field of /proc/PID/status (`VmRSS:`, `VmHWM:`, ...).
pub fn rss_kib(pid: u32, key: &str) -> u64 {
    kib_field(&format!("/proc/{pid}/status"), key)
}

/// The proportional set size (`Pss:` of /proc/PID/smaps_rollup), kB: memory counted once
/// however often it is mapped. The ring's data pages are mapped twice in a row (a record that
/// wraps reads straight on), so RSS counts them twice and PSS once.
pub fn pss_kib(pid: u32) -> u64 {
    kib_field(&format!("/proc/{pid}/smaps_rollup"), "Pss:")
}

fn kib_field(path: &str, key: &str) -> u64 {
    fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// reaper-trace with `n` quiet tracked sleepers as its gateway's children, once all of them
/// are forked; they exit after `secs` seconds, and so does the run.
pub(crate) fn start_sleepers(bins: &Bins, name: &str, n: usize, secs: f64) -> Result<Child> {
    start_sleepers_with(bins, name, n, secs, "auto", Spawner::Shapes)
}

/// Who forks the sleepers.
#[derive(Clone, Copy)]
pub(crate) enum Spawner {
    /// reaper-shapes' `sleepers` (Rust, through the C library's fork).
    Shapes,
    /// A python3 gateway, each sleeper a `subprocess.Popen` of `sleep` reading the gateway's
    /// pipe (as a Python MCP host starts its servers).
    Python,
    /// As `Python`, each sleeper started in an agent session of its own (`AGENT_SESSION_ID`).
    PythonSessions,
}

/// The Python gateway of [`Spawner::Python`]: `n` sleepers, TRUTH.ready once all run, then
/// `secs` seconds and the end of them all.
const PYTHON_SLEEPERS: &str = r#"import os, subprocess, sys, time
truth, n, secs, tagged = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4] == "sessions"
rd, wr = os.pipe()
def start_sleeper(i):
    env = dict(os.environ, AGENT_SESSION_ID=f"bench-session-{i}") if tagged else None
    return subprocess.Popen(["sleep", "3600"], stdin=rd, stdout=subprocess.DEVNULL, env=env)
sleepers = [start_sleeper(i) for i in range(n)]
open(truth + ".ready", "w").close()
time.sleep(secs)
for s in sleepers:
    s.kill()
for s in sleepers:
    s.wait()
"#;

/// As [`start_sleepers`], with `--spawn-stacks stacks`, the sleepers forked by `spawner`.
pub(crate) fn start_sleepers_with(
    bins: &Bins,
    name: &str,
    n: usize,
    secs: f64,
    stacks: &str,
    spawner: Spawner,
) -> Result<Child> {
    start_sleepers_given(bins, name, n, secs, &["--spawn-stacks", stacks], spawner)
}

/// As [`start_sleepers`], reaper-trace given `args`, the sleepers forked by `spawner`.
pub(crate) fn start_sleepers_given(
    bins: &Bins,
    name: &str,
    n: usize,
    secs: f64,
    args: &[&str],
    spawner: Spawner,
) -> Result<Child> {
    let truth = bins.scratch.join(format!("{name}.json"));
    let ready = bins.scratch.join(format!("{name}.json.ready"));
    let _ = fs::remove_file(&ready);
    let gateway: Vec<String> = match spawner {
        Spawner::Shapes => {
            let shape = format!(
                "{} sleepers {} {n} {secs}",
                bins.shapes.display(),
                truth.display()
            );
            vec!["sh".into(), "-c".into(), shape]
        }
        Spawner::Python | Spawner::PythonSessions => vec![
            "python3".into(),
            "-c".into(),
            PYTHON_SLEEPERS.into(),
            truth.display().to_string(),
            n.to_string(),
            secs.to_string(),
            match spawner {
                Spawner::PythonSessions => "sessions".into(),
                _ => "none".into(),
            },
        ],
    };
    let tracer = Command::new(&bins.reaper)
        .args(["--json", "--quiet"])
        .args(args)
        .arg("--")
        .args(&gateway)
        .stdout(Stdio::null())
        .spawn()?;
    while !ready.exists() {
        thread::sleep(Duration::from_millis(50));
    }
    Ok(tracer)
}

/// RSS with many live tracked processes: the Rust sleepers and a Python gateway's, each with
/// the spawn stacks taken (`auto`, the default) and without (`off`).
pub(crate) fn memory(bins: &Bins, opts: &BenchOptions) -> Result<()> {
    let idle = Bystander::start(bins)?;
    thread::sleep(Duration::from_millis(300));
    let empty = rss_kib(idle.pid(), "VmRSS:");
    idle.stop()?;
    let mib = |kib: u64| kib as f64 / 1024.0;
    println!("\n## Memory\n");
    println!(
        "reaper-trace tracking one idle process: {:.1} MiB\n",
        mib(empty)
    );
    println!(
        "| {} live processes forked by | --spawn-stacks | RSS | PSS | anonymous | peak (VmHWM) | per process |",
        opts.sleepers
    );
    println!("|---|---|---|---|---|---|---|");
    let spawners = [
        (Spawner::Shapes, "reaper-shapes (Rust)"),
        (Spawner::Python, "python3"),
    ];
    for (spawner, label) in spawners {
        for stacks in ["auto", "off"] {
            let mut tracer =
                start_sleepers_with(bins, "sleepers", opts.sleepers, 3.0, stacks, spawner)?;
            // Past a scan or two: every sleeper flagged (accumulating) and its spawn named.
            thread::sleep(Duration::from_millis(2500));
            let peak = rss_kib(tracer.id(), "VmHWM:");
            let steady = rss_kib(tracer.id(), "VmRSS:");
            let pss = pss_kib(tracer.id());
            let anon = rss_kib(tracer.id(), "RssAnon:");
            tracer.wait()?;
            println!(
                "| {label} | {stacks} | {:.1} MiB | {:.1} MiB | {:.1} MiB | {:.1} MiB | {:.0} bytes |",
                mib(steady),
                mib(pss),
                mib(anon),
                mib(peak),
                (steady.saturating_sub(empty) * 1024) as f64 / opts.sleepers as f64
            );
        }
    }
    Ok(())
}

pub(crate) fn cpu_ticks(pid: u32) -> u64 {
    stat_ticks(&format!("/proc/{pid}/stat"))
}

/// The CPU ticks of the thread of process `pid` named `comm` (the main thread: the
/// process's own command), 0 when it has none.
pub(crate) fn thread_ticks(pid: u32, comm: &str) -> u64 {
    let tasks = fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten();
    tasks
        .flatten()
        .map(|task| task.path())
        .find(|task| fs::read_to_string(task.join("comm")).is_ok_and(|c| c.trim_end() == comm))
        .map_or(0, |task| stat_ticks(&task.join("stat").to_string_lossy()))
}

/// utime + stime of a `stat` file.
fn stat_ticks(path: &str) -> u64 {
    let stat = fs::read_to_string(path).unwrap_or_default();
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15; `rest` starts at field 3.
    f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
}

/// CPU used while 1,000 quiet tracked processes do nothing.
pub(crate) fn idle(bins: &Bins, opts: &BenchOptions) -> Result<()> {
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

/// Latency of a lone fork on a quiet system: processes far apart (the reader asleep between),
/// then closer (the reader woken by one, ticking, going idle, woken by the next: the pace at
/// which a wake-up taken by another drain once left every later record to the 100 ms
/// housekeeping poll: p99 53 to 100 ms in 8 of 13 runs).
pub(crate) fn lone_latency(bins: &Bins) -> Result<()> {
    println!("\n## Latency on a quiet system\n");
    for (count, gap) in [(100, "0.05"), (1500, "0.008")] {
        let l = quiet_latency(bins, count, gap)?;
        println!(
            "kernel event → applied to the graph, {} records of {count} lone processes {gap} s apart: p50 {}, p99 {}, max {}",
            l["count"],
            ms(l["p50"].as_u64().unwrap_or(0)),
            ms(l["p99"].as_u64().unwrap_or(0)),
            ms(l["max"].as_u64().unwrap_or(0))
        );
    }
    Ok(())
}

/// The summary's `latency_ns` of a run whose records come a process at a time: `count` lone
/// `/bin/true`s, `gap` seconds apart (about 8 records each).
pub fn quiet_latency(bins: &Bins, count: usize, gap: &str) -> Result<Value> {
    let out = bins.scratch.join("lone.ndjson");
    let script = format!("for i in $(seq {count}); do /bin/true; sleep {gap}; done");
    Command::new(&bins.reaper)
        .args(["--json", "--quiet", "--", "sh", "-c", &script])
        .stdout(fs::File::create(&out)?)
        .status()?;
    let summary: Value = fs::read_to_string(&out)?
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["event"] == "summary")
        .context("no summary")?;
    Ok(summary["latency_ns"].clone())
}
