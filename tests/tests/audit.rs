//! Day-long audit plumbing against the real kernel: `/metrics` agrees with the stream,
//! `--output` rotation loses nothing, a full disk stops nothing. Needs root (see
//! `require_root`).
use std::{
    io::{BufRead, BufReader, Read},
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use reaper_tests::{
    Run, assert_schema_valid, free_port, metric_sample, patience, reaper_trace, require_root,
    run_reaper, scrape_metrics, scratch, shapes,
};
use serde_json::Value;

/// Events of `name` in the stream so far.
fn count(events: &[Value], name: &str) -> f64 {
    events.iter().filter(|e| e["event"] == name).count() as f64
}

#[test]
fn metrics_scrape_matches_the_stream() {
    if !require_root("metrics_scrape_matches_the_stream") {
        return;
    }
    let port = free_port();
    let dir = scratch("metrics");
    let truth = dir.join("truth.json");
    // The orphan's pipe is held until the scrape agreed (no window a slow guest can miss).
    let release = dir.join("release");
    let mut child = Command::new(reaper_trace())
        .args(["--json", "--quiet", "--scan-interval", "250ms", "--metrics"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("--")
        .arg(shapes())
        .args(["leak-orphan", truth.to_str().unwrap()])
        .env("REAPER_SHAPES_RELEASE", &release)
        .env(reaper_tests::HOLD_CAP, reaper_tests::hold_cap())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let events = Arc::new(Mutex::new(Vec::<Value>::new()));
    let reader = {
        let events = events.clone();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let event = serde_json::from_str(&line).unwrap();
                assert_schema_valid(&event);
                events.lock().unwrap().push(event);
            }
        })
    };
    // While the orphan's flag holds and nothing else moves, the scrape and the stream agree.
    let start = Instant::now();
    let mut last = String::new();
    let agreed = loop {
        if start.elapsed() > patience() {
            break false;
        }
        std::thread::sleep(Duration::from_millis(100));
        let evs = events.lock().unwrap().clone();
        if count(&evs, "flag") == 0.0 {
            continue;
        }
        let Some(text) = scrape_metrics(port) else {
            continue;
        };
        let alive = count(&evs, "fork") - count(&evs, "exit");
        let expected = [
            ("reaper_events_total{kind=\"fork\"}", count(&evs, "fork")),
            ("reaper_events_total{kind=\"exec\"}", count(&evs, "exec")),
            ("reaper_events_total{kind=\"exit\"}", count(&evs, "exit")),
            (
                "reaper_events_total{kind=\"reaped\"}",
                count(&evs, "reaped"),
            ),
            (
                "reaper_events_total{kind=\"setsid\"}",
                count(&evs, "setsid"),
            ),
            (
                "reaper_flags_total{reason=\"orphaned\"}",
                count(&evs, "flag"),
            ),
            ("reaper_flagged{reason=\"orphaned\"}", count(&evs, "flag")),
            ("reaper_events_lost_total", 0.0),
            ("reaper_descendants_alive", alive),
        ];
        last = text.clone();
        if expected
            .iter()
            .all(|(series, want)| metric_sample(&text, series) == Some(*want))
        {
            break true;
        }
    };
    std::fs::write(&release, b"").unwrap();
    assert!(
        agreed,
        "the scrape never matched the stream in {:?}:\n{last}\nthe stream: {:?}",
        patience(),
        events.lock().unwrap()
    );
    assert!(metric_sample(&last, "reaper_flagged_resident_bytes").unwrap() > 0.0);
    assert!(metric_sample(&last, "reaper_graph_nodes").unwrap() >= 3.0);
    assert!(metric_sample(&last, "reaper_scan_duration_seconds_count").unwrap() >= 1.0);
    let status = child.wait().unwrap();
    reader.join().unwrap();
    assert!(status.success());
    assert!(
        TcpStream::connect(("127.0.0.1", port)).is_err(),
        "the port is closed with the run"
    );
}

/// The rotated files, oldest first, then the live one.
fn rotated_in_order(path: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for k in (1..=1000).rev() {
        let p = PathBuf::from(format!("{}.{k}", path.display()));
        if p.exists() {
            files.push(p);
        }
    }
    files.push(path.to_path_buf());
    files
}

