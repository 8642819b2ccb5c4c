//! The metrics pipeline as a fleet runs it, with a real Prometheus (Debian's `prometheus` and
//! `promtool`, installed by `cargo xtask test`): the alerting rules in `contrib/prometheus/`
//! check and pass their unit tests (each alert fires on one series and stays silent on
//! another); Prometheus scrapes a reaper-trace run during a real orphan leak and its query API
//! returns the flag; `promtool check metrics` accepts a real scrape; the Grafana dashboard's
//! queries run there, over served metrics, and its kills panel answers after a real `--kill`.
//! Not part of the kernel matrix (no Prometheus in the guests).
use std::{
    io::{Read, Write},
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use reaper_tests::{Then, free_port, host_tool, patience, require_root, run_shape_until, scratch};
use serde_json::Value;

fn rules_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../contrib/prometheus")
}

#[test]
fn the_alerting_rules_check_and_pass_their_unit_tests() {
    let test = "the_alerting_rules_check_and_pass_their_unit_tests";
    let Some(promtool) = host_tool("promtool", "prometheus", test) else {
        return;
    };
    for args in [
        ["check", "rules", "reaper.rules.yml"],
        ["test", "rules", "reaper.rules.test.yml"],
    ] {
        let out = Command::new(&promtool)
            .args(args)
            .current_dir(rules_dir())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "promtool {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// GET `path` (HTTP/1.0: no chunking); the body, if the server answered 200.
fn get(port: u16, path: &str, accept: &str) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nAccept: {accept}\r\n\r\n");
    s.write_all(request.as_bytes()).ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.0 200").then(|| body.to_owned())
}

/// A Prometheus server scraping one reaper-trace every second with the alerting rules
/// loaded, stopped when dropped.
struct Prometheus {
    child: Child,
    /// Where its HTTP API listens.
    port: u16,
    dir: PathBuf,
}

impl Prometheus {
    /// Starts `prometheus` with its data and log in `dir`, scraping `127.0.0.1:metrics_port`.
    fn start(prometheus: &Path, dir: &Path, metrics_port: u16) -> Prometheus {
        let port = free_port();
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 rule_files:\n  - {}\n\
                 scrape_configs:\n  - job_name: reaper\n    static_configs:\n      \
                 - targets: ['127.0.0.1:{metrics_port}']\n",
                rules_dir().join("reaper.rules.yml").display()
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = Command::new(prometheus)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start prometheus");
        Prometheus {
            child,
            port,
            dir: dir.to_owned(),
        }
    }

    /// The answer to the instant query `expr`, if Prometheus gave one.
    fn query(&self, expr: &str) -> Option<Value> {
        get(
            self.port,
            &format!("/api/v1/query?query={}", encode(expr)),
            "application/json",
        )
        .and_then(|body| serde_json::from_str(&body).ok())
    }

    /// Its log, for a failure message.
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The dashboard's PromQL queries, over every instance.
fn dashboard_queries() -> Vec<String> {
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(rules_dir().join("reaper-dashboard.json")).unwrap(),
    )
    .expect("the dashboard is JSON");
    dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap().iter())
        .map(|t| t["expr"].as_str().unwrap().replace("$instance", ".*"))
        .collect()
}

