//! The `-- CMD` gateway as an operator meets it: named by what it runs, ended with the run,
//! and its output never split by reaper-trace's own lines. Needs root (see `require_root`).
use std::io::Read;
use std::process::{Command, Stdio};

use reaper_tests::{Run, pid, reaper_trace, require_root, run_reaper, run_shape};
use serde_json::Value;

#[test]
fn the_command_gateway_is_named_by_what_it_runs_not_by_reaper_trace() {
    if !require_root("the_command_gateway_is_named_by_what_it_runs_not_by_reaper_trace") {
        return;
    }
    let (run, truth) = run_shape("basic", &[]);
    let gw = pid(&truth["gateway"]);
    let gateway = run.one("gateway", gw);
    assert_eq!(gateway["selector"], "command", "{gateway}");
    assert_eq!(
        gateway["comm"], "reaper-shapes",
        "its name after the exec: {gateway}"
    );
    assert_eq!(gateway["argv"][1], "basic", "{gateway}");
    let seq = |e: &Value| e["seq"].as_u64().unwrap();
    assert!(
        seq(gateway) > seq(run.one("exec", gw)),
        "announced after its exec: {gateway}"
    );
}

/// The `stop_command` events and the command's exit, for a run that ended by `--duration`.
fn ended_by_duration(run: &Run) -> (Vec<String>, &Value) {
    let stops = run.all("stop_command");
    let gw = stops
        .first()
        .unwrap_or_else(|| panic!("no stop_command: {:?}\n{}", run.events, run.stderr))["pid"]
        .as_u64()
        .unwrap();
    for s in &stops {
        assert_eq!(
            (s["pid"].as_u64(), &s["because"]),
            (Some(gw), &Value::from("duration"))
        );
    }
    let signals = stops
        .iter()
        .map(|s| s["signal"].as_str().unwrap().to_owned())
        .collect();
    (signals, run.one("exit", gw))
}

#[test]
fn a_run_that_ends_at_its_duration_ends_the_command_like_timeout_does() {
    if !require_root("a_run_that_ends_at_its_duration_ends_the_command_like_timeout_does") {
        return;
    }
    let run = run_reaper(&["--duration", "1s", "--", "/bin/sleep", "3600"]);
    let (signals, exit) = ended_by_duration(&run);
    assert_eq!(signals, ["SIGTERM"]);
    assert_eq!(exit["signal"], "SIGTERM", "{exit}");
    assert!(run.status.success(), "the run ended it: {}", run.stderr);
    assert_eq!(run.summary()["gateway_exit_code"], Value::Null);

    // One that ignores SIGTERM gets SIGKILL after --term-timeout.
    let run = run_reaper(&[
        "--duration",
        "1s",
        "--term-timeout",
        "1s",
        "--",
        "/bin/sh",
        "-c",
        "trap '' TERM; exec /bin/sleep 3600",
    ]);
    let (signals, exit) = ended_by_duration(&run);
    assert_eq!(signals, ["SIGTERM", "SIGKILL"]);
    assert_eq!(exit["signal"], "SIGKILL", "{exit}");
}

#[test]
fn the_commands_lines_and_reaper_traces_stay_whole_on_one_stderr_under_a_fork_storm() {
    if !require_root(
        "the_commands_lines_and_reaper_traces_stay_whole_on_one_stderr_under_a_fork_storm",
    ) {
        return;
    }
    const LINES: usize = 1000;
    let pad = "x".repeat(100);
    let script = format!(
        "i=0; while [ $i -lt {LINES} ]; do /bin/true; echo \"cmd-$i-{pad}\"; i=$((i+1)); done"
    );
    // --json: the command's stdout goes to stderr, where reaper-trace's readable lines go.
    // stderr is read slowly, as a busy log shipper would: the pipe fills, and a write larger
    // than PIPE_BUF then goes in pieces that the other writer's lines can land between.
    let mut child = Command::new(reaper_trace())
        .args(["--json", "--", "/bin/sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run reaper-trace");
    let mut err_pipe = child.stderr.take().unwrap();
    let slow = std::thread::spawn(move || {
        let mut all = Vec::new();
        let mut chunk = [0u8; 512];
        loop {
            match err_pipe.read(&mut chunk) {
                Ok(0) | Err(_) => return all,
                Ok(n) => all.extend_from_slice(&chunk[..n]),
            }
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
    });
    let mut stdout = Vec::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_end(&mut stdout)
        .unwrap();
    let status = child.wait().unwrap();
    let stderr_bytes = slow.join().unwrap();
    let run = Run::from_output(&stdout, &stderr_bytes, status);
    run.assert_lossless();
    // Both sides write whole lines; a write of either that split the other's would leave a
    // command line that is not whole on a line of its own.
    let stderr = String::from_utf8_lossy(&stderr_bytes);
    let whole = stderr
        .lines()
        .filter(|line| {
            line.strip_prefix("cmd-")
                .and_then(|rest| rest.split_once('-'))
                .is_some_and(|(n, tail)| n.parse::<usize>().is_ok() && tail == pad)
        })
        .count();
    assert_eq!(whole, LINES, "every line of the command, whole:\n{stderr}");
    let ours = stderr.lines().filter(|l| l.starts_with('[')).count();
    assert!(
        ours > LINES,
        "reaper-trace's lines came too (a fork and an exit each)"
    );
}
