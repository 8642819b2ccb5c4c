//! Kinds: what makes two descendants "the same server" for the `accumulating` rule.
//!
//! A kind is the executable a process runs and the shape of its command line: its positional
//! arguments and option names, with option values held apart. Two instances of one kind can
//! differ in their option values (`--session-key K1`, `--session-key K2`, `--agent=x`) and in
//! `argv[0]` (`python3` or `/usr/bin/python3`), never in a positional argument
//! (`server.py alpha` and `server.py beta` are two kinds). An option value is the part after
//! `=` in `--name=value`, or the argument after a long option `--name` when it does not
//! itself start with `-`. A short option's argument (`-m module`, `-c code`) is positional:
//! which module a Python process runs is what it is.
//!
//! Limits (docs/leaks.md says them too): a long flag that takes no value followed by a
//! positional argument (`serve --verbose alpha`) reads as an option with a value, so
//! `serve --verbose alpha` and `serve --verbose beta` are one kind; a value passed as a
//! positional argument (`worker 4711`) makes each instance its own kind.
//!
//! A kind is formed once per exec of a process (see the inspector), not per scan.
use std::sync::Arc;

use crate::text::Args;

/// The most arguments a kind looks at; the rest are one `…` slot (a command line of
/// thousands of arguments must not cost a scan more than a few).
const MAX_SLOTS: usize = 32;

/// One argument of a kind's command line: a fixed part and, for an option value, the value.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Slot {
    fixed: Box<[u8]>,
    /// The option value (or `argv[0]`): the same kind whatever it is.
    value: Option<Box<[u8]>>,
}

/// A process's kind: its executable and the shape of its command line.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct Kind {
    exe: Arc<[u8]>,
    slots: Vec<Slot>,
    /// The shape alone (executable, fixed parts, where values go): what instances share.
    key: Vec<u8>,
}

impl Kind {
    /// The kind of a process that executed `exe` with `argv`.
    pub fn of(exe: Arc<[u8]>, argv: &Args) -> Kind {
        let mut slots = Vec::new();
        let mut args = argv.iter().peekable();
        if let Some(zero) = args.next() {
            slots.push(Slot {
                fixed: Box::default(),
                value: Some(zero.into()),
            });
        }
        let mut options_end = false;
        while let Some(arg) = args.next() {
            if slots.len() == MAX_SLOTS {
                slots.push(Slot {
                    fixed: (*b"...").into(),
                    value: None,
                });
                break;
            }
            let long = !options_end && arg.starts_with(b"--") && arg.len() > 2;
            if arg == b"--" {
                options_end = true;
            }
            match long.then(|| arg.iter().position(|&b| b == b'=')).flatten() {
                Some(eq) => slots.push(Slot {
                    fixed: arg[..=eq].into(),
                    value: Some(arg[eq + 1..].into()),
                }),
                None => {
                    slots.push(Slot {
                        fixed: arg.into(),
                        value: None,
                    });
                    if long && args.peek().is_some_and(|next| !next.starts_with(b"-")) {
                        let value = args.next().unwrap_or_default();
                        slots.push(Slot {
                            fixed: Box::default(),
                            value: Some(value.into()),
                        });
                    }
                }
            }
        }
        let mut key = exe.to_vec();
        for s in &slots {
            key.push(0);
            key.extend_from_slice(&s.fixed);
            if s.value.is_some() {
                key.extend_from_slice(b"\0*");
            }
        }
        Kind { exe, slots, key }
    }

    /// What instances of one kind share.
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    /// The executable's path.
    pub fn exe(&self) -> &[u8] {
        &self.exe
    }

