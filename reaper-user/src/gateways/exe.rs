//! `--gateway-exe PATH`: a program, matched in the kernel at exec.
//!
//! A binary is matched by its inode: the one file, whatever path, symlink or hard link runs
//! it, and never a same-named program elsewhere. A `#!` script is gone from the kernel's view
//! by the time the exec completes (the interpreter replaced it), so it is matched by the path
//! it was executed by: the path given and the path its symlinks resolve to.
use std::{
    fs,
    io::Read,
    os::unix::fs::{MetadataExt, PermissionsExt},
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail};
use reaper_common::{ExeKey, PATH_KEY_LEN, PathKey};

use crate::procfs::{self, Stat};

/// A selected program.
#[derive(Clone, Debug)]
pub struct Exe {
    pub kind: ExeKind,
    /// `st_dev`, `st_ino` as stat(2) shows the file: how a running process's `/proc/PID/exe`
    /// is compared at start.
    stat_id: (u64, u64),
}

#[derive(Clone, Debug)]
pub enum ExeKind {
    /// Matched by the kernel's view of its inode.
    Binary(ExeKey),
    /// Matched by the paths it may be executed by (absolute, without and with its symlinks
    /// resolved).
    Script(Vec<PathBuf>),
}

impl Exe {
    /// Checks PATH and learns how the kernel will see it.
    pub fn resolve(given: &Path) -> Result<Exe> {
        let what = || format!("--gateway-exe {}", given.display());
        let canonical =
            fs::canonicalize(given).with_context(|| format!("{}: cannot find it", what()))?;
        let meta = fs::metadata(&canonical).with_context(what)?;
        if !meta.is_file() {
            bail!("{}: not a regular file", what());
        }
        if meta.permissions().mode() & 0o111 == 0 {
            bail!("{}: not executable, so no process can execute it", what());
        }
        let mut head = [0u8; 2];
        let n = fs::File::open(&canonical)
            .and_then(|mut f| f.read(&mut head))
            .with_context(what)?;
        let kind = if n == 2 && &head == b"#!" {
            let absolute = std::path::absolute(given).with_context(what)?;
            let mut paths = vec![absolute];
            if !paths.contains(&canonical) {
                paths.push(canonical);
            }
            for p in &paths {
                path_key(p).with_context(what)?;
            }
            ExeKind::Script(paths)
        } else {
            ExeKind::Binary(kernel_inode(&canonical).with_context(what)?)
        };
        Ok(Exe {
            kind,
            stat_id: (meta.dev(), meta.ino()),
        })
    }

    /// Whether the running process `stat` is executing this program (at start-up: processes
    /// that were started before reaper-trace). A script's interpreter is recognised by the
    /// script's path among its first arguments, as the kernel passes it.
    pub fn is_running_in(&self, stat: &Stat) -> bool {
        match &self.kind {
            ExeKind::Binary(_) => fs::metadata(procfs::proc_path(stat.pid, "exe"))
                .is_ok_and(|m| (m.dev(), m.ino()) == self.stat_id),
            ExeKind::Script(paths) => procfs::read_cmdline(stat.pid, 4).is_ok_and(|(argv, _)| {
                argv.iter()
                    .skip(1)
                    .take(2)
                    .any(|a| paths.iter().any(|p| p.as_os_str().as_encoded_bytes() == a))
            }),
        }
    }
}

/// A path as the kernel programs' map key.
pub fn path_key(path: &Path) -> Result<PathKey> {
    let bytes = path.as_os_str().as_encoded_bytes();
    if bytes.len() >= PATH_KEY_LEN || bytes.contains(&0) {
        bail!(
            "{} is longer than the {} bytes a selected path may have",
            path.display(),
            PATH_KEY_LEN - 1
        );
    }
    let mut key = [0u8; PATH_KEY_LEN];
    key[..bytes.len()].copy_from_slice(bytes);
    Ok(key)
}

/// The file's inode as the kernel's exec sees it: `i_sb->s_dev` and `i_ino` of the file an
/// open of the path yields. stat(2) can show other numbers (btrfs subvolumes, overlayfs report
/// the underlying file's), so the device comes from the mount's superblock
/// (`/proc/self/mountinfo`, by the open file's mount id) and the inode from `fdinfo`.
pub fn kernel_inode(path: &Path) -> Result<ExeKey> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH)
        .open(path)?;
    let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
    let fdinfo = fs::read_to_string(format!("/proc/self/fdinfo/{fd}"))?;
    let field = |name: &str| {
        fdinfo.lines().find_map(|l| {
            l.strip_prefix(name)
                .and_then(|v| v.trim().parse::<u64>().ok())
        })
    };
    let mnt_id = field("mnt_id:").context("fdinfo shows no mnt_id")?;
    let ino = match field("ino:") {
        Some(ino) => ino,
        None => file.metadata()?.ino(), // kernels before 5.14 do not show it
    };
    let mountinfo = crate::procfs::own_mountinfo()?;
    let (major, minor) = superblock_dev(&mountinfo, mnt_id)
        .with_context(|| format!("mount {mnt_id} is not in /proc/self/mountinfo"))?;
    Ok(ExeKey {
        dev: (major << 20) | minor,
        ino,
    })
}

/// `major:minor` of mount `mnt_id`'s superblock, from mountinfo's third field.
pub fn superblock_dev(mountinfo: &str, mnt_id: u64) -> Option<(u64, u64)> {
    mountinfo.lines().find_map(|line| {
        let mut fields = line.split(' ');
        if fields.next()?.parse::<u64>().ok()? != mnt_id {
            return None;
        }
        let (major, minor) = fields.nth(1)?.split_once(':')?;
        Some((major.parse().ok()?, minor.parse().ok()?))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_superblock_device_is_the_mounts_third_field() {
        let mountinfo = "22 1 0:21 / /proc rw - proc proc rw\n\
                         31 1 259:2 / / rw,relatime - ext4 /dev/nvme0n1p2 rw\n\
                         45 31 0:45 / /var/lib/x/merged rw - overlay overlay rw\n";
        assert_eq!(superblock_dev(mountinfo, 31), Some((259, 2)));
        assert_eq!(superblock_dev(mountinfo, 45), Some((0, 45)));
        assert_eq!(superblock_dev(mountinfo, 7), None);
    }

    #[test]
    fn a_binary_is_keyed_by_inode_and_a_script_by_its_paths() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("gw.sh");
        fs::write(&script, "#!/bin/sh\nexit 0\n").unwrap();
        fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
        let link = dir.path().join("hermes");
        std::os::unix::fs::symlink(&script, &link).unwrap();
        match Exe::resolve(&link).unwrap().kind {
            ExeKind::Script(paths) => {
                assert_eq!(
                    paths,
                    vec![link.clone(), fs::canonicalize(&script).unwrap()]
                )
            }
            other => panic!("{other:?}"),
        }
        let sh = Exe::resolve(Path::new("/bin/sh")).unwrap();
        let ExeKind::Binary(key) = sh.kind else {
            panic!("/bin/sh is a binary")
        };
        assert_ne!(key.ino, 0);
        // This test's own process runs no shell: it is not "running" /bin/sh.
        let me = procfs::read_stat(std::process::id()).unwrap();
        assert!(!sh.is_running_in(&me));
        let notexec = dir.path().join("plain");
        fs::write(&notexec, "x").unwrap();
        let err = Exe::resolve(&notexec).unwrap_err().to_string();
        assert!(err.contains("not executable"), "{err}");
        let err = format!("{:#}", Exe::resolve(&dir.path().join("nope")).unwrap_err());
        assert!(err.contains("cannot find it"), "{err}");
    }
}
