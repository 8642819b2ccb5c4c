//! Finding a process's CPython interpreter: the object that holds `_PyRuntime` (the
//! executable, or `libpython3.N.so`), its version (`Py_Version`), its offsets, and where
//! `_PyRuntime` sits in the process. Each object file is read once (through the process's own
//! mapping, so a container's files and a replaced file read right), its exported symbols
//! first: an interpreter's exec then costs a read of its mappings, and the first one little
//! more, so its layout is in the kernel before the program gets to fork.
use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use anyhow::{Context, Result, bail};
use object::{Object as _, ObjectSegment as _, ObjectSymbol as _};
use reaper_common::ExeKey;
use reaper_common::python::PyLayout;

use super::super::mappings::{Mapping, mappings};
use super::debug_offsets;
use super::versions::{self, CodeLayout};
use crate::procfs::{placement, proc_path};
use crate::text::file_name;
use crate::untrusted::Checked;

/// A process's interpreter, as the probe and the namer need it.
#[derive(Clone, Debug)]
pub struct Interpreter {
    /// `python3.11`, as the exec event names it.
    pub name: String,
    pub probe: PyLayout,
    pub code: CodeLayout,
    /// The first time an executable that holds its own `_PyRuntime` (not a shared
    /// libpython) is found: the executable for the exec probe (see [`Binary`]).
    pub binary: Option<Binary>,
}

/// Whether a mapped file may hold an interpreter: `python3.N`, `libpython3.N.so…`.
fn may_be_python(path: &str) -> bool {
    let name = file_name(path);
    name.starts_with("python3") || name.starts_with("libpython3")
}

/// Whether a file's name is a Python interpreter executable's: `python3`, `python3.N`, and
/// builds of it (`python3.13t`), not its tools (`python3-config`) nor a libpython.
pub fn names_an_interpreter(path: &str) -> bool {
    let name = file_name(path);
    name.starts_with("python3") && !name.contains('-')
}

/// Whether the dynamic loader has mapped a `libpython3` with its data in place, among a
/// process's mappings. It first maps an object's whole span read-only, then each segment in
/// place: until then `_PyRuntime` is not where it will be.
fn libpython_loaded(maps: &[Mapping]) -> bool {
    maps.iter()
        .any(|m| m.writable && file_name(&m.path).starts_with("libpython3"))
}

/// What one read of a process's mappings tells of its interpreter.
pub enum Found {
    Python(Interpreter),
    /// Not yet: no interpreter mapped with its data in place, and no libpython either (the
    /// dynamic loader may still map one).
    Loading,
    /// Not an interpreter we read: a libpython is in place, and no `_PyRuntime` in it.
    NotPython,
}

/// An interpreter executable as the exec probe knows it (`PY_BINARIES`): its inode as the
/// kernel's exec sees it, and its layout with `runtime` the offset of `_PyRuntime` from the
/// start of the text an exec maps (`mm->start_code`).
#[derive(Clone, Copy, Debug)]
pub struct Binary {
    pub key: ExeKey,
    pub layout: PyLayout,
}

/// What an object file holds of an interpreter: its name, where `_PyRuntime` is in the file
/// and from the start of its text when the file is an executable, and the version's offsets.
#[derive(Clone)]
struct Runtime {
    name: String,
    file_offset: u64,
    text_offset: Option<u64>,
    offsets: versions::Offsets,
}

/// The object files looked into so far, by the kernel's device and inode numbers (as the exec
/// probe knows an executable, and as `maps` shows a mapping's): `None` for one that holds no
/// interpreter.
#[derive(Default)]
pub struct Files {
    read: HashMap<ExeKey, Option<Runtime>>,
    /// The executables whose layout was handed out for the kernel (see
    /// [`Interpreter::binary`]).
    binaries: HashSet<ExeKey>,
}

