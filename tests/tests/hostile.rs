//! Hostile processes against the real kernel: each does to what reaper-trace reads of it what
//! a buggy or hostile process can, beside a fork loop that must arrive whole (0 lost,
//! `consistent`), and reaper-trace is alive afterwards and ends as it should. The shapes are
//! `reaper-shapes hostile-*` (tests/src/bin/shapes/hostile.rs). Needs root (see
//! `require_root`).
use std::collections::HashSet;
use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use reaper_tests::{
    Run, Then, parent_of, pid, read_json, reaper_trace, require_root, run_reaper_until_polled,
    run_shape_with, scratch, shapes,
};
use serde_json::Value;

/// Every process of the fork loop `children` has its fork in the stream, nothing was lost, and
/// reaper-trace ended as it should, with its summary.
fn assert_whole(run: &Run, children: &Value) {
    assert!(
        run.status.success(),
        "reaper-trace ended with {:?}\n{}",
        run.status,
        run.stderr
    );
    run.assert_lossless();
    let forked: HashSet<u64> = run.all("fork").iter().map(|f| pid(&f["pid"])).collect();
    let children = children.as_array().expect("the loop's children");
    assert!(!children.is_empty());
    let missing: Vec<u64> = children
        .iter()
        .map(pid)
        .filter(|c| !forked.contains(c))
        .collect();
    assert!(missing.is_empty(), "forks not in the stream: {missing:?}");
}

/// Runs reaper-trace on `reaper-shapes SHAPE TRUTH` until the shape's `ready` truth is there
/// and `proof` holds over it and the stream; then lets the shape end. Returns the run and that
/// truth.
fn run_hostile(
    opts: &[&str],
    shape: &str,
    what: &str,
    mut proof: impl FnMut(&[Value], &Value) -> bool,
) -> (Run, Value) {
    let dir = scratch(shape);
    let truth = dir.join("truth.json");
    let ready_at = dir.join("truth.json.ready");
    let shapes = shapes();
    let mut args = vec!["--orphan-grace", "0s", "--scan-interval", "200ms"];
    args.extend_from_slice(opts);
    args.extend([
        "--",
        shapes.to_str().unwrap(),
        shape,
        truth.to_str().unwrap(),
    ]);
    let mut ready = None;
    let run = run_reaper_until_polled(
        &args,
        &[],
        &dir.join("release"),
        (what, Then::Release),
        |events| {
            if ready.is_none() && ready_at.exists() {
                ready = Some(read_json(&ready_at));
            }
            ready.as_ref().is_some_and(|r| proof(events, r))
        },
    );
    let ready = ready.unwrap_or_else(|| panic!("{shape} never said it was ready\n{}", run.stderr));
    (run, ready)
}

/// The flag of `pid` among `events`, if any.
fn flag_of(events: &[Value], pid: u64) -> Option<&Value> {
    events
        .iter()
        .find(|e| e["event"] == "flag" && e["pid"].as_u64() == Some(pid))
}

#[test]
fn a_process_holding_as_many_fds_as_its_limit_allows_is_judged_on_a_bounded_look() {
    if !require_root(
        "a_process_holding_as_many_fds_as_its_limit_allows_is_judged_on_a_bounded_look",
    ) {
        return;
    }
    let (run, ready) = run_hostile(&[], "hostile-fds", "its flag and the loop", |events, r| {
        flag_of(events, pid(&r["h"])).is_some()
    });
    assert_whole(&run, &ready["children"]);
    let fds = ready["prepared"]["fds"].as_u64().unwrap();
    eprintln!(
        "the orphan held {fds} fds (limit {})",
        ready["prepared"]["limit"]
    );
    assert!(fds > 1000, "{ready}");
    let flag = flag_of(&run.events, pid(&ready["h"])).unwrap();
    let listed = flag["pipes"].as_array().unwrap().len() as u64;
    let omitted = flag["pipes_omitted"].as_u64().unwrap_or(0);
    assert_eq!(listed, 64, "the first 64 listed: {}", flag["pipes"]);
    assert!(omitted > 900, "the rest counted: {omitted}");
    // A look reads a bounded number of fds, whatever the process holds.
    assert!(listed + omitted <= 16_384, "{listed} + {omitted}");
}

