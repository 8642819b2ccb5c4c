//! A Python spawner's own frames (`--spawn-stacks auto`): read in the kernel at the fork from
//! the interpreter's frame chain, named from the spawner's memory when its leak is flagged.
//! The host's Debian python3 (no frame pointers, libpython linked in) always; each other
//! CPython 3.11–3.14 this machine has (pyenv's, with a shared libpython), and Debian sid's 3.13
//! and 3.14 in a chroot. Needs root (see `require_root`). The guests of the kernel matrix
//! carry Debian's python3.11 of their architecture (x86_64's and arm64's) and no other.
use std::path::{Path, PathBuf};

use reaper_tests::{
    Then, frame, pid, require_root, run_reaper_until, scratch, trigger_after_warm_up,
};
use serde_json::Value;

/// The miniature MCP host the tests run.
fn host_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("python/mcp_host.py")
}

/// The line of `host_script()` that holds `text`.
fn line_of(text: &str) -> u64 {
    reaper_tests::line_of(&host_script(), text)
}

/// A CPython to run the host under: its path, and the root it runs in (a chroot), if not /.
struct Python {
    path: PathBuf,
    root: Option<PathBuf>,
}

impl Python {
    fn name(&self) -> String {
        self.path
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned()
    }
}

/// Debian's python3, each other CPython 3.11–3.14 pyenv installed on this machine, and
/// Debian sid's 3.13 and 3.14 in the root `cargo xtask test` makes (`REAPER_PYTHON_ROOT`;
/// without it, not run: the arm64 guests hold theirs, the other guests none).
fn interpreters() -> Vec<Python> {
    let mut found = vec![Python {
        path: PathBuf::from("/usr/bin/python3.11"),
        root: None,
    }];
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/root/.pyenv/versions")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .collect();
    versions.sort();
    for dir in versions {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let minor = name.split('.').nth(1).and_then(|m| m.parse::<u32>().ok());
        if let Some(minor) = minor.filter(|m| name.starts_with("3.") && (11..=14).contains(m)) {
            let path = dir.join(format!("bin/python3.{minor}"));
            if path.is_file() {
                found.push(Python { path, root: None });
            }
        }
    }
    if let Some(root) = std::env::var_os("REAPER_PYTHON_ROOT").map(PathBuf::from) {
        for minor in [13, 14] {
            let path = PathBuf::from(format!("/usr/bin/python3.{minor}"));
            assert!(
                root.join(path.strip_prefix("/").unwrap()).is_file(),
                "REAPER_PYTHON_ROOT {} has no {}",
                root.display(),
                path.display()
            );
            found.push(Python {
                path,
                root: Some(root.clone()),
            });
        }
    }
    found
}

/// Runs the host under `python` in `mode` until its server is flagged (see [`server_flag`]);
/// returns the flag's `spawned_at` and the interpreter the exec event named.
fn spawned_at(test: &str, python: &Python, mode: &str) -> (Vec<Value>, Value) {
    let label = format!("{test}-{}-{}", python.name(), python.root.is_some());
    // Inside a chroot the host's files are where the chroot sees them: under its /tmp.
    let (dir, seen_as) = match &python.root {
        Some(root) => {
            let inside = PathBuf::from("/tmp").join(&label);
            let dir = root.join(inside.strip_prefix("/").unwrap());
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            (dir, inside)
        }
        None => {
            let dir = scratch(&label);
            (dir.clone(), dir)
        }
    };
    std::fs::copy(host_script(), dir.join("mcp_host.py")).unwrap();
    let (trigger, release) = (dir.join("trigger"), dir.join("release"));
    let arg = |name: &str| seen_as.join(name).to_str().unwrap().to_owned();
    let mut command: Vec<String> = Vec::new();
    if let Some(root) = &python.root {
        command.extend(["chroot".into(), root.to_str().unwrap().into()]);
    }
    let host = [
        python.path.to_str().unwrap().into(),
        arg("mcp_host.py"),
        if mode == "unread" { "early" } else { mode }.into(),
        arg("trigger"),
        arg("release"),
    ];
    let mut interpreter_read = true;
    if mode == "unread" {
        // reaper-trace (CMD's parent) stopped from before the interpreter's exec until after
        // its first fork: nothing of either is read in time, whatever the machine's speed.
        // An interpreter not on PATH is run once first, and its exec read.
        let mut run_python = command.join(" ");
        run_python.push(' ');
        run_python.push_str(python.path.to_str().unwrap());
        interpreter_read = !on_path(&python.path) || python.root.is_some();
        let script = format!(
            r#"if [ "$1" = warm ]; then
    {run_python} -c pass
    i=0; while [ ! -e {trigger} ] && [ $i -lt 6000 ]; do sleep 0.05; i=$((i+1)); done
fi
shift
reaper=$PPID host=$$
kill -STOP $reaper
(i=0; while ! pgrep -x -P $host cat >/dev/null && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done
 kill -CONT $reaper) &
exec "$@""#,
            trigger = trigger.display(),
        );
        command = vec!["sh".into(), "-c".into(), script, "sh".into()];
        command.push(if interpreter_read { "warm" } else { "cold" }.into());
        if let Some(root) = &python.root {
            command.extend(["chroot".into(), root.to_str().unwrap().into()]);
        }
    }
    if mode == "early" {
        // Started by a shell busy forking, as a gateway's wrapper may be: the records stream
        // when the interpreter's exec comes, and the reader is polling, not waiting for one.
        let script = r#"i=0; while [ $i -lt 400 ]; do /bin/true; i=$((i+1)); done; exec "$@""#;
        command.extend(["sh".into(), "-c".into(), script.into(), "sh".into()]);
    }
    command.extend(host);
    let mut args = vec!["--idle-after", "1s", "--scan-interval", "250ms", "--"];
    args.extend(command.iter().map(String::as_str));
    let mut warmed = false;
    let run = run_reaper_until(
        &args,
        &[],
        &release,
        ("the server flagged, with its spawn site", Then::Release),
        |events| {
            match mode {
                "unread" if interpreter_read => {
                    trigger_after_interpreter_read(events, &mut warmed, &trigger)
                }
                _ => trigger_after_warm_up(events, &mut warmed, &trigger),
            }
            events.iter().any(|e| server_flag(mode, e))
        },
    );
    let proven = run.until_proof();
    let flag = proven
        .all("flag")
        .into_iter()
        .find(|f| server_flag(mode, f));
    let flag = flag.unwrap_or_else(|| panic!("no server flag: {:?}\n{}", run.events, run.stderr));
    let interpreter = proven
        .all("exec")
        .into_iter()
        .filter_map(|e| e.get("interpreter"))
        .next()
        .cloned()
        .unwrap_or(Value::Null);
    let frames = flag["spawned_at"].as_array().cloned().unwrap_or_default();
    assert!(pid(&flag["pid"]) > 0);
    (frames, interpreter)
}

