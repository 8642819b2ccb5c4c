//! Naming a JIT host's compiled code from its perf map (`/tmp/perf-PID.map`, which Node
//! writes under `--perf-basic-prof`): V8 names each function there as
//! `JS:~launchServer /srv/host.js:2:22` (kind, function, and where its source begins).
//!
//! The host writes that file, so it is read as anything a traced process controls (see
//! [`crate::untrusted`]): in the host's own `/tmp` (through its root) under the pid it sees
//! itself as, opened checked (a regular file, no symlink at the last step), owned by the
//! host's user or root, up to [`caps::PERF_MAP`]; each line `START SIZE NAME` (hex numbers)
//! is taken, or skipped when it is not one.
use crate::procfs::{self, placement};
use crate::stream::evidence::Frame;
use crate::untrusted::{Checked, caps};

/// The language of the frames named here.
pub const JAVASCRIPT: &str = "javascript";

/// Names `addrs`, code of process `pid` no object maps, from its perf map: a frame the map
/// does not name keeps its address only (see [`unnamed`]).
pub fn name(pid: u32, addrs: &[u64]) -> Vec<Frame> {
    let map = PerfMap::read(pid);
    addrs
        .iter()
        .map(|&addr| match map.as_ref().and_then(|m| m.name_of(addr)) {
            Some(name) => parse(name, addr),
            None => unnamed(addr),
        })
        .collect()
}

/// A perf map's functions: start, end and name, by start.
struct PerfMap {
    functions: Vec<(u64, u64, String)>,
}

impl PerfMap {
    fn read(pid: u32) -> Option<PerfMap> {
        let status = procfs::read_text(pid, "status").ok()?;
        let uid: u32 = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_ascii_whitespace().nth(1)?.parse().ok())?;
        let own_pid = placement::parse_nspid(&status).unwrap_or(pid);
        let path = procfs::proc_path(pid, "root").join(format!("tmp/perf-{own_pid}.map"));
        let file = Checked::open(&path).ok()?;
        if file.owner() != uid && file.owner() != 0 {
            return None; // another user's file, put where the host's would be
        }
        let text = file.read_head(caps::PERF_MAP).ok()?.whole_lines();
        Some(PerfMap::parse(&text))
    }

    fn parse(text: &str) -> PerfMap {
        let mut functions: Vec<(u64, u64, String)> = text
            .lines()
            .filter_map(|line| {
                let mut fields = line.splitn(3, ' ');
                let start = u64::from_str_radix(fields.next()?, 16).ok()?;
                let size = u64::from_str_radix(fields.next()?, 16).ok()?;
                Some((start, start.checked_add(size)?, fields.next()?.to_owned()))
            })
            .collect();
        functions.sort_by_key(|&(start, end, _)| (start, end));
        PerfMap { functions }
    }

    /// The name of the function that holds `addr`: the last to start at or before it (V8
    /// writes a function again when it recompiles it, at a new address).
    fn name_of(&self, addr: u64) -> Option<&str> {
        let after = self
            .functions
            .partition_point(|&(start, _, _)| start <= addr);
        let (_, end, name) = self.functions.get(after.checked_sub(1)?)?;
        (addr < *end).then_some(name.as_str())
    }
}

/// A frame of compiled code whose name is not known (its host gone, or not in its map).
pub fn unnamed(addr: u64) -> Frame {
    Frame {
        offset: addr,
        language: Some(JAVASCRIPT.to_string()),
        ..Frame::default()
    }
}

