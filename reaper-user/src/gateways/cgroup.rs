//! `--gateway-cgroup PATH` and `--gateway-unit NAME`: the processes of a cgroup v2 subtree
//! whose parent is outside it.
//!
//! The kernel programs keep the selection exact as cgroups come and go (`GATEWAY_CGROUPS`,
//! by id: a cgroup made inside a selected one is selected from its mkdir; a cgroup made again
//! at the selected path, as a restarted unit's is, too) and make a process a gateway when it
//! is moved into one, or created straight into one by a process not already followed. User
//! space selects what exists at start and finds the processes already inside.
use std::{
    collections::HashMap,
    fs,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, anyhow, bail};

use crate::procfs::{Stat, placement};

/// A selected cgroup subtree.
#[derive(Clone, Debug)]
pub struct CgroupDir {
    /// Its directory, where this process sees it.
    pub dir: PathBuf,
    /// Its path from the root of the hierarchy, as the kernel names it (`/system.slice/x`).
    pub path: String,
}

impl CgroupDir {
    /// A cgroup v2 directory. It may not exist yet (a unit not started); the directory it is
    /// made in must.
    pub fn resolve(dir: &Path) -> Result<CgroupDir> {
        let what = || format!("--gateway-cgroup {}", dir.display());
        let mountinfo = crate::procfs::own_mountinfo().with_context(what)?;
        let mounts = cgroup2_mounts(&mountinfo);
        if mounts.is_empty() {
            bail!("{}: no cgroup v2 hierarchy is mounted here", what());
        }
        let name = dir
            .file_name()
            .ok_or_else(|| anyhow!("{}: not a directory path", what()))?;
        let parent = dir.parent().unwrap_or(Path::new("/"));
        let parent = fs::canonicalize(parent)
            .with_context(|| format!("{}: its parent directory does not exist", what()))?;
        let dir = parent.join(name);
        for (mount_point, root) in &mounts {
            if let Ok(rest) = dir.strip_prefix(mount_point) {
                let path = Path::new(root).join(rest);
                let path = path.to_string_lossy().into_owned();
                if path == "/" {
                    bail!(
                        "{}: that is the root cgroup, which holds every process on the host",
                        what()
                    );
                }
                return Ok(CgroupDir { dir, path });
            }
        }
        let points: Vec<_> = mounts
            .iter()
            .map(|(m, _)| m.display().to_string())
            .collect();
        bail!(
            "{}: not in a cgroup v2 hierarchy (mounted at {})",
            what(),
            points.join(", ")
        )
    }

    /// A systemd unit's cgroup. Asked of systemd when it runs; otherwise (a container, a
    /// machine with another init) the cgroup directory named after the unit.
    pub fn of_unit(name: &str) -> Result<CgroupDir> {
        let unit = unit_name(name);
        if Path::new("/run/systemd/system").is_dir() {
            let show = |property: &str| -> Result<String> {
                let out = Command::new("systemctl")
                    .args(["show", "--property", property, "--value", &unit])
                    .output()
                    .with_context(|| format!("--gateway-unit {unit}: running systemctl"))?;
                if !out.status.success() {
                    bail!(
                        "--gateway-unit {unit}: systemctl: {}",
                        String::from_utf8_lossy(&out.stderr).trim()
                    );
                }
                Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
            };
            let mut path = show("ControlGroup")?;
            if path.is_empty() {
                // Not running now: where systemd will make it.
                path = format!("{}/{unit}", slice_path(&show("Slice")?));
            }
            let mountinfo = crate::procfs::own_mountinfo()?;
            let (mount_point, _) = cgroup2_mounts(&mountinfo)
                .into_iter()
                .next()
                .ok_or_else(|| anyhow!("--gateway-unit {unit}: no cgroup v2 hierarchy"))?;
            return Self::resolve(&mount_point.join(path.trim_start_matches('/')));
        }
        let mountinfo = crate::procfs::own_mountinfo()?;
        for (mount_point, _) in cgroup2_mounts(&mountinfo) {
            if let Some(dir) = find_dir(&mount_point, &unit, 4) {
                return Self::resolve(&dir);
            }
        }
        bail!(
            "--gateway-unit {unit}: systemd is not running here and no cgroup directory is \
             named {unit}; give the unit's cgroup with --gateway-cgroup"
        )
    }

