//! aarch64 against x86_64: the same loops and sleepers in a guest of each architecture on
//! Debian's kernel of one series, the two guests at once (see `vmtest::script_on_each_arch`).
//! Both are emulated (TCG), so absolute times say nothing; each figure is taken relative to
//! what the same guest's untraced loop costs, and only those ratios are compared.
use std::{collections::HashMap, path::Path, time::Duration};

use anyhow::{Context, Result, bail};

use super::{BenchOptions, median};
use crate::{arch::Arch, vmtest};

/// The kernel series both guests boot.
const SERIES: &str = "6.12";

/// The tracked sleepers whose RSS is compared.
const SLEEPERS: usize = 10_000;

/// What one guest printed: a line per measurement, after this mark.
const MARK: &str = "reaper-bench: ";

/// The guest's script: `reps` rounds of a fork+exec loop of `procs` untraced, then tracked
/// (reaper-trace's run time read from just before the loop to once its stream went quiet, as
/// on the host: the gateway waits on FIFOs around the loop), then `sleepers` tracked sleepers
/// and reaper-trace's RSS once the stream holds all their forks. Every wait is capped (ten
/// minutes) and ends early when reaper-trace exits; a failure prints why and ends the script.
fn script(root: &Path, arch: Arch, procs: usize, reps: usize, sleepers: usize) -> String {
    let release = vmtest::release_dir(root, arch);
    let (reaper, shapes) = (release.join("reaper-trace"), release.join("reaper-shapes"));
    let (reaper, shapes) = (reaper.display(), shapes.display());
    let cpu_us = "busybox sed 's/.*\"cpu_us\":\\([0-9]*\\).*/\\1/'";
    format!(
        r#"cd /tmp
fail() {{ echo "{MARK}failed: $*"; exit 1; }}
# Waits until the condition $1 holds, while reaper-trace runs.
await() {{
    n=0
    until eval "$1"; do
        n=$((n + 1))
        [ $n -le 1200 ] || fail "waited 600 s for $1"
        busybox kill -0 $tracer 2>/dev/null || fail "reaper-trace exited waiting for $1"
        busybox sleep 0.5
    done
}}
# Writes a line to the FIFO $1, whose reader is the tracked gateway.
release() {{ busybox timeout 600 sh -c "echo > $1" || fail "nobody read $1"; }}
size() {{ busybox stat -c %s /tmp/traced.ndjson; }}
busybox mkfifo /tmp/go /tmp/done
i=0
while [ $i -lt {reps} ]; do
    i=$((i + 1))
    {shapes} storm-exec /tmp/untraced.json {procs} || fail "the untraced loop"
    echo "{MARK}untraced $({cpu_us} /tmp/untraced.json)"
    {reaper} --json --quiet -- sh -c "read _ < /tmp/go; {shapes} storm-exec /tmp/traced.json {procs}; read _ < /tmp/done" > /tmp/traced.ndjson &
    tracer=$!
    await "busybox grep -q '\"event\":\"ready\"' /tmp/traced.ndjson"
    before=$(busybox cut -d' ' -f1 /proc/$tracer/schedstat)
    release /tmp/go
    await "[ -e /tmp/traced.json ]"
    seen=-1
    await '[ "$seen" = "$(size)" ] || {{ seen=$(size); false; }}'
    after=$(busybox cut -d' ' -f1 /proc/$tracer/schedstat)
    release /tmp/done
    wait $tracer || fail "reaper-trace exited with $?"
    echo "{MARK}traced $({cpu_us} /tmp/traced.json) $((after - before))"
    busybox rm -f /tmp/untraced.json /tmp/traced.json
done
{reaper} --json --quiet -- {shapes} sleepers /tmp/sleepers.json {sleepers} 3600 > /tmp/sleepers.ndjson &
tracer=$!
await "[ -e /tmp/sleepers.json.ready ]"
forks() {{ busybox grep -c '"event":"fork"' /tmp/sleepers.ndjson; }}
await '[ "$(forks)" -ge {sleepers} ]'
echo "{MARK}rss_kib $(busybox grep VmRSS /proc/$tracer/status | busybox tr -s ' \t' ' ' | busybox cut -d' ' -f2) $(forks)"
busybox kill $tracer
"#
    )
}