/// A frame from a perf map's name for it. V8 writes `KIND:NAME LOCATION` for JavaScript
/// (kind `JS`, or `LazyCompile`/`Function` before V8 11; NAME after a tier mark `~` `^` `+`
/// `*`; LOCATION `file:line:column`, or `file:line`), `KIND:NAME` for its own code
/// (`Builtin:`, `Stub:`, `RegExp:`).
fn parse(text: &str, addr: u64) -> Frame {
    let mut frame = Frame {
        offset: addr,
        language: Some(JAVASCRIPT.to_string()),
        ..Frame::default()
    };
    let (kind, rest) = text.split_once(':').unwrap_or(("", text));
    if !matches!(kind, "JS" | "LazyCompile" | "Function" | "Script" | "Eval") {
        frame.function = Some(text.to_string());
        return frame;
    }
    let rest = rest.trim_start_matches(['~', '^', '+', '*']);
    let (function, location) = rest.rsplit_once(' ').unwrap_or((rest, ""));
    frame.function = Some(match function {
        "" => "(anonymous)".to_string(),
        f => f.to_string(),
    });
    // `file:line:column` (the file may hold colons: `node:child_process`, `file:///…`).
    let mut parts = location.rsplitn(3, ':');
    let (last, middle, file) = (parts.next(), parts.next(), parts.next());
    let (file, line) = match (file, middle, last) {
        (Some(file), Some(line), Some(_column)) if line.parse::<u32>().is_ok() => {
            (file, line.parse().ok())
        }
        (_, Some(_), Some(line)) if line.parse::<u32>().is_ok() => (
            location.rsplit_once(':').map_or("", |(f, _)| f),
            line.parse().ok(),
        ),
        _ => (location, None),
    };
    if !file.is_empty() {
        frame.file = Some(file.to_string());
    }
    frame.line = line;
    frame
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(text: &str) -> (Option<String>, Option<String>, Option<u32>) {
        let f = parse(text, 0x1000);
        assert_eq!(f.offset, 0x1000);
        assert_eq!(f.language.as_deref(), Some(JAVASCRIPT));
        (f.function, f.file, f.line)
    }

    #[test]
    fn v8_names_read_as_function_file_and_line() {
        let s = |v: &str| Some(v.to_string());
        assert_eq!(
            parsed("JS:~launchServer /tmp/sp.js:2:22"),
            (s("launchServer"), s("/tmp/sp.js"), Some(2))
        );
        assert_eq!(
            parsed("JS:*ChildProcess.spawn node:internal/child_process:354:40"),
            (
                s("ChildProcess.spawn"),
                s("node:internal/child_process"),
                Some(354)
            )
        );
        assert_eq!(
            parsed("JS:^start file:///srv/node_modules/sdk/client/stdio.js:88:16"),
            (
                s("start"),
                s("file:///srv/node_modules/sdk/client/stdio.js"),
                Some(88)
            )
        );
        // An arrow function has no name; V8 before 11 gave no column.
        assert_eq!(
            parsed("JS:~ /srv/host.js:10:30"),
            (s("(anonymous)"), s("/srv/host.js"), Some(10))
        );
        assert_eq!(
            parsed("LazyCompile:~main /srv/host.js:4"),
            (s("main"), s("/srv/host.js"), Some(4))
        );
        // V8's own code: its name, no file.
        assert_eq!(
            parsed("Builtin:InterpreterEntryTrampoline"),
            (s("Builtin:InterpreterEntryTrampoline"), None, None)
        );
    }

    #[test]
    fn a_perf_map_names_the_function_holding_an_address_and_skips_what_is_not_a_line() {
        let map = PerfMap::parse(
            "3000 10 JS:~b /srv/b.js:1:1\n\
             not a line\n\
             1000 100 JS:~a /srv/a.js:1:1\n\
             ffffffffffffffff 10 JS:~overflows\n\
             2000 zz JS:~bad size\n",
        );
        assert_eq!(map.name_of(0x1000), Some("JS:~a /srv/a.js:1:1"));
        assert_eq!(map.name_of(0x10ff), Some("JS:~a /srv/a.js:1:1"));
        assert_eq!(map.name_of(0x1100), None, "past its end");
        assert_eq!(map.name_of(0x300f), Some("JS:~b /srv/b.js:1:1"));
        assert_eq!(map.name_of(0x0fff), None);
        assert_eq!(map.functions.len(), 2);
    }

    #[test]
    fn a_hosts_perf_map_is_read_and_a_fifo_or_a_link_in_its_place_is_not() {
        // This test process as the host: its map where a host's is, removed at the end.
        let me = std::process::id();
        let path = std::path::PathBuf::from(format!("/tmp/perf-{me}.map"));
        struct Removed<'a>(&'a std::path::Path);
        impl Drop for Removed<'_> {
            fn drop(&mut self) {
                let _ = std::fs::remove_file(self.0);
            }
        }
        let _removed = Removed(&path);
        std::fs::write(&path, "1000 100 JS:~spawnServer /srv/host.js:3:9\n").unwrap();
        let named = name(me, &[0x1010]);
        assert_eq!(named[0].function.as_deref(), Some("spawnServer"));
        std::fs::remove_file(&path).unwrap();
        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        // Would wait for a writer forever, were it opened to read.
        assert_eq!(name(me, &[0x1010])[0].function, None);
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink("/proc/self/status", &path).unwrap();
        assert_eq!(name(me, &[0x1010])[0].function, None);
    }
}
