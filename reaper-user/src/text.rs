//! Bytes that came from a process (comm, argv, paths), on their way out.
//!
//! Two outlets, one rule each: JSON carries them losslessly (a lossy string plus, only when
//! the bytes are not UTF-8, the exact bytes in base64), and a terminal never receives a raw
//! control character (C0, DEL, C1) or a bidi override from them.
use std::{borrow::Cow, fmt::Write as _};

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

/// Escapes an argv for a terminal, arguments separated by spaces.
pub fn escape_args(args: &[Vec<u8>]) -> String {
    args.iter()
        .map(|a| escape_for_terminal(a))
        .collect::<Vec<_>>()
        .join(" ")
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
}
