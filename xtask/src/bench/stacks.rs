//! `--spawn-stacks` for a Python spawner: the fork probe's kernel cost with the interpreter's
//! frames read, the native stack only, and nothing; the bytes of a fork record; the reader's
//! wake-ups when every fork is from a stack never seen (each such record may wake it at
//! once); and the kernel memory of the stack stores at 10,000 distinct stacks.
use std::{
    fs,
    process::{Command, Stdio},
    thread,
    time::Duration,
};

use anyhow::{Context, Result};

use super::*;

/// Debian's python3: no frame pointers, libpython linked in (found at its exec).
const PYTHON: &str = "/usr/bin/python3.11";

/// A Python gateway that forks N children from one function (one stack), or from N functions
/// of their own (N distinct stacks), writes DONE, then lingers for the stats to be read, until
/// DONE.end exists (a minute at most).
const GATEWAY: &str = r#"
import os, sys, time
n, distinct, done = int(sys.argv[1]), sys.argv[2] == "distinct", sys.argv[3]
def spawn():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
if distinct:
    src = "".join(f"def f{i}():\n    spawn()\n" for i in range(n))
    exec(src)
    for i in range(n):
        globals()[f"f{i}"]()
else:
    for _ in range(n):
        spawn()
open(done, "w").close()
t = time.time()
while not os.path.exists(done + ".end") and time.time() - t < 60:
    time.sleep(0.05)
"#;

/// Runs the Python gateway under reaper-trace with `stacks`; returns reaper-trace once DONE is
/// written (the gateway lingers).
fn traced_gateway(
    bins: &Bins,
    stacks: &str,
    n: usize,
    distinct: bool,
) -> Result<(std::process::Child, std::path::PathBuf)> {
    let dir = std::env::temp_dir().join(format!("reaper-bench-py-{}", std::process::id()));
    fs::create_dir_all(&dir)?;
    let script = dir.join("gateway.py");
    let done = dir.join(format!("done-{stacks}-{distinct}"));
    // A run before with the same arguments left both: its DONE.end would end this one's
    // gateway as soon as it is done.
    let _ = fs::remove_file(&done);
    let _ = fs::remove_file(format!("{}.end", done.display()));
    fs::write(&script, GATEWAY)?;
    let tracer = Command::new(&bins.reaper)
        .args([
            "--json",
            "--quiet",
            "--retain-dead",
            "30000",
            "--spawn-stacks",
            stacks,
        ])
        .args(["--", PYTHON])
        .arg(&script)
        .arg(n.to_string())
        .arg(if distinct { "distinct" } else { "same" })
        .arg(&done)
        .stdout(Stdio::null())
        .spawn()?;
    while !done.exists() {
        thread::sleep(Duration::from_millis(50));
    }
    Ok((tracer, done))
}

/// Lets the gateway of [`traced_gateway`] end, and waits for reaper-trace.
fn finish(mut tracer: std::process::Child, done: &std::path::Path) -> Result<()> {
    fs::write(format!("{}.end", done.display()), b"")?;
    tracer.wait()?;
    Ok(())
}

/// The kernel cost of a tracked Python spawner's fork with each `--spawn-stacks`, the fork
/// record's size, and the stack stores' memory at 10,000 distinct Python stacks.
pub(crate) fn python_stacks(bins: &Bins, opts: &BenchOptions) -> Result<()> {
    println!(
        "\n### A Python spawner's forks ({PYTHON}, {} forks from one function)\n",
        opts.procs
    );
    println!("| --spawn-stacks | sched_process_fork ns per run |\n|---|---|");
    let sysctl = "/proc/sys/kernel/bpf_stats_enabled";
    let before = fs::read_to_string(sysctl).unwrap_or_else(|_| "0".into());
    fs::write(sysctl, "1").context("enabling kernel.bpf_stats_enabled")?;
    let result = (|| -> Result<()> {
        for stacks in ["auto", "native", "off"] {
            let (tracer, done) = traced_gateway(bins, stacks, opts.procs, false)?;
            thread::sleep(Duration::from_millis(500));
            let fork = prog_stats(tracer.id())?
                .into_iter()
                .find(|(name, _, _)| name.contains("fork"));
            if let Some((_, runs, ns)) = fork {
                println!("| {stacks} | {:.0} |", ns as f64 / runs.max(1) as f64);
            }
            finish(tracer, &done)?;
        }
        Ok(())
    })();
    let _ = fs::write(sysctl, before.trim());
    result?;
    println!(
        "\nA fork record is {} bytes (header {}).",
        size_of::<reaper_common::ForkEvent>(),
        size_of::<reaper_common::EventHeader>()
    );

    wake_ups(bins, opts)?;

    let n = 10_000;
    let (tracer, done) = traced_gateway(bins, "auto", n, true)?;
    thread::sleep(Duration::from_millis(500));
    println!("\n### The stack stores after {n} forks from {n} distinct Python functions\n");
    println!("| map | entries kept | kernel memory |\n|---|---|---|");
    let usage = map_usage(tracer.id(), &["PY_STACKS", "STACKS"])?;
    for (name, entries, bytes) in &usage {
        println!(
            "| {name} | {entries} | {:.2} MiB |",
            *bytes as f64 / (1 << 20) as f64
        );
    }
    // Debian's python3 keeps no frame pointers: its forks share one native stack. The native
    // store filled to N entries of the probe's own size measures its memory there.
    if let Some(id) = map_id(tracer.id(), "STACKS")? {
        fill_native_store(&id, n)?;
        for (name, entries, bytes) in map_usage(tracer.id(), &["STACKS"])? {
            println!(
                "| {name}, filled to {n} | {entries} | {:.2} MiB |",
                bytes as f64 / (1 << 20) as f64
            );
        }
    }
    finish(tracer, &done)
}

