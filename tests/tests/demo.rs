//! The README's demo: what `cargo xtask demo` prints is what the README shows (its LEAK line
//! and tree, pids, times, inodes and sizes aside), whatever fds the caller leaves open; in the
//! guests of `cargo xtask test`, from the OCI image's binary of the guest's architecture
//! (`$REAPER_IMAGE_TRACE`). Needs root (see `require_root`).
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use reaper_tests::{patience, reaper_trace, require_root};
use serde_json::Value;

/// A line as the comparison sees it: every number one `N`, every size one `SIZE` (a guest's
/// cat is KiB where a host's is MiB), every run of spaces one space, and no spawn site (its
/// frames are the machine's shell build's).
fn normalized(line: &str) -> String {
    let line = line.split("; spawned at ").next().unwrap_or(line);
    let mut out = String::new();
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() {
            while chars.peek().is_some_and(|d| d.is_ascii_digit()) {
                chars.next();
            }
            out.push('N');
        } else if c == ' ' {
            while chars.peek() == Some(&' ') {
                chars.next();
            }
            out.push(' ');
        } else {
            out.push(c);
        }
    }
    for unit in ["GiB", "MiB", "KiB"] {
        out = out
            .replace(&format!("N.N {unit}"), "SIZE")
            .replace(&format!("N {unit}"), "SIZE");
    }
    out
}

/// The README's picture of the demo: the code block after its marker.
fn readme_picture() -> Vec<String> {
    let readme = Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    let text = std::fs::read_to_string(readme).unwrap();
    let after = text
        .split("<!-- the demo's output")
        .nth(1)
        .expect("the README marks the demo's output");
    let block = after
        .split("```")
        .nth(1)
        .expect("a code block after the marker");
    block
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(normalized)
        .collect()
}

#[test]
fn the_demo_prints_what_the_readme_shows() {
    let test = "the_demo_prints_what_the_readme_shows";
    if !require_root(test) {
        return;
    }
    // From the checkout, as `cargo xtask demo` runs it.
    let checkout = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    // The caller leaves a pipe open past stdio, as a shell often does: the example closes it.
    let mut kept = [0; 2];
    // SAFETY: a plain pipe(2) into a local array; both ends stay open (inherited by the run).
    assert_eq!(unsafe { libc::pipe(kept.as_mut_ptr()) }, 0);
    // The guests of `cargo xtask test` hold the image's binary of their architecture: the
    // demo is then what a node running the image shows.
    let trace = std::env::var_os("REAPER_IMAGE_TRACE").map_or_else(reaper_trace, Into::into);
    eprintln!("the demo runs {}", trace.display());
    let mut child = Command::new(&trace)
        .arg("--json")
        .args(["--", "examples/leaky-gateway.sh"])
        .current_dir(&checkout)
        .env("LEAK_SECONDS", "600")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let stderr = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    // The server's and the holder's flags, then the stop (no wall-clock window: the patience
    // only ends a run whose flags never come).
    let give_up = Instant::now() + patience();
    let mut flagged: Vec<Value> = Vec::new();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    while flagged.len() < 2 && Instant::now() < give_up {
        let Some(Ok(line)) = lines.next() else { break };
        let Ok(event) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        if event["event"] == "flag" {
            flagged.push(event);
        }
    }
    // SAFETY: a plain signal to the child this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    for _ in lines.by_ref() {}
    child.wait().unwrap();
    let printed = stderr.join().unwrap();
    // SAFETY: this test's own pipe, closed once.
    unsafe {
        libc::close(kept[0]);
        libc::close(kept[1]);
    }
    for f in &flagged {
        if let Some(pid) = f["pid"].as_i64() {
            // SAFETY: the demo's leftovers, by the pids its flags named.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
    }
    assert_eq!(flagged.len(), 2, "two flags: {flagged:?}\n{printed}");
    let cat = flagged
        .iter()
        .find(|f| f["comm"] == "cat")
        .expect("the server flagged");
    let stdin = &cat["pipes"][0];
    assert_eq!(
        (stdin["fd"].as_u64(), stdin["end"].as_str()),
        (Some(0), Some("read")),
        "{cat}"
    );
    assert_eq!(
        cat["pipes"].as_array().map(Vec::len),
        Some(1),
        "only fd 0: {cat}"
    );
    assert_eq!(cat["session"]["id"], "demo-session-2", "{cat}");
    let shown: Vec<String> = printed.lines().map(normalized).collect();
    for line in readme_picture() {
        assert!(
            shown.iter().any(|s| s.ends_with(&line) || *s == line),
            "the README shows\n  {line}\nwhich the demo did not print:\n{printed}"
        );
    }
}
