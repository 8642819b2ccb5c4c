//! The running audit's API, asked by `reaper-trace why PID` and `tree` while the run traces
//! a real setsid escapee (gateway > A (setsid, exited) > B holding the gateway's pipe): the
//! answer names B's lineage with A's exit, its pipe and who holds the other end, its flag,
//! and that `--kill` would follow it; a pid no run tracks gets exit status 1 and what /proc
//! says. `events --follow` through a fork storm, beside a follower that stops reading. Needs
//! root (see `require_root`).
use std::process::{Command, Output};

use reaper_tests::{Then, pid, reaper_trace, require_root, run_shape_until};
use serde_json::Value;

/// `reaper-trace why ARGS`.
fn why(args: &[&str]) -> Output {
    client("why", args)
}

/// `reaper-trace WORD ARGS`.
fn client(word: &str, args: &[&str]) -> Output {
    Command::new(reaper_trace())
        .arg(word)
        .args(args)
        .output()
        .expect("run reaper-trace's client")
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
    let mut tree: Option<(Output, Output, Output)> = None;
    let mut untracked: Option<Output> = None;
    let audit = reaper_tests::scratch(test).join("audit.ndjson");
    let (run, truth) = run_shape_until(
        &[
            "--scan-interval",
            "250ms",
            "--output",
            audit.to_str().unwrap(),
        ],
        "leak-orphan",
        &[],
        ("the orphan's flag, and why answered", Then::Release),
        |events| {
            if let Some(b) = orphaned(events).filter(|_| asked.is_none()) {
                let b = b.to_string();
                asked = Some((why(&[&b, "--json"]), why(&[&b])));
                tree = Some((
                    client("tree", &["--reason", "orphaned"]),
                    client("tree", &["--kind", "no-such-program-here"]),
                    client("tree", &["--json"]),
                ));
                untracked = Some(why(&[&std::process::id().to_string()]));
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

    // The tree of the orphaned processes: the gateway, A (exited) and B flagged, drawn as
    // the summary draws them; a filter that picks nothing says so.
    let (orphans, none, live_tree) = tree.expect("asked");
    let drawn = String::from_utf8_lossy(&orphans.stdout).into_owned();
    eprintln!("{drawn}");
    assert!(orphans.status.success(), "{drawn}");
    let line_of = |p: u64| drawn.lines().find(|l| l.contains(&format!("{p} (")));
    assert!(
        line_of(gw).is_some_and(|l| l.contains("gateway")),
        "{drawn}"
    );
    assert!(line_of(a).is_some_and(|l| l.contains("[exited")), "{drawn}");
    assert!(
        line_of(b).is_some_and(|l| l.contains("└─ ") && l.contains("LEAK: orphaned")),
        "{drawn}"
    );
    let said = String::from_utf8_lossy(&none.stdout);
    assert!(said.contains("that these filters pick"), "{said}");

    // The audit file read back at the moment the live answer was made says the same of B's
    // process, lineage and flags, and draws the same live tree.
    let now = answer["now"]
        .as_u64()
        .expect("the answer's moment")
        .to_string();
    let audit = audit.to_str().unwrap();
    let replayed = why(&[&b.to_string(), "--from", audit, "--at", &now, "--json"]);
    assert!(replayed.status.success(), "{replayed:?}");
    let replayed: Value = serde_json::from_slice(&replayed.stdout).expect("one JSON object");
    eprintln!("read back: {replayed:#}");
    for field in [
        "pid", "start", "alive", "exited", "flags", "lineage", "escaped", "ppid",
    ] {
        assert_eq!(replayed[field], answer[field], "{field}");
    }
    let members = |a: &Value| -> Vec<(Value, Value)> {
        let list = a["ancestors"].as_array().expect("ancestors");
        list.iter()
            .map(|m| (m["pid"].clone(), m["exited"].clone()))
            .collect()
    };
    assert_eq!(members(&replayed), members(&answer));
    assert_eq!(replayed["spawned_at"], answer["spawned_at"]);
    let text = why(&[&b.to_string(), "--from", audit, "--at", &now]);
    let said = String::from_utf8_lossy(&text.stdout).into_owned();
    eprintln!("{said}");
    assert!(said.starts_with("as at "), "the moment: {said}");
    assert!(said.contains("flagged orphaned for"), "{said}");
    let tree_then = client("tree", &["--from", audit, "--at", &now, "--json"]);
    assert!(tree_then.status.success(), "{tree_then:?}");
    let roots_of = |out: &Output| -> Value {
        let all: Value = serde_json::from_slice(&out.stdout).expect("a JSON object");
        let (_, roots) = all.as_object().unwrap().iter().next().expect("a tree");
        shape_of(roots)
    };
    assert_eq!(roots_of(&tree_then), roots_of(&live_tree));
    // Before B was forked, nobody had its pid in this audit.
    let forked = run
        .events
        .iter()
        .find(|e| e["event"] == "fork" && pid(&e["pid"]) == b)
        .and_then(|e| e["ts"].as_u64())
        .expect("B's fork");
    let before = (forked - 1).to_string();
    let first = why(&[&b.to_string(), "--from", audit, "--at", &before]);
    assert_eq!(first.status.code(), Some(1), "{first:?}");

    // A process no run tracks, asked while this run served: exit status 1, the runs asked
    // and what /proc says of it.
    let untracked = untracked.expect("asked");
    let said = String::from_utf8_lossy(&untracked.stdout).into_owned();
    assert_eq!(untracked.status.code(), Some(1), "{said}");
    assert!(said.contains("what /proc says"), "{said}");
    assert!(said.contains("not a descendant of any gateway"), "{said}");
}

/// A tree's processes, their state, parent and flags, and what they spawned: what a replay
/// must agree on with the live answer.
fn shape_of(roots: &Value) -> Value {
    let list = roots.as_array().expect("branches");
    let each = list.iter().map(|b| {
        serde_json::json!({
            "pid": b["pid"], "start": b["start"], "state": b["state"], "ppid": b["ppid"],
            "flags": b["flags"], "spawned": shape_of(&b["spawned"]),
        })
    });
    Value::Array(each.collect())
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

/// `GET path` on the API at `socket`, the body whole (the client's own HTTP/1.1, no crate).
fn get(socket: &std::path::Path, path: &str) -> String {
    let text = reaper_tests::api_call(socket, "GET", path);
    text.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or(text)
}

#[test]
fn a_follower_gets_a_storm_complete_and_in_order_and_one_that_stops_reading_is_dropped() {
    let test =
        "a_follower_gets_a_storm_complete_and_in_order_and_one_that_stops_reading_is_dropped";
    if !require_root(test) {
        return;
    }
    let dir = reaper_tests::scratch(test);
    let (go, done) = (dir.join("go"), dir.join("done"));
    let (truth, followed) = (dir.join("truth.json"), dir.join("followed.ndjson"));
    // A socket's path has room for 107 bytes: the scratch directory's is too long.
    let socket = std::path::PathBuf::from(format!("/tmp/reaper-api-{}.sock", std::process::id()));
    for fifo in [&go, &done] {
        reaper_tests::make_fifo(fifo);
    }
    // The gateway waits on a FIFO (a blocked read forks nothing) until both followers
    // follow, runs the storm, and waits again until the one that did not read has read its
    // stream's end. 5,000 processes make 15,000 lines: less than the reading follower's
    // queue (65,536 lines: it is never dropped, however the run batches), more than the one
    // that does not read asked for (1,000) with what the socket and hyper's buffer hold.
    let script = format!(
        "read _ < {}; {} storm {} 5000; read _ < {}",
        go.display(),
        reaper_tests::shapes().display(),
        truth.display(),
        done.display()
    );
    let mut follower: Option<std::process::Child> = None;
    let mut stalled: Option<std::thread::JoinHandle<String>> = None;
    let run = reaper_tests::run_reaper_until(
        &["--api", socket.to_str().unwrap(), "--", "sh", "-c", &script],
        &[],
        &dir.join("release"),
        (
            "both followers following, then the storm let go",
            Then::Release,
        ),
        |events| {
            let Some(ready) = events.iter().find(|e| e["event"] == "ready") else {
                return false;
            };
            let gw = pid(&ready["gateway"][0]).to_string();
            follower = Some(
                Command::new(reaper_trace())
                    .args(["events", "--follow", "--api", socket.to_str().unwrap()])
                    .args(["--pid", &gw])
                    .stdout(std::fs::File::create(&followed).unwrap())
                    .spawn()
                    .expect("start the follower"),
            );
            // A follower that asks, then reads nothing until the run dropped it.
            use std::io::{Read, Write};
            let mut s = std::os::unix::net::UnixStream::connect(&socket).unwrap();
            let ask =
                "GET /v1/events?follow&queue=1000 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
            s.write_all(ask.as_bytes()).unwrap();
            followers_become(&socket, 2);
            let (socket, done) = (socket.clone(), done.clone());
            stalled = Some(std::thread::spawn(move || {
                followers_become(&socket, 1);
                let mut text = Vec::new();
                s.read_to_end(&mut text).unwrap();
                std::fs::write(&done, b"\n").unwrap();
                String::from_utf8_lossy(&text).into_owned()
            }));
            std::fs::write(&go, b"\n").unwrap();
            true
        },
    );
    run.assert_lossless();
    let children: Vec<u64> = reaper_tests::read_json(&truth)["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(pid)
        .collect();
    // The run's own stream lost nothing, and says it dropped the follower that did not read.
    let summary = run.summary();
    assert_eq!(summary["delivery"]["followers_dropped"], 1, "{summary}");
    assert!(
        run.all("note").iter().any(|n| n["text"]
            .as_str()
            .is_some_and(|t| t.contains("dropped 1 follower"))),
        "{}",
        run.stderr
    );
    let forks_in = |events: &[Value]| -> Vec<u64> {
        let mine: std::collections::HashSet<u64> = children.iter().copied().collect();
        events
            .iter()
            .filter(|e| e["event"] == "fork" && mine.contains(&pid(&e["pid"])))
            .map(|e| pid(&e["pid"]))
            .collect()
    };
    assert_eq!(forks_in(&run.events), children, "the run's stream");

    // The one that did not read: its stream ends with the notice that it was dropped.
    let text = stalled.take().unwrap().join().unwrap();
    let end = text
        .trim_end()
        .rsplit_once('\n')
        .map_or(&text[..], |(_, l)| l);
    assert!(
        text.contains("this follower did not keep up and was dropped"),
        "its end: {end}"
    );

    // The reading follower: every fork of the storm, in order, to the run's end; only the
    // gateway's subtree (and the run's own events).
    let status = follower.take().unwrap().wait().unwrap();
    let lines: Vec<Value> = std::fs::read_to_string(&followed)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).expect("an NDJSON line"))
        .collect();
    assert!(status.success(), "{status}");
    assert_eq!(forks_in(&lines), children, "the follower's stream");
    let seqs: Vec<u64> = lines.iter().filter_map(|l| l["seq"].as_u64()).collect();
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "in the stream's order"
    );
    assert_eq!(lines.last().unwrap()["event"], "summary");
    let gw = pid(&run.all("ready")[0]["gateway"][0]);
    let storm = pid(&run.one("fork", children[0])["spawner"]);
    let strays: Vec<&Value> = lines
        .iter()
        .filter(|l| !l["pid"].is_null() && ![gw, storm].contains(&pid(&l["pid"])))
        .filter(|l| !children.contains(&pid(&l["pid"])))
        .collect();
    assert!(strays.is_empty(), "only the gateway's subtree: {strays:?}");
}

/// Waits until the run at `socket` has `n` followers.
fn followers_become(socket: &std::path::Path, n: u64) {
    reaper_tests::wait_until(&format!("{n} followers"), || {
        let status: Value = serde_json::from_str(&get(socket, "/v1/status")).unwrap();
        status["followers"] == n
    });
}

#[test]
fn the_api_group_may_ask_and_a_user_outside_it_may_not() {
    let test = "the_api_group_may_ask_and_a_user_outside_it_may_not";
    if !require_root(test) {
        return;
    }
    const GROUP: u32 = 4242;
    let dir = reaper_tests::scratch(test);
    let go = dir.join("go");
    reaper_tests::make_fifo(&go);
    let socket = std::path::PathBuf::from(format!("/tmp/reaper-api-g-{}.sock", std::process::id()));
    // The client as `nobody` runs from a copy any user may execute (the checkout's directory
    // may be root's alone).
    let client = dir.join("reaper-trace");
    std::fs::copy(reaper_trace(), &client).unwrap();
    let as_nobody = |groups: &'static [libc::gid_t], gw: &str| {
        use std::os::unix::process::CommandExt;
        let mut command = Command::new(&client);
        command.args(["why", gw, "--api", socket.to_str().unwrap()]);
        // SAFETY: setgroups, setgid and setuid only, between fork and exec.
        unsafe {
            command.pre_exec(move || {
                if libc::setgroups(groups.len(), groups.as_ptr()) != 0
                    || libc::setgid(65534) != 0
                    || libc::setuid(65534) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        command.output().expect("run the client as nobody")
    };
    let mut asked = None;
    let mut bad_input = Vec::new();
    let run = reaper_tests::run_reaper_until(
        &[
            "--api",
            socket.to_str().unwrap(),
            "--api-group",
            &GROUP.to_string(),
            "--",
            "sh",
            "-c",
            &format!("read _ < {}", go.display()),
        ],
        &[],
        &dir.join("release"),
        ("both clients answered", Then::Release),
        |events| {
            let Some(ready) = events.iter().find(|e| e["event"] == "ready") else {
                return false;
            };
            let gw = pid(&ready["gateway"][0]).to_string();
            bad_input = bad_questions(&socket);
            use std::os::unix::fs::MetadataExt;
            let meta = std::fs::metadata(&socket).unwrap();
            asked = Some((
                (meta.mode() & 0o777, meta.gid()),
                as_nobody(&[GROUP], &gw),
                as_nobody(&[], &gw),
            ));
            std::fs::write(&go, b"\n").unwrap();
            true
        },
    );
    assert!(run.status.success(), "{}", run.stderr);
    let ((mode, gid), member, outsider) = asked.unwrap();
    assert_eq!((mode, gid), (0o660, GROUP), "the socket is the group's");
    let said = String::from_utf8_lossy(&member.stdout).into_owned();
    assert!(member.status.success(), "a member asks: {said}{:?}", member);
    assert!(
        said.contains("gateway") || said.starts_with("pid "),
        "{said}"
    );
    // A refusal is no answer: it is said on stderr, and stdout stays empty.
    let said = String::from_utf8_lossy(&outsider.stderr).into_owned();
    assert_eq!(outsider.status.code(), Some(1), "{said}");
    assert!(said.contains("may be asked by root only"), "{said}");
    assert!(outsider.stdout.is_empty(), "{:?}", outsider.stdout);

    // Bad questions get a clear status, and the run answers on (it ended normally above).
    for (question, status) in &bad_input {
        eprintln!("{question} -> {status}");
    }
    let statuses: Vec<&str> = bad_input.iter().map(|(_, s)| s.as_str()).collect();
    assert_eq!(
        statuses,
        [
            "HTTP/1.1 400 Bad Request",
            "HTTP/1.1 404 Not Found",
            "HTTP/1.1 400 Bad Request",
            "HTTP/1.1 405 Method Not Allowed",
            "HTTP/1.1 404 Not Found",
            "HTTP/1.1 400 Bad Request",
            "HTTP/1.1 400 Bad Request",
            "HTTP/1.1 400 Bad Request",
            "HTTP/1.1 200 OK",
        ],
        "{bad_input:?}"
    );

    // Without a run to ask, a bad group is a usage error.
    let bad = reaper_tests::run_reaper(&["--api-group", "no-such-group-here", "--", "true"]);
    assert_eq!(bad.status.code(), Some(2), "{}", bad.stderr);
    assert!(bad.stderr.contains("no group named"), "{}", bad.stderr);
}

/// Bad questions, each with the status line it got; last, the status asked after a client
/// that connected and sent nothing.
fn bad_questions(socket: &std::path::Path) -> Vec<(String, String)> {
    use std::io::{Read, Write};
    let ask = |request: &str| {
        let mut s = std::os::unix::net::UnixStream::connect(socket).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        let status = text.lines().next().unwrap_or_default().to_owned();
        (
            request.lines().next().unwrap_or_default().to_owned(),
            status,
        )
    };
    let get = |path: &str| {
        ask(&format!(
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        ))
    };
    let mut got = vec![
        get("/v1/process/99999999999"),
        get("/v1/process/4000000"),
        get("/v1/tree?bogus=1"),
        ask(
            "POST /v1/status HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        ),
        get("/v1/nothing"),
        ask("NOT HTTP AT ALL\r\n\r\n"),
        get("/v1/events?follow&event=bogus"),
        get("/v1/events"),
    ];
    // One that connects and says nothing holds nobody up.
    let _silent = std::os::unix::net::UnixStream::connect(socket).unwrap();
    got.push(get("/v1/status"));
    got
}

/// A socket left by a run that was killed (nobody listens; its name is no reaper-trace's
/// pid): a run starting removes it and says so, and the clients skip one that turns up while
/// it runs, answering from the live runs only.
#[test]
fn the_sockets_of_runs_that_are_gone_are_removed_and_skipped() {
    let test = "the_sockets_of_runs_that_are_gone_are_removed_and_skipped";
    if !require_root(test) {
        return;
    }
    let dir = std::path::Path::new("/run/reaper-trace");
    std::fs::create_dir_all(dir).unwrap();
    // pid_max is at most 4194304: these name no process.
    let left = |n: u32| {
        let path = dir.join(format!(
            "{}.sock",
            4_000_000_000u32 + n + std::process::id()
        ));
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        path
    };
    let before = left(0);
    let scratch = reaper_tests::scratch("dead-sockets");
    let go = scratch.join("go");
    reaper_tests::make_fifo(&go);
    let mut seen = None;
    let run = reaper_tests::run_reaper_until(
        &["--", "sh", "-c", &format!("read _ < {}", go.display())],
        &[],
        &scratch.join("release"),
        ("the live run answered", Then::Release),
        |events| {
            let Some(ready) = events.iter().find(|e| e["event"] == "ready") else {
                return false;
            };
            let gw = pid(&ready["gateway"][0]).to_string();
            let still_there = before.exists();
            // Another test's run starting meanwhile removes a dead socket too: the clients
            // are asked again until one stayed while they were.
            for _ in 0..20 {
                let during = left(1);
                let asked = (why(&[&gw]), client("tree", &["--gateway", &gw]));
                let stayed = during.exists();
                let _ = std::fs::remove_file(&during);
                seen = Some((still_there, asked.0, asked.1, stayed));
                if stayed {
                    break;
                }
            }
            std::fs::write(&go, b"\n").unwrap();
            true
        },
    );
    let (still_there, asked, tree, during) = seen.expect("the run was ready");
    assert!(run.status.success(), "{}", run.stderr);
    assert!(
        !still_there,
        "{} was removed at the start",
        before.display()
    );
    assert!(
        during,
        "a socket left while it runs stays until the next start"
    );
    let removed = run.all("note").iter().any(|n| {
        n["text"]
            .as_str()
            .is_some_and(|t| t.contains("removed the sockets of runs that are gone"))
    });
    assert!(
        removed,
        "the run says what it removed: {:?}",
        run.all("note")
    );
    let said = String::from_utf8_lossy(&asked.stdout);
    assert!(
        asked.status.success(),
        "why: {said}{}",
        String::from_utf8_lossy(&asked.stderr)
    );
    assert!(said.starts_with("pid "), "{said}");
    let drawn = String::from_utf8_lossy(&tree.stdout);
    assert!(
        tree.status.success(),
        "tree: {drawn}{}",
        String::from_utf8_lossy(&tree.stderr)
    );
    assert!(!drawn.contains("4000000"), "no dead run is named: {drawn}");
}

/// A question no run can answer (the socket named serves nothing): an error on stderr,
/// nothing on stdout, exit status 1, for each client.
#[test]
fn a_question_no_run_can_take_is_an_error_on_stderr() {
    let none = reaper_tests::scratch("no-run").join("nobody.sock");
    let none = none.to_str().unwrap();
    for out in [
        why(&["1", "--api", none]),
        client("tree", &["--api", none]),
        client("events", &["--follow", "--api", none]),
    ] {
        let said = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        assert!(out.stdout.is_empty(), "{out:?}");
        assert!(
            said.contains("no reaper-trace run serves its API at "),
            "{said}"
        );
        assert!(said.contains(none), "the socket asked: {said}");
    }
}
