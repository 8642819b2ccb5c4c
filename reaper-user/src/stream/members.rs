//! The lines every traced process makes (fork, exec, exit, reaped: nearly all of a storm's
//! bytes) written by hand, byte for byte as serde writes them. serde_json looks at every byte
//! of every key for something to escape and goes through a map serializer for a flattened
//! field; these keys are the structs' own identifiers, written as they are, and the values go
//! through `itoa` and serde_json's own string escaping. In a fork storm that halved the cost
//! of a line. The serde form stays the stream's definition: `tests.rs` checks each writer
//! against it, and each writer names every field of its struct (a field added fails to build
//! until it is written here too).
use std::borrow::Cow;

use base64::{Engine as _, engine::general_purpose::STANDARD};

use crate::text::{Args, lossy};

use super::events::{Envelope, Event, Exec, Exit, Fork, Reaped, SpawningThread};
use super::fields::{Argv, ProcText};

impl Envelope<'_> {
    /// Opens the line's object with the envelope's fields: `{"event":...,"seq":...,"ts":...`.
    pub(super) fn open(&self, line: &mut Vec<u8>) {
        line.extend_from_slice(b"{\"event\":\"");
        // An event's name is an identifier, as a key is: nothing in it to escape.
        line.extend_from_slice(self.event.as_bytes());
        line.push(b'"');
        let mut m = Members(line);
        m.number("seq", self.seq);
        m.number("ts", self.ts);
    }
}

impl Event {
    /// Appends the event's fields to an object already open (`{"event":...`) and closes it;
    /// false, writing nothing, for an event serde writes.
    pub(super) fn write_members(&self, line: &mut Vec<u8>) -> bool {
        let mut m = Members(line);
        match self {
            Event::Fork(b) => b.write(&mut m),
            Event::Exec(b) => b.write(&mut m),
            Event::Exit(b) => b.write(&mut m),
            Event::Reaped(b) => b.write(&mut m),
            _ => return false,
        }
        m.0.push(b'}');
        true
    }
}

/// The members of a JSON object after its first: each written `,"key":value`.
struct Members<'a>(&'a mut Vec<u8>);

impl Members<'_> {
    /// `key` is an identifier: nothing in it to escape.
    fn key(&mut self, key: &str) {
        debug_assert!(key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'));
        self.0.extend_from_slice(b",\"");
        self.0.extend_from_slice(key.as_bytes());
        self.0.extend_from_slice(b"\":");
    }

    fn number(&mut self, key: &str, n: impl itoa::Integer) {
        self.key(key);
        self.0
            .extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
    }

    fn optional_number(&mut self, key: &str, n: Option<impl itoa::Integer>) {
        match n {
            Some(n) => self.number(key, n),
            None => self.null(key),
        }
    }

    fn bool(&mut self, key: &str, b: bool) {
        self.key(key);
        self.0.extend_from_slice(if b { b"true" } else { b"false" });
    }

    fn null(&mut self, key: &str) {
        self.key(key);
        self.0.extend_from_slice(b"null");
    }

    fn string(&mut self, key: &str, s: &str) {
        self.key(key);
        self.value(s);
    }

    /// A string value, escaped as serde_json escapes it: a string with nothing to escape
    /// (nearly every name and argument) is copied as it is.
    fn value(&mut self, s: &str) {
        if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
            self.0.push(b'"');
            self.0.extend_from_slice(s.as_bytes());
            self.0.push(b'"');
            return;
        }
        serde_json::to_writer(&mut *self.0, s).expect("writing to a Vec cannot fail");
    }

    /// A [`ProcText`]: its text and, when the bytes are not UTF-8, its `_b64` twin.
    fn text(&mut self, t: &ProcText) {
        let (name, bytes) = t.parts();
        match std::str::from_utf8(bytes) {
            Ok(text) => self.string(name, text),
            Err(_) => {
                self.string(name, &lossy(bytes));
                self.0.extend_from_slice(b",\"");
                self.0.extend_from_slice(name.as_bytes());
                self.0.extend_from_slice(b"_b64\":");
                self.value(&STANDARD.encode(bytes));
            }
        }
    }

    /// An [`Argv`]: `argv` and, when any argument is not UTF-8, `argv_b64`.
    fn argv(&mut self, argv: &Argv) {
        let args = argv.args();
        let mut exact = true;
        self.list("argv", args, |a| {
            let text = lossy(a);
            exact &= matches!(text, Cow::Borrowed(_));
            text
        });
        if !exact {
            self.list("argv_b64", args, |a| STANDARD.encode(a).into());
        }
    }

    /// A list of strings, each argument's made by `text`.
    fn list<'a>(
        &mut self,
        key: &str,
        args: &'a Args,
        mut text: impl FnMut(&'a [u8]) -> Cow<'a, str>,
    ) {
        self.key(key);
        self.0.push(b'[');
        for (i, a) in args.iter().enumerate() {
            if i > 0 {
                self.0.push(b',');
            }
            self.value(&text(a));
        }
        self.0.push(b']');
    }
}

