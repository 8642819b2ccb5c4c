//! Helpers for the integration tests: run reaper-trace on a shape, read its NDJSON stream and
//! the shape's own record of what it did.
use std::path::PathBuf;

use serde_json::Value;

mod cgroups;
mod instance;
mod kept;
mod leaks;
mod orphan_later;
mod run;
mod spawn_sites;
mod tools;
mod until;

pub use cgroups::*;
pub use instance::*;
pub use kept::*;
pub use leaks::*;
pub use orphan_later::*;
pub use run::*;
pub use spawn_sites::*;
pub use tools::*;
pub use until::*;

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

/// A fresh scratch directory for one test's files. The scratch directories a test process
/// made are removed when it exits, unless a test failed: then they stay for a look, and their
/// names are printed.
pub fn scratch(name: &str) -> PathBuf {
    static CLEAN_AT_EXIT: std::sync::Once = std::sync::Once::new();
    CLEAN_AT_EXIT.call_once(|| {
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            A_TEST_FAILED.store(true, std::sync::atomic::Ordering::Relaxed);
            hook(info)
        }));
        // SAFETY: registers a plain `extern "C" fn` to run at `exit`, which the test harness
        // reaches once every test is done (returning from `main`, or `process::exit`).
        unsafe { libc::atexit(remove_scratch) };
    });
    let dir = scratch_path(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    MADE.lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(dir.clone());
    dir
}

/// The scratch directories this test process made.
static MADE: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

/// Whether a test of this process panicked (its assertion failed).
static A_TEST_FAILED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Removes the scratch directories this test process made, or names them when a test failed.
extern "C" fn remove_scratch() {
    let made = std::mem::take(&mut *MADE.lock().unwrap_or_else(|e| e.into_inner()));
    let failed = A_TEST_FAILED.load(std::sync::atomic::Ordering::Relaxed);
    for dir in made {
        if failed {
            eprintln!("scratch kept for a look: {}", dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
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

/// When a proof is asked.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Asked {
    /// After each event (a proof over the stream alone; one that acts on the newest event
    /// must see each event once).
    OnEachEvent,
    /// After each event, and every 250 ms while the stream is quiet.
    AlsoWhileQuiet,
}
