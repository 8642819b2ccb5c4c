//! The reader under load (`--only loaded`): its latency while a round of the rules looks at
//! `--sleepers` live tracked processes each second (`--idle-after 4s`: every one is due at
//! every round), ten `why` a second are asked and a follower reads the whole stream, on a
//! quiet system (a lone `/bin/true` every 50 ms) and in a storm (`--procs` fork+exit); with
//! the `why` answers' own latency and what was lost.
//!
//! The sleepers are started before reaper-trace and found in /proc (`--gateway-pid`), so
//! their 10,000 forks are not records: the latency is the phase's alone.
use std::{
    fs,
    path::Path,
    process::{Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use super::*;

/// Sleepers with no channel (no rule flags them): `sleep 3600`s started by one Python
/// process, which writes `TRUTH.ready` once they all run, then waits; SIGTERM ends them all.
const SLEEPERS: &str = r#"import signal, subprocess, sys, time
truth, n = sys.argv[1], int(sys.argv[2])
quiet = dict(stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
sleepers = [subprocess.Popen(["sleep", "3600"], **quiet) for _ in range(n)]
def end(*_):
    for s in sleepers:
        s.kill()
    for s in sleepers:
        s.wait()
    sys.exit(0)
signal.signal(signal.SIGTERM, end)
open(truth + ".ready", "w").close()
time.sleep(3600)
"#;

/// `why` asked this often while a phase runs.
const WHY_EVERY: Duration = Duration::from_millis(100);

pub(crate) fn loaded(bins: &Bins, opts: &BenchOptions) -> Result<()> {
    let truth = bins.scratch.join("loaded-sleepers");
    let ready = bins.scratch.join("loaded-sleepers.ready");
    let _ = fs::remove_file(&ready);
    let mut sleepers = Command::new("python3")
        .args(["-c", SLEEPERS])
        .arg(&truth)
        .arg(opts.sleepers.to_string())
        .stdout(Stdio::null())
        .spawn()
        .context("starting the sleepers (python3)")?;
    let patience = Instant::now() + Duration::from_secs(600);
    while !ready.exists() {
        if Instant::now() > patience || sleepers.try_wait()?.is_some() {
            bail!("the sleepers never all ran");
        }
        thread::sleep(Duration::from_millis(100));
    }
    println!(
        "\n## The reader under load: {} tracked sleepers looked at every round (1 s), ten `why` a second, a follower\n",
        opts.sleepers
    );
    println!(
        "| phase | records | latency p50 | p99 | max | lost | delivery | `why` answers | `why` p50 | `why` p99 |\n|---|---|---|---|---|---|---|---|---|---|"
    );
    let phases = [
        (
            "quiet (a lone /bin/true every 50 ms)",
            "for i in $(seq 200); do /bin/true; sleep 0.05; done".to_owned(),
        ),
        (
            "storm (fork+exit)",
            format!(
                "i=0; while [ $i -lt {} ]; do ( : ) ; i=$((i+1)); done",
                opts.procs
            ),
        ),
    ];
    let result = phases
        .iter()
        .try_for_each(|(name, script)| phase(bins, sleepers.id(), name, script));
    // SAFETY: a plain signal to the child this bench started (it ends its sleepers).
    unsafe { libc::kill(sleepers.id() as i32, libc::SIGTERM) };
    sleepers.wait()?;
    result
}

/// One phase: reaper-trace tracing the sleepers (`sleepers`, their spawner's pid) and the
/// phase's `script` as its `-- CMD` gateway, asked `why` and followed while it runs.
fn phase(bins: &Bins, sleepers: u32, name: &str, script: &str) -> Result<()> {
    let socket = bins.scratch.join("loaded.sock");
    let out = bins.scratch.join("loaded.ndjson");
    let go = bins.scratch.join("loaded-go");
    let ended = bins.scratch.join("loaded-ended");
    let _ = fs::remove_file(&go);
    let _ = fs::remove_file(&ended);
    if !Command::new("mkfifo").arg(&go).status()?.success() {
        bail!("mkfifo {} failed", go.display());
    }
    let held = format!(
        "read _ < {}; {script}; : > {}",
        go.display(),
        ended.display()
    );
    let mut tracer = Command::new(&bins.reaper)
        .args([
            "--json",
            "--quiet",
            "--idle-after",
            "4s",
            "--scan-interval",
            "1s",
        ])
        // One kind of 10,000 instances would be flagged `accumulating` 9,990 times: this is
        // the looks' cost, not a flood of flags'.
        .args(["--max-instances", "100000"])
        .args(["--gateway-pid", &sleepers.to_string()])
        .arg("--api")
        .arg(&socket)
        .args(["--", "sh", "-c", &held])
        .stdout(fs::File::create(&out)?)
        .spawn()?;
    let patience = Instant::now() + Duration::from_secs(300);
    let ready = || fs::read_to_string(&out).is_ok_and(|t| t.contains("\"event\":\"ready\""));
    while !ready() {
        if Instant::now() > patience || tracer.try_wait()?.is_some() {
            bail!("reaper-trace never became ready");
        }
        thread::sleep(Duration::from_millis(50));
    }
    let pids = sleeper_pids(sleepers)?;
    let mut follower = Command::new(&bins.reaper)
        .args(["events", "--follow", "--api"])
        .arg(&socket)
        .stdout(Stdio::null())
        .spawn()?;
    // A round or two first: the first looks are spread over a sample period.
    thread::sleep(Duration::from_secs(3));
    let done = Arc::new(AtomicBool::new(false));
    let asking = {
        let (done, socket) = (done.clone(), socket.clone());
        thread::spawn(move || ask_why(&socket, &pids, &done))
    };
    fs::write(&go, "\n")?;
    // The phase ends with its script: reaper-trace goes on (the sleepers live), so it is
    // stopped once the script's last records are in the stream (it stops growing).
    while !ended.exists() {
        if Instant::now() > patience + Duration::from_secs(600) || tracer.try_wait()?.is_some() {
            bail!("the phase never ended");
        }
        thread::sleep(Duration::from_millis(100));
    }
    let mut size = 0;
    loop {
        thread::sleep(Duration::from_millis(300));
        let now = fs::metadata(&out)?.len();
        if now == size {
            break;
        }
        size = now;
    }
    done.store(true, Ordering::Relaxed);
    let mut why = asking
        .join()
        .map_err(|_| anyhow::anyhow!("the why thread panicked"))??;
    // SAFETY: plain signals to children this bench started.
    unsafe { libc::kill(tracer.id() as i32, libc::SIGINT) };
    tracer.wait()?;
    let _ = follower.kill();
    let _ = follower.wait();
    let summary: Value = fs::read_to_string(&out)?
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["event"] == "summary")
        .context("no summary")?;
    let l = &summary["latency_ns"];
    let d = &summary["delivery"];
    let at = |v: &Value| ms(v.as_u64().unwrap_or(0));
    why.sort_by(|a, b| a.total_cmp(b));
    let q = |q: f64| {
        why.get(((why.len().max(1) - 1) as f64 * q).round() as usize)
            .copied()
            .unwrap_or(0.0)
    };
    println!(
        "| {name} | {} | {} | {} | {} | {} | {} | {} | {:.1} ms | {:.1} ms |",
        l["count"],
        at(&l["p50"]),
        at(&l["p99"]),
        at(&l["max"]),
        d["dropped"]
            .as_object()
            .map_or(0, |m| m.values().filter_map(Value::as_u64).sum::<u64>()),
        d["consistent"],
        why.len(),
        q(0.5),
        q(0.99)
    );
    Ok(())
}

/// The pids of `spawner`'s children, from /proc.
fn sleeper_pids(spawner: u32) -> Result<Vec<u32>> {
    let text = fs::read_to_string(format!("/proc/{spawner}/task/{spawner}/children"))?;
    let pids: Vec<u32> = text
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect();
    if pids.is_empty() {
        bail!("the sleepers' spawner {spawner} has no children");
    }
    Ok(pids)
}

/// Asks `why` of the sleepers in turn every [`WHY_EVERY`] until `done`: each answer's time, ms.
fn ask_why(socket: &Path, pids: &[u32], done: &AtomicBool) -> Result<Vec<f64>> {
    let mut took = Vec::new();
    let mut next = Instant::now();
    for pid in pids.iter().cycle() {
        if done.load(Ordering::Relaxed) {
            break;
        }
        let t = Instant::now();
        super::api::get(socket, &format!("/v1/process/{pid}"))?;
        took.push(t.elapsed().as_secs_f64() * 1e3);
        next += WHY_EVERY;
        thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    Ok(took)
}