    /// The selected directory and every directory under it, parents first, as (cgroup id,
    /// path): a cgroup's id is its directory's inode number.
    pub fn existing(&self) -> Vec<u64> {
        let mut ids = Vec::new();
        let mut queue = vec![self.dir.clone()];
        while let Some(dir) = queue.pop() {
            let Ok(meta) = fs::metadata(&dir) else {
                continue;
            };
            ids.push(meta.ino());
            if let Ok(entries) = fs::read_dir(&dir) {
                for e in entries.flatten() {
                    if e.file_type().is_ok_and(|t| t.is_dir()) {
                        queue.push(e.path());
                    }
                }
            }
        }
        ids
    }

    /// Whether a cgroup path (as `/proc/PID/cgroup` shows it) is in this subtree.
    pub fn contains(&self, path: &str) -> bool {
        path.strip_prefix(self.path.as_str())
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    }

    /// Whether `stat`'s process is a gateway of this subtree: in it, with its parent not.
    /// A process whose parent is init may be a unit's main process (systemd is init) or an
    /// orphan of an earlier session, reparented: /proc cannot tell, so it is a gateway only if
    /// it is the oldest process of its cgroup (a main process is older than what it spawned).
    /// The kernel finds later ones exactly.
    pub fn is_entry(&self, stat: &Stat, cgroups: &Cgroups) -> bool {
        let Some(own) = cgroups.of.get(&stat.pid).filter(|c| self.contains(c)) else {
            return false;
        };
        if cgroups.of.get(&stat.ppid).is_some_and(|c| self.contains(c)) {
            return false;
        }
        stat.ppid != 1 || cgroups.oldest.get(own) == Some(&stat.pid)
    }
}

/// Every process's cgroup v2 path, and each cgroup's oldest process, read once at start.
#[derive(Default)]
pub struct Cgroups {
    of: HashMap<u32, String>,
    oldest: HashMap<String, u32>,
}

impl Cgroups {
    pub fn read(all: &HashMap<u32, Stat>) -> Cgroups {
        let of: HashMap<u32, String> = all
            .keys()
            .filter_map(|&pid| {
                let text = crate::procfs::read_text(pid, "cgroup").ok()?;
                Some((pid, placement::parse_cgroup(&text)?))
            })
            .collect();
        Cgroups::from_paths(all, of)
    }

    fn from_paths(all: &HashMap<u32, Stat>, of: HashMap<u32, String>) -> Cgroups {
        let mut first: HashMap<&str, (u64, u32)> = HashMap::new();
        for (pid, path) in &of {
            let Some(stat) = all.get(pid) else { continue };
            let key = (stat.start_ticks, stat.pid);
            let slot = first.entry(path.as_str()).or_insert(key);
            *slot = (*slot).min(key);
        }
        let oldest = first
            .into_iter()
            .map(|(path, (_, pid))| (path.to_owned(), pid))
            .collect();
        Cgroups { of, oldest }
    }
}

/// `name` with systemd's default `.service` suffix when it has no unit type.
fn unit_name(name: &str) -> String {
    const TYPES: [&str; 5] = [".service", ".scope", ".slice", ".socket", ".mount"];
    match TYPES.iter().any(|t| name.ends_with(t)) {
        true => name.to_owned(),
        false => format!("{name}.service"),
    }
}

/// A slice's cgroup path: `a-b.slice` lives in `/a.slice/a-b.slice`.
fn slice_path(slice: &str) -> String {
    let Some(stem) = slice
        .strip_suffix(".slice")
        .filter(|s| *s != "-" && !s.is_empty())
    else {
        return String::new();
    };
    let mut path = String::new();
    let mut prefix = String::new();
    for part in stem.split('-') {
        if !prefix.is_empty() {
            prefix.push('-');
        }
        prefix.push_str(part);
        path.push_str(&format!("/{prefix}.slice"));
    }
    path
}

