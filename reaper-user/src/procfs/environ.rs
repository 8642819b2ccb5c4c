//! A process's environment as its last exec gave it (`/proc/PID/environ`: the block the kernel
//! laid out at the exec; the process may have written over it since, as it may over its
//! command line), read as hostile input: capped at [`caps::ARGS`] (the kernel lets an
//! environment take a quarter of the stack limit), taken as bytes.
use std::io;

use super::proc_path;
use crate::untrusted::{self, caps};

/// The environment of process `pid`: NUL-separated `NAME=value`, up to [`caps::ARGS`] bytes.
pub fn read_environ(pid: u32) -> io::Result<Vec<u8>> {
    Ok(untrusted::read(&proc_path(pid, "environ"), caps::ARGS)?.bytes)
}

/// The value of the first variable of `environ` that is one of `names`, in the environment's
/// own order (an entry without `=`, or an empty value, names nothing).
pub fn first_of<'e>(environ: &'e [u8], names: &[Vec<u8>]) -> Option<&'e [u8]> {
    environ.split(|&b| b == 0).find_map(|var| {
        let eq = var.iter().position(|&b| b == b'=')?;
        let (name, value) = var.split_at(eq);
        let value = &value[1..];
        let named = names.iter().any(|n| n.as_slice() == name);
        (named && !value.is_empty()).then_some(value)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_named_variable_in_the_environments_order_gives_the_value() {
        let names = [b"A_SESSION".to_vec(), b"B_SESSION".to_vec()];
        let env = b"PATH=/bin\0B_SESSION=b\0A_SESSION=a\0";
        assert_eq!(first_of(env, &names), Some(&b"b"[..]));
        assert_eq!(
            first_of(b"A_SESSION=\0B_SESSION=b\0", &names),
            Some(&b"b"[..])
        );
        assert_eq!(
            first_of(b"A_SESSIONX=1\0XA_SESSION=2\0A_SESSION\0", &names),
            None
        );
        assert_eq!(
            first_of(b"A_SESSION=x=y\xff\0", &names),
            Some(&b"x=y\xff"[..])
        );
        assert_eq!(first_of(b"", &names), None);
    }
}
