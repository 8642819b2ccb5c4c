//! Leaks as the field sees them, against real processes: many instances of one server under
//! one gateway (`accumulating`), a crashed agent whose servers exit on EOF (never orphaned),
//! and helpers whose only channel is a terminal or a loopback TCP connection. Needs root (see
//! `require_root`).
use reaper_tests::{
    Then, cleared, flag, flags_for, free_port, pid, pids, pipe_fd, require_root, run_leak,
    run_shape_until,
};
use serde_json::json;

#[test]
fn the_older_of_many_pinged_servers_of_one_kind_are_accumulating_once_each() {
    let test = "the_older_of_many_pinged_servers_of_one_kind_are_accumulating_once_each";
    if !require_root(test) {
        return;
    }
    let port = free_port().to_string();
    let metrics = format!("127.0.0.1:{port}");
    let mut opts = reaper_tests::ACCUMULATING.to_vec();
    opts.extend(["--metrics", &metrics]);
    let pool_series = |text: &str| {
        text.lines()
            .find(|l| l.starts_with("reaper_kind_instances{") && l.contains("stdio-server pool"))
            .map(str::to_owned)
    };
    // The proof: three flags, and a count of every kind (the metrics' census) that saw the
    // pool at its limit, so the pool's silence is a judgement, not a look not yet taken.
    let mut pool_counted = None;
    // And `why` of an accumulating instance while the run holds its flag: its kind and how
    // many are alive, as the flag said.
    let mut asked: Option<(serde_json::Value, std::process::Output)> = None;
    let (run, truth) = run_shape_until(
        &opts,
        "leak-accumulate",
        &[],
        ("3 accumulating flags and the pool counted", Then::Release),
        |events| {
            if flags_for(events, "accumulating") < 3 {
                return false;
            }
            if asked.is_none() {
                let flag = events
                    .iter()
                    .find(|e| e["event"] == "flag" && e["reason"] == "accumulating")
                    .unwrap()
                    .clone();
                let why = std::process::Command::new(reaper_tests::reaper_trace())
                    .args([
                        "why",
                        &reaper_tests::pid(&flag["pid"]).to_string(),
                        "--json",
                    ])
                    .output()
                    .expect("run reaper-trace why");
                asked = Some((flag, why));
            }
            let port: u16 = port.parse().unwrap();
            pool_counted = reaper_tests::scrape_metrics(port).and_then(|t| pool_series(&t));
            pool_counted.is_some()
        },
    );
    let sessions = pids(&truth["sessions"]);
    let proven = run.until_proof();
    let (flagged, why) = asked.expect("asked");
    assert!(why.status.success(), "{why:?}");
    let answer: serde_json::Value = serde_json::from_slice(&why.stdout).unwrap();
    assert!(flagged["kind"]["pattern"].is_string(), "{flagged}");
    assert_eq!(answer["kind"], flagged["kind"], "{answer:#}");
    assert_eq!(answer["instances"], flagged["instances"], "{answer:#}");
    for (i, s) in sessions.iter().enumerate() {
        let want: Vec<String> = match i < 3 {
            true => vec!["accumulating".into()],
            false => vec![],
        };
        assert_eq!(run.reasons_of(*s), want, "session server {i} (pid {s})");
    }
    for p in pids(&truth["pool"]) {
        assert_eq!(
            proven.reasons_of(p),
            Vec::<String>::new(),
            "pool server {p}"
        );
    }
    // A pool that replaces each worker as the next starts is over its limit only while the
    // replaced one exits: never flagged.
    for p in pids(&truth["rolling"]) {
        assert_eq!(
            run.reasons_of(p),
            Vec::<String>::new(),
            "rolling worker {p}"
        );
    }
    assert!(
        pool_counted.as_deref().is_some_and(|l| l.ends_with(" 3")),
        "the pool counted at 3: {pool_counted:?}"
    );
    let f = flag(&run, sessions[0], "accumulating");
    let pattern = f["kind"]["pattern"].as_str().unwrap();
    assert!(
        pattern.ends_with(" stdio-server --session-key * --model m"),
        "the session key is masked, the shared model is not: {f}"
    );
    assert_eq!(f["instances"], 6, "{f}");
    assert_eq!(f["newest"].as_u64(), Some(sessions[5]), "{f}");
    assert_eq!(f["lineage"], json!([pid(&truth["gateway"]), sessions[0]]));
    assert!(
        f["kind"]["exe"]
            .as_str()
            .unwrap()
            .ends_with("reaper-shapes")
    );
    // Released, every server reads EOF and exits, in any order: a flag ends with its own exit,
    // or first, when newer ones exit before it, with the count back within the limit.
    for s in &sessions[..3] {
        let because = &cleared(&run, *s, "accumulating")["because"];
        assert!(
            because == "exited" || because == "no more than --max-instances of its kind alive now",
            "{because}"
        );
    }
    assert_eq!(run.summary()["leaks"]["raised"]["accumulating"], 3);
}

