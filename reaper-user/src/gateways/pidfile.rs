//! `--gateway-pidfile FILE`: the pid a service writes, re-read when the file changes.
//!
//! A pidfile is written after its process started, so what that process spawned before is
//! found in /proc (as with `--gateway-pid`); from then on the kernel follows it.
use std::{
    fs,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use anyhow::{Result, bail};

/// One pidfile and what it said last.
#[derive(Debug)]
pub struct Pidfile {
    pub path: PathBuf,
    /// (inode, mtime in ns, length) at the last read: a change of any is a rewrite.
    seen: Option<(u64, i128, u64)>,
    last_pid: Option<u32>,
}

impl Pidfile {
    /// The file may not exist yet (the service has not started); its directory must.
    pub fn new(path: &Path) -> Result<Pidfile> {
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
        if let Some(dir) = dir
            && !dir.is_dir()
        {
            bail!(
                "--gateway-pidfile {}: its directory does not exist",
                path.display()
            );
        }
        Ok(Pidfile {
            path: path.to_owned(),
            seen: None,
            last_pid: None,
        })
    }

    /// The pid in the file, if the file changed since the last look and names another pid.
    /// `Err` for a file that does not hold a pid (the text says what it holds).
    pub fn changed(&mut self) -> Option<Result<u32>> {
        let meta = fs::metadata(&self.path).ok()?;
        let stamp = (
            meta.ino(),
            i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
            meta.len(),
        );
        if self.seen == Some(stamp) {
            return None;
        }
        let text = read(&self.path).ok()?;
        self.seen = Some(stamp);
        match parse_pid(&text) {
            Ok(pid) if self.last_pid == Some(pid) => None,
            Ok(pid) => {
                self.last_pid = Some(pid);
                Some(Ok(pid))
            }
            Err(e) => Some(Err(e)),
        }
    }
}

/// The text of the pidfile at `path` (its symlinks resolved): as a file its gateway writes, a
/// regular file opened checked (see [`crate::untrusted`]), up to 4 KiB.
pub fn read(path: &std::path::Path) -> std::io::Result<String> {
    let file = crate::untrusted::Checked::open(&fs::canonicalize(path)?)?;
    Ok(file.read_head(4096)?.whole_lines())
}

/// A pidfile's pid: the first line, a positive integer (whitespace around it allowed).
pub fn parse_pid(text: &str) -> Result<u32> {
    let line = text.lines().next().unwrap_or("").trim();
    match line.parse::<u32>() {
        Ok(pid) if pid > 0 => Ok(pid),
        _ if line.is_empty() => bail!("the file is empty"),
        _ => bail!(
            "`{}` is not a pid",
            line.chars().take(40).collect::<String>()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pids_parse_strictly() {
        assert_eq!(parse_pid("1234\n").unwrap(), 1234);
        assert_eq!(parse_pid("  77 \nrest").unwrap(), 77);
        assert!(parse_pid("").is_err());
        assert!(parse_pid("0").is_err());
        assert!(parse_pid("12ab").unwrap_err().to_string().contains("12ab"));
    }

    #[test]
    fn a_rewrite_is_seen_once_and_the_same_pid_is_not_news() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gw.pid");
        let mut pf = Pidfile::new(&path).unwrap();
        assert!(pf.changed().is_none(), "not written yet");
        fs::write(&path, "100\n").unwrap();
        assert_eq!(pf.changed().unwrap().unwrap(), 100);
        assert!(pf.changed().is_none());
        // Rewritten (a new inode, as `mv` from a temporary file does) with another pid.
        let tmp = dir.path().join("tmp");
        fs::write(&tmp, "200\n").unwrap();
        fs::rename(&tmp, &path).unwrap();
        assert_eq!(pf.changed().unwrap().unwrap(), 200);
        fs::write(&tmp, "200\n").unwrap();
        fs::rename(&tmp, &path).unwrap();
        assert!(pf.changed().is_none(), "the same pid again");
        fs::write(&path, "garbage").unwrap();
        assert!(pf.changed().unwrap().is_err());
        assert!(Pidfile::new(Path::new("/no/such/dir/x.pid")).is_err());
    }
}
