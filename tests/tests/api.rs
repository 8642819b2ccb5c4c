//! The running audit's API, asked by `reaper-trace why PID` while the run traces a real
//! setsid escapee (gateway > A (setsid, exited) > B holding the gateway's pipe): the answer
//! names B's lineage with A's exit, its pipe and who holds the other end, its flag, and that
//! `--kill` would follow it; a pid no run tracks gets exit status 1 and what /proc says. Needs root (see `require_root`).
use std::process::{Command, Output};

use reaper_tests::{Then, pid, reaper_trace, require_root, run_shape_until};
use serde_json::Value;

/// `reaper-trace why ARGS`.
fn why(args: &[&str]) -> Output {
    Command::new(reaper_trace())
        .arg("why")
        .args(args)
        .output()
        .expect("run reaper-trace why")
}

/// The orphaned process's pid, once the stream holds its flag.
fn orphaned(events: &[Value]) -> Option<u64> {
    events
        .iter()
        .find(|e| e["event"] == "flag" && e["reason"] == "orphaned")
        .map(|e| pid(&e["pid"]))
}

#[test]
fn why_names_an_escapees_lineage_its_exited_spawner_its_pipe_and_its_flag() {
    let test = "why_names_an_escapees_lineage_its_exited_spawner_its_pipe_and_its_flag";
    if !require_root(test) {
        return;
    }
    // Asked while the run holds the flag (the default socket: every run's is asked).
    let mut asked: Option<(Output, Output)> = None;
    let (run, truth) = run_shape_until(
        &["--scan-interval", "250ms"],
        "leak-orphan",
        &[],
        ("the orphan's flag, and why answered", Then::Release),
        |events| {
            if let Some(b) = orphaned(events).filter(|_| asked.is_none()) {
                let b = b.to_string();
                asked = Some((why(&[&b, "--json"]), why(&[&b])));
            }
            asked.is_some()
        },
    );
    let (gw, a, b) = (pid(&truth["gateway"]), pid(&truth["a"]), pid(&truth["b"]));
    let (json, text) = asked.expect("asked");
    assert!(json.status.success(), "{json:?}\n{}", run.stderr);
    let answer: Value = serde_json::from_slice(&json.stdout).expect("one JSON object");
    eprintln!("{answer:#}");
    assert_eq!(pid(&answer["pid"]), b);
    assert_eq!(answer["alive"], true);
    assert_eq!(answer["lineage"], serde_json::json!([gw, a, b]));
    assert!(answer["ancestors"][1]["exited"].is_u64(), "A exited");
    assert!(
        answer["ancestors"][0]["exited"].is_null(),
        "the gateway is alive"
    );
    assert_eq!(answer["escaped"], true);
    let flags = answer["flags"].as_array().expect("flags");
    assert!(flags.iter().any(|f| f["reason"] == "orphaned"), "{flags:?}");
    let kill = &answer["kill"];
    assert_eq!(
        (&kill["enabled"], &kill["could"]),
        (&false.into(), &true.into()),
        "{kill}"
    );
    assert!(
        kill["why"].as_str().unwrap().contains("`orphaned`"),
        "{kill}"
    );
    let stdin = answer["pipes"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["fd"] == 0))
        .expect("its stdin");
    assert_eq!(
        (&stdin["kind"], &stdin["end"]),
        (&"pipe".into(), &"read".into())
    );
    assert!(
        stdin["peers"].as_array().is_some_and(|p| p
            .iter()
            .any(|h| pid(&h["pid"]) == gw && h["end"] == "write")),
        "the gateway holds the write end: {stdin}"
    );

    let text = String::from_utf8_lossy(&text.stdout).into_owned();
    eprintln!("{text}");
    assert!(text.starts_with(&format!("pid {b} ")), "{text}");
    assert!(text.contains("flagged orphaned for"), "{text}");
    assert!(
        text.contains(&format!("{a} (")) && text.contains("[exited "),
        "{text}"
    );
    assert!(
        text.contains("--kill would act (this run does not kill)"),
        "{text}"
    );

    // A process no run tracks: exit status 1, and what /proc says of it.
    let me = std::process::id().to_string();
    let untracked = why(&[&me]);
    let said = String::from_utf8_lossy(&untracked.stdout).into_owned();
    assert_eq!(untracked.status.code(), Some(1), "{said}");
    assert!(said.contains("what /proc says"), "{said}");
}

#[test]
fn a_run_with_api_off_serves_nothing_and_a_socket_it_cannot_make_is_an_error() {
    let test = "a_run_with_api_off_serves_nothing_and_a_socket_it_cannot_make_is_an_error";
    if !require_root(test) {
        return;
    }
    let dir = reaper_tests::scratch(test);
    let socket = dir.join("api.sock");
    let off = reaper_tests::run_reaper(&["--api", "off", "--", "true"]);
    assert!(off.status.success(), "{}", off.stderr);
    let asked = reaper_tests::run_reaper(&["--api", socket.to_str().unwrap(), "--", "true"]);
    assert!(asked.status.success(), "{}", asked.stderr);
    assert!(!socket.exists(), "the socket goes with the run");
    std::fs::write(&socket, b"not a socket").unwrap();
    let refused = reaper_tests::run_reaper(&["--api", socket.to_str().unwrap(), "--", "true"]);
    assert_eq!(refused.status.code(), Some(1), "{}", refused.stderr);
    assert!(
        refused.stderr.contains("is not a socket"),
        "{}",
        refused.stderr
    );
    assert_eq!(
        std::fs::read(&socket).unwrap(),
        b"not a socket",
        "left alone"
    );
}
