//! A run of reaper-trace held until something is seen: a shape waits for a release file, a
//! run is stopped once its stream shows what the test waits for, with a generous cap.
use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::*;

/// How long a test waits for the event or state that proves its point before it gives up and
/// prints what it saw. Generous, because single-threaded TCG guests are several times slower
/// than the host: `REAPER_TEST_PATIENCE_SECS`, default 300. A test never passes or fails on
/// this window; it only ends a test that would otherwise hang.
pub fn patience() -> Duration {
    let secs = std::env::var("REAPER_TEST_PATIENCE_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    Duration::from_secs(secs)
}

/// The variable that caps how long a shape holds its leak (`reaper-shapes`' `sys::patience`).
pub const HOLD_CAP: &str = "REAPER_SHAPES_HOLD_CAP_SECS";

/// [`HOLD_CAP`]'s value for a shape a test starts: the test's own patience, so that a shape
/// never gives up before the test waiting for it does.
pub fn hold_cap() -> String {
    patience().as_secs().to_string()
}

/// What a test does once the event that proves its point has arrived.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Then {
    /// Let the shape go on: it ends its leak, and reaper-trace stops when the tree is done.
    Release,
    /// Stop reaper-trace (SIGINT) while the shape still holds its leak; the shape is released
    /// once reaper-trace has exited.
    Interrupt,
}

/// Runs a leak shape that holds its leak until released (`REAPER_SHAPES_RELEASE`, see
/// `reaper-shapes`): reaper-trace's stream is read as it comes, and once `proof` holds over
/// the events so far, the test does `then`. No wall-clock window: a slow machine only makes
/// the wait longer. If the proof never comes, the shape gives up after its cap and the test
/// fails, printing the stream.
pub fn run_shape_until(
    opts: &[&str],
    shape: &str,
    env: &[(&str, &str)],
    (what, then): (&str, Then),
    proof: impl FnMut(&[Value]) -> bool,
) -> (Run, Value) {
    static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = scratch(&format!("{shape}-held-{n}"));
    let truth = dir.join("truth.json");
    let shapes = shapes();
    let mut args = opts.to_vec();
    args.extend([
        "--",
        shapes.to_str().unwrap(),
        shape,
        truth.to_str().unwrap(),
    ]);
    let run = run_reaper_until(&args, env, &dir.join("release"), (what, then), proof);
    (run, read_json(&truth))
}

/// Runs `reaper-trace --json --quiet ARGS` with `REAPER_SHAPES_RELEASE` set to `release`,
/// reading the stream as it comes: see [`run_shape_until`].
pub fn run_reaper_until(
    args: &[&str],
    env: &[(&str, &str)],
    release: &std::path::Path,
    (what, then): (&str, Then),
    proof: impl FnMut(&[Value]) -> bool,
) -> Run {
    run_reaper_until_in(args, env, release, (what, then), proof, |_| {})
}

/// [`run_reaper_until`], with `setup` applied to the command first (a `pre_exec` that puts
/// reaper-trace in namespaces of its own, say).
pub fn run_reaper_until_in(
    args: &[&str],
    env: &[(&str, &str)],
    release: &std::path::Path,
    (what, then): (&str, Then),
    proof: impl FnMut(&[Value]) -> bool,
    setup: impl FnOnce(&mut Command),
) -> Run {
    run_until(
        args,
        env,
        release,
        (what, then),
        proof,
        setup,
        Asked::OnEachEvent,
    )
}

/// [`run_reaper_until`] for a proof that rests on more than the stream (a scrape of
/// `/metrics`, a count of scans): it is asked again every 250 ms while the stream is quiet,
/// not only when an event arrives.
pub fn run_reaper_until_polled(
    args: &[&str],
    env: &[(&str, &str)],
    release: &std::path::Path,
    (what, then): (&str, Then),
    proof: impl FnMut(&[Value]) -> bool,
) -> Run {
    run_until(
        args,
        env,
        release,
        (what, then),
        proof,
        |_| {},
        Asked::AlsoWhileQuiet,
    )
}

fn run_until(
    args: &[&str],
    env: &[(&str, &str)],
    release: &std::path::Path,
    (what, then): (&str, Then),
    mut proof: impl FnMut(&[Value]) -> bool,
    setup: impl FnOnce(&mut Command),
    asked: Asked,
) -> Run {
    use std::io::{BufRead, Read};
    use std::os::unix::process::CommandExt;
    let mut command = Command::new(reaper_trace());
    setup(&mut command);
    // Only stdio goes to reaper-trace and the processes it starts, as a service manager
    // would have it: an fd the test runner inherited from its own parent (a job server's
    // pipe, say) would otherwise be one more channel in every flag.
    // SAFETY: close_range is async-signal-safe and touches only this child's fd table.
    unsafe {
        command.pre_exec(|| {
            libc::close_range(3, u32::MAX, 0);
            Ok(())
        });
    }
    let mut child = command
        .args(["--json", "--quiet"])
        .args(args)
        .envs(env.iter().copied())
        .env("REAPER_SHAPES_RELEASE", release)
        .env(HOLD_CAP, hold_cap())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run reaper-trace");
    let mut stderr = child.stderr.take().unwrap();
    let stderr = std::thread::spawn(move || {
        let mut text = Vec::new();
        let _ = stderr.read_to_end(&mut text);
        text
    });
    let release_now = || std::fs::write(release, b"").expect("create the release file");
    let mut stdout = Vec::new();
    let mut events = Vec::new();
    let mut proven = false;
    let mut proven_after = 0;
    // Lines come from a reader thread, so that a proof resting on something besides the
    // stream (a scrape of /metrics, say) is asked again while the stream is quiet.
    let (lines, arriving) = std::sync::mpsc::channel();
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).split(b'\n') {
            if lines
                .send(line.expect("read reaper-trace's stream"))
                .is_err()
            {
                return;
            }
        }
    });
    let give_up = Instant::now() + patience();
    let mut gave_up = false;
    loop {
        let arrived = match arriving.recv_timeout(Duration::from_millis(250)) {
            Ok(line) => {
                if let Ok(event) = serde_json::from_slice::<Value>(&line) {
                    events.push(event);
                }
                stdout.extend_from_slice(&line);
                stdout.push(b'\n');
                true
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => false,
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
        };
        if !proven && !gave_up && Instant::now() >= give_up {
            // The cap on a proof that never comes: stop reaper-trace; the test then fails
            // with the stream it saw.
            gave_up = true;
            // SAFETY: a plain signal to the child this test started.
            unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
        }
        let ask = arrived || asked == Asked::AlsoWhileQuiet;
        if !proven && !gave_up && ask && proof(&events) {
            proven = true;
            proven_after = events.len();
            match then {
                Then::Release => release_now(),
                // SAFETY: a plain signal to the child this test started.
                Then::Interrupt => unsafe {
                    libc::kill(child.id() as i32, libc::SIGINT);
                },
            }
        }
    }
    let status = child.wait().expect("wait for reaper-trace");
    release_now(); // whatever happened, the shape's processes end
    let stderr = stderr.join().unwrap();
    let mut run = Run::from_output(&stdout, &stderr, status);
    run.proven_after = proven_after;
    assert!(
        proven,
        "waited {:?} for {what}; it never came. The stream:\n{}\n{}",
        patience(),
        String::from_utf8_lossy(&stdout),
        run.stderr
    );
    run.assert_well_formed();
    run
}
