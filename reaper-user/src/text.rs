//! Bytes that came from a process (comm, argv, paths), on their way out.
//!
//! Two outlets, one rule each: JSON carries them losslessly (a lossy string plus, only when
//! the bytes are not UTF-8, the exact bytes in base64), and a terminal never receives a raw
//! control character (C0, DEL, C1) or a bidi override from them.
use std::{borrow::Cow, fmt::Write as _, sync::Arc};

use base64::{Engine as _, engine::general_purpose::STANDARD};

/// A process name (`comm`) held inline: the kernel's 16 bytes at most, so no allocation.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct Comm {
    bytes: [u8; 16],
    len: u8,
}

impl Comm {
    /// The bytes before the first NUL (at most 16).
    pub fn from_c(raw: &[u8]) -> Comm {
        let end = raw
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(raw.len())
            .min(16);
        let mut bytes = [0; 16];
        bytes[..end].copy_from_slice(&raw[..end]);
        Comm {
            bytes,
            len: end as u8,
        }
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    /// The name the kernel gives a process that executes `path`: its last component, cut to
    /// 15 bytes (`TASK_COMM_LEN` with its NUL).
    pub fn of_program(path: &[u8]) -> Comm {
        let base = path.rsplit(|&b| b == b'/').next().unwrap_or(path);
        Comm::from_c(&base[..base.len().min(15)])
    }
}

impl std::fmt::Debug for Comm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", String::from_utf8_lossy(self.as_bytes()))
    }
}

/// Process bytes as JSON text: the string itself when valid UTF-8 (borrowed, no copy),
/// otherwise its lossy form.
pub fn lossy(bytes: &[u8]) -> Cow<'_, str> {
    String::from_utf8_lossy(bytes)
}

/// The last part of a path (an object's, a source file's): its file name.
pub fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// `bytes` in hex, two lowercase digits a byte.
pub fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// The exact bytes in base64, only when they are not UTF-8 (and the lossy text lost them).
pub fn exact_b64(bytes: &[u8]) -> Option<String> {
    std::str::from_utf8(bytes)
        .is_err()
        .then(|| STANDARD.encode(bytes))
}

/// Characters that reorder or hide text on a terminal (Unicode bidi controls).
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

