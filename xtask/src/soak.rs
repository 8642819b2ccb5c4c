//! `cargo xtask soak [--mins N]`: gateways that come and go for N minutes (60 by default), one
//! instance of a `--gateway-exe` program a second, each leaving a helper that exits: the
//! gateways are pruned like any process (`--retain-dead 500`, which the churn fills in its
//! first minutes), so reaper-trace's RSS after the churn is within 10% of its RSS after the
//! first ten minutes (a sixth of a shorter run), or the soak fails.
//!
//! `cargo xtask bench --only soak [--soak-mins N]`: reaper-trace follows a gateway that churns
//! processes for N minutes (30 by default) in every shape it knows: plain fork+exec, pipelines,
//! setsid double forks reparented to init, short leaks that get flagged and then end. Every
//! sample reports reaper-trace's RSS, open fds and graph size (from its own `/metrics`); the
//! verdict compares the samples after warm-up. With `pid_max` at 32768, pids are reused many
//! times over, which is what a day on a busy host does to the graph.
use std::{
    fs,
    net::TcpListener,
    path::Path,
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

/// One look at the tracer.
struct Sample {
    secs: f64,
    rss_kib: u64,
    fds: usize,
    graph_nodes: u64,
    alive: u64,
    gateways: u64,
    events: u64,
    flags: u64,
}

impl Sample {
    /// A look at tracer `pid` `start` in, its scrape `text`.
    fn take(pid: u32, text: &str, start: Instant) -> Sample {
        Sample {
            secs: start.elapsed().as_secs_f64(),
            rss_kib: crate::bench::rss_kib(pid, "VmRSS:"),
            fds: fs::read_dir(format!("/proc/{pid}/fd"))
                .map(|d| d.count())
                .unwrap_or(0),
            graph_nodes: metric(text, "reaper_graph_nodes "),
            alive: metric(text, "reaper_descendants_alive "),
            gateways: metric(text, "reaper_gateways_alive "),
            events: metric(text, "reaper_events_total{"),
            flags: metric(text, "reaper_flags_total{"),
        }
    }
}

/// The churning gateway: about 110 processes a second of mixed shapes, and every 20 s a
/// leak (a setsid'd reader holding a pipe) that lives 8 s after its spawner exits.
fn gateway_script(minutes: u64) -> String {
    format!(
        r#"end=$(( $(date +%s) + {secs} ))
i=0
while [ "$(date +%s)" -lt "$end" ]; do
  i=$((i+1))
  for k in 1 2 3 4 5; do /bin/true; done
  echo churn | cat > /dev/null
  sh -c 'setsid sh -c "sleep 0.2" &' 
  if [ $((i % 200)) -eq 0 ]; then
    sh -c 'sleep 8 | setsid sh -c "exec cat" &'
  fi
  sleep 0.1
done
"#,
        secs = minutes * 60
    )
}

fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

fn scrape(port: u16) -> String {
    let out = Command::new("curl")
        .args(["-s", "--max-time", "5"])
        .arg(format!("http://127.0.0.1:{port}/metrics"))
        .output();
    out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

pub fn run(reaper: &Path, minutes: u64) -> Result<()> {
    if !crate::prereqs::ensure("curl") {
        bail!("curl is missing");
    }
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let mut tracer = Command::new(reaper)
        .args([
            "--json",
            "--quiet",
            "--scan-interval",
            "1s",
            "--idle-after",
            "1m",
        ])
        .arg("--metrics")
        .arg(format!("127.0.0.1:{port}"))
        .args(["--", "sh", "-c", &gateway_script(minutes)])
        .stdout(Stdio::null())
        .spawn()
        .context("starting reaper-trace")?;
    let pid = tracer.id();
    let every = Duration::from_secs((minutes * 60 / 30).clamp(5, 60));
    println!(
        "\n## Soak: {minutes} min of churn, a sample every {} s\n",
        every.as_secs()
    );
    println!("| t | RSS | fds | graph nodes | alive | events | flags |");
    println!("|---|---|---|---|---|---|---|");
    let start = Instant::now();
    let mut samples = Vec::new();
    while tracer.try_wait()?.is_none() {
        thread::sleep(every);
        let text = scrape(port);
        if text.is_empty() {
            continue; // stopping
        }
        let s = Sample::take(pid, &text, start);
        println!(
            "| {:.0} s | {:.1} MiB | {} | {} | {} | {} | {} |",
            s.secs,
            s.rss_kib as f64 / 1024.0,
            s.fds,
            s.graph_nodes,
            s.alive,
            s.events,
            s.flags
        );
        samples.push(s);
    }
    let status = tracer.wait()?;
    if !status.success() {
        bail!("reaper-trace ended with {status}");
    }
    verdict(&samples)
}

/// A gateway instance: a `#!` script (matched by its path) that leaves a helper, which exits
/// a moment later, and exits itself.
const GATEWAY: &str = "#!/bin/sh\nsleep 0.3 &\nsleep 0.5\n";

/// `cargo xtask soak`: see the module's documentation.
pub fn gateways(reaper: &Path, minutes: u64) -> Result<()> {
    if !crate::prereqs::ensure("curl") {
        bail!("curl is missing");
    }
    let dir = std::env::temp_dir().join(format!("reaper-soak-{}", std::process::id()));
    fs::create_dir_all(&dir)?;
    let gateway = dir.join("gateway.sh");
    fs::write(&gateway, GATEWAY)?;
    fs::set_permissions(
        &gateway,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )?;
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let mut tracer = Command::new(reaper)
        // A retention the churn fills within its first minutes: from then on the graph holds
        // what is alive and the newest 500 reaped, gateways included, or it grows.
        .args([
            "--json",
            "--quiet",
            "--api",
            "off",
            "--retain-dead",
            "500",
            "--gateway-exe",
        ])
        .arg(&gateway)
        .arg("--metrics")
        .arg(format!("127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .spawn()
        .context("starting reaper-trace")?;
    let pid = tracer.id();
    thread::sleep(Duration::from_secs(2));
    println!("\n## Gateway soak: {minutes} min, one gateway instance a second\n");
    println!("| t | RSS | fds | graph nodes | gateways alive | events |");
    println!("|---|---|---|---|---|---|");
    let start = Instant::now();
    let end = start + Duration::from_secs(minutes * 60);
    let every = Duration::from_secs(60)
        .min(Duration::from_secs(minutes * 60 / 12).max(Duration::from_secs(5)));
    let mut next_sample = start + every;
    let mut samples = Vec::new();
    let mut instances = Vec::new();
    while Instant::now() < end {
        instances.push(Command::new(&gateway).stdout(Stdio::null()).spawn()?);
        instances.retain_mut(|c| c.try_wait().ok().flatten().is_none());
        if Instant::now() >= next_sample {
            next_sample += every;
            let s = Sample::take(pid, &scrape(port), start);
            println!(
                "| {:.0} s | {:.1} MiB | {} | {} | {} | {} |",
                s.secs,
                s.rss_kib as f64 / 1024.0,
                s.fds,
                s.graph_nodes,
                s.gateways,
                s.events
            );
            samples.push(s);
        }
        thread::sleep(Duration::from_secs(1));
    }
    for mut c in instances {
        let _ = c.wait();
    }
    // SAFETY: a plain signal to the tracer this command started.
    unsafe { libc::kill(pid as i32, libc::SIGINT) };
    let status = tracer.wait()?;
    let _ = fs::remove_dir_all(&dir);
    if !status.success() {
        bail!("reaper-trace ended with {status}");
    }
    // The RSS after the first ten minutes (a sixth of a shorter run), against the last.
    let settled = Duration::from_secs((minutes * 60 / 6).min(600)).as_secs_f64();
    let (Some(first), Some(last)) = (samples.iter().find(|s| s.secs >= settled), samples.last())
    else {
        bail!("too few samples: run longer (--mins)");
    };
    let ratio = last.rss_kib as f64 / first.rss_kib.max(1) as f64;
    println!(
        "\nRSS {:.1} MiB at {:.0} s, {:.1} MiB at {:.0} s: {ratio:.3}x (goal: within 10%); graph \
         nodes {} then {}",
        first.rss_kib as f64 / 1024.0,
        first.secs,
        last.rss_kib as f64 / 1024.0,
        last.secs,
        first.graph_nodes,
        last.graph_nodes
    );
    if ratio > 1.10 {
        bail!("RSS grew {ratio:.3}x over the churn");
    }
    Ok(())
}

/// After warm-up (the first fifth of the run, when the graph fills to --retain-dead), RSS,
/// fds and graph size must stay flat.
fn verdict(samples: &[Sample]) -> Result<()> {
    let warm: Vec<&Sample> = samples.iter().skip(samples.len() / 5).collect();
    let (Some(first), Some(last)) = (warm.first(), warm.last()) else {
        bail!("too few samples: run longer (--soak-mins)");
    };
    let max = |f: fn(&Sample) -> u64| warm.iter().map(|s| f(s)).max().unwrap_or(0);
    let min = |f: fn(&Sample) -> u64| warm.iter().map(|s| f(s)).min().unwrap_or(0);
    println!(
        "\nafter warm-up ({:.0} s to {:.0} s, {} events, {} flags): RSS {:.1}..{:.1} MiB \
         (max/min {:.3}), fds {}..{}, graph nodes {}..{}",
        first.secs,
        last.secs,
        last.events,
        last.flags,
        min(|s| s.rss_kib) as f64 / 1024.0,
        max(|s| s.rss_kib) as f64 / 1024.0,
        max(|s| s.rss_kib) as f64 / min(|s| s.rss_kib).max(1) as f64,
        min(|s| s.fds as u64),
        max(|s| s.fds as u64),
        min(|s| s.graph_nodes),
        max(|s| s.graph_nodes),
    );
    Ok(())
}
