//! The library a gone spawner forked in, found from its executable alone: a spawner that
//! forks through its C library and exits at once leaves nothing mapping that library when its
//! stack copy is unwound, and the kernel names the frame it forked in by the library's build id
//! only. When no process the run read ever mapped a file of that build id (a static gateway's
//! helper, a Go runner's `sh -c 'cmd &'`), the file is looked for where the dynamic loader
//! would have found it: each library the executable names (`DT_NEEDED`), in its run paths
//! (`DT_RUNPATH`, else `DT_RPATH`, `$ORIGIN` the executable's directory), then in the
//! loader's default directories for this architecture. It is taken only if it has the build id
//! the kernel named. `LD_LIBRARY_PATH`, `/etc/ld.so.conf` and the libraries those libraries
//! need are not followed: the C library is named by the executable itself.
//!
//! The executable and every candidate are files a traced process may control: opened as
//! [`Checked`], read in bounded pieces (its dynamic section one of them); the first
//! [`ENTRIES_READ`] entries of that section are looked at, [`NEEDED_READ`] names and
//! [`RUN_PATHS_READ`] run paths taken, each of a bounded length; [`CANDIDATES_OPENED`] files
//! are tried at most. The candidates are found in reaper-trace's own mount namespace: a
//! spawner in a container of its own finds none there.
use std::collections::HashSet;
use std::path::{Path, PathBuf};

use object::elf;
use object::read::elf::ElfFile64;

use super::build_ids::{BuildId, has_build_id};
use crate::untrusted::Checked;

/// Libraries named by one executable that are looked at, at most.
const NEEDED_READ: usize = 32;
/// Run paths of one executable that are looked in, at most.
const RUN_PATHS_READ: usize = 8;
/// Entries of its dynamic section looked at, at most (a linker writes a few dozen).
const ENTRIES_READ: usize = 1024;
/// Files tried for their build id for one executable, at most.
const CANDIDATES_OPENED: usize = 64;
/// The longest library name (a file name), and the longest run path list, taken.
const NAME_MAX: usize = 255;
const PATH_MAX: usize = 4095;

/// Where the dynamic loader looks for a library no run path holds, on this architecture
/// (Debian's multiarch directories first, then those of other distributions).
#[cfg(target_arch = "x86_64")]
const DEFAULT_DIRS: &[&str] = &[
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/lib64",
    "/usr/lib64",
    "/lib",
    "/usr/lib",
];
#[cfg(target_arch = "aarch64")]
const DEFAULT_DIRS: &[&str] = &[
    "/lib/aarch64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/lib64",
    "/usr/lib64",
    "/lib",
    "/usr/lib",
];

/// The library of build id `id` that executable `exe` (found at `exe_path`) names, opened,
/// and where it was found: see the module's doc.
pub fn library_of(exe: &Checked, exe_path: &Path, id: &BuildId) -> Option<(Checked, PathBuf)> {
    let (needed, run_paths) = dynamic_names(exe)?;
    let origin = exe_path.parent().unwrap_or(Path::new("/"));
    let dirs: Vec<PathBuf> = (run_paths.iter())
        .map(|dir| with_origin(dir, origin))
        .chain(DEFAULT_DIRS.iter().map(PathBuf::from))
        .collect();
    let mut tried = HashSet::new();
    for name in &needed {
        for dir in &dirs {
            if tried.len() == CANDIDATES_OPENED {
                return None;
            }
            // Links resolved (`libfoo.so.1` is a link to its version), each file tried once.
            let Ok(path) = std::fs::canonicalize(dir.join(name)) else {
                continue;
            };
            if !tried.insert(path.clone()) {
                continue;
            }
            let Ok(file) = Checked::open(&path) else {
                continue;
            };
            if has_build_id(&file, id) {
                return Some((file, path));
            }
        }
    }
    None
}

