//! The real Hermes agent gateway (PyPI `hermes-agent`, in the venv `cargo xtask test` makes and
//! names in `REAPER_HERMES_VENV`), run as its users run it: `hermes gateway run` with a
//! `HERMES_HOME` whose `config.yaml` lists stdio MCP servers (written with the mcp SDK), behind
//! Hermes's own watchdog wrapper. No LLM key and no messaging platform: the gateway stays up
//! for its cron scheduler. Needs root (see `require_root`); host only.
use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
};

use reaper_tests::{
    Then, free_port, metric_sample, pid, require_root, run_reaper_until, run_reaper_until_polled,
    scrape_metrics, scratch, skip,
};
use serde_json::Value;

/// The venv with Hermes, or `None` to skip.
fn hermes_venv(test: &str) -> Option<PathBuf> {
    venv_of(test, "REAPER_HERMES_VENV")
}

/// The venv that `var` names (`cargo xtask test` makes each), or `None` to skip.
fn venv_of(test: &str, var: &str) -> Option<PathBuf> {
    if !require_root(test) {
        return None;
    }
    match std::env::var_os(var).map(PathBuf::from) {
        Some(v) if v.join("bin/hermes").is_file() => Some(v),
        _ => {
            skip(
                test,
                &format!("{var} names no venv with hermes (`cargo xtask test` makes it)"),
            );
            None
        }
    }
}

/// A `HERMES_HOME` in `dir` whose gateway starts one stdio MCP server per `(name, extra args)`,
/// each pinged every `keepalive` seconds. Hermes's download of its command scanner is off.
fn hermes_home(dir: &Path, venv: &Path, servers: &[(&str, &[&str])], keepalive: u32) -> PathBuf {
    hermes_home_with(
        dir,
        venv,
        servers,
        &format!("keepalive_interval: {keepalive}"),
    )
}

/// [`hermes_home`] with `options` (YAML, one `key: value`) for each server.
fn hermes_home_with(
    dir: &Path,
    venv: &Path,
    servers: &[(&str, &[&str])],
    options: &str,
) -> PathBuf {
    let home = dir.join("hermes-home");
    std::fs::create_dir_all(&home).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("hermes/tiny_mcp_server.py");
    let python = venv.join("bin/python3");
    let mut config = String::from("security:\n  tirith_enabled: false\nmcp_servers:\n");
    for (name, extra) in servers {
        let mut args = vec![format!("\"{}\"", script.display()), format!("\"{name}\"")];
        args.extend(extra.iter().map(|a| format!("\"{a}\"")));
        config += &format!(
            "  {name}:\n    command: \"{}\"\n    args: [{}]\n    {options}\n",
            python.display(),
            args.join(", ")
        );
    }
    std::fs::write(home.join("config.yaml"), config).unwrap();
    home
}

/// The pids of the processes that executed `python3 SCRIPT NAME ...` (a server itself, not
/// Hermes's watchdog wrapper, whose argv ends with the server's), in the stream so far.
fn execs_of(events: &[Value], script: &str, name: &str) -> Vec<u64> {
    events
        .iter()
        .filter(|e| e["event"] == "exec")
        .filter(|e| {
            let argv = e["argv"].as_array();
            let arg = |i: usize| argv.and_then(|a| a.get(i)).and_then(Value::as_str);
            arg(1).is_some_and(|s| s.ends_with(script)) && arg(2) == Some(name)
        })
        .map(|e| pid(&e["pid"]))
        .collect()
}

/// The one server named `name` in the stream so far.
fn server(events: &[Value], name: &str) -> Option<u64> {
    execs_of(events, "tiny_mcp_server.py", name)
        .first()
        .copied()
}

/// The flag events so far.
fn flags(events: &[Value]) -> Vec<&Value> {
    events.iter().filter(|e| e["event"] == "flag").collect()
}

#[test]
fn a_healthy_gateway_whose_servers_are_pinged_raises_no_flag() {
    let test = "a_healthy_gateway_whose_servers_are_pinged_raises_no_flag";
    let Some(venv) = hermes_venv(test) else {
        return;
    };
    let dir = scratch(test);
    let home = hermes_home(&dir, &venv, &[("alpha", &[]), ("beta", &[])], 5);
    let port = free_port();
    let metrics = format!("127.0.0.1:{port}");
    let hermes = venv.join("bin/hermes");
    // The proof: both servers started, then a whole --idle-after (8 s) of scans (32 at
    // 250 ms) with both servers watched: every rule had its look.
    let mut watched_from = None;
    let run = run_reaper_until_polled(
        &[
            "--idle-after",
            "8s",
            "--scan-interval",
            "250ms",
            "--metrics",
            &metrics,
            "--",
            hermes.to_str().unwrap(),
            "gateway",
            "run",
        ],
        &[("HERMES_HOME", home.to_str().unwrap())],
        &dir.join("release"),
        (
            "both servers watched for a whole --idle-after",
            Then::Interrupt,
        ),
        |events| {
            if server(events, "alpha").is_none() || server(events, "beta").is_none() {
                return false;
            }
            let scans = scrape_metrics(port)
                .and_then(|t| metric_sample(&t, "reaper_scan_duration_seconds_count"));
            let Some(scans) = scans else { return false };
            let from = *watched_from.get_or_insert(scans);
            scans >= from + 40.0
        },
    );
    let proven = run.until_proof();
    assert!(
        flags(&proven.events).is_empty(),
        "a healthy gateway: {:?}\n{}",
        flags(&proven.events),
        run.stderr
    );
    let gateways = proven.all("gateway");
    assert_eq!(gateways.len(), 1, "{gateways:?}");
    assert_eq!(gateways[0]["selector"], "command");
    // The servers are the gateway's descendants, through Hermes's watchdog wrapper.
    let alpha = server(&proven.events, "alpha").unwrap();
    let fork = proven.one("fork", alpha);
    assert_ne!(
        pid(&fork["spawner"]),
        pid(&gateways[0]["pid"]),
        "behind a wrapper: {fork}"
    );
}

