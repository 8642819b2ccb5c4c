//! Naming a JIT host's compiled code from its perf map (`/tmp/perf-PID.map`, which Node
//! writes under `--perf-basic-prof`): V8 names each function there as
//! `JS:~launchServer /srv/host.js:2:22` (kind, function, and where its source begins).
use blazesym::Pid;
use blazesym::symbolize::source::{Process, Source};
use blazesym::symbolize::{Input, Symbolized, Symbolizer};

use crate::stream::evidence::Frame;

/// The language of the frames named here.
pub const JAVASCRIPT: &str = "javascript";

/// Names `addrs`, code of process `pid` no object maps, from its perf map: a frame the map
/// does not name keeps its address only (see [`unnamed`]).
pub fn name(symbolizer: &Symbolizer, pid: u32, addrs: &[u64]) -> Vec<Frame> {
    let src = Source::Process(Process {
        debug_syms: false,
        perf_map: true,
        map_files: false,
        vdso: false,
        ..Process::new(Pid::from(pid))
    });
    let found = symbolizer
        .symbolize(&src, Input::AbsAddr(addrs))
        .unwrap_or_default();
    addrs
        .iter()
        .enumerate()
        .map(|(i, &addr)| match found.get(i) {
            Some(Symbolized::Sym(sym)) => parse(&sym.name, addr),
            _ => unnamed(addr),
        })
        .collect()
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
}
