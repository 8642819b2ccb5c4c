//! The interpreters whose spawners' own frames are read (`--spawn-stacks auto`), told by the
//! name of the file a process runs: the kernel reads it at exec (the exec record's `program`,
//! where a `#!` script's interpreter is named, not the script) and wakes the reader at once for
//! one, so user space has looked at the interpreter before it can fork; user space reads
//! nothing from `/proc` to tell.

/// An interpreter a spawner may run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Interpreter {
    /// CPython: `python3`, `python3.N`, `python3.Nt` (a venv's `python` is a link to one, and
    /// the file is what is named).
    Python,
    /// Node: `node`, Debian's `nodejs`, a versioned `node22`.
    Node,
}

impl Interpreter {
    /// The interpreter a program file named `name` (NUL-padded or not) runs, if any.
    pub fn of_program(name: &[u8]) -> Option<Interpreter> {
        let len = name.iter().position(|&b| b == 0).unwrap_or(name.len());
        let name = name.get(..len)?;
        if name.starts_with(b"python3") {
            return Some(Interpreter::Python);
        }
        let rest = name
            .strip_prefix(b"nodejs")
            .or_else(|| name.strip_prefix(b"node"))?;
        rest.iter()
            .all(|&b| b.is_ascii_digit() || b == b'.')
            .then_some(Interpreter::Node)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interpreters_are_told_by_their_programs_name() {
        let python = [
            &b"python3"[..],
            b"python3.12",
            b"python3.13t",
            b"python3.11\0\0\0",
        ];
        for name in python {
            assert_eq!(Interpreter::of_program(name), Some(Interpreter::Python));
        }
        for name in [
            &b"node"[..],
            b"nodejs",
            b"node22",
            b"node20.11",
            b"node\0\0",
        ] {
            assert_eq!(Interpreter::of_program(name), Some(Interpreter::Node));
        }
        let others = [
            &b"nodemon"[..],
            b"node-gyp",
            b"noder",
            b"python",
            b"python2.7",
            b"sh",
            b"",
        ];
        for name in others {
            assert_eq!(Interpreter::of_program(name), None, "{name:?}");
        }
    }
}