/// A process that leaves 2,000 children unreaped: each is a zombie /proc shows, and the
/// reader looks for 32 of them a turn, in turns (it looked for every one at every turn: at
/// this test's five to ten turns a second, some 40,000 read calls a second). Its read calls
/// (`syscr` of its /proc/PID/io, which counts them whatever the machine's speed) settle once
/// their flags are raised, to under 2,000 a second, while they are held (checked). Two
/// thousand, not more: a guest of 2 GiB runs this binary's tests side by side.
#[test]
fn a_process_leaving_thousands_of_zombies_costs_a_few_reads_a_turn() {
    if !require_root("a_process_leaving_thousands_of_zombies_costs_a_few_reads_a_turn") {
        return;
    }
    const SETTLED: u64 = 2000;
    let mut seen = None;
    let (run, ready) = run_hostile(
        &["--zombie-after", "2s"],
        "hostile-zombies",
        "a zombie flag, then reaper-trace's reads settled",
        |events, r| {
            let zombies = r["prepared"]["zombies"].as_array().unwrap();
            let Some(first) = zombies.first().map(pid) else {
                return true; // said below
            };
            if seen.is_some() || flag_of(events, first).is_none() {
                return seen.is_some();
            }
            let started = events.iter().find(|e| e["event"] == "ready").unwrap();
            let reaper = parent_of(pid(&started["gateway"][0])).expect("reaper-trace's pid");
            // Settling: the flags of 2,000 zombies raised and written.
            let each = each_second_until_below(|| read_calls(reaper) as f64, SETTLED as f64);
            let reads = read_calls(reaper);
            std::thread::sleep(Duration::from_secs(2));
            let after = read_calls(reaper) - reads;
            // Counted while they were held: the shape lets them go at its own cap.
            seen = Some((each, after, is_zombie(first)));
            true
        },
    );
    assert_whole(&run, &ready["children"]);
    let zombies = ready["prepared"]["zombies"].as_array().unwrap();
    assert_eq!(zombies.len(), 2000, "{}", ready["prepared"]);
    let (each, after, held) = seen.expect("a zombie's flag");
    eprintln!("reaper-trace's read calls each second once flagged {each:?}, then {after} in 2 s");
    assert!(
        held,
        "the zombies were let go before reaper-trace settled: {each:?}"
    );
    assert!(
        each.last().is_some_and(|&n| n < SETTLED as f64),
        "reaper-trace's read calls each second while the zombies were held: {each:?}"
    );
    assert!(
        after < 2 * SETTLED,
        "{after} read calls in the 2 s after it settled"
    );
}

/// The read calls process `pid` made so far (`syscr` of its /proc/PID/io).
fn read_calls(pid: u64) -> u64 {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap();
    let syscr = io.lines().find_map(|l| l.strip_prefix("syscr:"));
    syscr
        .and_then(|n| n.trim().parse().ok())
        .expect("syscr in /proc/PID/io")
}

/// Whether process `pid` is a zombie now.
fn is_zombie(pid: u64) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit_once(") ")
        .is_some_and(|(_, rest)| rest.starts_with('Z'))
}

#[test]
fn a_process_with_sixty_thousand_mappings_costs_a_bounded_read() {
    if !require_root("a_process_with_sixty_thousand_mappings_costs_a_bounded_read") {
        return;
    }
    let (run, ready) = run_hostile(
        &["--spawn-stacks", "native"],
        "hostile-maps",
        "its flag and the loop",
        |events, r| flag_of(events, pid(&r["h"])).is_some(),
    );
    assert_whole(&run, &ready["children"]);
    let mapped = ready["prepared"]["mappings"].as_u64().unwrap();
    eprintln!("the orphan mapped {mapped} regions");
    assert!(mapped >= 50_000, "{ready}");
    // Its own fork was read, from its site.
    let h = pid(&ready["h"]);
    assert!(
        !run.forks_by(h).is_empty(),
        "the orphan's fork is in the stream"
    );
}