    /// The command line of a group of instances of this kind (see [`Kind::masked`]).
    #[cfg(test)]
    pub fn pattern<'a>(instances: impl IntoIterator<Item = &'a Kind>) -> String {
        let mut all = instances.into_iter();
        let Some(first) = all.next() else {
            return String::new();
        };
        let mut agreed = first.agreed();
        for other in all {
            first.agree(other, &mut agreed);
        }
        first.masked(&agreed)
    }

    /// Which of its slots the instances of this kind agree on, before any other is seen:
    /// every one (to be narrowed by [`Kind::agree`]).
    pub fn agreed(&self) -> Vec<bool> {
        vec![true; self.slots.len()]
    }

    /// Narrows `agreed` (this kind's slots its instances agree on so far) by `other`, an
    /// instance of the same shape (one of another shape changes nothing).
    pub fn agree(&self, other: &Kind, agreed: &mut [bool]) {
        if other.key != self.key {
            return;
        }
        for ((a, b), same) in self.slots.iter().zip(&other.slots).zip(agreed) {
            *same &= a.value == b.value;
        }
    }

    /// The command line of a group of instances of this kind, for people and metrics, from
    /// the slots `agreed` says they agree on (the same for any of them): each value they
    /// agree on as it is, each other one `*` (`python3 -m tui_gateway.slash_worker
    /// --session-key * --model m`). An argument with white space is quoted.
    pub fn masked(&self, agreed: &[bool]) -> String {
        let words: Vec<String> = self
            .slots
            .iter()
            .zip(agreed)
            .map(|(slot, &same)| {
                let fixed = String::from_utf8_lossy(&slot.fixed);
                match (&slot.value, same) {
                    (None, _) => quoted(&fixed),
                    (Some(v), true) => quoted(&format!("{fixed}{}", String::from_utf8_lossy(v))),
                    (Some(_), false) => format!("{}*", quoted(&fixed)),
                }
            })
            .collect();
        words.join(" ")
    }
}

/// `'a b'` for an argument with white space (or nothing), as a shell would need it.
fn quoted(arg: &str) -> String {
    match arg.is_empty() || arg.contains(char::is_whitespace) {
        true if arg.is_empty() => String::new(),
        true => format!("'{arg}'"),
        false => arg.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(exe: &str, argv: &[&str]) -> Kind {
        Kind::of(exe.as_bytes().into(), &Args::from_list(argv))
    }

    #[test]
    fn session_keys_are_one_kind_and_the_model_they_share_is_shown() {
        let worker = |key| {
            kind(
                "/usr/bin/python3.11",
                &[
                    "python3",
                    "-m",
                    "tui_gateway.slash_worker",
                    "--session-key",
                    key,
                    "--model",
                    "m",
                ],
            )
        };
        let (a, b) = (worker("K1"), worker("K2"));
        assert_eq!(a.key(), b.key());
        assert_eq!(
            Kind::pattern([&a, &b]),
            "python3 -m tui_gateway.slash_worker --session-key * --model m"
        );
    }

    #[test]
    fn positional_arguments_make_two_kinds() {
        let alpha = kind("/usr/bin/python3", &["python3", "server.py", "alpha"]);
        let beta = kind("/usr/bin/python3", &["python3", "server.py", "beta"]);
        assert_ne!(alpha.key(), beta.key());
        let module = |m| kind("/usr/bin/python3", &["python3", "-m", m]);
        assert_ne!(
            module("a").key(),
            module("b").key(),
            "-m's module is positional"
        );
    }

    #[test]
    fn an_equals_value_and_argv0_are_masked_only_where_instances_differ() {
        let bridge =
            |zero, agent| kind("/usr/bin/node", &[zero, "bridge.cjs", agent, "--no-viewer"]);
        let a = bridge("node", "--agent=hermes");
        let b = bridge("/usr/bin/node", "--agent=other");
        assert_eq!(a.key(), b.key());
        assert_eq!(
            Kind::pattern([&a, &b]),
            "* bridge.cjs --agent=* --no-viewer"
        );
        let same = bridge("node", "--agent=hermes");
        assert_eq!(
            Kind::pattern([&a, &same]),
            "node bridge.cjs --agent=hermes --no-viewer"
        );
    }

    #[test]
    fn another_executable_is_another_kind() {
        let a = kind("/usr/bin/stdio-mcp-binary", &["stdio-mcp-binary", "serve"]);
        let b = kind(
            "/opt/other/stdio-mcp-binary",
            &["stdio-mcp-binary", "serve"],
        );
        assert_ne!(a.key(), b.key());
    }

    #[test]
    fn after_a_double_dash_nothing_is_an_option() {
        let a = kind("/bin/x", &["x", "--", "--name", "v1"]);
        let b = kind("/bin/x", &["x", "--", "--name", "v2"]);
        assert_ne!(a.key(), b.key());
    }

    #[test]
    fn a_huge_command_line_costs_a_bounded_kind() {
        let many: Vec<String> = (0..10_000).map(|i| format!("arg{i}")).collect();
        let mut argv = vec!["x".to_owned()];
        argv.extend(many);
        let k = Kind::of((*b"/bin/x").into(), &Args::from_list(&argv));
        assert_eq!(k.slots.len(), MAX_SLOTS + 1);
        assert!(Kind::pattern([&k]).ends_with("..."));
    }
}
