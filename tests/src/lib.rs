//! Helpers for the integration tests: run reaper-trace on a shape, read its NDJSON stream and
//! the shape's own record of what it did.
use std::{
    path::PathBuf,
    process::{Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

/// Says that `test` is skipped, and why; in CI (`CI=true`) it fails instead, since there a
/// skip would hide a broken set-up. Either way it is written to `$REAPER_SKIP_LOG` when set,
/// so that `cargo xtask test` counts skips apart from passes.
pub fn skip(test: &str, why: &str) {
    if let Some(log) = std::env::var_os("REAPER_SKIP_LOG") {
        use std::io::Write;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log);
        // One write of one line: tests on other threads append theirs whole.
        let _ = file.and_then(|mut f| f.write_all(format!("{test}: {why}\n").as_bytes()));
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{test}: {why}, and CI=true forbids skipping it");
    }
    eprintln!("skipped {test}: {why}");
}

/// True when these tests can load eBPF programs; otherwise [`skip`].
pub fn require_root(test: &str) -> bool {
    // SAFETY: plain syscall.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    skip(test, "the kernel tests need root to load eBPF programs");
    false
}

/// A binary of this workspace, next to the test's own build (`target/<profile>/`).
fn workspace_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    let bin = dir.join(name);
    assert!(
        bin.exists(),
        "{} is missing: build the workspace first (`cargo xtask test` does)",
        bin.display()
    );
    bin
}

/// The `reaper-trace` binary under test, or `$REAPER_TRACE`.
pub fn reaper_trace() -> PathBuf {
    match std::env::var_os("REAPER_TRACE") {
        Some(p) => PathBuf::from(p),
        None => workspace_bin("reaper-trace"),
    }
}

/// The process-shape helper (this package's `reaper-shapes` binary).
pub fn shapes() -> PathBuf {
    workspace_bin("reaper-shapes")
}

/// Where the scratch directory `name` of this test process is.
pub fn scratch_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("reaper-tests-{}-{name}", std::process::id()))
}