#[test]
fn a_gateway_with_a_command_line_and_environment_at_the_kernels_limits_is_read_capped() {
    let test = "a_gateway_with_a_command_line_and_environment_at_the_kernels_limits_is_read_capped";
    if !require_root(test) {
        return;
    }
    let dir = scratch("hostile-args");
    let truth = dir.join("truth.json");
    let (go, release) = (dir.join("go"), dir.join("release"));
    // Started before reaper-trace, and taken as a gateway by pid: its command line is read
    // from /proc, as a gateway found at start is.
    let mut shape = Command::new(shapes())
        .args(["hostile-args", truth.to_str().unwrap()])
        .env("REAPER_SHAPES_GO", &go)
        .env("REAPER_SHAPES_RELEASE", &release)
        .env(reaper_tests::HOLD_CAP, reaper_tests::hold_cap())
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let started = dir.join("truth.json.started");
    reaper_tests::wait_for_file(&started, reaper_tests::patience());
    let sizes = read_json(&started);
    eprintln!("the gateway's command line and environment: {sizes}");
    assert!(sizes["cmdline"].as_u64().unwrap() > 2 << 20, "{sizes}");
    assert!(sizes["environ"].as_u64().unwrap() > 2 << 20, "{sizes}");
    let gw = sizes["pid"].as_u64().unwrap().to_string();
    let ready_at = dir.join("truth.json.ready");
    let mut ready = None;
    let run = run_reaper_until_polled(
        &["--gateway-pid", &gw],
        &[],
        &release,
        ("the gateway announced, the loop done", Then::Release),
        |events| {
            if !events.iter().any(|e| e["event"] == "gateway") {
                return false;
            }
            let _ = std::fs::write(&go, b"");
            if ready.is_none() && ready_at.exists() {
                ready = Some(read_json(&ready_at));
            }
            ready.is_some()
        },
    );
    let _ = std::fs::write(&release, b"");
    let status = shape.wait().unwrap();
    assert!(status.success(), "the gateway: {status}");
    let ready = ready.expect("the loop ran");
    assert_whole(&run, &ready["children"]);
    let gateway = &run.all("gateway")[0];
    let args = gateway["argv"].as_array().expect("the argv, as text");
    let read: usize = args.iter().map(|a| a.as_str().unwrap_or("").len()).sum();
    eprintln!(
        "the gateway event carries {} arguments, {read} bytes",
        args.len()
    );
    assert!(read <= 256 << 10, "read up to the cap: {read} bytes");
    assert_eq!(args[1], "hostile-args-run", "{gateway}");
}

