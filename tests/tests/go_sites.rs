//! A Go spawner (`--spawn-stacks auto`): Go keeps frame pointers and forks by a raw clone from
//! its syscall package, so the frame-pointer walk alone gives its whole stack, named from the
//! binary's own symbols and line tables (a Go binary carries no GNU build id, only Go's: its
//! frames are located in the spawner's mappings on the unwinding thread). Built here with
//! the Go toolchain (`go`, see the prerequisites table). Needs root (see `require_root`); host
//! only (the guests carry no Go toolchain).
use std::path::{Path, PathBuf};
use std::process::Command;

use reaper_tests::{Then, frame, frame_holding, require_root, run_reaper_until, scratch};
use serde_json::Value;

/// The gateway's source: it holds `cat` on a pipe, started from `startStdioServer`.
fn gateway_source() -> PathBuf {
    go_source("leaky_gateway")
}

/// The Go program `name`'s source.
fn go_source(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("go/{name}.go"))
}

/// The line of `gateway_source()` that holds `text`.
fn line_of(text: &str) -> u64 {
    reaper_tests::line_of(&gateway_source(), text)
}

/// Builds the gateway into `dir` (see [`build_go`]).
fn build_gateway(dir: &Path) -> PathBuf {
    build_go(dir, "leaky_gateway")
}

