//! A process's file-backed mappings (`/proc/PID/maps`), and the file each maps, opened as
//! [`crate::untrusted`] opens what a traced process controls.
use std::path::PathBuf;

use reaper_common::ExeKey;

use crate::procfs::proc_path;
use crate::untrusted::{self, Checked, caps};

/// One file-backed mapping of `/proc/PID/maps`.
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    /// Its offset in the file.
    pub offset: u64,
    /// Whether its code may run (`x`).
    pub executable: bool,
    /// Whether it may be written (`w`): a loaded object's data.
    pub writable: bool,
    /// The mapped file: its device (the kernel's encoding) and inode.
    pub file: ExeKey,
    pub path: String,
}

impl Mapping {
    /// The file offset address `addr` maps to, if this mapping holds it.
    pub fn file_offset(&self, addr: u64) -> Option<u64> {
        (self.start..self.end)
            .contains(&addr)
            .then(|| addr - self.start + self.offset)
    }

    /// The mapped file, opened where this process can open it, and the path it was found at:
    /// the path as `maps` shows it (which is relative to the reader's root, so it holds for a
    /// chroot'd process), else the same path under the process's own root (another mount
    /// namespace: a container). Whatever a path names, only the mapped file itself is opened
    /// (see [`Checked::open_as`]). (`map_files/` would name it even once replaced, but needs
    /// CAP_SYS_ADMIN, which the run gave up after attaching.)
    pub fn open(&self, pid: u32) -> Option<(Checked, PathBuf)> {
        let paths = [
            PathBuf::from(&self.path),
            proc_path(pid, "root").join(self.path.trim_start_matches('/')),
        ];
        Checked::open_as(paths, self.file).ok()
    }

    /// Where the mapped file can be opened (see [`Mapping::open`]).
    pub fn file(&self, pid: u32) -> Option<PathBuf> {
        self.open(pid).map(|(_, path)| path)
    }
}

/// The file-backed mappings of process `pid`.
pub fn mappings(pid: u32) -> std::io::Result<Vec<Mapping>> {
    Ok(parse(&text(pid)?))
}

/// The text of `/proc/PID/maps`, up to [`caps::MAPS`]; an error for a process that maps
/// nothing (one that exited and awaits its reaping, a zombie, reads as empty): no code of it
/// can be read.
pub fn text(pid: u32) -> std::io::Result<String> {
    let text = untrusted::read_text(&proc_path(pid, "maps"), caps::MAPS)?;
    match text.is_empty() {
        true => Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("pid {pid} maps nothing (it exited)"),
        )),
        false => Ok(text),
    }
}

/// The file-backed mappings `/proc/PID/maps` text `text` lists, [`caps::FILE_MAPPINGS`] at
/// most.
pub fn parse(text: &str) -> Vec<Mapping> {
    text.lines()
        .filter_map(parse_mapping)
        .take(caps::FILE_MAPPINGS)
        .collect()
}

/// The address ranges of every executable mapping `/proc/PID/maps` text `text` lists, of a
/// file or not (a JIT's code), [`caps::FILE_MAPPINGS`] at most: where code can be.
pub fn executable_ranges(text: &str) -> Vec<std::ops::Range<u64>> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split_ascii_whitespace();
            let (start, end) = fields.next()?.split_once('-')?;
            fields.next()?.contains('x').then_some(())?;
            Some(u64::from_str_radix(start, 16).ok()?..u64::from_str_radix(end, 16).ok()?)
        })
        .take(caps::FILE_MAPPINGS)
        .collect()
}

fn parse_mapping(line: &str) -> Option<Mapping> {
    let mut fields = line.split_ascii_whitespace();
    let (start, end) = fields.next()?.split_once('-')?;
    let perms = fields.next()?;
    let (executable, writable) = (perms.contains('x'), perms.contains('w'));
    let offset = u64::from_str_radix(fields.next()?, 16).ok()?;
    let dev = kernel_dev(fields.next()?)?;
    let ino = fields.next()?.parse().ok()?;
    let path = fields.collect::<Vec<_>>().join(" ");
    if !path.starts_with('/') {
        return None;
    }
    Some(Mapping {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        offset,
        executable,
        writable,
        file: ExeKey { dev, ino },
        path,
    })
}

/// `maps`' `MAJOR:MINOR` (hex) as the kernel's `dev_t` (`major << 20 | minor`).
fn kernel_dev(maps_dev: &str) -> Option<u64> {
    let (major, minor) = maps_dev.split_once(':')?;
    let major = u64::from_str_radix(major, 16).ok()?;
    let minor = u64::from_str_radix(minor, 16).ok()?;
    Some(major << 20 | minor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lines_name_their_files() {
        let m = parse_mapping(
            "7f1c2a000000-7f1c2a200000 r-xp 00001000 08:01 1234   /usr/lib/libpython3.12.so.1.0",
        )
        .unwrap();
        assert_eq!(
            (m.start, m.end, m.offset, m.executable),
            (0x7f1c2a000000, 0x7f1c2a200000, 0x1000, true)
        );
        assert_eq!(
            m.file,
            ExeKey {
                dev: 8 << 20 | 1,
                ino: 1234
            }
        );
        assert_eq!(m.path, "/usr/lib/libpython3.12.so.1.0");
        assert_eq!(m.file_offset(0x7f1c2a000010), Some(0x1010));
        assert_eq!(m.file_offset(0x7f1c2a200000), None, "the end is not in it");
        assert!(parse_mapping("7ffd-7ffe rw-p 00000000 00:00 0 [stack]").is_none());
        let data = parse_mapping("7f00-7f10 r--p 00000000 08:01 7 /usr/bin/node").unwrap();
        assert!(!data.executable);
    }

    #[test]
    fn code_is_any_executable_mapping_of_a_file_or_not() {
        let text = "\
55d0-55e0 r-xp 00001000 08:01 7 /usr/bin/node
7f00-7f40 rwxp 00000000 00:00 0
7f40-7f80 r-xp 00000000 00:00 0 [anon:v8]
7ffd-7ffe rw-p 00000000 00:00 0 [stack]
7fff-8000 r--p 00000000 08:01 7 /usr/bin/node
";
        assert_eq!(
            executable_ranges(text),
            [0x55d0..0x55e0, 0x7f00..0x7f40, 0x7f40..0x7f80]
        );
    }

    #[test]
    fn maps_devices_read_as_the_kernel_encodes_them() {
        assert_eq!(kernel_dev("08:01"), Some(8 << 20 | 1));
        assert_eq!(kernel_dev("103:0a"), Some(0x103 << 20 | 0xa));
        assert_eq!(kernel_dev("0801"), None);
    }

    #[test]
    fn a_mapped_file_opens_as_itself_and_a_replaced_one_does_not() {
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let maps = mappings(std::process::id()).unwrap();
        let own = maps
            .iter()
            .find(|m| std::path::Path::new(&m.path) == exe)
            .unwrap();
        let (_, path) = own
            .open(std::process::id())
            .expect("its own executable opens");
        assert_eq!(path, exe);
        let other = Mapping {
            file: ExeKey {
                ino: own.file.ino + 1,
                ..own.file
            },
            path: own.path.clone(),
            ..*own
        };
        assert!(
            other.open(std::process::id()).is_none(),
            "another inode at that path"
        );
    }
}
