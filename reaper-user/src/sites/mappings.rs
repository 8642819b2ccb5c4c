//! A process's file-backed mappings (`/proc/PID/maps`), and where the reader can open each
//! mapped file.
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use anyhow::Result;

use crate::procfs::proc_path;

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
    pub dev: String,
    pub inode: u64,
    pub path: String,
}

impl Mapping {
    /// The file offset address `addr` maps to, if this mapping holds it.
    pub fn file_offset(&self, addr: u64) -> Option<u64> {
        (self.start..self.end)
            .contains(&addr)
            .then(|| addr - self.start + self.offset)
    }

    /// The mapped file, where this process can open it: the path as `maps` shows it (which
    /// is relative to the reader's root, so it holds for a chroot'd process), else the same
    /// path under the process's own root (another mount namespace: a container). The inode
    /// tells which is the mapped file. (`map_files/` would name it even once replaced, but
    /// needs CAP_SYS_ADMIN, which the run gave up after attaching.)
    pub fn file(&self, pid: u32) -> Option<PathBuf> {
        [
            PathBuf::from(&self.path),
            proc_path(pid, "root").join(self.path.trim_start_matches('/')),
        ]
        .into_iter()
        .find(|p| std::fs::metadata(p).is_ok_and(|m| m.ino() == self.inode))
    }
}

/// The file-backed mappings of process `pid`.
pub fn mappings(pid: u32) -> Result<Vec<Mapping>> {
    Ok(parse(&text(pid)?))
}

/// The text of `/proc/PID/maps`; an error for a process that maps nothing (one that exited
/// and awaits its reaping, a zombie, reads as empty): no code of it can be read.
pub fn text(pid: u32) -> std::io::Result<String> {
    let text = std::fs::read_to_string(proc_path(pid, "maps"))?;
    match text.is_empty() {
        true => Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("pid {pid} maps nothing (it exited)"),
        )),
        false => Ok(text),
    }
}

/// The file-backed mappings `/proc/PID/maps` text `text` lists.
pub fn parse(text: &str) -> Vec<Mapping> {
    text.lines().filter_map(parse_mapping).collect()
}

fn parse_mapping(line: &str) -> Option<Mapping> {
    let mut fields = line.split_ascii_whitespace();
    let (start, end) = fields.next()?.split_once('-')?;
    let perms = fields.next()?;
    let (executable, writable) = (perms.contains('x'), perms.contains('w'));
    let offset = u64::from_str_radix(fields.next()?, 16).ok()?;
    let dev = fields.next()?.to_string();
    let inode = fields.next()?.parse().ok()?;
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
        dev,
        inode,
        path,
    })
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
            (m.start, m.end, m.offset, m.executable, m.inode),
            (0x7f1c2a000000, 0x7f1c2a200000, 0x1000, true, 1234)
        );
        assert_eq!(m.path, "/usr/lib/libpython3.12.so.1.0");
        assert_eq!(m.file_offset(0x7f1c2a000010), Some(0x1010));
        assert_eq!(m.file_offset(0x7f1c2a200000), None, "the end is not in it");
        assert!(parse_mapping("7ffd-7ffe rw-p 00000000 00:00 0 [stack]").is_none());
        let data = parse_mapping("7f00-7f10 r--p 00000000 08:01 7 /usr/bin/node").unwrap();
        assert!(!data.executable);
    }
}