/// Builds Go program `name` into `dir` with a Go cache of its own (the same build on a machine
/// that never built Go before); returns the binary.
fn build_go(dir: &Path, name: &str) -> PathBuf {
    let gateway = dir.join(name);
    let built = Command::new("go")
        .args(["build", "-o"])
        .arg(&gateway)
        .arg(go_source(name))
        .env("GOCACHE", dir.join("go-cache"))
        .env("GOPATH", dir.join("go-path"))
        .env("GO111MODULE", "off")
        .output()
        .expect("go: install the prerequisites (`cargo xtask prereqs`)");
    assert!(
        built.status.success(),
        "go build: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    gateway
}

/// Runs Go program `name` (built here, see [`build_go`]) as the gateway, with its release
/// file and then `gateway_args` as its arguments, until a flag of `reason` is raised
/// (`options` given to reaper-trace besides `--scan-interval 250ms`); returns that flag. A
/// Go gateway links no C library (Go's defaults: no cgo): checked here.
fn first_flag_of_go_gateway(
    test: &str,
    name: &str,
    gateway_args: &[&str],
    (reason, options): (&str, &[&str]),
) -> Value {
    let dir = scratch(test);
    let gateway = build_go(&dir, name);
    let image = std::fs::read(&gateway).unwrap();
    assert!(
        !image.windows(9).any(|w| w == b"libc.so.6"),
        "the Go gateway is static: it names no C library"
    );
    let release = dir.join("release");
    let is_flag = |e: &Value| e["event"] == "flag" && e["reason"] == reason;
    let mut args = options.to_vec();
    args.extend(["--scan-interval", "250ms", "--"]);
    args.extend([gateway.to_str().unwrap(), release.to_str().unwrap()]);
    args.extend(gateway_args);
    let run = run_reaper_until(
        &args,
        &[],
        &release,
        (&format!("a flag {reason}"), Then::Release),
        |events| events.iter().any(is_flag),
    );
    let _ = std::fs::remove_dir_all(&dir);
    let proven = run.until_proof();
    let flag = proven.all("flag").into_iter().find(|e| is_flag(e));
    let flag = flag.unwrap_or_else(|| panic!("no {reason} flag: {:#?}", run.events));
    eprintln!("{test}: {:#}", flag["spawned_at"]);
    flag.clone()
}

/// The `idle` flag of the gateway's `cat`: `spawned_at` names the function that started it
/// (file and line), its caller, and the path through `os/exec` and `syscall` down to the raw
/// fork, with no frame cut.
#[test]
fn a_go_spawner_is_named_down_to_its_raw_fork() {
    let test = "a_go_spawner_is_named_down_to_its_raw_fork";
    if !require_root(test) {
        return;
    }
    let flag = first_flag_of_go_gateway(
        test,
        "leaky_gateway",
        &[],
        ("idle", &["--idle-after", "1s"]),
    );
    assert_eq!(flag["comm"], "cat", "{flag}");
    let frames = flag["spawned_at"].as_array().cloned().unwrap_or_default();
    assert_ne!(
        flag["spawned_at_truncated"], true,
        "the walk reached the end of the stack: {frames:#?}"
    );
    let own = frame(&frames, "main.startStdioServer");
    assert!(
        own["file"]
            .as_str()
            .is_some_and(|f| f.ends_with("go/leaky_gateway.go")),
        "{own}"
    );
    assert_eq!(own["line"], line_of("if err := cmd.Start()"), "{own}");
    let caller = frame(&frames, "main.main");
    assert_eq!(
        caller["line"],
        line_of("server := startStdioServer()"),
        "{caller}"
    );
    frame(&frames, "os/exec.(*Cmd).Start");
    frame(&frames, "syscall.forkExec");
    let innermost = frames[0]["function"].as_str().unwrap_or("");
    assert!(
        innermost.starts_with("syscall."),
        "the walk starts at the raw fork: {frames:#?}"
    );
}

/// The same spawner across a restart of reaper-trace (`--state-dir`): the first run reads the
/// fork of `cat` and keeps it in its checkpoint, the next takes it back with the gateway still
/// running. A Go binary carries no GNU build id, so its walk is all addresses: the next run
/// locates it in the gateway's mappings at start-up (on the unwinding thread, never the
/// reader's), and its `idle` flag names the same function and line.
#[test]
fn a_go_spawn_read_before_a_restart_is_located_by_the_run_after_it() {
    let test = "a_go_spawn_read_before_a_restart_is_located_by_the_run_after_it";
    // The gateway forks `cat` as it starts: under its pid, a shell waits for the trigger.
    let start = |dir: &Path| {
        let gateway = build_gateway(dir);
        let waiting = format!(
            "while [ ! -e '{trigger}' ]; do sleep 0.05; done; exec '{gateway}' '{release}'",
            trigger = dir.join("trigger").display(),
            gateway = gateway.display(),
            release = dir.join("release").display(),
        );
        Command::new("sh")
            .args(["-c", &waiting])
            .spawn()
            .expect("start the gateway's shell")
    };
    let Some(frames) = reaper_tests::spawned_at_across_a_restart(test, start, "cat") else {
        return;
    };
    let own = frame(&frames, "main.startStdioServer");
    assert_eq!(own["line"], line_of("if err := cmd.Start()"), "{own}");
    frame(&frames, "syscall.forkExec");
}

/// A static Go gateway (it maps no C library) starts its helper through a C spawner that
/// forks it by glibc's `fork()` and exits at once (`sh -c 'helper &'`): no process the run
/// reads maps that C library, and the spawner is gone before its stack copy is unwound. The
/// library is found from the spawner's executable (the libraries it names) by the build id the
/// kernel named its frame by, and the helper's `orphaned` flag names the C function that
/// forked it, past the C library, down to the spawner's `main`.
#[test]
fn a_c_spawner_of_a_static_gateway_gone_at_once_is_named_past_its_c_library() {
    let test = "a_c_spawner_of_a_static_gateway_gone_at_once_is_named_past_its_c_library";
    if !require_root(test) {
        return;
    }
    let shapes = reaper_tests::shapes();
    let spawner = [shapes.to_str().unwrap(), "fork-through-c-and-exit"];
    let flag = first_flag_of_go_gateway(test, "c_spawner_gateway", &spawner, ("orphaned", &[]));
    let frames = flag["spawned_at"].as_array().cloned().unwrap_or_default();
    frame_holding(&frames, "fork");
    let own = frame(&frames, "spawn_leaky_helper_fp");
    assert!(
        own["file"]
            .as_str()
            .is_some_and(|f| f.ends_with("spawner.c")),
        "{own}"
    );
    frame_holding(&frames, "fork_through_c_and_exit");
    assert!(
        frames.iter().any(|f| f["function"] == "main"
            && f["object"]
                .as_str()
                .is_some_and(|o| o.ends_with("reaper-shapes"))),
        "down to the spawner's main: {frames:#?}"
    );
}
