//! A process's environment as its last exec gave it (`/proc/PID/environ`: the block the kernel
//! laid out at the exec; the process may have written over it since, as it may over its
//! command line), read as hostile input: capped at [`caps::ARGS`] (the kernel lets an
//! environment take a quarter of the stack limit), taken as bytes.
use std::io;

use super::proc_path;
use crate::untrusted::{self, caps};

/// The environment of process `pid`: NUL-separated `NAME=value`, up to [`caps::ARGS`] bytes,
/// and whether it was cut there.
pub fn read_environ(pid: u32) -> io::Result<(Vec<u8>, bool)> {
    let read = untrusted::read(&proc_path(pid, "environ"), caps::ARGS)?;
    Ok((read.bytes, read.cut))
}

/// The value of the first of `names` (in that order) that `environ` sets to a value not in
/// `ambient` (an entry without `=`, or an empty value, names nothing). An environment that
/// was cut (`cut`) loses its last, unterminated entry: its value may be a prefix.
pub fn first_of<'e>(
    environ: &'e [u8],
    cut: bool,
    names: &[Vec<u8>],
    ambient: &[Vec<u8>],
) -> Option<&'e [u8]> {
    let whole = match cut {
        true => &environ[..environ.iter().rposition(|&b| b == 0).map_or(0, |i| i + 1)],
        false => environ,
    };
    let value_of = |name: &[u8]| {
        whole.split(|&b| b == 0).find_map(|var| {
            let value = var.strip_prefix(name)?.strip_prefix(b"=")?;
            (!value.is_empty()).then_some(value)
        })
    };
    names
        .iter()
        .filter_map(|name| value_of(name))
        .find(|value| !ambient.iter().any(|a| a.as_slice() == *value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_of_the_names_in_their_order_gives_the_value() {
        fn first(env: &[u8]) -> Option<&[u8]> {
            let names = [b"A_SESSION".to_vec(), b"B_SESSION".to_vec()];
            first_of(env, false, &names, &[])
        }
        assert_eq!(
            first(b"PATH=/bin\0B_SESSION=b\0A_SESSION=a\0"),
            Some(&b"a"[..])
        );
        assert_eq!(first(b"A_SESSION=\0B_SESSION=b\0"), Some(&b"b"[..]));
        assert_eq!(first(b"A_SESSIONX=1\0XA_SESSION=2\0A_SESSION\0"), None);
        assert_eq!(first(b"A_SESSION=x=y\xff\0"), Some(&b"x=y\xff"[..]));
        assert_eq!(first(b""), None);
    }

    #[test]
    fn an_ambient_value_is_passed_over_and_a_cut_entry_is_not_read() {
        let names = [b"A_SESSION".to_vec(), b"B_SESSION".to_vec()];
        let env = b"A_SESSION=ci-job\0B_SESSION=b\0";
        let ambient = [b"ci-job".to_vec()];
        assert_eq!(first_of(env, false, &names, &ambient), Some(&b"b"[..]));
        assert_eq!(
            first_of(b"A_SESSION=ci-job\0", false, &names, &ambient),
            None
        );
        let cut = b"B_SESSION=b\0A_SESSION=long-value-cut-h";
        assert_eq!(first_of(cut, true, &names, &[]), Some(&b"b"[..]));
        assert_eq!(first_of(b"A_SESSION=cut-h", true, &names, &[]), None);
    }
}
