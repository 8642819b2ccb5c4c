//! A Python spawner's own frames (`--spawn-stacks auto`): read in the kernel at the fork from
//! the interpreter's frame chain, named from the spawner's memory when its leak is flagged.
//! The host's Debian python3 (no frame pointers, libpython linked in) always; each other
//! CPython 3.11–3.14 this machine has (pyenv's, with a shared libpython) too. Needs root
//! (see `require_root`); host only (the guests carry no Python).
use std::path::{Path, PathBuf};

use reaper_tests::{Then, pid, require_root, run_reaper_until, scratch};
use serde_json::Value;

/// The miniature MCP host the tests run.
fn host_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("python/mcp_host.py")
}

/// The line of `host_script()` that holds `text`.
fn line_of(text: &str) -> u64 {
    let script = std::fs::read_to_string(host_script()).unwrap();
    let at = script.lines().position(|l| l.contains(text));
    at.expect("the line is in the script") as u64 + 1
}

/// Debian's python3, then each other CPython 3.11–3.14 pyenv installed on this machine.
fn interpreters() -> Vec<PathBuf> {
    let mut found = vec![PathBuf::from("/usr/bin/python3.11")];
    let pyenv = Path::new("/root/.pyenv/versions");
    let mut versions: Vec<PathBuf> = std::fs::read_dir(pyenv)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .collect();
    versions.sort();
    for dir in versions {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let minor = name.split('.').nth(1).and_then(|m| m.parse::<u32>().ok());
        if name.starts_with("3.") && minor.is_some_and(|m| (11..=14).contains(&m)) {
            let bin = dir.join(format!("bin/python3.{}", minor.unwrap()));
            if bin.is_file() {
                found.push(bin);
            }
        }
    }
    found
}

/// Runs the host under `python` in `mode` until its server is flagged idle; returns the
/// flag's `spawned_at` and the interpreter the exec event named.
fn spawned_at(test: &str, python: &Path, mode: &str) -> (Vec<Value>, Value) {
    let dir = scratch(&format!("{test}-{}", python.display()).replace('/', "_"));
    let (trigger, release) = (dir.join("trigger"), dir.join("release"));
    let script = host_script();
    let mut warmed = false;
    let run = run_reaper_until(
        &[
            "--idle-after",
            "1s",
            "--scan-interval",
            "250ms",
            "--",
            python.to_str().unwrap(),
            script.to_str().unwrap(),
            mode,
            trigger.to_str().unwrap(),
            release.to_str().unwrap(),
        ],
        &[],
        &release,
        (
            "the server flagged idle, with its spawn site",
            Then::Release,
        ),
        |events| {
            // The warm-up child's fork is written once the interpreter was looked at.
            if !warmed
                && events
                    .iter()
                    .any(|e| e["event"] == "exec" && e["argv"][0] == "true")
            {
                warmed = true;
                std::fs::write(&trigger, b"").unwrap();
            }
            events
                .iter()
                .any(|e| e["event"] == "flag" && e["reason"] == "idle")
        },
    );
    let proven = run.until_proof();
    let flag = proven
        .all("flag")
        .into_iter()
        .find(|f| f["reason"] == "idle");
    let flag = flag.unwrap_or_else(|| panic!("no idle flag: {:?}\n{}", run.events, run.stderr));
    let gateway = proven.all("gateway")[0]["pid"].clone();
    let exec = proven
        .all("exec")
        .into_iter()
        .find(|e| e["pid"] == gateway)
        .cloned()
        .unwrap_or(Value::Null);
    let frames = flag["spawned_at"].as_array().cloned().unwrap_or_default();
    assert!(pid(&flag["pid"]) > 0);
    (frames, exec["interpreter"].clone())
}

/// The first frame in `frames` naming `function`.
fn frame<'a>(frames: &'a [Value], function: &str) -> &'a Value {
    frames
        .iter()
        .find(|f| f["function"] == function)
        .unwrap_or_else(|| panic!("no frame of {function}: {frames:#?}"))
}

#[test]
fn a_python_spawners_flag_names_the_function_file_and_line_of_its_popen() {
    let test = "a_python_spawners_flag_names_the_function_file_and_line_of_its_popen";
    if !require_root(test) {
        return;
    }
    for python in interpreters() {
        let (frames, interpreter) = spawned_at(test, &python, "popen");
        eprintln!("{}: {interpreter}: {frames:?}", python.display());
        // An interpreter linked with its libpython is found at its exec, and the exec event
        // names it; one with a shared libpython only once the loader mapped it, later.
        if python.starts_with("/usr/bin") {
            let version = python.file_name().unwrap().to_string_lossy().into_owned();
            assert_eq!(interpreter, version.as_str(), "the exec event names it");
        }
        let own = frame(&frames, "start_stdio_server");
        assert_eq!(own["language"], "python", "{own}");
        assert!(
            own["file"]
                .as_str()
                .unwrap()
                .ends_with("tests/python/mcp_host.py"),
            "{own}"
        );
        assert_eq!(own["line"], line_of("return subprocess.Popen("), "{own}");
        // Innermost first: subprocess's own frames, then the host's, then native ones.
        let first = &frames[0];
        assert!(
            first["file"]
                .as_str()
                .is_some_and(|f| f.ends_with("subprocess.py")),
            "{first}"
        );
        let caller = frame(&frames, "main");
        assert_eq!(caller["line"], line_of("server = start_stdio_server()"));
        let python_frames = frames
            .iter()
            .take_while(|f| f["language"] == "python")
            .count();
        assert!(
            frames[python_frames..]
                .iter()
                .all(|f| f.get("language").is_none()),
            "native frames after the Python ones: {frames:#?}"
        );
    }
}

#[test]
fn an_asyncio_spawn_from_an_event_loop_thread_names_its_coroutine() {
    let test = "an_asyncio_spawn_from_an_event_loop_thread_names_its_coroutine";
    if !require_root(test) {
        return;
    }
    let python = PathBuf::from("/usr/bin/python3.11");
    let (frames, _) = spawned_at(test, &python, "asyncio");
    let own = frame(&frames, "start_stdio_server_async");
    assert_eq!(
        own["line"],
        line_of("return await asyncio.create_subprocess_exec("),
        "{own}"
    );
    assert!(
        frames
            .iter()
            .any(|f| f["file"].as_str().is_some_and(|f| f.contains("/asyncio/"))),
        "asyncio's own frames are there too: {frames:#?}"
    );
}