/// One guest's figures.
#[derive(Default)]
struct Figures {
    /// The loop's own CPU per process, untraced and tracked (µs).
    untraced_us: Vec<f64>,
    traced_us: Vec<f64>,
    /// reaper-trace's run time per process of the tracked loop (µs).
    reader_us: Vec<f64>,
    rss_kib: u64,
}

impl Figures {
    fn read(log: &[String], procs: usize) -> Result<Figures> {
        let mut f = Figures::default();
        let per_proc = |us: f64| us / procs.max(1) as f64;
        for line in log {
            let Some((_, said)) = line.split_once(MARK) else {
                continue;
            };
            if said.starts_with("failed") {
                bail!("the guest's bench {said}");
            }
            let words: Vec<f64> = said
                .split_whitespace()
                .skip(1)
                .map(|w| w.parse().with_context(|| format!("a figure in {said:?}")))
                .collect::<Result<_>>()?;
            match (said.split_whitespace().next(), &words[..]) {
                (Some("untraced"), &[cpu]) => f.untraced_us.push(per_proc(cpu)),
                (Some("traced"), &[cpu, reader_ns]) => {
                    f.traced_us.push(per_proc(cpu));
                    f.reader_us.push(per_proc(reader_ns / 1e3));
                }
                (Some("rss_kib"), &[kib, forks]) if forks >= SLEEPERS as f64 => {
                    f.rss_kib = kib as u64
                }
                _ => bail!("the guest said {said:?}"),
            }
        }
        if f.untraced_us.is_empty() || f.reader_us.is_empty() || f.rss_kib == 0 {
            bail!("the guest printed no figures");
        }
        Ok(f)
    }

    /// The tracked loop's CPU over the untraced one's (the hooks' cost in the traced
    /// processes), and reaper-trace's CPU per process over the untraced loop's.
    fn ratios(&mut self) -> (f64, f64) {
        let untraced = median(&mut self.untraced_us);
        (
            median(&mut self.traced_us) / untraced,
            median(&mut self.reader_us) / untraced,
        )
    }
}

pub(crate) fn arches(root: &Path, opts: &BenchOptions) -> Result<()> {
    // Fewer processes than on the host: an emulated fork+exec costs milliseconds.
    let procs = (opts.procs / 10).max(500);
    let sleepers = SLEEPERS;
    eprintln!("bench: aarch64 against x86_64, Debian {SERIES} guests, both at once");
    let logs = vmtest::script_on_each_arch(
        root,
        SERIES,
        |arch| script(root, arch, procs, opts.reps, sleepers),
        Duration::from_secs(3600),
    )?;
    println!(
        "\n## aarch64 against x86_64 (Debian {SERIES} guests under TCG, a fork+exec loop of \
         {procs}, {} rounds; {sleepers} tracked sleepers)\n",
        opts.reps
    );
    println!(
        "| guest | loop CPU tracked / untraced | reaper-trace CPU per process / loop CPU per \
         untraced process | RSS at {sleepers} tracked |"
    );
    println!("|---|---|---|---|");
    let mut each = HashMap::new();
    for (arch, log) in &logs {
        let mut figures = Figures::read(log, procs)?;
        let (hooks, reader) = figures.ratios();
        println!(
            "| {} | {hooks:.3} | {reader:.3} | {:.1} MiB |",
            arch.name(),
            figures.rss_kib as f64 / 1024.0
        );
        each.insert(*arch, (hooks, reader, figures.rss_kib as f64));
    }
    let (arm, x86) = (each[&Arch::Aarch64], each[&Arch::X86_64]);
    println!(
        "| aarch64 / x86_64 | {:.2}x | {:.2}x | {:.2}x |",
        arm.0 / x86.0,
        arm.1 / x86.1,
        arm.2 / x86.2
    );
    Ok(())
}