#[test]
fn prometheus_scrapes_a_real_leak() {
    let test = "prometheus_scrapes_a_real_leak";
    let (Some(prometheus), Some(promtool)) = (
        host_tool("prometheus", "prometheus", test),
        host_tool("promtool", "prometheus", test),
    ) else {
        return;
    };
    if !require_root(test) {
        return;
    }
    let dir = scratch("prometheus");
    let metrics_port = free_port();
    let server = Prometheus::start(&prometheus, &dir, metrics_port);
    let prom_port = server.port;
    let query = "/api/v1/query?query=reaper_flagged%7Breason%3D%22orphaned%22%7D";
    let mut seen: Option<Value> = None;
    let mut scrape: Option<String> = None;
    let metrics_arg = format!("127.0.0.1:{metrics_port}");
    let (run, _) = run_shape_until(
        &["--scan-interval", "250ms", "--metrics", &metrics_arg],
        "leak-orphan",
        &[],
        ("Prometheus to see the orphaned flag", Then::Release),
        |events| {
            let flagged = events
                .iter()
                .any(|e| e["event"] == "flag" && e["reason"] == "orphaned");
            if !flagged || seen.is_some() {
                return flagged && seen.is_some();
            }
            // The leak is held until this returns: ask Prometheus until its scrape of it is in.
            let deadline = Instant::now() + patience();
            while Instant::now() < deadline {
                let answer = get(prom_port, query, "application/json")
                    .and_then(|body| serde_json::from_str::<Value>(&body).ok());
                let value = answer.as_ref().and_then(|a| {
                    a["data"]["result"][0]["value"][1]
                        .as_str()
                        .map(str::to_owned)
                });
                if value.as_deref() == Some("1") {
                    seen = answer;
                    break;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            scrape = get(metrics_port, "/metrics", "*/*");
            true
        },
    );
    assert!(run.status.success(), "{}", run.stderr);
    let seen = seen.unwrap_or_else(|| {
        panic!(
            "Prometheus never returned reaper_flagged{{reason=\"orphaned\"}} == 1; its log:\n{}",
            server.log()
        )
    });
    let series = &seen["data"]["result"][0]["metric"];
    assert_eq!(series["job"], "reaper", "{seen}");
    assert_eq!(series["instance"], metrics_arg.as_str(), "{seen}");

    let scrape = scrape.expect("a scrape while the leak held");
    assert!(
        scrape.contains("reaper_flagged{reason=\"orphaned\"} 1"),
        "{scrape}"
    );
    let mut check = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    check
        .stdin
        .take()
        .unwrap()
        .write_all(scrape.as_bytes())
        .unwrap();
    let out = check.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // The Grafana dashboard's every query is PromQL this Prometheus accepts, over metrics a
    // real scrape has.
    let exprs = dashboard_queries();
    assert!(exprs.len() >= 8, "{exprs:?}");
    for expr in &exprs {
        for name in metric_names(expr) {
            // A sample, or its family (a histogram's `_bucket`). The kill steps appear with the
            // first kill: their query is proven on a real kill's scrape below.
            let served = scrape.lines().any(|l| {
                l.starts_with(&name)
                    || l.strip_prefix("# TYPE ")
                        .and_then(|t| t.split(' ').next())
                        .is_some_and(|family| name.starts_with(family))
            });
            let kill_steps = name == "reaper_kills_total";
            assert!(served || kill_steps, "{name} (in `{expr}`) is not served");
        }
        let answer = server.query(expr);
        assert_eq!(
            answer.as_ref().map(|a| a["status"].clone()),
            Some(Value::from("success")),
            "Prometheus refused `{expr}`: {answer:?}"
        );
    }
}

/// The `reaper_*` metric names in a PromQL expression.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("reaper_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.push(tail[..end].to_owned());
        rest = &tail[end..];
    }
    names
}

/// A query string value, percent-encoded.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The dashboard's kills panel reads a real kill: reaper-trace with `--kill` ends an orphaned
/// leak while its gateway lives on, and once the stream has the kill's `exited` step,
/// Prometheus, scraping that run, answers the panel's own query with the steps by reason and
/// result.
#[test]
fn the_dashboards_kills_query_reads_a_real_kill() {
    let test = "the_dashboards_kills_query_reads_a_real_kill";
    let Some(prometheus) = host_tool("prometheus", "prometheus", test) else {
        return;
    };
    if !require_root(test) {
        return;
    }
    let kills = dashboard_queries()
        .into_iter()
        .find(|e| e.contains("reaper_kills_total"))
        .expect("the dashboard has a kills panel");
    let dir = scratch("prometheus-kill");
    let metrics_port = free_port();
    let server = Prometheus::start(&prometheus, &dir, metrics_port);
    let metrics_arg = format!("127.0.0.1:{metrics_port}");
    let mut answer: Option<Value> = None;
    let (run, _) = run_shape_until(
        &[
            "--scan-interval",
            "250ms",
            "--metrics",
            &metrics_arg,
            "--kill",
            "--grace",
            "0s",
        ],
        "leak-orphan",
        &[],
        ("Prometheus to answer the kills query", Then::Release),
        |events| {
            let killed = events
                .iter()
                .any(|e| e["event"] == "kill" && e["result"] == "exited");
            if !killed || answer.is_some() {
                return killed && answer.is_some();
            }
            // The gateway lives, and so does the run, until this returns.
            let deadline = Instant::now() + patience();
            while Instant::now() < deadline {
                let reply = server.query(&kills);
                let series = reply
                    .as_ref()
                    .and_then(|a| a["data"]["result"].as_array().cloned());
                let exited = series.iter().flatten().any(|s| {
                    s["metric"]["reason"] == "orphaned" && s["metric"]["result"] == "exited"
                });
                if exited {
                    answer = reply;
                    break;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            true
        },
    );
    assert!(run.status.success(), "{}", run.stderr);
    let answer = answer.unwrap_or_else(|| {
        panic!(
            "Prometheus never answered `{kills}` with the kill; its log:\n{}",
            server.log()
        )
    });
    let steps: Vec<(String, String)> = answer["data"]["result"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let label = |name: &str| s["metric"][name].as_str().unwrap_or("").to_owned();
            (label("reason"), label("result"))
        })
        .collect();
    assert!(
        steps.contains(&("orphaned".to_owned(), "sent".to_owned())),
        "the SIGTERM step too: {steps:?}"
    );
}
