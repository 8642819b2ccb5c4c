//! Bytes that came from a process (comm, argv, paths), on their way out.
//!
//! Two outlets, one rule each: JSON carries them losslessly (a lossy string plus, only when
//! the bytes are not UTF-8, the exact bytes in base64), and a terminal never receives a raw
//! control character (C0, DEL, C1) or a bidi override from them.
use std::fmt::Write as _;

use base64::{Engine as _, engine::general_purpose::STANDARD};

/// A byte string shown as text: `lossy` for people and JSON strings, `b64` set only when the
/// bytes are not valid UTF-8 (so that nothing is lost).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Text {
    pub lossy: String,
    pub b64: Option<String>,
}

impl Text {
    pub fn new(bytes: &[u8]) -> Text {
        match std::str::from_utf8(bytes) {
            Ok(s) => Text {
                lossy: s.to_owned(),
                b64: None,
            },
            Err(_) => Text {
                lossy: String::from_utf8_lossy(bytes).into_owned(),
                b64: Some(STANDARD.encode(bytes)),
            },
        }
    }
}

/// A list of byte strings (argv): all shown lossily, and all in base64 as well when any one
/// of them is not UTF-8.
pub fn text_list(items: &[Vec<u8>]) -> (Vec<String>, Option<Vec<String>>) {
    let lossy = items
        .iter()
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let exact = items.iter().any(|a| std::str::from_utf8(a).is_err());
    (
        lossy,
        exact.then(|| items.iter().map(|a| STANDARD.encode(a)).collect()),
    )
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
        let t = Text::new(bytes);
        assert_eq!(t.lossy, "ok\u{fffd}\u{fffd}");
        assert_eq!(STANDARD.decode(t.b64.unwrap()).unwrap(), bytes);
        assert_eq!(Text::new(b"plain").b64, None);
    }

    #[test]
    fn argv_is_exact_only_when_needed() {
        let (lossy, exact) = text_list(&[b"a".to_vec(), b"b".to_vec()]);
        assert_eq!((lossy, exact), (vec!["a".to_owned(), "b".to_owned()], None));
        let (_, exact) = text_list(&[b"a".to_vec(), b"\xff".to_vec()]);
        assert_eq!(exact.unwrap(), vec!["YQ==".to_owned(), "/w==".to_owned()]);
    }

    #[test]
    fn unicode_text_passes_through() {
        assert_eq!(
            escape_for_terminal("naïve ✓ 日本".as_bytes()),
            "naïve ✓ 日本"
        );
    }
}