#[test]
fn rotation_loses_no_event() {
    if !require_root("rotation_loses_no_event") {
        return;
    }
    let dir = scratch("rotation");
    let file = dir.join("audit.ndjson");
    let out = Command::new(reaper_trace())
        .args([
            "--json",
            "--quiet",
            "--rotate-size",
            "4KiB",
            "--rotate-keep",
            "1000",
        ])
        .arg("--output")
        .arg(&file)
        .args(["--", "sh", "-c", "for i in $(seq 200); do /bin/true; done"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let files = rotated_in_order(&file);
    assert!(files.len() > 10, "rotated into {} files", files.len());
    let mut joined = Vec::new();
    for f in &files {
        let bytes = std::fs::read(f).unwrap();
        assert!(
            bytes.len() <= 4096,
            "{} holds {} bytes",
            f.display(),
            bytes.len()
        );
        assert!(bytes.ends_with(b"\n"), "{} ends inside a line", f.display());
        joined.extend_from_slice(&bytes);
    }
    assert_eq!(
        String::from_utf8(joined).unwrap(),
        String::from_utf8(out.stdout.clone()).unwrap(),
        "the files, in order, are the stream"
    );
    let run = Run::from_output(&out.stdout, &out.stderr, out.status);
    run.assert_well_formed();
    assert!(run.all("exec").len() >= 200);
}

/// A tmpfs of `size` mounted at `dir` for the life of the value.
struct SmallDisk(PathBuf);

impl SmallDisk {
    fn mount(dir: &Path, size: &str) -> SmallDisk {
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "reaper-test"])
            .arg(dir)
            .status()
            .unwrap()
            .success();
        assert!(ok, "mounting a tmpfs at {}", dir.display());
        SmallDisk(dir.to_path_buf())
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn a_full_disk_stops_nothing_and_loses_nothing() {
    if !require_root("a_full_disk_stops_nothing_and_loses_nothing") {
        return;
    }
    let dir = scratch("full-disk");
    let _disk = SmallDisk::mount(&dir, "256k");
    let filler = dir.join("filler");
    // Fill the disk to the last block.
    let _ = Command::new("dd")
        .args(["if=/dev/zero", "bs=4k"])
        .arg(format!("of={}", filler.display()))
        .stderr(Stdio::null())
        .status();
    let file = dir.join("audit.ndjson");
    // The gateway makes events while the disk is full; once reaper-trace said it cannot
    // write, the test lets it free the space and make more (no window to race).
    let go = scratch("full-disk-go").join("go");
    let script = format!(
        "for i in $(seq 50); do /bin/true; done; n=0; \
         while [ ! -e {} ] && [ $n -lt {} ]; do sleep 0.05; n=$((n+1)); done; \
         rm {}; for i in $(seq 50); do /bin/true; done",
        go.display(),
        patience().as_secs() * 20,
        filler.display()
    );
    let mut child = Command::new(reaper_trace())
        .args(["--json", "--quiet", "--output"])
        .arg(&file)
        .args(["--", "sh", "-c", &script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout_pipe = child.stdout.take().unwrap();
    let stdout_reader = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        stdout_pipe.read_to_end(&mut bytes).unwrap();
        bytes
    });
    let mut stderr_bytes = Vec::new();
    for line in BufReader::new(child.stderr.take().unwrap()).split(b'\n') {
        let line = line.unwrap();
        if String::from_utf8_lossy(&line).contains("No space left on device") {
            std::fs::write(&go, b"").unwrap();
        }
        stderr_bytes.extend_from_slice(&line);
        stderr_bytes.push(b'\n');
    }
    let status = child.wait().unwrap();
    std::fs::write(&go, b"").unwrap(); // whatever happened, the gateway ends
    let out = std::process::Output {
        status,
        stdout: stdout_reader.join().unwrap(),
        stderr: stderr_bytes,
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("No space left on device"), "{stderr}");
    assert!(stderr.contains("still tracing"), "{stderr}");
    assert!(
        stderr.contains("writing again; 0 events dropped"),
        "{stderr}"
    );
    let written = std::fs::read_to_string(&file).unwrap();
    assert_eq!(written, String::from_utf8(out.stdout.clone()).unwrap());
    let run = Run::from_output(&out.stdout, &out.stderr, out.status);
    assert!(run.all("exec").len() >= 100);
}

#[test]
fn bad_metrics_and_output_places_are_clear_errors() {
    if !require_root("bad_metrics_and_output_places_are_clear_errors") {
        return;
    }
    let held = TcpListener::bind("127.0.0.1:0").unwrap();
    let busy = held.local_addr().unwrap().to_string();
    let run = run_reaper(&["--metrics", &busy, "--", "true"]);
    assert_eq!(run.status.code(), Some(1), "{}", run.stderr);
    assert!(run.stderr.contains("cannot listen there"), "{}", run.stderr);
    assert!(run.events.is_empty(), "nothing traced: {:?}", run.events);

    let run = run_reaper(&["--metrics", "9464", "--", "true"]);
    assert_eq!(run.status.code(), Some(2), "{}", run.stderr);
    assert!(run.stderr.contains("127.0.0.1:9464"), "{}", run.stderr);

    let run = run_reaper(&["--output", "/nonexistent-dir/audit.ndjson", "--", "true"]);
    assert_eq!(run.status.code(), Some(1), "{}", run.stderr);
    assert!(
        run.stderr.contains("cannot open it for writing"),
        "{}",
        run.stderr
    );
}

/// Waits until the run serving metrics on `port` has counted `n` leak scans (each one a
/// chance to draw the status line), for at most the tests' patience.
fn wait_for_scans(port: u16, n: u32) {
    let deadline = Instant::now() + patience();
    let mut last = None;
    while Instant::now() < deadline {
        last = scrape_metrics(port)
            .and_then(|t| metric_sample(&t, "reaper_scan_duration_seconds_count"));
        if last.is_some_and(|count| count >= f64::from(n)) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("the run never counted {n} scans (last count: {last:?})");
}

/// On a terminal the status line is drawn in place; with --quiet, or off a terminal, never.
#[test]
fn the_status_line_shows_on_a_terminal_only() {
    if !require_root("the_status_line_shows_on_a_terminal_only") {
        return;
    }
    // The gateway (a shell reading a line) lives until its stdin closes: on a terminal, until
    // the status line was drawn; with --quiet, until the run's metrics count three scans (a
    // status line would have been drawn at each).
    let on_tty = |extra: &[&str]| -> String {
        let port = free_port();
        let metrics = format!("127.0.0.1:{port}");
        let (mut master, mut slave) = (0, 0);
        // SAFETY: openpty fills two fds we own from here on.
        let rc = unsafe {
            libc::openpty(
                &mut master,
                &mut slave,
                std::ptr::null_mut(),
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        assert_eq!(rc, 0, "openpty");
        use std::os::fd::FromRawFd;
        // SAFETY: both fds are open and owned by nobody else.
        let (master, slave) = unsafe {
            (
                std::fs::File::from_raw_fd(master),
                std::process::Stdio::from_raw_fd(slave),
            )
        };
        let mut child = Command::new(reaper_trace())
            .args(["--json", "--scan-interval", "100ms", "--metrics", &metrics])
            .args(extra)
            .args(["--", "sh", "-c", "read line || true"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(slave)
            .spawn()
            .unwrap();
        let (seen_tx, seen_rx) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut text = Vec::new();
            let mut master = master;
            let mut buf = [0u8; 4096];
            // The read fails (EIO) once every writer of the terminal is gone.
            while let Ok(n) = master.read(&mut buf) {
                if n == 0 {
                    break;
                }
                text.extend_from_slice(&buf[..n]);
                if String::from_utf8_lossy(&text).contains(" tracked · ") {
                    let _ = seen_tx.send(());
                }
            }
            String::from_utf8_lossy(&text).into_owned()
        });
        match extra.contains(&"--quiet") {
            true => wait_for_scans(port, 3),
            false => {
                let _ = seen_rx.recv_timeout(patience());
            }
        }
        drop(child.stdin.take());
        assert!(child.wait().unwrap().success());
        reader.join().unwrap()
    };
    let shown = on_tty(&[]);
    assert!(
        shown.contains("\r\x1b[Kreaper: ") && shown.contains(" tracked · "),
        "{shown:?}"
    );
    assert!(
        shown.contains("events/s · 0 flagged · 0 lost · "),
        "{shown:?}"
    );
    let quiet = on_tty(&["--quiet"]);
    assert!(!quiet.contains("tracked ·"), "{quiet:?}");
    // Off a terminal (a pipe), no status line either, over as many scans.
    let port = free_port();
    let metrics = format!("127.0.0.1:{port}");
    let mut child = Command::new(reaper_trace())
        .args(["--json", "--scan-interval", "100ms", "--metrics", &metrics])
        .args(["--", "sh", "-c", "read line || true"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_scans(port, 3);
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("exec"),
        "readable lines are there: {stderr}"
    );
    assert!(!stderr.contains("tracked ·"), "{stderr}");
}
