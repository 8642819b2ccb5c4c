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
    Symlink {
        target: PathBuf,
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

    /// Every file and directory of `inner` under directory `at`.
    pub fn nest(&mut self, at: &Path, inner: Initramfs) {
        for (path, entry) in inner.entries {
            self.add(&at.join(path), entry);
        }
    }

    pub fn dir(&mut self, path: &str) {
        self.add(Path::new(path), Entry::Dir);
    }

    /// A symbolic link at `path` to `target`.
    pub fn symlink(&mut self, path: &str, target: &str) {
        let target = PathBuf::from(target);
        self.add(Path::new(path), Entry::Symlink { target });
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

    /// Program `path` of the foreign root `root` (another architecture's Debian files, which
    /// this machine's `ldd` cannot run) at its own path in the archive, with the loader and the
    /// shared libraries it loads, found in `root` as the guest's loader will find them.
    pub fn foreign_program(&mut self, root: &Path, path: &Path) -> Result<()> {
        let mut wanted = vec![path.to_owned()];
        let mut seen = std::collections::BTreeSet::new();
        while let Some(file) = wanted.pop() {
            if !seen.insert(file.clone()) {
                continue;
            }
            let host = resolve_in(root, &file)?;
            self.host_file_at(&file, &host)?;
            let linked = read_dynamic(&host)?;
            wanted.extend(linked.interpreter);
            for lib in linked.needed {
                let found = library_dirs(&file, &linked.runpath)
                    .into_iter()
                    .map(|dir| dir.join(&lib))
                    .find(|p| resolve_in(root, p).is_ok_and(|h| h.is_file()))
                    .with_context(|| {
                        format!(
                            "{} needs {lib}, which {} lacks",
                            file.display(),
                            root.display()
                        )
                    })?;
                wanted.push(found);
            }
        }
        Ok(())
    }

    /// Every file under directory `dir` of the foreign root `root` (`/` for this machine's
    /// own), at its own path, but those under a directory named in `left_out`: its symbolic
    /// links to files resolved inside `root`; links to directories, and links that lead
    /// nowhere, left out.
    pub fn foreign_dir(&mut self, root: &Path, dir: &Path, left_out: &[&str]) -> Result<()> {
        let host = resolve_in(root, dir)?;
        for entry in fs::read_dir(&host).with_context(|| format!("{}", host.display()))? {
            let entry = entry?;
            let path = dir.join(entry.file_name());
            if entry.file_type()?.is_dir() {
                let name = entry.file_name();
                if !left_out.iter().any(|l| name.to_str() == Some(l)) {
                    self.foreign_dir(root, &path, left_out)?;
                }
            } else if let Ok(file) = resolve_in(root, &path)
                && file.is_file()
            {
                self.host_file_at(&path, &file)?;
            }
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
                Entry::Symlink { target } => (
                    0o120777,
                    target
                        .to_str()
                        .context("non-UTF-8 link target in the initramfs")?
                        .as_bytes()
                        .to_vec(),
                ),
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

/// What an ELF file asks of the dynamic loader.
struct Dynamic {
    interpreter: Option<PathBuf>,
    needed: Vec<String>,
    runpath: Vec<String>,
}

/// `file`'s program interpreter, `NEEDED` libraries and run path, as `readelf` reads them
/// (for any architecture's ELF). None of them for a static program.
fn read_dynamic(file: &Path) -> Result<Dynamic> {
    let out = Command::new("readelf")
        .args(["-d", "-l", "-W"])
        // The lines read below are in English only.
        .env("LC_ALL", "C")
        .arg(file)
        .output()
        .context("running readelf")?;
    if !out.status.success() {
        bail!("readelf {} failed ({})", file.display(), out.status);
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let bracketed = |l: &str| {
        l.split_once('[')?
            .1
            .split_once(']')
            .map(|(v, _)| v.to_owned())
    };
    let mut linked = Dynamic {
        interpreter: None,
        needed: Vec::new(),
        runpath: Vec::new(),
    };
    for line in text.lines() {
        if line.contains("Requesting program interpreter:") {
            linked.interpreter = line
                .split_once(": ")
                .and_then(|(_, p)| p.strip_suffix(']'))
                .map(PathBuf::from);
        } else if line.contains("(NEEDED)") {
            linked.needed.extend(bracketed(line));
        } else if line.contains("(RUNPATH)") || line.contains("(RPATH)") {
            let paths = bracketed(line).unwrap_or_default();
            linked.runpath.extend(paths.split(':').map(str::to_owned));
        }
    }
    Ok(linked)
}

/// Where the loader looks for the libraries of `file` (a path in the guest): its run path
/// (`$ORIGIN` is `file`'s directory), then Debian's library directories for the
/// architecture's multiarch triplets, then the plain ones.
fn library_dirs(file: &Path, runpath: &[String]) -> Vec<PathBuf> {
    let origin = file.parent().unwrap_or(Path::new("/")).to_string_lossy();
    let mut dirs: Vec<PathBuf> = runpath
        .iter()
        .map(|p| PathBuf::from(p.replace("$ORIGIN", &origin)))
        .collect();
    for triplet in ["aarch64-linux-gnu", "x86_64-linux-gnu"] {
        dirs.push(Path::new("/lib").join(triplet));
        dirs.push(Path::new("/usr/lib").join(triplet));
    }
    dirs.extend(["/lib", "/usr/lib"].map(PathBuf::from));
    dirs
}

/// The host file that path `path` of root `root` names, its symbolic links followed inside
/// `root` (an absolute link target is a path of the root, not of this machine).
pub fn resolve_in(root: &Path, path: &Path) -> Result<PathBuf> {
    let mut path = normal(path);
    for _ in 0..40 {
        let mut host = root.to_owned();
        let mut linked = None;
        let parts: Vec<_> = path.components().collect();
        for (i, part) in parts.iter().enumerate() {
            host.push(part);
            if let Ok(target) = fs::read_link(&host) {
                let inside: PathBuf = parts[..i].iter().collect();
                let target = match target.is_absolute() {
                    true => target,
                    false => Path::new("/").join(&inside).join(target),
                };
                linked = Some(normal(
                    &target.join(parts[i + 1..].iter().collect::<PathBuf>()),
                ));
                break;
            }
        }
        match linked {
            Some(next) => path = next,
            None if host.exists() => return Ok(host),
            None => bail!("{} is not in {}", path.display(), root.display()),
        }
    }
    bail!(
        "too many symbolic links at {} in {}",
        path.display(),
        root.display()
    )
}

/// `path` without `.` and `..`, relative to the root (`/usr/bin/../lib` is `usr/lib`).
fn normal(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(p) => out.push(p),
            Component::ParentDir => {
                out.pop();
            }
            _ => {}
        }
    }
    out
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
    fn a_foreign_roots_links_resolve_inside_it() {
        let root = std::env::temp_dir().join(format!("xtask-root-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(root.join("usr/lib/t")).unwrap();
        fs::create_dir_all(root.join("usr/bin")).unwrap();
        fs::write(root.join("usr/lib/t/libx.so.1.2"), b"x").unwrap();
        // An absolute link is a path of the root; a relative one, of its directory.
        std::os::unix::fs::symlink("/usr/lib", root.join("lib")).unwrap();
        std::os::unix::fs::symlink("libx.so.1.2", root.join("usr/lib/t/libx.so.1")).unwrap();
        std::os::unix::fs::symlink("/etc/nowhere", root.join("usr/bin/gone")).unwrap();
        let found = resolve_in(&root, Path::new("/lib/t/libx.so.1")).unwrap();
        assert_eq!(found, root.join("usr/lib/t/libx.so.1.2"));
        let up = resolve_in(&root, Path::new("/usr/bin/../lib/t/libx.so.1")).unwrap();
        assert_eq!(up, found);
        assert!(resolve_in(&root, Path::new("/usr/bin/gone")).is_err());
        let dirs = library_dirs(Path::new("/usr/bin/node"), &["$ORIGIN/../lib".into()]);
        assert_eq!(dirs[0], Path::new("/usr/bin/../lib"));
        fs::remove_dir_all(&root).unwrap();
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