#[test]
fn why_asked_every_100ms_of_a_process_with_thousands_of_peers_during_a_fork_storm() {
    let test = "why_asked_every_100ms_of_a_process_with_thousands_of_peers_during_a_fork_storm";
    if !require_root(test) {
        return;
    }
    let dir = scratch("hostile-peers");
    let socket = dir.join("api.sock");
    let truth = dir.join("truth.json");
    let holders_at = dir.join("truth.json.holders");
    let shapes = shapes();
    let args = [
        "--orphan-grace",
        "0s",
        "--scan-interval",
        "200ms",
        "--api",
        socket.to_str().unwrap(),
        "--",
        shapes.to_str().unwrap(),
        "hostile-peers",
        truth.to_str().unwrap(),
    ];
    let mut answers = Vec::new();
    // What the proof last saw, said on stderr each time it changes: a run that never asks its
    // questions says why.
    let mut saw = String::new();
    let mut say = |now: String| {
        if now != saw {
            eprintln!("{test}: {now}");
            saw = now;
        }
    };
    let run = run_reaper_until_polled(
        &args,
        &[],
        &dir.join("release"),
        ("ten answers of why", Then::Release),
        |events| {
            let Ok(text) = std::fs::read_to_string(&holders_at) else {
                say(format!("no {} yet", holders_at.display()));
                return false;
            };
            let h = pid(&serde_json::from_str::<Value>(&text).unwrap()["h"]);
            if flag_of(events, h).is_none() {
                say(format!("holders written, h {h}; no flag of h yet"));
                return false;
            }
            say(format!("h {h} flagged: asking why"));
            // The storm goes on meanwhile: a question every 100 ms, until ten answers have
            // listed the holders the inspector has looked at by then (it looks at them on
            // its own cadence: the first answers may find fewer). Ten: under the storm a slow
            // guest takes seconds an answer. The questions get half the run's patience, so
            // that too few answers fail below with every answer seen, not as a run that
            // never ended.
            let full = |a: &Value| a["pipes"][0]["peers_omitted"].as_u64().is_some();
            let began = Instant::now();
            while answers.iter().filter(|(_, a)| full(a)).count() < 10
                && began.elapsed() < reaper_tests::patience() / 2
            {
                let asked = Instant::now();
                let out = Command::new(reaper_trace())
                    .args([
                        "why",
                        &h.to_string(),
                        "--json",
                        "--api",
                        socket.to_str().unwrap(),
                    ])
                    .output()
                    .unwrap();
                assert!(
                    out.status.success(),
                    "why: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                answers.push((
                    asked.elapsed(),
                    serde_json::from_slice::<Value>(&out.stdout).unwrap(),
                ));
                std::thread::sleep(Duration::from_millis(100));
            }
            true
        },
    );
    let truth = read_json(&truth);
    assert_whole(&run, &truth["children"]);
    // The answers that list the holders (as the loop above counted them): one made before
    // the inspector looked at them, or while a look was under way, lists fewer.
    let full: Vec<_> = answers
        .iter()
        .filter(|(_, a)| a["pipes"][0]["peers_omitted"].as_u64().is_some())
        .collect();
    eprintln!(
        "{} answers, {} listing the holders",
        answers.len(),
        full.len()
    );
    let seen: Vec<String> = (answers.iter())
        .map(|(took, a)| {
            format!(
                "{took:?} peers {:?} omitted {}",
                a["pipes"][0]["peers"].as_array().map(Vec::len),
                a["pipes"][0]["peers_omitted"]
            )
        })
        .collect();
    assert!(
        full.len() >= 10,
        "ten answers listing the holders; the answers (took, peers, omitted):\n{}\nthe last: {:?}",
        seen.join("\n"),
        answers.last()
    );
    for (took, answer) in full {
        let pipe = &answer["pipes"][0];
        let (listed, omitted) = (
            pipe["peers"]
                .as_array()
                .unwrap_or_else(|| panic!("the holders listed: {answer}"))
                .len(),
            pipe["peers_omitted"].as_u64(),
        );
        assert_eq!(listed, 16, "the first 16 holders listed: {pipe}");
        // The holders found so far (those the inspector looked at, bounded work), the rest
        // of them counted.
        assert!(omitted.unwrap_or(0) > 0, "the rest counted: {pipe}");
        eprintln!("why answered in {took:?}");
    }
}

/// A `python3.99` maps a library that is cut and rewritten, or its path swapped, while it
/// forks: reaper-trace reads the library (it is named like a libpython) and must neither fault
/// nor block.
fn a_library_under_attack(test: &str, how: &str) {
    if !require_root(test) {
        return;
    }
    let dir = scratch(&format!("hostile-library-{how}"));
    let (run, truth) = run_shape_with(
        &["--spawn-stacks", "auto"],
        "hostile-library",
        &[how, dir.to_str().unwrap()],
        &[],
    );
    assert_whole(&run, &truth["children"]);
    let execs = run
        .all("exec")
        .iter()
        .filter(|e| {
            e["filename"]
                .as_str()
                .is_some_and(|f| f.ends_with("/python3.99"))
        })
        .count();
    assert_eq!(
        execs as u64,
        truth["rounds"].as_u64().unwrap(),
        "each round's interpreter"
    );
    eprintln!("{}", run.stderr);
}

#[test]
fn a_library_cut_and_rewritten_while_its_interpreter_forks_faults_nothing() {
    a_library_under_attack(
        "a_library_cut_and_rewritten_while_its_interpreter_forks_faults_nothing",
        "truncate",
    );
}

#[test]
fn a_library_path_swapped_for_a_fifo_a_socket_or_a_device_blocks_nothing() {
    a_library_under_attack(
        "a_library_path_swapped_for_a_fifo_a_socket_or_a_device_blocks_nothing",
        "swap",
    );
}

/// How much a counter `count` grew in each second, until a second's growth is under `below`
/// (capped by the tests' patience): a settling waited for, not a window.
fn each_second_until_below(count: impl Fn() -> f64, below: f64) -> Vec<f64> {
    let (settling, mut each) = (Instant::now(), Vec::new());
    while each.last().is_none_or(|&n| n >= below) && settling.elapsed() < reaper_tests::patience() {
        let before = count();
        std::thread::sleep(Duration::from_secs(1));
        each.push(count() - before);
    }
    each
}