#[test]
fn a_crashed_agents_servers_that_exit_on_eof_are_never_orphaned() {
    let test = "a_crashed_agents_servers_that_exit_on_eof_are_never_orphaned";
    // The crash lands at a different phase of the scan each time.
    for scan in ["100ms", "250ms", "1s"] {
        let Some((run, truth)) = run_leak(
            test,
            &["--scan-interval", scan],
            "leak-crash",
            (1, "orphaned"),
        ) else {
            return;
        };
        let lingerer = pid(&truth["lingerer"]);
        let f = flag(&run, lingerer, "orphaned");
        assert_eq!(
            f["lineage"],
            json!([pid(&truth["gateway"]), pid(&truth["agent"]), lingerer])
        );
        for s in pids(&truth["exit_on_eof"]) {
            assert_eq!(
                run.reasons_of(s),
                Vec::<String>::new(),
                "server {s} (scan {scan})"
            );
            run.one("exit", s);
        }
        let leaks = &run.summary()["leaks"];
        assert_eq!(leaks["raised"]["orphaned"], 1, "scan {scan}: {leaks}");
        let cleared = run.all("cleared");
        let exit_seq = run.one("exit", lingerer)["seq"].as_u64().unwrap();
        let clear = cleared
            .iter()
            .find(|c| c["pid"].as_u64() == Some(lingerer))
            .unwrap_or_else(|| panic!("no cleared for {lingerer}: {cleared:?}"));
        assert_eq!(
            clear["seq"].as_u64(),
            Some(exit_seq + 1),
            "cleared from the exit record itself: {clear}"
        );
    }
}

#[test]
fn a_nohup_helper_left_on_a_hung_up_pty_is_orphaned_and_deaf() {
    let Some((run, truth)) = run_leak(
        "a_nohup_helper_left_on_a_hung_up_pty_is_orphaned_and_deaf",
        &["--idle-after", "2s", "--scan-interval", "250ms"],
        "leak-pty-hungup",
        (1, "deaf"),
    ) else {
        return;
    };
    let helper = pid(&truth["helper"]);
    assert_eq!(run.reasons_of(helper), ["orphaned", "deaf"]);
    let f = flag(&run, helper, "orphaned");
    assert_eq!(
        f["lineage"],
        json!([pid(&truth["gateway"]), pid(&truth["agent"]), helper])
    );
    let stdin = pipe_fd(f, 0);
    assert_eq!(
        (&stdin["kind"], &stdin["end"], &stdin["index"]),
        (&json!("pty"), &json!("slave"), &truth["index"]),
        "{stdin}"
    );
    assert_eq!(stdin["other_end"], "closed", "the master is gone: {stdin}");
}

#[test]
fn a_helper_on_a_pty_whose_master_the_gateway_holds_is_orphaned_with_the_gateway_as_peer() {
    let Some((run, truth)) = run_leak(
        "a_helper_on_a_pty_whose_master_the_gateway_holds_is_orphaned_with_the_gateway_as_peer",
        &["--scan-interval", "250ms"],
        "leak-pty-held",
        (1, "orphaned"),
    ) else {
        return;
    };
    let helper = pid(&truth["helper"]);
    let stdin = pipe_fd(flag(&run, helper, "orphaned"), 0);
    assert_eq!(
        (&stdin["kind"], &stdin["end"], &stdin["other_end"]),
        (&json!("pty"), &json!("slave"), &json!("open")),
        "{stdin}"
    );
    let peers = stdin["peers"].as_array().unwrap();
    assert!(
        peers
            .iter()
            .any(|p| p["pid"] == truth["gateway"] && p["end"] == "master"),
        "the gateway holds the master: {stdin}"
    );
}

#[test]
fn a_helper_holding_only_a_loopback_tcp_connection_is_orphaned_and_udp_is_no_channel() {
    let Some((run, truth)) = run_leak(
        "a_helper_holding_only_a_loopback_tcp_connection_is_orphaned_and_udp_is_no_channel",
        &["--scan-interval", "250ms"],
        "leak-tcp",
        (1, "orphaned"),
    ) else {
        return;
    };
    let (gw, tcp, udp) = (
        pid(&truth["gateway"]),
        pid(&truth["tcp"]),
        pid(&truth["udp"]),
    );
    let f = flag(&run, tcp, "orphaned");
    let socket = f["pipes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["protocol"] == "tcp")
        .unwrap_or_else(|| panic!("no tcp socket in {f}"));
    assert_eq!(
        socket["remote"],
        format!("127.0.0.1:{}", truth["port"]),
        "{socket}"
    );
    assert!(
        socket["peers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["pid"].as_u64() == Some(gw)),
        "the gateway holds the other end: {socket}"
    );
    // Judged at the same look (both lost their agent at once): a UDP and a netlink socket
    // tie the other helper to no process.
    assert_eq!(run.reasons_of(udp), Vec::<String>::new());
}