/// cgroup2 mounts: (mount point, root of the hierarchy it shows).
fn cgroup2_mounts(mountinfo: &str) -> Vec<(PathBuf, String)> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            if right.split(' ').next()? != "cgroup2" {
                return None;
            }
            let fields: Vec<&str> = left.split(' ').collect();
            Some((PathBuf::from(fields.get(4)?), fields.get(3)?.to_string()))
        })
        .collect()
}

/// The first directory named `name` at most `depth` levels under `root`, breadth first.
fn find_dir(root: &Path, name: &str, depth: usize) -> Option<PathBuf> {
    let mut level = vec![root.to_owned()];
    for _ in 0..depth {
        let mut next = Vec::new();
        for dir in level {
            for e in fs::read_dir(&dir).into_iter().flatten().flatten() {
                if !e.file_type().is_ok_and(|t| t.is_dir()) {
                    continue;
                }
                if e.file_name() == name {
                    return Some(e.path());
                }
                next.push(e.path());
            }
        }
        level = next;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_unit_without_a_type_is_a_service() {
        assert_eq!(unit_name("hermes"), "hermes.service");
        assert_eq!(unit_name("hermes.service"), "hermes.service");
        assert_eq!(unit_name("run-r1.scope"), "run-r1.scope");
    }

    #[test]
    fn slices_nest_by_their_dashes() {
        assert_eq!(slice_path("system.slice"), "/system.slice");
        assert_eq!(slice_path("user-1000.slice"), "/user.slice/user-1000.slice");
        assert_eq!(slice_path("-.slice"), "");
    }

    #[test]
    fn cgroup2_mounts_and_their_roots() {
        let mountinfo = "25 20 0:22 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n\
                         26 20 0:23 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n\
                         90 80 0:22 /kubepods /host/cg rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            cgroup2_mounts(mountinfo),
            vec![
                (PathBuf::from("/sys/fs/cgroup/unified"), "/".to_owned()),
                (PathBuf::from("/host/cg"), "/kubepods".to_owned()),
            ]
        );
    }

    #[test]
    fn under_init_only_the_oldest_of_its_cgroup_is_a_gateway() {
        let stat = |pid: u32, ppid: u32, start_ticks: u64| Stat {
            pid,
            comm: Default::default(),
            state: b'S',
            ppid,
            pgrp: pid,
            session: pid,
            flags: 0,
            threads: 1,
            start_ticks,
        };
        // 10: the unit's main process; 11 its child; 12 an orphan of an earlier session, now
        // under init; 20 a process started outside and moved in, its parent outside.
        let procs = [
            stat(10, 1, 100),
            stat(11, 10, 101),
            stat(12, 1, 102),
            stat(20, 5, 90),
        ];
        let all: HashMap<u32, Stat> = procs.iter().map(|s| (s.pid, s.clone())).collect();
        let of = [(10, "/a"), (11, "/a"), (12, "/a"), (20, "/a/b"), (5, "/")]
            .into_iter()
            .map(|(pid, path)| (pid, path.to_owned()))
            .collect();
        let cgroups = Cgroups::from_paths(&all, of);
        let a = CgroupDir {
            dir: PathBuf::from("/sys/fs/cgroup/a"),
            path: "/a".into(),
        };
        let entries: Vec<u32> = procs
            .iter()
            .filter(|s| a.is_entry(s, &cgroups))
            .map(|s| s.pid)
            .collect();
        assert_eq!(entries, [10, 20]);
    }

    #[test]
    fn a_subtree_contains_its_descendants_only() {
        let c = CgroupDir {
            dir: PathBuf::from("/sys/fs/cgroup/a"),
            path: "/a".into(),
        };
        assert!(c.contains("/a"));
        assert!(c.contains("/a/b"));
        assert!(!c.contains("/ab"));
        assert!(!c.contains("/"));
    }
}