/// CPU seconds process `pid` used so far (user and system).
fn cpu_secs(pid: u64) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat.rsplit_once(") ").unwrap().1.split(' ').collect();
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap()) / ticks
}

/// Opens connections to `connect` until `budget` are open or the fds run out, each sending a
/// request line and never its end.
fn flood<S: Write>(budget: usize, connect: impl Fn() -> std::io::Result<S>) -> Vec<S> {
    let mut held = Vec::new();
    while held.len() < budget {
        let Ok(mut s) = connect() else {
            break;
        };
        let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n");
        held.push(s);
    }
    held
}

#[test]
fn a_flood_of_idle_connections_starves_neither_the_metrics_nor_the_api_nor_the_run() {
    let test = "a_flood_of_idle_connections_starves_neither_the_metrics_nor_the_api_nor_the_run";
    if !require_root(test) {
        return;
    }
    let dir = scratch("hostile-flood");
    let socket = dir.join("api.sock");
    let port = reaper_tests::free_port();
    let addr = format!("127.0.0.1:{port}");
    let truth = dir.join("truth.json");
    let shapes = shapes();
    let go = dir.join("go");
    let args = [
        "--metrics",
        &addr,
        "--api",
        socket.to_str().unwrap(),
        "--",
        shapes.to_str().unwrap(),
        "hostile-loop",
        truth.to_str().unwrap(),
    ];
    let limit = reaper_tests::raise_fd_limit();
    let ready_at = dir.join("truth.json.ready");
    let mut seen = None;
    let run = run_reaper_until_polled(
        &args,
        &[("REAPER_SHAPES_GO", go.to_str().unwrap())],
        &dir.join("release"),
        ("answers under a flood, the loop done", Then::Release),
        |events| {
            if seen.is_none() {
                let Some(ready) = events.iter().find(|e| e["event"] == "ready") else {
                    return false;
                };
                let reaper = parent_of(pid(&ready["gateway"][0])).expect("reaper-trace's pid");
                // Half of this process's fds each, a few kept for the questions below.
                let budget = (limit as usize).saturating_sub(64) / 2;
                let began = Instant::now();
                let mut metrics =
                    flood(budget, || std::net::TcpStream::connect(("127.0.0.1", port)));
                let api = flood(budget, || std::os::unix::net::UnixStream::connect(&socket));
                let fds = std::fs::read_dir(format!("/proc/{reaper}/fd")).map_or(0, |d| d.count());
                eprintln!(
                    "{} connections to the metrics, {} to the API, in {:?}; reaper-trace holds {fds} fds",
                    metrics.len(),
                    api.len(),
                    began.elapsed(),
                );
                metrics.truncate(metrics.len().saturating_sub(8));
                // The connections still waiting in the listeners' backlogs are taken (each
                // closing the one idle longest) until none is left: then holding the rest
                // costs next to nothing. A loop retrying an accept that cannot succeed
                // spins a whole core for as long as the flood lasts, and never settles.
                let spent = each_second_until_below(|| cpu_secs(reaper), 0.25);
                let cpu = cpu_secs(reaper);
                std::thread::sleep(Duration::from_secs(2));
                let after = cpu_secs(reaper) - cpu;
                // A new client of each is answered.
                let asked = Instant::now();
                let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    .unwrap();
                let mut text = String::new();
                let _ = s.read_to_string(&mut text);
                let metrics_took = asked.elapsed();
                let asked = Instant::now();
                let why = Command::new(reaper_trace())
                    .args(["why", "1", "--api", socket.to_str().unwrap()])
                    .output()
                    .unwrap();
                let api_took = asked.elapsed();
                let held = metrics.len() + api.len();
                seen = Some((spent, after, text, metrics_took, why, api_took, held, fds));
                drop((metrics, api));
                std::fs::write(&go, b"").unwrap();
            }
            ready_at.exists()
        },
    );
    let (spent, after, text, metrics_took, why, api_took, held, fds) = seen.expect("the flood ran");
    eprintln!(
        "{held} connections held: reaper-trace's CPU each second after the flood {spent:.2?}; \
         /metrics answered in {metrics_took:?}, the API in {api_took:?}"
    );
    assert!(held > 1000, "a flood: {held} connections");
    // Its connections capped far below its limit: /proc reads, pidfds and kills keep theirs.
    assert!(fds < 500, "reaper-trace held {fds} fds under the flood");
    assert!(text.starts_with("HTTP/1.1 200"), "a new scrape: {text:?}");
    assert!(
        why.status.code() == Some(1),
        "why of an untracked pid: {why:?}"
    );
    assert!(
        String::from_utf8_lossy(&why.stdout).contains("not a descendant"),
        "{why:?}"
    );
    // Settled, and staying so: no loop retrying an accept that cannot succeed (a spin is a
    // whole core, for as long as the flood is held).
    assert!(
        spent.last().is_some_and(|&s| s < 0.25),
        "reaper-trace's CPU each second while the flood was held: {spent:.2?}"
    );
    assert!(
        after < 0.5,
        "reaper-trace spent {after:.2} s of CPU in the 2 s after it settled"
    );
    let truth = read_json(&ready_at);
    assert_whole(&run, &truth["children"]);
}