/// The libraries `exe` names, by file name (a name holding a `/` is a path from the spawner's
/// working directory, gone with it: left out), and its run paths, each list capped.
fn dynamic_names(exe: &Checked) -> Option<(Vec<String>, Vec<String>)> {
    let reader = exe.reader();
    let file = ElfFile64::<object::Endianness, _>::parse(&reader).ok()?;
    let table = (file.elf_section_table())
        .dynamic_table(file.endian(), &reader)
        .ok()?;
    let (mut needed, mut runpath, mut rpath) = (Vec::new(), None, None);
    // Each string read only while its list has room, and kept only at a bounded length.
    for entry in table.iter().take(ENTRIES_READ) {
        let (room, longest) = match entry.tag {
            elf::DT_NEEDED => (needed.len() < NEEDED_READ, NAME_MAX),
            elf::DT_RUNPATH => (runpath.is_none(), PATH_MAX),
            elf::DT_RPATH => (rpath.is_none(), PATH_MAX),
            _ => continue,
        };
        if !room {
            continue;
        }
        let text = (table.string(entry).ok())
            .filter(|s| s.len() <= longest)
            .and_then(|s| std::str::from_utf8(s).ok());
        let Some(text) = text else {
            continue;
        };
        match entry.tag {
            elf::DT_NEEDED if !text.contains('/') && !text.is_empty() => {
                needed.push(text.to_string());
            }
            elf::DT_RUNPATH => runpath = Some(text.to_string()),
            elf::DT_RPATH => rpath = Some(text.to_string()),
            _ => {}
        }
    }
    // The loader ignores DT_RPATH where DT_RUNPATH is given.
    let run_paths = runpath.or(rpath).unwrap_or_default();
    let run_paths: Vec<String> = (run_paths.split(':'))
        .filter(|dir| !dir.is_empty())
        .take(RUN_PATHS_READ)
        .map(str::to_string)
        .collect();
    Some((needed, run_paths))
}

/// Run path `dir` with `$ORIGIN` (or `${ORIGIN}`) the executable's directory `origin`; a
/// relative one is taken from `/` (the spawner's working directory is gone with it).
fn with_origin(dir: &str, origin: &Path) -> PathBuf {
    let origin = origin.to_string_lossy();
    let dir = dir
        .replace("${ORIGIN}", &origin)
        .replace("$ORIGIN", &origin);
    Path::new("/").join(dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sites::build_ids::read_build_id;
    use crate::sites::mappings::mappings;

    /// This test binary names its C library; the file this process maps as its C library is
    /// the one found, by that library's build id, from the executable alone.
    #[test]
    fn the_c_library_this_test_maps_is_found_from_its_executable() {
        let exe_path = std::fs::canonicalize("/proc/self/exe").unwrap();
        let exe = Checked::open(&exe_path).unwrap();
        let (needed, _) = dynamic_names(&exe).expect("a dynamic executable");
        assert!(
            needed.iter().any(|n| n.starts_with("libc.so")),
            "{needed:?}"
        );
        let maps = mappings(std::process::id()).unwrap();
        let libc = (maps.iter())
            .find(|m| m.executable && m.path.contains("/libc.so"))
            .expect("this process maps its C library");
        let (file, _) = libc.open(std::process::id()).unwrap();
        let (id, _) = read_build_id(&file).expect("the C library has a build id");
        let (found, path) = library_of(&exe, &exe_path, &id).expect("found by its build id");
        assert!(
            found.is(libc.file),
            "{path:?} is the file mapped at {}",
            libc.path
        );
        // Another build id names no file it needs.
        assert!(library_of(&exe, &exe_path, &[0xab; 20]).is_none());
    }

    #[test]
    fn a_run_path_is_taken_from_the_executables_directory() {
        let origin = Path::new("/opt/gw/bin");
        assert_eq!(
            with_origin("$ORIGIN/../lib", origin),
            Path::new("/opt/gw/bin/../lib")
        );
        assert_eq!(with_origin("${ORIGIN}", origin), Path::new("/opt/gw/bin"));
        assert_eq!(with_origin("lib", origin), Path::new("/lib"));
    }
}