/// Escapes the five characters markup gives meaning to (`& < > " '`), for text and attribute
/// values alike, in HTML and XML. Run it over text already escaped for a terminal: markup has
/// no way to show a control byte either.
pub fn escape_markup(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Escapes bytes for a terminal: printable UTF-8 passes, a backslash doubles, control and
/// bidi characters become `\xNN` / `\u{NNNN}`, invalid UTF-8 bytes become `\xNN`.
pub fn escape_for_terminal(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                c if (c as u32) < 0x20 || c == '\u{7f}' || ('\u{80}'..='\u{9f}').contains(&c) => {
                    let _ = write!(out, "\\x{:02x}", c as u32);
                }
                c if is_bidi_control(c) => {
                    let _ = write!(out, "\\u{{{:04x}}}", c as u32);
                }
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    out
}

/// A process's arguments as the kernel and /proc lay them out: each one followed by a NUL, in
/// one block. One allocation holds them all, shared (cloning is a count) by the lineage graph,
/// a child that has not exec'd yet, and the events that name the process.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Args(Arc<[u8]>);

impl Args {
    /// At most `max` arguments of a NUL-separated block (`/proc/PID/cmdline`, or argv read at
    /// exec, which may end mid-argument). Returns them and whether any were cut.
    pub fn from_block(block: &[u8], max: usize) -> (Args, bool) {
        let args = block.strip_suffix(&[0]).unwrap_or(block);
        if args.is_empty() || max == 0 {
            return (Args::none(), !args.is_empty());
        }
        // The NUL that ends the `max`-th argument, if more follow.
        let cut_at = args
            .iter()
            .enumerate()
            .filter(|(_, b)| **b == 0)
            .nth(max - 1)
            .map(|(i, _)| i);
        let bytes: Arc<[u8]> = match cut_at {
            Some(end) => Arc::from(&args[..=end]),
            None if args.len() < block.len() => Arc::from(block),
            // Cut mid-argument (argv is copied at exec up to a size): its NUL is added.
            None => args.iter().copied().chain([0]).collect(),
        };
        (Args(bytes), cut_at.is_some())
    }

    /// Arguments from a list (tests, and tools that build their own).
    pub fn from_list<A: AsRef<[u8]>>(args: impl IntoIterator<Item = A>) -> Args {
        let mut block = Vec::new();
        for a in args {
            block.extend_from_slice(a.as_ref());
            block.push(0);
        }
        Args(Arc::from(block))
    }

    /// No arguments.
    pub fn none() -> Args {
        Args(Arc::from(&[][..]))
    }

    /// Each argument's bytes.
    pub fn iter(&self) -> impl Iterator<Item = &[u8]> {
        self.0.split(|&b| b == 0).take(self.len())
    }

    /// How many arguments.
    pub fn len(&self) -> usize {
        self.0.iter().filter(|&&b| b == 0).count()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The arguments escaped for a terminal, separated by spaces.
    pub fn for_terminal(&self) -> String {
        self.iter()
            .map(escape_for_terminal)
            .collect::<Vec<_>>()
            .join(" ")
    }
}

impl Default for Args {
    fn default() -> Args {
        Args::none()
    }
}

impl std::fmt::Debug for Args {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter().map(lossy)).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_never_sees_control_bytes() {
        let evil = "a\nb\x1b[31mred\u{202e}txt\u{85}\x7f\\".as_bytes();
        let shown = escape_for_terminal(evil);
        assert_eq!(shown, "a\\x0ab\\x1b[31mred\\u{202e}txt\\x85\\x7f\\\\");
        assert!(!shown.chars().any(|c| c.is_control()));
    }

    #[test]
    fn invalid_utf8_is_escaped_and_kept_exactly_in_json() {
        let bytes = b"ok\xff\xfe";
        assert_eq!(escape_for_terminal(bytes), "ok\\xff\\xfe");
        assert_eq!(lossy(bytes), "ok\u{fffd}\u{fffd}");
        assert_eq!(STANDARD.decode(exact_b64(bytes).unwrap()).unwrap(), bytes);
        assert_eq!(exact_b64(b"plain"), None);
        assert!(matches!(lossy(b"plain"), Cow::Borrowed("plain")));
    }

    #[test]
    fn comm_keeps_bytes_before_the_nul() {
        assert_eq!(Comm::from_c(b"bash\0junk").as_bytes(), b"bash");
        assert_eq!(Comm::from_c(b"").as_bytes(), b"");
        assert_eq!(Comm::from_c(&[b'x'; 20]).as_bytes(), &[b'x'; 16]);
    }

    #[test]
    fn unicode_text_passes_through() {
        assert_eq!(
            escape_for_terminal("naïve ✓ 日本".as_bytes()),
            "naïve ✓ 日本"
        );
    }

    #[test]
    fn args_keep_the_kernels_layout_and_are_cut_by_count() {
        let (a, cut) = Args::from_block(b"a\0bb\0\0c\0", 10);
        assert_eq!(a.iter().collect::<Vec<_>>(), [&b"a"[..], b"bb", b"", b"c"]);
        assert!(!cut);
        assert_eq!(a, Args::from_list(["a", "bb", "", "c"]));
        let (a, cut) = Args::from_block(b"a\0b\0c\0", 2);
        assert_eq!((a.len(), cut), (2, true));
        assert_eq!(a.for_terminal(), "a b");
        // Cut mid-argument at exec: the last one is kept as it is.
        let (a, cut) = Args::from_block(b"node\0serv", 256);
        assert_eq!((a.iter().last(), cut), (Some(&b"serv"[..]), false));
        let (a, cut) = Args::from_block(b"", 10);
        assert!(a.is_empty() && !cut && a.iter().next().is_none());
        assert_eq!(
            Args::from_list([""]).len(),
            1,
            "one empty argument is not none"
        );
    }
}
