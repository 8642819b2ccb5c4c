//! Small helpers: ports, host tools, the report, reading files, metrics.
use std::{
    path::PathBuf,
    process::Command,
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::*;

/// A TCP port on 127.0.0.1 free right now (for `--metrics`, a Prometheus), and never one this
/// test process handed out before: two ports asked for in a row (or by tests running side by
/// side) must differ even though neither is bound yet.
///
/// Below the kernel's ephemeral range (`ip_local_port_range`): a port in it can be taken
/// before its server binds it, as the source port of any connection, even one to that very
/// port (TCP's self-connect). Seen once: reaper-trace's `--metrics` port was taken while a
/// Prometheus already scraped it.
pub fn free_port() -> u16 {
    static NEXT: std::sync::Mutex<Option<u16>> = std::sync::Mutex::new(None);
    let ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let low = 10_000.min(ephemeral / 2);
    let mut next = NEXT.lock().unwrap_or_else(|e| e.into_inner());
    // Each test process starts at its own place in the range: two test binaries run at once.
    let span = u32::from(ephemeral - low);
    let start =
        next.unwrap_or(low + (u64::from(std::process::id()) * 7919 % u64::from(span)) as u16);
    for i in 0..span {
        let port = low + ((u32::from(start - low) + i) % span) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            *next = Some(low + ((u32::from(port - low) + 1) % span) as u16);
            return port;
        }
    }
    panic!("no free port on 127.0.0.1 below the ephemeral range ({ephemeral})");
}

/// A program a test needs from the host (`cargo xtask test` installs it from Debian's
/// `package`), or `None` to [`skip`].
pub fn host_tool(name: &str, package: &str, test: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file());
    if found.is_none() {
        let why = format!("no {name} on PATH (`cargo xtask test` installs Debian's {package})");
        skip(test, &why);
    }
    found
}

/// Runs `reaper-trace report AUDIT -o PAGE`; returns what it said on stderr.
pub fn render_report(audit: &std::path::Path, page: &std::path::Path) -> String {
    let out = Command::new(reaper_trace())
        .arg("report")
        .arg(audit)
        .arg("-o")
        .arg(page)
        .output()
        .expect("run reaper-trace report");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    stderr
}

/// The evidence of fd `fd` in a flag (its `pipes` entry).
pub fn pipe_fd(flag: &Value, fd: u64) -> &Value {
    flag["pipes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["fd"].as_u64() == Some(fd))
        .unwrap_or_else(|| panic!("no fd {fd} in {flag}"))
}

pub fn read_json(path: &std::path::Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("truth is JSON")
}

/// Waits until `path` exists (a shape publishes its truth by renaming it into place).
pub fn wait_for_file(path: &std::path::Path, limit: Duration) {
    let start = Instant::now();
    while !path.exists() {
        assert!(
            start.elapsed() < limit,
            "{} did not appear within {limit:?}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Makes a FIFO at `path` (mkfifo(3): the guests have no mkfifo program).
pub fn make_fifo(path: &std::path::Path) {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).expect("a path without NUL");
    // SAFETY: a NUL-terminated path that lives across the call.
    let made = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
    assert_eq!(
        made,
        0,
        "mkfifo {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
}

pub fn pid(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a pid: {v}"))
}

/// Whether `events` hold process `pid`'s exit.
pub fn exited(events: &[Value], pid: u32) -> bool {
    (events.iter()).any(|e| e["event"] == "exit" && e["pid"].as_u64() == Some(u64::from(pid)))
}

/// Whether `events` hold a `session` event naming `value`.
pub fn session_begun(events: &[Value], value: &str) -> bool {
    (events.iter()).any(|e| e["event"] == "session" && e["session"] == value)
}

/// The pid a shell gateway wrote in `dir`'s file `name` (`echo $! > DIR/NAME`), once it is
/// there whole.
pub fn pid_in(dir: &std::path::Path, name: &str) -> Option<u32> {
    std::fs::read_to_string(dir.join(name))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// `METHOD path` on the API at `socket`: the answer whole, status line first (the client's
/// own HTTP/1.1, no crate); an answer that does not come within a quarter of the tests'
/// patience fails the test.
pub fn api_call(socket: &std::path::Path, method: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::os::unix::net::UnixStream::connect(socket).expect("connect to the API");
    s.set_read_timeout(Some(patience() / 4)).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text)
        .unwrap_or_else(|e| panic!("{method} {path}: no answer: {e}"));
    text
}

/// GET /metrics from reaper-trace's `--metrics` on 127.0.0.1:`port`, as Prometheus would;
/// None while nothing answers there.
pub fn scrape_metrics(port: u16) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    Some(text)
}

/// The value of the sample line `series` (name with labels) in a scrape.
pub fn metric_sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// Waits for `done` (asked every 10 ms), or fails after the tests' patience saying `what`.
pub fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    wait_seeing(what, || done().then_some(()).ok_or_else(String::new));
}

/// Waits for `look` to give its value (asked every 10 ms); after the tests' patience, fails
/// saying `what` and what the last look saw (its `Err`).
pub fn wait_seeing<T>(what: &str, mut look: impl FnMut() -> Result<T, String>) -> T {
    let start = Instant::now();
    loop {
        let seen = match look() {
            Ok(found) => return found,
            Err(seen) => seen,
        };
        if start.elapsed() >= patience() {
            let saw = match seen.is_empty() {
                true => String::new(),
                false => format!("; the last look saw:\n{seen}"),
            };
            panic!("waited {:?} for {what}{saw}", patience());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A process's parent now, from /proc.
pub fn parent_of(pid: u64) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.split(' ').nth(1)?.parse().ok()
}

/// Raises this process's soft limit on fds to its hard one; returns it.
pub fn raise_fd_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: valid rlimit structs.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
        limit.rlim_cur = limit.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
    }
    limit.rlim_cur
}