/// A fresh scratch directory for one test's files.
pub fn scratch(name: &str) -> PathBuf {
    let dir = scratch_path(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// The event stream's JSON Schema (`schema/events.schema.json`), built into the tests so that
/// they check it wherever they run.
pub const EVENT_SCHEMA: &str = include_str!("../../schema/events.schema.json");

/// The compiled schema.
pub fn event_schema() -> &'static jsonschema::Validator {
    static SCHEMA: std::sync::OnceLock<jsonschema::Validator> = std::sync::OnceLock::new();
    SCHEMA.get_or_init(|| {
        let schema: Value = serde_json::from_str(EVENT_SCHEMA).expect("the schema is JSON");
        jsonschema::draft202012::new(&schema).expect("the schema is a valid JSON Schema")
    })
}

/// Fails on an event the schema does not describe: every event of every test run is checked.
pub fn assert_schema_valid(event: &Value) {
    let errors: Vec<String> = event_schema()
        .iter_errors(event)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(
        errors.is_empty(),
        "event does not match schema/events.schema.json: {errors:?}\n{event}"
    );
}

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

/// When a proof is asked.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Asked {
    /// After each event (a proof over the stream alone; one that acts on the newest event
    /// must see each event once).
    OnEachEvent,
    /// After each event, and every 250 ms while the stream is quiet.
    AlsoWhileQuiet,
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
        .env(
            "REAPER_SHAPES_HOLD_CAP_SECS",
            patience().as_secs().to_string(),
        )
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

/// One gateway instance the test started: `reaper-shapes leak-orphan` (it forks A, which
/// calls setsid and forks B reading a pipe, then exits; the instance holds the pipe's write
/// end until its own release file appears).
pub struct Instance {
    child: std::process::Child,
    truth: std::path::PathBuf,
    release: std::path::PathBuf,
    go: std::path::PathBuf,
}

impl Instance {
    /// Starts `program ARGS... TRUTH` with its own release file; `prepare` runs in the child
    /// before exec. With `waits`, it makes its leak only at [`Instance::go`] (a process that
    /// is made a gateway after it started must not escape before).
    pub fn start(
        dir: &std::path::Path,
        name: &str,
        program: &std::path::Path,
        args: &[&str],
        prepare: Option<Box<dyn FnMut() -> std::io::Result<()> + Send + Sync>>,
        waits: bool,
    ) -> Instance {
        use std::os::unix::process::CommandExt;
        let truth = dir.join(format!("{name}.json"));
        let release = dir.join(format!("{name}.release"));
        let go = dir.join(format!("{name}.go"));
        if !waits {
            std::fs::write(&go, b"").expect("go file");
        }
        let mut command = Command::new(program);
        command
            .args(args)
            .arg(&truth)
            .env("REAPER_SHAPES_RELEASE", &release)
            .env("REAPER_SHAPES_GO", &go)
            .env("REAPER_SHAPES_BIN", shapes())
            .env(
                "REAPER_SHAPES_HOLD_CAP_SECS",
                patience().as_secs().to_string(),
            )
            .stdin(Stdio::null());
        if let Some(prepare) = prepare {
            // SAFETY: the closures given here only write(2) to a file.
            unsafe { command.pre_exec(prepare) };
        }
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", program.display()));
        Instance {
            child,
            truth,
            release,
            go,
        }
    }

    /// Lets an instance started with `Waits::ForGo` make its leak.
    pub fn go(&self) {
        std::fs::write(&self.go, b"").expect("go file");
    }

    pub fn pid(&self) -> u64 {
        u64::from(self.child.id())
    }

    /// Lets it end (the orphan reads EOF and exits too) and waits for it.
    pub fn finish(&mut self) {
        std::fs::write(&self.release, b"").expect("release file");
        self.child.wait().expect("wait for the instance");
    }

    /// Its orphan B, once the shape has written its truth.
    pub fn orphan(&self) -> u64 {
        wait_for_file(&self.truth, patience());
        pid(&read_json(&self.truth)["b"])
    }
}

/// A TCP port on 127.0.0.1 free right now (for `--metrics`, a Prometheus), and never one this
/// test process handed out before: two ports asked for in a row (or by tests running side by
/// side) must differ even though neither is bound yet.
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

/// A program a test needs from the host (`cargo xtask test` installs it from Debian's
/// `package`), or `None` to [`skip`].
pub fn host_tool(name: &str, package: &str, test: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file());
    if found.is_none() {
        let why = format!("no {name} on PATH (`cargo xtask test` installs Debian's {package})");
        skip(test, &why);
    }
    found
}

/// Runs `reaper-trace report AUDIT -o PAGE`; returns what it said on stderr.
pub fn render_report(audit: &std::path::Path, page: &std::path::Path) -> String {
    let out = Command::new(reaper_trace())
        .arg("report")
        .arg(audit)
        .arg("-o")
        .arg(page)
        .output()
        .expect("run reaper-trace report");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    stderr
}

/// The evidence of fd `fd` in a flag (its `pipes` entry).
pub fn pipe_fd(flag: &Value, fd: u64) -> &Value {
    flag["pipes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["fd"].as_u64() == Some(fd))
        .unwrap_or_else(|| panic!("no fd {fd} in {flag}"))
}

pub fn read_json(path: &std::path::Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("truth is JSON")
}

/// Waits until `path` exists (a shape publishes its truth by renaming it into place).
pub fn wait_for_file(path: &std::path::Path, limit: Duration) {
    let start = Instant::now();
    while !path.exists() {
        assert!(
            start.elapsed() < limit,
            "{} did not appear within {limit:?}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub fn pid(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a pid: {v}"))
}

/// GET /metrics from reaper-trace's `--metrics` on 127.0.0.1:`port`, as Prometheus would;
/// None while nothing answers there.
pub fn scrape_metrics(port: u16) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    Some(text)
}

/// The value of the sample line `series` (name with labels) in a scrape.
pub fn metric_sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}
