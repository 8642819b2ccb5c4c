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
    events: u64,
    flags: u64,
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
        let s = Sample {
            secs: start.elapsed().as_secs_f64(),
            rss_kib: crate::bench::rss_kib(pid, "VmRSS:"),
            fds: fs::read_dir(format!("/proc/{pid}/fd"))
                .map(|d| d.count())
                .unwrap_or(0),
            graph_nodes: metric(&text, "reaper_graph_nodes "),
            alive: metric(&text, "reaper_descendants_alive "),
            events: metric(&text, "reaper_events_total{"),
            flags: metric(&text, "reaper_flags_total{"),
        };
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