/// Stops a Hermes gateway the test started itself, and waits for it.
struct Gateway(Child);

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_sigkilled_gateway_leaves_only_the_server_helper_that_lingers_orphaned() {
    let test = "a_sigkilled_gateway_leaves_only_the_server_helper_that_lingers_orphaned";
    let Some(venv) = hermes_venv(test) else {
        return;
    };
    let dir = scratch(test);
    let home = hermes_home(
        &dir,
        &venv,
        &[("alpha", &[]), ("beta", &[]), ("gamma", &["--helper"])],
        5,
    );
    let hermes = venv.join("bin/hermes");
    let mut killed = None;
    let mut helper = None;
    let run = run_reaper_until_polled(
        &[
            "--scan-interval",
            "250ms",
            "--",
            hermes.to_str().unwrap(),
            "gateway",
            "run",
        ],
        &[("HERMES_HOME", home.to_str().unwrap())],
        &dir.join("release"),
        ("the lingering helper orphaned", Then::Interrupt),
        |events| {
            if killed.is_none() {
                let servers = ["alpha", "beta", "gamma"].map(|s| server(events, s));
                helper = execs_of(
                    events,
                    "",
                    "import sys, time; sys.stdin.read(); time.sleep(3600)",
                )
                .first()
                .copied();
                let gateway = events.iter().find(|e| e["event"] == "gateway");
                if servers.iter().all(Option::is_some) && helper.is_some() {
                    let gw = pid(&gateway.unwrap()["pid"]);
                    // SAFETY: the gateway reaper-trace started for this test, not yet reaped.
                    unsafe { libc::kill(gw as i32, libc::SIGKILL) };
                    killed = Some(gw);
                }
                return false;
            }
            flags(events)
                .iter()
                .any(|f| f["reason"] == "orphaned" && f["pid"].as_u64() == helper)
        },
    );
    let helper = helper.unwrap();
    // SAFETY: ends the helper the test left behind (init's child by now).
    unsafe { libc::kill(helper as i32, libc::SIGKILL) };
    let orphaned: Vec<&Value> = run
        .all("flag")
        .into_iter()
        .filter(|f| f["reason"] == "orphaned")
        .collect();
    assert_eq!(
        orphaned.len(),
        1,
        "only the helper: {orphaned:?}\n{}",
        run.stderr
    );
    assert_eq!(orphaned[0]["pid"].as_u64(), Some(helper));
    let lineage = orphaned[0]["lineage"].as_array().unwrap();
    assert_eq!(lineage.first().and_then(Value::as_u64), killed);
    let gamma = server(&run.events, "gamma").unwrap();
    assert!(
        lineage.iter().any(|p| p.as_u64() == Some(gamma)),
        "spawned by the gamma server: {lineage:?}"
    );
    for s in ["alpha", "beta", "gamma"] {
        let p = server(&run.events, s).unwrap();
        assert!(run.flags_of(p).is_empty(), "{s} exited on EOF");
        run.one("exit", p);
    }
    assert_eq!(run.summary()["leaks"]["raised"]["orphaned"], 1);
}

