//! The cgroup v2 hierarchy the tests make cgroups in, and their removal.
use std::path::{Path, PathBuf};

use crate::patience;

/// The cgroup v2 hierarchy this machine mounts (where tests can make cgroups).
pub fn cgroup2_root() -> PathBuf {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    mountinfo
        .lines()
        .find_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let mount_point = left.split(' ').nth(4)?;
            (right.split(' ').next()? == "cgroup2").then(|| PathBuf::from(mount_point))
        })
        .expect("a cgroup v2 hierarchy is mounted (the kernel tests need one)")
}

/// Ends whatever is left in a test's cgroup and removes it (deepest first).
pub fn remove_cgroup(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            remove_cgroup(&e.path());
        }
    }
    let deadline = std::time::Instant::now() + patience();
    while std::fs::remove_dir(dir).is_err() && std::time::Instant::now() < deadline {
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        for p in procs.lines().filter_map(|l| l.parse::<i32>().ok()) {
            // SAFETY: a plain signal to a process of the test's own cgroup.
            unsafe { libc::kill(p, libc::SIGKILL) };
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A test's cgroup below the hierarchy's root, made anew and removed when dropped (a test that
/// fails leaves none behind).
pub struct TestCgroup(PathBuf);

impl TestCgroup {
    /// Makes the cgroup `name` (one left by an earlier run is removed first).
    pub fn make(name: &str) -> TestCgroup {
        let path = cgroup2_root().join(name);
        remove_cgroup(&path);
        std::fs::create_dir(&path).unwrap_or_else(|e| panic!("make {}: {e}", path.display()));
        TestCgroup(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        remove_cgroup(&self.0);
    }
}