/// A body written by hand.
trait Write {
    fn write(&self, m: &mut Members);
}

impl Write for Fork {
    fn write(&self, m: &mut Members) {
        let Fork {
            pid,
            ppid,
            spawner,
            comm,
            start,
            sid,
            pgid,
            uid,
            cgroup_id,
            untracked,
            thread,
        } = self;
        m.number("pid", *pid);
        m.number("ppid", *ppid);
        m.number("spawner", *spawner);
        m.text(comm);
        m.number("start", *start);
        m.number("sid", *sid);
        m.number("pgid", *pgid);
        m.number("uid", *uid);
        m.number("cgroup_id", *cgroup_id);
        if *untracked {
            m.bool("untracked", true);
        }
        if let Some(SpawningThread { tid, comm }) = thread {
            m.key("thread");
            m.0.extend_from_slice(b"{\"tid\":");
            m.0.extend_from_slice(itoa::Buffer::new().format(*tid).as_bytes());
            m.text(comm);
            m.0.push(b'}');
        }
    }
}

impl Write for Exec {
    fn write(&self, m: &mut Members) {
        let Exec {
            pid,
            filename,
            argv,
            truncated,
            tid,
            interpreter,
        } = self;
        m.number("pid", *pid);
        m.text(filename);
        m.argv(argv);
        m.bool("truncated", *truncated);
        m.number("tid", *tid);
        if let Some(name) = interpreter {
            m.string("interpreter", name);
        }
    }
}

impl Write for Exit {
    fn write(&self, m: &mut Members) {
        let Exit {
            pid,
            exit_code,
            signal,
            core,
        } = self;
        m.number("pid", *pid);
        m.optional_number("exit_code", *exit_code);
        match signal {
            Some(name) => m.string("signal", name),
            None => m.null("signal"),
        }
        m.bool("core", *core);
    }
}

impl Write for Reaped {
    fn write(&self, m: &mut Members) {
        let Reaped { pid, from_proc } = self;
        m.number("pid", *pid);
        if *from_proc {
            m.bool("from_proc", true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::Comm;

    /// Texts with something to escape, not UTF-8, or neither.
    const TEXTS: [&[u8]; 6] = [
        b"sh",
        b"a\"b\\c\n\x01",
        b"del\x7f/ \x1f",
        b"\xff\xfeweird",
        "n\u{e9}e".as_bytes(),
        b"",
    ];

    fn samples() -> Vec<Event> {
        let mut all = Vec::new();
        for (i, text) in TEXTS.into_iter().enumerate() {
            let comm = || ProcText::new("comm", Comm::from_c(text));
            all.push(Event::Fork(Fork {
                pid: 7,
                ppid: 1,
                spawner: u32::MAX,
                comm: comm(),
                start: u64::MAX,
                sid: 0,
                pgid: 3,
                uid: 1000,
                cgroup_id: 1 << 40,
                untracked: i % 2 == 1,
                thread: (i % 2 == 0).then(|| SpawningThread {
                    tid: 8,
                    comm: comm(),
                }),
            }));
            all.push(Event::Exec(Exec {
                pid: 7,
                filename: ProcText::new("filename", text),
                argv: Argv::new(Args::from_list(TEXTS[..i].iter().copied())),
                truncated: i % 2 == 0,
                tid: 9,
                interpreter: (i % 2 == 1).then(|| "python3.12".into()),
            }));
        }
        for status in [0, 1 << 8, 255 << 8, 9, 0x80 | 11, 64] {
            let (exit_code, signal, core) = super::super::events::wait_status(status);
            all.push(Event::Exit(Exit {
                pid: 7,
                exit_code,
                signal,
                core,
            }));
        }
        for from_proc in [false, true] {
            all.push(Event::Reaped(Reaped { pid: 7, from_proc }));
        }
        all
    }

    #[test]
    fn each_hand_written_body_is_what_serde_writes() {
        for event in samples() {
            let mut by_hand = b"{\"x\":0".to_vec();
            assert!(event.write_members(&mut by_hand));
            let body = serde_json::to_vec(&event).unwrap();
            let mut by_serde = b"{\"x\":0,".to_vec();
            by_serde.extend_from_slice(&body[1..]);
            assert_eq!(
                String::from_utf8_lossy(&by_hand),
                String::from_utf8_lossy(&by_serde),
                "{event:?}"
            );
        }
    }

    #[test]
    fn other_bodies_are_left_to_serde() {
        let mut line = Vec::new();
        let setsid = Event::Setsid(super::super::events::Setsid { pid: 7, sid: 7 });
        assert!(!setsid.write_members(&mut line));
        assert!(line.is_empty());
    }
}
