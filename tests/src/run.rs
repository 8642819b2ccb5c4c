//! One run of reaper-trace to its end: its stream, its readable lines and its exit status.
use std::process::{Command, ExitStatus, Stdio};

use serde_json::Value;

use crate::*;

/// What one reaper-trace run produced.
#[derive(Debug)]
pub struct Run {
    pub events: Vec<Value>,
    pub stderr: String,
    pub status: ExitStatus,
    /// How many events had come when the test's proof held (all of them for a run that was
    /// not waited on): what came after is the test's own teardown.
    pub proven_after: usize,
}

impl Run {
    /// Parses NDJSON, failing loudly on any line that is not one JSON object.
    pub fn from_output(stdout: &[u8], stderr: &[u8], status: ExitStatus) -> Run {
        let text = String::from_utf8(stdout.to_vec()).expect("NDJSON is UTF-8");
        let events: Vec<Value> = text
            .lines()
            .map(|l| {
                let event = serde_json::from_str::<Value>(l)
                    .unwrap_or_else(|e| panic!("bad NDJSON line {l:?}: {e}"));
                assert_schema_valid(&event);
                event
            })
            .collect();
        Run {
            proven_after: events.len(),
            events,
            stderr: String::from_utf8_lossy(stderr).into_owned(),
            status,
        }
    }

    /// The run as it stood when the proof held: the events before the test released or
    /// stopped what it ran (a teardown can orphan a wrapper's child for a moment).
    pub fn until_proof(&self) -> Run {
        Run {
            events: self.events[..self.proven_after].to_vec(),
            stderr: self.stderr.clone(),
            status: self.status,
            proven_after: self.proven_after,
        }
    }

    /// The flag events about `pid`.
    pub fn flags_of(&self, pid: u64) -> Vec<&Value> {
        self.all("flag")
            .into_iter()
            .filter(|f| f["pid"].as_u64() == Some(pid))
            .collect()
    }

    /// The reasons `pid` was flagged for, in order.
    pub fn reasons_of(&self, pid: u64) -> Vec<String> {
        self.flags_of(pid)
            .iter()
            .map(|f| f["reason"].as_str().unwrap_or_default().to_owned())
            .collect()
    }

    /// Events named `name`.
    pub fn all(&self, name: &str) -> Vec<&Value> {
        self.events.iter().filter(|e| e["event"] == name).collect()
    }

    /// The forks whose spawner is `spawner`.
    pub fn forks_by(&self, spawner: u64) -> Vec<&Value> {
        self.all("fork")
            .into_iter()
            .filter(|e| e["spawner"].as_u64() == Some(spawner))
            .collect()
    }

    /// The only event named `name` about `pid`.
    pub fn one(&self, name: &str, pid: u64) -> &Value {
        let found: Vec<&Value> = self
            .all(name)
            .into_iter()
            .filter(|e| e["pid"].as_u64() == Some(pid))
            .collect();
        assert_eq!(
            found.len(),
            1,
            "expected one {name} event for pid {pid}, got {found:?}\n{}",
            self.stderr
        );
        found[0]
    }

    pub fn summary(&self) -> &Value {
        let s = self.all("summary");
        assert_eq!(s.len(), 1, "one summary: {}", self.stderr);
        s[0]
    }

    /// Every record the kernel produced arrived, none was dropped, and no `lost` event.
    pub fn assert_lossless(&self) {
        let d = &self.summary()["delivery"];
        assert_eq!(d["consistent"], true, "delivery {d}");
        assert_eq!(d["kernel_events"], d["received"], "delivery {d}");
        assert!(
            self.all("lost").is_empty(),
            "lost events: {:?}",
            self.all("lost")
        );
    }

    /// `seq` counts 0, 1, 2... and every line has `event` and `ts`.
    pub fn assert_well_formed(&self) {
        for (i, e) in self.events.iter().enumerate() {
            assert_eq!(e["seq"].as_u64(), Some(i as u64), "seq of {e}");
            assert!(e["event"].is_string() && e["ts"].is_u64(), "{e}");
        }
    }
}

/// Runs `reaper-trace --json --quiet ARGS`.
pub fn run_reaper(args: &[&str]) -> Run {
    run_reaper_env(args, &[])
}

/// Runs `reaper-trace --json --quiet ARGS` with extra environment variables (which the
/// gateway command inherits).
pub fn run_reaper_env(args: &[&str], env: &[(&str, &str)]) -> Run {
    let out = Command::new(reaper_trace())
        .args(["--json", "--quiet"])
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("run reaper-trace");
    let run = Run::from_output(&out.stdout, &out.stderr, out.status);
    run.assert_well_formed();
    run
}

/// Runs `reaper-trace --json -- reaper-shapes SHAPE TRUTH [extra]` and returns the run and
/// the shape's truth.
pub fn run_shape(shape: &str, extra: &[&str]) -> (Run, Value) {
    run_shape_with(&[], shape, extra, &[])
}

/// Like [`run_shape`], with reaper-trace options before `--` and environment variables.
pub fn run_shape_with(
    opts: &[&str],
    shape: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> (Run, Value) {
    // Tests of one binary run in parallel, several on the same shape: one directory a run.
    static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    run_shape_in(&scratch(&format!("{shape}-{n}")), opts, shape, extra, env)
}

/// Runs a shape whose truth files go to `dir`.
pub fn run_shape_in(
    dir: &std::path::Path,
    opts: &[&str],
    shape: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> (Run, Value) {
    let truth = dir.join("truth.json");
    let truth_s = truth.to_str().unwrap();
    let shapes = shapes();
    let mut args = opts.to_vec();
    args.extend(["--", shapes.to_str().unwrap(), shape, truth_s]);
    args.extend_from_slice(extra);
    let run = run_reaper_env(&args, env);
    let truth = read_json(&truth);
    (run, truth)
}