/// Whether `path` is a file in a directory of this process's `PATH`.
fn on_path(path: &Path) -> bool {
    let dirs = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&dirs).any(|dir| Some(dir.as_path()) == path.parent())
}

/// Writes `trigger` once `events` hold the exec of an interpreter run as `-c pass`, named in
/// the event (the reader looked at it).
fn trigger_after_interpreter_read(events: &[Value], read: &mut bool, trigger: &Path) {
    if !*read
        && events
            .iter()
            .any(|e| e["event"] == "exec" && e["argv"][1] == "-c" && e["interpreter"].is_string())
    {
        *read = true;
        std::fs::write(trigger, b"").unwrap();
    }
}

/// Whether `event` flags the server: `cat` idle, or in `forked` mode `sleep` deaf (its
/// stdin's writer closed by the worker that started it).
fn server_flag(mode: &str, event: &Value) -> bool {
    let (reason, comm) = match mode {
        "forked" => ("deaf", "sleep"),
        _ => ("idle", "cat"),
    };
    event["event"] == "flag" && event["reason"] == reason && event["comm"] == comm
}

#[test]
fn a_python_spawners_flag_names_the_function_file_and_line_of_its_popen() {
    let test = "a_python_spawners_flag_names_the_function_file_and_line_of_its_popen";
    if !require_root(test) {
        return;
    }
    for python in interpreters() {
        let (frames, interpreter) = spawned_at(test, &python, "popen");
        eprintln!(
            "{} ({:?}): {interpreter}: {frames:?}",
            python.path.display(),
            python.root
        );
        // An interpreter linked with its libpython (Debian's) is found at its exec, and the
        // exec event names it; one with a shared libpython only once the loader mapped it.
        if python.path.starts_with("/usr/bin") {
            assert_eq!(
                interpreter,
                python.name().as_str(),
                "the exec event names it"
            );
        }
        let own = frame(&frames, "start_stdio_server");
        assert_eq!(own["language"], "python", "{own}");
        assert!(
            own["file"].as_str().unwrap().ends_with("/mcp_host.py"),
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
    let python = Python {
        path: PathBuf::from("/usr/bin/python3.11"),
        root: None,
    };
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

#[test]
fn a_forked_copy_of_the_interpreter_spawns_with_its_frames() {
    let test = "a_forked_copy_of_the_interpreter_spawns_with_its_frames";
    if !require_root(test) {
        return;
    }
    let python = Python {
        path: PathBuf::from("/usr/bin/python3.11"),
        root: None,
    };
    let (frames, _) = spawned_at(test, &python, "forked");
    let own = frame(&frames, "start_stdio_server");
    assert_eq!(own["line"], line_of("return subprocess.Popen("), "{own}");
    let caller = frame(&frames, "main");
    assert_eq!(
        caller["line"],
        line_of("worker_server = start_stdio_server("),
        "{caller}"
    );
}

#[test]
fn a_python_spawn_read_before_a_restart_is_named_by_the_run_after_it() {
    let test = "a_python_spawn_read_before_a_restart_is_named_by_the_run_after_it";
    let start = |dir: &Path| {
        std::fs::copy(host_script(), dir.join("mcp_host.py")).unwrap();
        std::process::Command::new("/usr/bin/python3.11")
            .arg(dir.join("mcp_host.py"))
            .arg("popen")
            .arg(dir.join("trigger"))
            .arg(dir.join("release"))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("start python3")
    };
    let Some(frames) = reaper_tests::spawned_at_across_a_restart(test, start, "cat") else {
        return;
    };
    // Its Python frames, read in the kernel at the fork while the first run recorded, and
    // named by the second from the host's memory.
    let own = frame(&frames, "start_stdio_server");
    assert_eq!(own["language"], "python", "{own}");
    assert_eq!(own["line"], line_of("return subprocess.Popen("), "{own}");
}

/// A gateway whose first fork comes before its exec is read (the reader stopped from before
/// the exec to after the fork) gets its Python frames all the same: the kernel places the
/// interpreter's layout at the exec. An interpreter on PATH is read as reaper-trace starts;
/// any other (Debian sid's in a chroot) once the reader has seen it run (`-c pass` first).
/// Not for a shared libpython (pyenv's): the loader maps it after the exec.
#[test]
fn a_python_gateway_that_forks_before_its_exec_is_read_has_its_frames() {
    let test = "a_python_gateway_that_forks_before_its_exec_is_read_has_its_frames";
    if !require_root(test) {
        return;
    }
    for python in interpreters() {
        if python.root.is_none() && !on_path(&python.path) {
            continue;
        }
        let (frames, _) = spawned_at(test, &python, "unread");
        eprintln!("{} ({:?}): {frames:?}", python.path.display(), python.root);
        let own = frame(&frames, "start_stdio_server");
        assert_eq!(own["line"], line_of("return subprocess.Popen("), "{own}");
        let caller = frame(&frames, "main");
        assert_eq!(caller["line"], line_of("first = start_stdio_server()"));
    }
}

/// A gateway that spawns its server as it starts (its first fork, within its first
/// milliseconds: no warm-up, no trigger) gets its Python frames: the interpreter is known
/// before it can fork.
#[test]
fn a_spawn_at_the_interpreters_start_has_its_python_frames() {
    let test = "a_spawn_at_the_interpreters_start_has_its_python_frames";
    if !require_root(test) {
        return;
    }
    for python in interpreters() {
        let (frames, _) = spawned_at(test, &python, "early");
        eprintln!("{}: {frames:?}", python.path.display());
        let own = frame(&frames, "start_stdio_server");
        assert_eq!(own["line"], line_of("return subprocess.Popen("), "{own}");
        let caller = frame(&frames, "main");
        assert_eq!(caller["line"], line_of("first = start_stdio_server()"));
    }
}

/// A gateway that leaks a helper from a named function and exits.
const LEAKY_GATEWAY: &str = r#"import subprocess


def start_stdio_server():
    # Its own session, and none of the job's output: the job ends, the helper stays.
    return subprocess.Popen(["sleep", "3600.25"], start_new_session=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


start_stdio_server()
"#;

/// `--check` names a Python leak's spawner as a flag does: its verdict comes after the
/// spawner exited, and `check.leaked[].spawned_at` still holds its function, file and line
/// (named at the fork, from the spawner's memory).
#[test]
fn check_names_the_function_that_leaked_a_python_helper() {
    let test = "check_names_the_function_that_leaked_a_python_helper";
    if !require_root(test) {
        return;
    }
    let dir = scratch(test);
    let script = dir.join("leaky_gateway.py");
    std::fs::write(&script, LEAKY_GATEWAY).unwrap();
    let args = ["--check", "--settle", "1s", "--", "/usr/bin/python3.11"];
    let mut args = args.to_vec();
    args.push(script.to_str().unwrap());
    let run = reaper_tests::run_reaper(&args);
    let _ = std::process::Command::new("pkill")
        .args(["-f", "^sleep 3600.25$"])
        .status();
    assert_eq!(run.status.code(), Some(3), "exit 3: leaked\n{}", run.stderr);
    let check = &run.all("check")[0];
    let leaked = check["leaked"].as_array().expect("leaked");
    assert_eq!(leaked.len(), 1, "{check}");
    let frames = leaked[0]["spawned_at"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    eprintln!("{frames:#?}");
    let own = frame(&frames, "start_stdio_server");
    assert_eq!(own["language"], "python", "{own}");
    assert!(
        own["file"]
            .as_str()
            .is_some_and(|f| f.ends_with("/leaky_gateway.py")),
        "{own}"
    );
    let line = LEAKY_GATEWAY
        .lines()
        .position(|l| l.contains("return subprocess.Popen("))
        .unwrap() as u64
        + 1;
    assert_eq!(own["line"], line, "{own}");
}