/// Object files and executables remembered before the lists start again (a day of venvs,
/// containers and upgrades meets ever new files; one forgotten is only read again).
const REMEMBERED: usize = 4096;

impl Files {
    /// Remembers what object file `key` holds.
    fn remember(&mut self, key: ExeKey, runtime: Option<Runtime>) {
        if self.read.len() >= REMEMBERED {
            self.read.clear();
        }
        if self.binaries.len() >= REMEMBERED {
            // Handed out again when met: the kernel's map takes what it has room for.
            self.binaries.clear();
        }
        self.read.insert(key, runtime);
    }

    /// The interpreter process `pid` (started at `start`) runs, if it runs one, from one read
    /// of its mappings (two reads could see the loader's work half done by the first and done
    /// by the second); an error for one whose interpreter cannot be read.
    pub fn find(&mut self, pid: u32, start: u64) -> Result<Found> {
        self.find_in(pid, start, &mappings(pid)?)
    }

    /// As [`Files::find`], in process `pid`'s mappings `maps`.
    fn find_in(&mut self, pid: u32, start: u64, maps: &[Mapping]) -> Result<Found> {
        let mut seen: Vec<&str> = Vec::new();
        for m in maps.iter().filter(|m| may_be_python(&m.path)) {
            if seen.contains(&m.path.as_str()) {
                continue;
            }
            seen.push(&m.path);
            let key = m.file;
            let runtime = match self.read.get(&key) {
                Some(known) => known.clone(),
                None => {
                    let (file, _) = m
                        .open(pid)
                        .with_context(|| format!("{} (mapped) cannot be opened", m.path))?;
                    let runtime =
                        runtime_of(&file).with_context(|| format!("reading {}", m.path))?;
                    self.remember(key, runtime.clone());
                    runtime
                }
            };
            let Some(Runtime {
                name,
                file_offset,
                text_offset,
                offsets,
            }) = runtime
            else {
                continue;
            };
            let data = maps
                .iter()
                .filter(|o| o.path == m.path)
                .find(|o| (o.offset..o.offset + (o.end - o.start)).contains(&file_offset))
                .with_context(|| format!("{name}: _PyRuntime is not mapped"))?;
            // Still the loader's read-only span, before the data segment is mapped in place
            // (see `libpython_loaded`).
            if !data.writable {
                return Ok(Found::Loading);
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
            // An executable of its own (a libpython is the loader's, mapped after the exec).
            // An overlayfs file shows `maps` the file under it where the exec sees the
            // overlay's, which then matches no exec: such an exec is looked at when read.
            let binary = text_offset
                .filter(|_| names_an_interpreter(&m.path) && self.binaries.insert(key))
                .map(|at| Binary::new(key, &offsets.probe, at));
            return Ok(Found::Python(Interpreter {
                name,
                probe,
                code: offsets.code,
                binary,
            }));
        }
        Ok(match libpython_loaded(maps) {
            true => Found::NotPython,
            false => Found::Loading,
        })
    }

    /// The interpreter executable at `path`, for the exec probe, before any process runs it
    /// (see [`Binary`]): `None` for a file that is not one, or was handed out already.
    pub fn executable(&mut self, path: &Path) -> Result<Option<Binary>> {
        let key = crate::gateways::exe::kernel_inode(path)?;
        if self.binaries.contains(&key) {
            return Ok(None);
        }
        let runtime = match self.read.get(&key) {
            Some(known) => known.clone(),
            None => {
                let runtime = runtime_of(&Checked::open(path)?)?;
                self.remember(key, runtime.clone());
                runtime
            }
        };
        let Some((at, offsets)) = runtime.and_then(|r| Some((r.text_offset?, r.offsets))) else {
            return Ok(None);
        };
        self.binaries.insert(key);
        Ok(Some(Binary::new(key, &offsets.probe, at)))
    }
}

impl Binary {
    /// The executable `key` with the interpreter's layout, `_PyRuntime` at `text_offset`.
    fn new(key: ExeKey, probe: &PyLayout, text_offset: u64) -> Binary {
        let layout = PyLayout {
            runtime: text_offset,
            ..*probe
        };
        Binary { key, layout }
    }
}

/// The interpreter object file `file` holds, if it holds one: where `_PyRuntime` is, and the
/// version `Py_Version` (3.11+'s `PY_VERSION_HEX`) names, with its offsets.
fn runtime_of(file: &Checked) -> Result<Option<Runtime>> {
    let reader = file.reader();
    let elf = object::File::parse(&reader).context("not an object file")?;
    let Some((runtime, version)) = symbols(&elf) else {
        return Ok(None);
    };
    let mut bytes = [0u8; 8];
    file.read_exact_at(&mut bytes, version)?;
    let version = u64::from_le_bytes(bytes) & 0xffff_ffff;
    if version >> 24 != 3 {
        bail!("Py_Version reads {version:#x}");
    }
    let (major, minor) = ((version >> 24) as u8, ((version >> 16) & 0xff) as u8);
    let name = format!("python{major}.{minor}");
    let mut head = vec![0u8; debug_offsets::NEEDED];
    file.read_exact_at(&mut head, runtime)
        .context("reading _PyRuntime")?;
    let offsets = versions::offsets(major, minor, &head).with_context(|| name.clone())?;
    Ok(Some(Runtime {
        name,
        file_offset: runtime,
        text_offset: text_offset(file, runtime)?,
        offsets,
    }))
}

/// The file offsets of `_PyRuntime` and `Py_Version`: among the symbols `elf` exports
/// (`.dynsym`: a libpython's, and an interpreter's built to load extension modules), else in
/// its symbol table (an interpreter that exports nothing).
fn symbols<'a, R: object::ReadRef<'a>>(elf: &object::File<'a, R>) -> Option<(u64, u64)> {
    let address = |name: &str| {
        let wanted = |s: &object::Symbol<'a, '_, R>| s.name() == Ok(name) && s.is_definition();
        elf.dynamic_symbols()
            .find(wanted)
            .or_else(|| elf.symbols().find(wanted))
            .map(|s| s.address())
    };
    let (runtime, version) = (address("_PyRuntime")?, address("Py_Version")?);
    let offset = |address: u64| {
        elf.segments().find_map(|s| {
            let (start, (file_start, size)) = (s.address(), s.file_range());
            // A header's fields are the file's: sums that overflow are no segment.
            (start..start.checked_add(size)?)
                .contains(&address)
                .then(|| file_start.checked_add(address - start))
                .flatten()
        })
    };
    offset(runtime).zip(offset(version))
}

/// Where file offset `at` of executable `file` lies from the start of its text as an exec
/// maps it: the kernel's `start_code` is the lowest address of the executable `PT_LOAD`
/// segments (`load_elf_binary`), moved by the same bias as everything else. `None` for an
/// object that cannot be run (no `PT_INTERP`).
fn text_offset(file: &Checked, at: u64) -> Result<Option<u64>> {
    use object::elf::{PF_X, PT_INTERP, PT_LOAD};
    use object::read::elf::{ElfFile64, ProgramHeader as _};
    let reader = file.reader();
    let elf = ElfFile64::<object::Endianness, _>::parse(&reader).context("not a 64-bit ELF")?;
    let endian = elf.endian();
    let headers = elf.elf_program_headers();
    if !headers.iter().any(|h| h.p_type(endian) == PT_INTERP) {
        return Ok(None);
    }
    let loads = || headers.iter().filter(|h| h.p_type(endian) == PT_LOAD);
    let text = loads()
        .filter(|h| h.p_flags(endian) & PF_X != 0)
        .map(|h| h.p_vaddr(endian))
        .min();
    let address = loads().find_map(|h| {
        let (start, size) = (h.p_offset(endian), h.p_filesz(endian));
        (start..start.saturating_add(size))
            .contains(&at)
            .then(|| h.p_vaddr(endian).wrapping_add(at - start))
    });
    Ok(text
        .zip(address)
        .map(|(text, address)| address.wrapping_sub(text)))
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
        for name in ["python3", "/usr/bin/python3.11", "python3.13t"] {
            assert!(names_an_interpreter(name), "{name}");
        }
        for name in [
            "python3-config",
            "/usr/lib/libpython3.12.so.1.0",
            "python2.7",
        ] {
            assert!(!names_an_interpreter(name), "{name}");
        }
    }