/// The reader's wake-ups (its thread's voluntary context switches, the whole run) per fork
/// of a Python spawner forking from ever-new stacks, against one forking from one stack,
/// interleaved: a stack seen first wakes the reader at once, at most once per poll interval.
fn wake_ups(bins: &Bins, opts: &BenchOptions) -> Result<()> {
    let reps = opts.reps.max(3);
    let n = opts.procs;
    println!(
        "\n### The reader's wake-ups per fork: {n} forks from {n} distinct Python functions \
         against {n} from one ({reps} runs each, interleaved)\n"
    );
    let (mut same, mut distinct) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        for (wakes, new_stacks) in [(&mut same, false), (&mut distinct, true)] {
            let (tracer, done) = traced_gateway(bins, "auto", n, new_stacks)?;
            let status = fs::read_to_string(format!("/proc/{0}/task/{0}/status", tracer.id()))?;
            let woken = status
                .lines()
                .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .context("the reader's voluntary_ctxt_switches")?;
            wakes.push(woken / n as f64);
            finish(tracer, &done)?;
        }
    }
    let (same, distinct) = (median(&mut same), median(&mut distinct));
    println!("| forks from | wake-ups per fork (median) |\n|---|---|");
    println!("| one stack | {same:.3} |\n| a new stack each | {distinct:.3} |");
    println!(
        "\nA new stack each against one: {:.1}x the wake-ups.",
        distinct / same.max(f64::EPSILON)
    );
    Ok(())
}

/// The id of map `name` that process `pid` holds.
fn map_id(pid: u32, name: &str) -> Result<Option<String>> {
    Ok(maps_of(pid)?
        .into_iter()
        .find(|(_, n, _)| n == name)
        .map(|(id, _, _)| id))
}

/// Adds distinct native stacks to the store `id` (`bpftool batch`) until it holds `n`: each
/// a full stack of the probe's size, keyed as the probe keys them (odd).
fn fill_native_store(id: &str, n: usize) -> Result<()> {
    use reaper_common::native::{NATIVE_FRAMES_MAX, NativeStack};
    let value_len = size_of::<NativeStack>();
    let mut batch = String::new();
    for i in 0..n as u64 {
        let key = (i << 1 | 1 | 1 << 63).to_le_bytes();
        let mut value = vec![0u8; value_len];
        value[..4].copy_from_slice(&(NATIVE_FRAMES_MAX as u32).to_le_bytes());
        value[8..16].copy_from_slice(&i.to_le_bytes());
        let hex = |bytes: &[u8]| {
            bytes
                .iter()
                .map(|b| format!("0x{b:02x}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        batch.push_str(&format!(
            "map update id {id} key {} value {}\n",
            hex(&key),
            hex(&value)
        ));
    }
    let file = std::env::temp_dir().join(format!("reaper-bench-fill-{}", std::process::id()));
    fs::write(&file, batch)?;
    let status = Command::new("bpftool")
        .arg("batch")
        .arg("file")
        .arg(&file)
        .stdout(Stdio::null())
        .status()?;
    let _ = fs::remove_file(&file);
    anyhow::ensure!(status.success(), "bpftool batch: {status}");
    Ok(())
}

/// (id, name, memlock bytes) of each map process `pid` holds.
fn maps_of(pid: u32) -> Result<Vec<(String, String, u64)>> {
    let mut out = Vec::new();
    for text in fdinfos(pid)? {
        let field = |k: &str| fdinfo_field(&text, k);
        let (Some(id), Some(memlock)) = (field("map_id:"), field("memlock:")) else {
            continue;
        };
        let shown = Command::new("bpftool")
            .args(["-j", "map", "show", "id", &id])
            .output()?;
        let info: serde_json::Value = serde_json::from_slice(&shown.stdout).unwrap_or_default();
        let name = info["name"].as_str().unwrap_or("").to_owned();
        out.push((id, name, memlock.parse().unwrap_or(0)));
    }
    Ok(out)
}

/// (name, entries, memlock bytes) of each map named in `names` that process `pid` holds.
fn map_usage(pid: u32, names: &[&str]) -> Result<Vec<(String, usize, u64)>> {
    let mut out: Vec<(String, usize, u64)> = Vec::new();
    for (id, name, memlock) in maps_of(pid)? {
        if !names.contains(&name.as_str()) || out.iter().any(|(n, _, _)| *n == name) {
            continue;
        }
        let dump = Command::new("bpftool")
            .args(["-j", "map", "dump", "id", &id])
            .output()?;
        let entries = serde_json::from_slice::<serde_json::Value>(&dump.stdout)
            .ok()
            .and_then(|v| v.as_array().map(Vec::len))
            .unwrap_or(0);
        out.push((name, entries, memlock));
    }
    out.sort();
    Ok(out)
}