#[test]
fn a_replace_restart_is_a_second_instance_with_its_own_servers() {
    let test = "a_replace_restart_is_a_second_instance_with_its_own_servers";
    let Some(venv) = hermes_venv(test) else {
        return;
    };
    let dir = scratch(test);
    let home = hermes_home(&dir, &venv, &[("alpha", &[])], 5);
    let hermes = venv.join("bin/hermes");
    let start = |replace: bool| {
        let mut cmd = Command::new(&hermes);
        cmd.args(["gateway", "run"])
            .env("HERMES_HOME", &home)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if replace {
            cmd.arg("--replace");
        }
        Gateway(cmd.spawn().expect("start hermes gateway run"))
    };
    // Other tests' gateways run the same program: only this test's two instances count.
    let mut first: Option<Gateway> = None;
    let mut second: Option<Gateway> = None;
    let ours = |events: &[Value], gw: &Option<Gateway>| -> (bool, Vec<u64>) {
        let Some(gw) = gw.as_ref().map(|g| u64::from(g.0.id())) else {
            return (false, Vec::new());
        };
        let announced = events
            .iter()
            .any(|e| e["event"] == "gateway" && e["pid"].as_u64() == Some(gw));
        let servers = execs_of(events, "tiny_mcp_server.py", "alpha")
            .into_iter()
            .filter(|s| lineage_in(events, *s).first() == Some(&gw))
            .collect();
        (announced, servers)
    };
    let run = run_reaper_until_polled(
        &[
            "--gateway-exe",
            hermes.to_str().unwrap(),
            "--scan-interval",
            "250ms",
        ],
        &[],
        &dir.join("release"),
        ("two instances, each with its server", Then::Interrupt),
        |events| {
            if events.iter().any(|e| e["event"] == "ready") && first.is_none() {
                first = Some(start(false));
            }
            let (announced, servers) = ours(events, &first);
            if announced && servers.len() == 1 && second.is_none() {
                second = Some(start(true));
            }
            let (again, theirs) = ours(events, &second);
            announced && again && servers.len() == 1 && theirs.len() == 1
        },
    );
    let proven = run.until_proof();
    for gw in [&first, &second] {
        let (announced, servers) = ours(&proven.events, gw);
        assert!(
            announced && servers.len() == 1,
            "{:?}",
            proven.all("gateway")
        );
        let pid_ = u64::from(gw.as_ref().unwrap().0.id());
        let event = proven
            .all("gateway")
            .into_iter()
            .find(|e| e["pid"].as_u64() == Some(pid_))
            .unwrap();
        assert_eq!(event["selector"], format!("exe:{}", hermes.display()));
    }
    drop(second);
    drop(first);
}

/// A process's lineage, from its fork's spawner chain in the stream, up to a gateway.
fn lineage_in(events: &[Value], pid_: u64) -> Vec<u64> {
    let of = |name: &'static str| events.iter().filter(move |e| e["event"] == name);
    let gateways: Vec<u64> = of("gateway").map(|g| pid(&g["pid"])).collect();
    let mut chain = vec![pid_];
    let mut at = pid_;
    while !gateways.contains(&at) && chain.len() < 64 {
        let Some(fork) = of("fork").find(|f| pid(&f["pid"]) == at) else {
            break;
        };
        at = pid(&fork["spawner"]);
        chain.insert(0, at);
    }
    chain
}

#[test]
fn hermes_0_14s_connect_timeout_leak_is_named_in_run_stdio() {
    let test = "hermes_0_14s_connect_timeout_leak_is_named_in_run_stdio";
    let Some(venv) = venv_of(test, "REAPER_HERMES_LEAKING_VENV") else {
        return;
    };
    let dir = scratch(test);
    // A server stuck before it answers `initialize`: Hermes 0.14's connect timeout gives up
    // on it, and nothing ends it (the task that spawned it goes on holding its pipes).
    let home = hermes_home_with(&dir, &venv, &[("stuck", &["--hang"])], "connect_timeout: 2");
    let hermes = venv.join("bin/hermes");
    let mut asked = None;
    let run = run_reaper_until(
        &[
            "--idle-after",
            "2s",
            "--scan-interval",
            "250ms",
            "--",
            hermes.to_str().unwrap(),
            "gateway",
            "run",
        ],
        &[("HERMES_HOME", home.to_str().unwrap())],
        &dir.join("release"),
        (
            "the stuck server flagged, and why asked of it",
            Then::Interrupt,
        ),
        |events| {
            let stuck = server(events, "stuck");
            let flagged = flags(events).into_iter().find(|f| {
                let chain = f["chain"].as_array().cloned().unwrap_or_default();
                chain.iter().any(|c| c["pid"].as_u64() == stuck)
            });
            if let Some(flagged) = flagged.filter(|_| asked.is_none()) {
                let why = Command::new(reaper_tests::reaper_trace())
                    .args(["why", &pid(&flagged["pid"]).to_string()])
                    .output()
                    .expect("run reaper-trace why");
                asked = Some(why);
            }
            asked.is_some()
        },
    );
    // `why` of the leaked server names the code that spawned it: hermes's own `_run_stdio`.
    let asked = asked.expect("asked");
    let said = String::from_utf8_lossy(&asked.stdout);
    eprintln!("{said}");
    assert!(asked.status.success(), "{asked:?}");
    assert!(
        said.contains("spawned at ") && said.contains("_run_stdio (mcp_tool.py:"),
        "{said}"
    );
    let proven = run.until_proof();
    let flag = flags(&proven.events)[0].clone();
    let frames = flag["spawned_at"].as_array().cloned().unwrap_or_default();
    eprintln!(
        "{} flag on {}: spawned at {frames:#?}",
        flag["reason"], flag["pid"]
    );
    let spawner = frames
        .iter()
        .find(|f| f["function"] == "MCPServerTask._run_stdio");
    let spawner = spawner.unwrap_or_else(|| {
        panic!("no _run_stdio frame in {flag:#}\n{}", run.stderr);
    });
    assert!(
        spawner["file"]
            .as_str()
            .is_some_and(|f| f.ends_with("tools/mcp_tool.py")),
        "{spawner}"
    );
    assert!(spawner["line"].as_u64().is_some(), "{spawner}");
}