/// A reader of reaper-trace's standard output that stops reading (a pager left on its first
/// page, a `| grep` stopped with Ctrl-Z): the ring is read on, the audit file gets every
/// event and the summary while stdout is still not read, and the readable lines wait for
/// stdout and reach it whole once it is read.
#[test]
fn a_stdout_nobody_reads_holds_neither_the_ring_nor_the_audit() {
    let test = "a_stdout_nobody_reads_holds_neither_the_ring_nor_the_audit";
    if !require_root(test) {
        return;
    }
    let dir = scratch("stalled-stdout");
    let audit = dir.join("audit.ndjson");
    let stderr = std::fs::File::create(dir.join("stderr")).unwrap();
    // 150 short processes, each with a long argument: their readable lines (some 170 KB) are
    // more than a pipe holds (64 KiB) and a buffer of lines beside it (64 KiB), and few
    // enough for a slow guest beside a fork storm.
    let work = format!(
        "i=0; while [ $i -lt 150 ]; do /bin/true {}; i=$((i+1)); done",
        "x".repeat(1000)
    );
    let mut run = Command::new(reaper_trace())
        .args(["--api", "off", "--output", audit.to_str().unwrap()])
        .args(["--", "sh", "-c", &work])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let events_now = || -> Vec<Value> {
        let text = std::fs::read_to_string(&audit).unwrap_or_default();
        // The last line may be half written.
        text.lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    };
    reaper_tests::wait_seeing(
        "the summary in the audit file while nobody reads stdout",
        || {
            let events = events_now();
            match events.iter().any(|e| e["event"] == "summary") {
                true => Ok(()),
                false => Err(format!(
                    "{} events, the last {:?}",
                    events.len(),
                    events.last().map(|e| &e["event"])
                )),
            }
        },
    );
    let mut said = Vec::new();
    run.stdout.take().unwrap().read_to_end(&mut said).unwrap();
    let status = run.wait().unwrap();
    let stderr = std::fs::read_to_string(dir.join("stderr")).unwrap();
    let audited = Run::from_output(&std::fs::read(&audit).unwrap(), stderr.as_bytes(), status);
    assert!(
        status.success(),
        "reaper-trace ended with {status}\n{stderr}"
    );
    audited.assert_lossless();
    let ran = audited
        .all("exec")
        .iter()
        .filter(|e| e["filename"] == "/bin/true")
        .count();
    assert_eq!(ran, 150, "every process's exec is in the audit");
    let dropped = audited.all("note").into_iter().find(|n| {
        n["text"]
            .as_str()
            .is_some_and(|t| t.contains("does not keep up"))
    });
    assert!(dropped.is_none(), "nothing was dropped: {dropped:?}");
    eprintln!("stdout took {} bytes once read", said.len());
    assert!(
        said.len() > 2 * (64 << 10),
        "more than a pipe and a buffer hold: {}",
        said.len()
    );
    let text = String::from_utf8(said).expect("readable lines are UTF-8");
    assert!(text.ends_with('\n'), "whole lines");
    assert!(
        text.lines().filter(|l| l.contains("/bin/true")).count() >= 150,
        "a line for each exec"
    );
}
