//! Finding a process's CPython interpreter: the object that holds `_PyRuntime` (the
//! executable, or `libpython3.N.so`), its version (`Py_Version`), its offsets, and where
//! `_PyRuntime` sits in the process. Read once per exec, from the object file itself (through
//! the process's own mapping, so a container's files and a replaced file read right).
use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use blazesym::inspect::source::{Elf, Source};
use blazesym::inspect::{Inspector, SymInfo};
use reaper_common::python::PyLayout;

use super::super::mappings::mappings;
use super::debug_offsets;
use super::versions::{self, CodeLayout};
use crate::procfs::{placement, proc_path};

/// A process's interpreter, as the probe and the namer need it.
#[derive(Clone, Debug)]
pub struct Interpreter {
    /// `python3.11`, as the exec event names it.
    pub name: String,
    pub probe: PyLayout,
    pub code: CodeLayout,
}

/// Whether a mapped file may hold an interpreter: `python3.N`, `libpython3.N.so…`.
fn may_be_python(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.starts_with("python3") || name.starts_with("libpython3")
}

/// Whether the dynamic loader has mapped a `libpython3` into process `pid`, its data
/// included (or the process is gone). The loader first maps an object's whole span read-only,
/// then each segment in place: until then `_PyRuntime` is not where it will be.
pub fn loaded_libpython(pid: u32) -> bool {
    mappings(pid).map_or(true, |maps| {
        maps.iter().any(|m| {
            m.writable
                && m.path
                    .rsplit('/')
                    .next()
                    .is_some_and(|n| n.starts_with("libpython3"))
        })
    })
}

/// The interpreter process `pid` (started at `start`) runs, if it runs one: `Ok(None)` for a
/// process that is not Python, an error for one whose interpreter cannot be read.
pub fn find(inspector: &Inspector, pid: u32, start: u64) -> Result<Option<Interpreter>> {
    let maps = mappings(pid)?;
    let mut seen: Vec<&str> = Vec::new();
    for m in maps.iter().filter(|m| may_be_python(&m.path)) {
        if seen.contains(&m.path.as_str()) {
            continue;
        }
        seen.push(&m.path);
        let file = m
            .file(pid)
            .with_context(|| format!("{} (mapped) cannot be opened", m.path))?;
        let Some((runtime, version)) = runtime_and_version(inspector, &file)? else {
            continue;
        };
        let (major, minor) = ((version >> 24) as u8, ((version >> 16) & 0xff) as u8);
        let name = format!("python{major}.{minor}");
        let object = File::open(&file).with_context(|| format!("opening {}", m.path))?;
        let file_offset = runtime
            .file_offset
            .context("_PyRuntime has no file offset")?;
        let mut head = vec![0u8; debug_offsets::NEEDED];
        object
            .read_exact_at(&mut head, file_offset)
            .with_context(|| format!("reading _PyRuntime from {}", m.path))?;
        let offsets = versions::offsets(major, minor, &head)
            .with_context(|| format!("{name} ({})", m.path))?;
        let data = maps
            .iter()
            .filter(|o| o.path == m.path)
            .find(|o| (o.offset..o.offset + (o.end - o.start)).contains(&file_offset))
            .with_context(|| format!("{name}: _PyRuntime is not mapped"))?;
        // Still the loader's read-only span, before the data segment is mapped in place
        // (see `loaded_libpython`): looked at again.
        if !data.writable {
            return Ok(None);
        }
        let address = data.start + (file_offset - data.offset);
        let (pidns_dev, pidns_ino) = pid_namespace(pid)?;
        let probe = PyLayout {
            start,
            runtime: address,
            pidns_dev,
            pidns_ino,
            ..offsets.probe
        };
        return Ok(Some(Interpreter {
            name,
            probe,
            code: offsets.code,
        }));
    }
    Ok(None)
}

/// `_PyRuntime` and the value of `Py_Version` (3.11+'s `PY_VERSION_HEX`) in an object file,
/// if it has them.
fn runtime_and_version(
    inspector: &Inspector,
    file: &PathBuf,
) -> Result<Option<(SymInfo<'static>, u64)>> {
    let src = Source::Elf(Elf {
        debug_syms: false,
        ..Elf::new(file)
    });
    let found = inspector
        .lookup(&src, &["_PyRuntime", "Py_Version"])
        .with_context(|| format!("reading the symbols of {}", file.display()))?;
    let first = |i: usize| found.get(i).and_then(|v| v.first()).map(SymInfo::to_owned);
    let (Some(runtime), Some(version)) = (first(0), first(1)) else {
        return Ok(None);
    };
    let at = version
        .file_offset
        .context("Py_Version has no file offset")?;
    let mut bytes = [0u8; 8];
    File::open(file)?.read_exact_at(&mut bytes, at)?;
    let version = u64::from_le_bytes(bytes) & 0xffff_ffff;
    if version >> 24 != 3 {
        bail!("Py_Version reads {version:#x}");
    }
    Ok(Some((runtime, version)))
}

/// The pid namespace process `pid` numbers its threads in, when it is not the initial one
/// (whose ids the probe reads directly).
fn pid_namespace(pid: u32) -> Result<(u64, u64)> {
    if !placement::in_child_pid_namespace(pid) {
        return Ok((0, 0));
    }
    let ns = std::fs::metadata(proc_path(pid, "ns/pid"))?;
    Ok((ns.dev(), ns.ino()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interpreters_are_told_by_their_files_names() {
        assert!(may_be_python("/usr/lib/libpython3.12.so.1.0"));
        assert!(may_be_python("/usr/bin/python3.11"));
        assert!(!may_be_python("/usr/lib/x86_64-linux-gnu/libc.so.6"));
    }
}