    /// The dynamic loader maps a libpython in steps (its whole span read-only, then each
    /// segment in place); each step is one read of the maps, and only the last one, with the
    /// data in place, places `_PyRuntime`. A libpython in place without one is not Python.
    #[test]
    fn an_interpreter_is_found_once_the_loader_placed_its_data() {
        let python = |inode: u64| ExeKey { dev: 1, ino: inode };
        let runtime = Runtime {
            name: "python3.11".into(),
            file_offset: 0x5010,
            text_offset: None,
            offsets: versions::offsets(3, 11, &[]).unwrap(),
        };
        let mut files = Files::default();
        files.read.insert(python(1), None);
        files.read.insert(python(2), Some(runtime));
        files.read.insert(python(3), None);
        let exe = "55d000000000-55d000001000 r-xp 00000000 00:01 1 /opt/py/bin/python3.11\n";
        let lib = "/opt/py/lib/libpython3.11.so.1.0";
        let span = format!("7f0000000000-7f0000008000 r--p 00000000 00:01 2 {lib}\n");
        let text = format!(
            "7f0000000000-7f0000001000 r--p 00000000 00:01 2 {lib}\n\
             7f0000001000-7f0000003000 r-xp 00001000 00:01 2 {lib}\n\
             7f0000003000-7f0000008000 r--p 00003000 00:01 2 {lib}\n"
        );
        let placed = format!(
            "7f0000000000-7f0000001000 r--p 00000000 00:01 2 {lib}\n\
             7f0000001000-7f0000003000 r-xp 00001000 00:01 2 {lib}\n\
             7f0000003000-7f0000004000 r--p 00003000 00:01 2 {lib}\n\
             7f0000004000-7f0000006000 rw-p 00004000 00:01 2 {lib}\n"
        );
        let mut find = |maps: &str| {
            let maps = crate::sites::mappings::parse(maps);
            files.find_in(std::process::id(), 7, &maps).unwrap()
        };
        assert!(matches!(find(exe), Found::Loading), "no libpython yet");
        assert!(matches!(find(&(exe.to_owned() + &span)), Found::Loading));
        assert!(matches!(find(&(exe.to_owned() + &text)), Found::Loading));
        let Found::Python(found) = find(&(exe.to_owned() + &placed)) else {
            panic!("the data is in place");
        };
        assert_eq!(
            (found.probe.runtime, found.probe.start),
            (0x7f0000005010, 7)
        );
        let other = "7f1000000000-7f1000001000 rw-p 00000000 00:01 3 /opt/libpython3.so\n";
        assert!(matches!(find(&(exe.to_owned() + other)), Found::NotPython));
    }

    /// The offset from the start of the text the kernel maps, read from the file, is where
    /// the code is from the `startcode` of a process running it: this test's own function.
    #[test]
    fn an_executables_text_offset_is_its_place_from_start_code() {
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let address =
            an_executables_text_offset_is_its_place_from_start_code as fn() as usize as u64;
        let maps = mappings(std::process::id()).unwrap();
        let at = maps.iter().find_map(|m| m.file_offset(address)).unwrap();
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
        let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
        let start_code: u64 = fields[26 - 3].parse().unwrap();
        let exe = Checked::open(&exe).unwrap();
        assert_eq!(text_offset(&exe, at).unwrap(), Some(address - start_code));
    }
}
