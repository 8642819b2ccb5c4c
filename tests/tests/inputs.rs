//! What reaper-trace is given: bad options get a clear error, and hostile process names and
//! arguments stay lossless in the stream and inert in the readable lines. Needs root for the
//! shapes (see `require_root`).
use std::{
    process::{Command, Stdio},
    time::Duration,
};

use base64::{Engine as _, engine::general_purpose::STANDARD};
use reaper_tests::{
    Run, patience, pid, read_json, reaper_trace, require_root, run_reaper, scratch, shapes,
};

/// Waits until `pid` has exited and is not yet reaped (its state letter is Z).
fn wait_until_zombie(pid: u32) {
    let start = std::time::Instant::now();
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.chars().next());
        if state == Some('Z') {
            return;
        }
        assert!(
            start.elapsed() < patience(),
            "{pid} never became a zombie: {stat}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn bad_input_is_a_clear_error() {
    if !require_root("bad_input_is_a_clear_error") {
        return;
    }
    let run = run_reaper(&["--gateway-pid", "4194304"]);
    assert_eq!(run.status.code(), Some(1));
    assert!(
        run.stderr
            .contains("--gateway-pid 4194304: no such process"),
        "{}",
        run.stderr
    );
    assert!(run.events.is_empty());

    // Kernel threads, init (without --allow-init) and zombies are refused before any load.
    let run = run_reaper(&["--gateway-pid", "2"]);
    assert_eq!(run.status.code(), Some(1));
    assert!(run.stderr.contains("kernel thread"), "{}", run.stderr);
    let run = run_reaper(&["--gateway-pid", "1"]);
    assert_eq!(run.status.code(), Some(1));
    assert!(run.stderr.contains("--allow-init"), "{}", run.stderr);
    let zombie = Command::new("true").spawn().unwrap();
    wait_until_zombie(zombie.id());
    let run = run_reaper(&["--gateway-pid", &zombie.id().to_string()]);
    assert_eq!(run.status.code(), Some(1));
    assert!(run.stderr.contains("zombie"), "{}", run.stderr);
    drop(zombie);

    let run = run_reaper(&["--", "/nonexistent/gateway"]);
    assert_eq!(run.status.code(), Some(1));
    assert!(
        run.stderr.contains("cannot start \"/nonexistent/gateway\""),
        "{}",
        run.stderr
    );

    let out = Command::new(reaper_trace())
        .args(["--ring-size", "3MiB", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("power of two"));
}

/// Hostile names and arguments: the stream stays one valid JSON object per line and lossless
/// (exact bytes in `*_b64`), and the readable lines carry no raw control byte or bidi override.
#[test]
fn hostile_names_and_arguments_stay_lossless_and_inert() {
    if !require_root("hostile_names_and_arguments_stay_lossless_and_inert") {
        return;
    }
    let dir = scratch("hostile");
    let truth = dir.join("truth.json");
    let out = Command::new(reaper_trace())
        .args(["--json", "--"])
        .arg(shapes())
        .arg("hostile")
        .arg(&truth)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let run = Run::from_output(&out.stdout, &out.stderr, out.status);
    run.assert_well_formed();
    run.assert_lossless();
    let truth = read_json(&truth);

    let exec = run.one("exec", pid(&truth["exec"]));
    assert_eq!(exec["truncated"], true, "a 100 KB argument is cut: {exec}");
    let exact: Vec<Vec<u8>> = exec["argv_b64"]
        .as_array()
        .expect("argv_b64: an argument is not UTF-8")
        .iter()
        .map(|a| STANDARD.decode(a.as_str().unwrap()).unwrap())
        .collect();
    let want: [&[u8]; 5] = [
        b"true",
        b"line\nbreak",
        b"\x1b[31mred\x07",
        b"\xff\xfe not utf-8",
        "\u{202e}txt.exe".as_bytes(),
    ];
    assert_eq!(&exact[..5], &want.map(|a| a.to_vec())[..]);
    assert!(
        exact[5].iter().all(|&b| b == b'x'),
        "the long argument, cut"
    );

    let renamed = pid(&truth["renamed"]);
    let fork = run
        .all("fork")
        .into_iter()
        .find(|f| f["spawner"].as_u64() == Some(renamed))
        .expect("the renamed child's fork");
    assert_eq!(fork["comm"], "a\nb\u{1b}[31m");

    // People's lines: every control byte and bidi override escaped.
    let human = String::from_utf8(out.stderr).unwrap();
    assert!(human.contains("exec"), "{human}");
    for c in human.chars() {
        assert!(
            c == '\n' || !(c.is_control() || ('\u{202a}'..='\u{202e}').contains(&c)),
            "raw {c:?} in the readable output"
        );
    }
}
