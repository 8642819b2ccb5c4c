//! `cargo xtask bench --only report`: `reaper-trace report` on a day-sized audit. Audits of
//! 100,000 and 1,000,000 lines in the stream's own format (fork, exec, exit and reaped cycles
//! with pid reuse, plus a leak flagged and cleared every 2,000 processes) are rendered side by
//! side: time per line, and peak memory, whose ratio between the two shows it is bounded.
use std::{
    fs::{self, File},
    io::{BufWriter, Write},
    path::Path,
    process::Command,
    time::Instant,
};

use anyhow::{Result, bail};

/// Writes an audit of about `lines` lines.
fn synthetic_audit(path: &Path, lines: usize) -> Result<()> {
    // Streamed to the file: this process stays small, since a child's peak RSS as the kernel
    // reports it includes the parent's memory it shared until its exec.
    let mut text = BufWriter::new(File::create(path)?);
    let mut ts = 1_000_000_000u64;
    let mut seq = 0u64;
    let mut line = |text: &mut BufWriter<File>, ts: u64, body: &str| {
        let _ = writeln!(text, r#"{{"event":{body},"seq":{seq},"ts":{ts}}}"#);
        seq += 1;
        seq as usize
    };
    let mut written = line(
        &mut text,
        ts,
        r#""ready","gateway":[100],"tracked":1,"setsid_hook":"tracepoint","kernel":"6.18""#,
    );
    let mut n = 0u64;
    while written < lines {
        n += 1;
        let pid = 200 + (n % 32_000);
        ts += 250_000_000;
        line(
            &mut text,
            ts,
            &format!(
                r#""fork","pid":{pid},"ppid":100,"spawner":100,"comm":"gateway","start":{ts},"sid":100,"pgid":100,"uid":1000,"cgroup_id":4242"#
            ),
        );
        line(
            &mut text,
            ts + 1000,
            &format!(
                r#""exec","pid":{pid},"filename":"/usr/bin/node","argv":["node","/opt/mcp/server-{}.js","--stdio"],"truncated":false,"tid":{pid}"#,
                n % 40
            ),
        );
        if n.is_multiple_of(2000) {
            line(
                &mut text,
                ts + 2000,
                &format!(
                    r#""flag","pid":{pid},"reason":"orphaned","since":{ts},"lineage":[100,{pid}],"ancestors":[{{"pid":100,"comm":"gateway","argv":["gateway"],"exited":null}},{{"pid":{pid},"comm":"node","argv":["node","server.js"],"exited":null}}],"pipes":[{{"fd":0,"kind":"pipe","inode":{n},"end":"read","other_end":"open","peers":[{{"pid":100,"fd":9,"end":"write","comm":"gateway"}}]}}],"state":"S (sleeping)","rss_kib":95000,"ppid":1,"escaped":true,"comm":"node","argv":["node","server.js"]"#
                ),
            );
            line(
                &mut text,
                ts + 3000,
                &format!(r#""cleared","pid":{pid},"reason":"orphaned","because":"exited""#),
            );
        }
        line(
            &mut text,
            ts + 5000,
            &format!(r#""exit","pid":{pid},"exit_code":0,"signal":null,"core":false"#),
        );
        written = line(&mut text, ts + 6000, &format!(r#""reaped","pid":{pid}"#));
    }
    text.flush()?;
    Ok(())
}

/// Runs `reaper-trace report` and returns (seconds, peak RSS in KiB) of that process alone.
fn render(reaper: &Path, audit: &Path, page: &Path) -> Result<(f64, u64)> {
    let start = Instant::now();
    let child = Command::new(reaper)
        .arg("report")
        .arg(audit)
        .arg("-o")
        .arg(page)
        .spawn()?;
    let mut status = 0;
    // SAFETY: zeroed rusage is valid; wait4 fills it for this child only.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let waited = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    let secs = start.elapsed().as_secs_f64();
    if waited < 0 || !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        bail!("reaper-trace report failed on {}", audit.display());
    }
    Ok((secs, usage.ru_maxrss as u64))
}

pub fn run(reaper: &Path, scratch: &Path) -> Result<()> {
    println!("\n## Report\n");
    println!("| audit | size | time | per line | peak RSS | page |");
    println!("|---|---|---|---|---|---|");
    let mut peaks = Vec::new();
    for lines in [100_000, 1_000_000] {
        let audit = scratch.join(format!("audit-{lines}.ndjson"));
        let page = scratch.join(format!("report-{lines}.html"));
        synthetic_audit(&audit, lines)?;
        let (secs, peak) = render(reaper, &audit, &page)?;
        let size = fs::metadata(&audit)?.len();
        println!(
            "| {lines} lines | {:.0} MiB | {secs:.2} s | {:.2} µs | {:.1} MiB | {:.0} KiB |",
            size as f64 / (1 << 20) as f64,
            secs * 1e6 / lines as f64,
            peak as f64 / 1024.0,
            fs::metadata(&page)?.len() as f64 / 1024.0
        );
        peaks.push(peak);
        let _ = fs::remove_file(&audit);
    }
    println!(
        "\npeak RSS, 1,000,000 lines / 100,000 lines: {:.2} (bounded memory: near 1)",
        peaks[1] as f64 / peaks[0].max(1) as f64
    );
    Ok(())
}
