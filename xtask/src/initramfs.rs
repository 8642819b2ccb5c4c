//! A newc cpio initramfs holding host files at their host paths: the guest kernel unpacks it
//! as its root filesystem, so it needs no disk, no 9p and no modules.
use std::{
    collections::BTreeMap,
    fs,
    io::{BufWriter, Write},
    os::unix::fs::PermissionsExt,
    path::{Component, Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

enum Entry {
    Dir,
    /// Contents read from a host file when written.
    HostFile {
        source: PathBuf,
        mode: u32,
    },
    Data {
        bytes: Vec<u8>,
        mode: u32,
    },
}

#[derive(Default)]
pub struct Initramfs {
    /// Archive paths, relative (`bin/sh`); a map sorts parents before their children.
    entries: BTreeMap<PathBuf, Entry>,
}

impl Initramfs {
    fn add(&mut self, path: &Path, entry: Entry) {
        let rel: PathBuf = path
            .components()
            .filter(|c| matches!(c, Component::Normal(_)))
            .collect();
        let mut parent = PathBuf::new();
        if let Some(dirs) = rel.parent() {
            for c in dirs.components() {
                parent.push(c);
                self.entries.entry(parent.clone()).or_insert(Entry::Dir);
            }
        }
        self.entries.insert(rel, entry);
    }

    pub fn dir(&mut self, path: &str) {
        self.add(Path::new(path), Entry::Dir);
    }

    pub fn data(&mut self, path: &str, bytes: Vec<u8>, mode: u32) {
        self.add(Path::new(path), Entry::Data { bytes, mode });
    }

    /// Host file `source` at archive path `at` (symlinks followed: the guest gets contents).
    pub fn host_file_at(&mut self, at: &Path, source: &Path) -> Result<()> {
        let meta = fs::metadata(source).with_context(|| format!("{}", source.display()))?;
        let source = fs::canonicalize(source)?;
        let mode = meta.permissions().mode() & 0o7777;
        self.add(at, Entry::HostFile { source, mode });
        Ok(())
    }

    /// A host program at its own path, with every shared library it loads.
    pub fn program(&mut self, path: &Path) -> Result<()> {
        self.host_file_at(path, path)?;
        for lib in shared_libraries(path)? {
            self.host_file_at(&lib, &lib)?;
        }
        Ok(())
    }

    pub fn write(&self, out: &Path) -> Result<()> {
        let mut w = BufWriter::new(fs::File::create(out)?);
        for (ino, (path, entry)) in self.entries.iter().enumerate() {
            let name = path.to_str().context("non-UTF-8 path in the initramfs")?;
            let (mode, bytes) = match entry {
                Entry::Dir => (0o040755, Vec::new()),
                Entry::HostFile { source, mode } => (
                    0o100000 | mode,
                    fs::read(source).with_context(|| format!("{}", source.display()))?,
                ),
                Entry::Data { bytes, mode } => (0o100000 | mode, bytes.clone()),
            };
            let size = u32::try_from(bytes.len()).context("file too large for cpio")?;
            let mut file = cpio::newc::Builder::new(name)
                .ino(ino as u32 + 1)
                .mode(mode)
                .nlink(1)
                .write(&mut w, size);
            file.write_all(&bytes)?;
            file.finish()?;
        }
        cpio::newc::trailer(&mut w)?;
        w.flush()?;
        Ok(())
    }
}

/// The shared libraries (and the loader) `ldd` says a program loads. None for static ones.
fn shared_libraries(program: &Path) -> Result<Vec<PathBuf>> {
    let out = Command::new("ldd")
        .arg(program)
        .output()
        .context("running ldd")?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        if String::from_utf8_lossy(&out.stderr).contains("not a dynamic executable")
            || text.contains("not a dynamic executable")
        {
            return Ok(Vec::new());
        }
        bail!("ldd {} failed", program.display());
    }
    Ok(text
        .lines()
        .filter_map(|l| {
            // `libc.so.6 => /lib/.../libc.so.6 (0x...)` or `/lib64/ld-linux-x86-64.so.2 (0x...)`
            let l = l.trim();
            let path = l.split_once("=>").map_or(l, |(_, p)| p.trim());
            let path = path.split_whitespace().next()?;
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parents_come_first_and_libraries_are_found() {
        let mut fs = Initramfs::default();
        fs.data("/a/b/c", b"x".to_vec(), 0o644);
        fs.dir("/tmp");
        let order: Vec<_> = fs.entries.keys().map(|p| p.display().to_string()).collect();
        assert_eq!(order, ["a", "a/b", "a/b/c", "tmp"]);
        let libs = shared_libraries(Path::new("/bin/sh")).unwrap();
        assert!(
            libs.iter().any(|l| l.to_string_lossy().contains("libc.so")),
            "{libs:?}"
        );
    }

    #[test]
    fn archive_is_newc_with_a_trailer() {
        let mut fs = Initramfs::default();
        fs.data("/init", b"#!/bin/sh\n".to_vec(), 0o755);
        let out = std::env::temp_dir().join(format!("xtask-cpio-{}", std::process::id()));
        fs.write(&out).unwrap();
        let bytes = std::fs::read(&out).unwrap();
        let _ = std::fs::remove_file(&out);
        assert!(bytes.starts_with(b"070701"));
        assert!(bytes.windows(10).any(|w| w == b"TRAILER!!!"));
        let reader = cpio::newc::Reader::new(&bytes[..]).unwrap();
        assert_eq!(reader.entry().name(), "init");
        assert_eq!(reader.entry().mode(), 0o100755);
    }
}
