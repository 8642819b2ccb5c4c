//! The kernel side of a state (`--state-dir`): the probes' maps and links pinned in bpffs, one
//! directory per state directory, so the programs stay attached, the tracked set stays
//! exact and the ring keeps its records while no reaper-trace runs.
//!
//! ```text
//! /sys/fs/bpf/reaper-trace/<state dir, escaped>/
//!     TRACKED EVENTS SEQ LOSSES READER ...    the maps (reaper_common::names::PINNED)
//!     link-<generation>-<program>             one per attached program
//!
//! (bpffs refuses names with a dot.)
//! ```
use std::{
    fs,
    os::unix::fs::DirBuilderExt,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, anyhow, bail};
use aya::{
    maps::{Array, MapData},
    programs::links::{FdLink, PinnedLink},
};
use reaper_common::{ReaderMark, names};

const BPFFS: &str = "/sys/fs/bpf";
const ROOT: &str = "/sys/fs/bpf/reaper-trace";
/// `statfs` magic of bpffs.
const BPF_FS_MAGIC: i64 = 0xcafe4a11;

/// A state's directory in bpffs.
#[derive(Clone, Debug)]
pub struct PinDir {
    path: PathBuf,
}

impl PinDir {
    /// The directory for state directory `state` (not created).
    pub fn of(state: &Path) -> PinDir {
        PinDir {
            path: Path::new(ROOT).join(escape(state)),
        }
    }

    /// The directory a checkpoint names (see `KernelKept::pins`), if it is one of these: a
    /// state made in a container names the host's bpffs path by the container's state
    /// directory, which the host may see elsewhere.
    pub fn recorded(path: &Path) -> Option<PinDir> {
        let name = path.strip_prefix(ROOT).ok()?;
        let one = name.components().count() == 1
            && matches!(
                name.components().next(),
                Some(std::path::Component::Normal(_))
            );
        one.then(|| PinDir {
            path: path.to_owned(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Makes the directory (0700, as its parent), mounting bpffs at /sys/fs/bpf first when
    /// it is not mounted there. Returns a note when it mounted it.
    pub fn create(&self) -> Result<Option<String>> {
        let note = mount_bpffs()?;
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.path)
            .with_context(|| format!("creating {}", self.path.display()))?;
        Ok(note)
    }

    /// Where map `name` is pinned.
    pub fn map(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// Where a program of `generation` keeps its link.
    pub fn link(&self, generation: u64, program: &str) -> PathBuf {
        self.path.join(format!("link-{generation}-{program}"))
    }

    /// The capacity of pinned map `name` (a ring's bytes), if it is pinned.
    pub fn capacity(&self, name: &str) -> Result<Option<u32>> {
        let path = self.map(name);
        if !path.exists() {
            return Ok(None);
        }
        let info = aya::maps::MapInfo::from_pin(&path)
            .with_context(|| format!("reading the pinned map {}", path.display()))?;
        Ok(Some(info.max_entries()))
    }

    /// What the last run told its probes, if a kernel state is pinned here.
    pub fn mark(&self) -> Result<Option<ReaderMark>> {
        let path = self.map(names::READER);
        if !path.exists() {
            return Ok(None);
        }
        let map = MapData::from_pin(&path)
            .with_context(|| format!("opening the pinned map {}", path.display()))?;
        let array: Array<MapData, ReaderMark> =
            Array::try_from(aya::maps::Map::Array(map)).map_err(|e| anyhow!("{e}"))?;
        Ok(Some(array.get(&0, 0)?))
    }

    /// Detaches the links of every generation but `keep`: the programs of a run before.
    pub fn detach_others(&self, keep: u64) -> Result<usize> {
        let own = format!("link-{keep}-");
        let mut n = 0;
        for path in self.links()? {
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if name.starts_with(&own) {
                continue;
            }
            detach(&path)?;
            n += 1;
        }
        Ok(n)
    }

    /// Detaches every program and unpins every map (the ring's unread records go with it),
    /// then removes the directory, and its parent once empty. Returns whether anything was
    /// pinned.
    pub fn release(&self) -> Result<bool> {
        if !self.path.is_dir() {
            return Ok(false);
        }
        for path in self.links()? {
            detach(&path)?;
        }
        for entry in fs::read_dir(&self.path)? {
            let path = entry?.path();
            fs::remove_file(&path).with_context(|| format!("unpinning {}", path.display()))?;
        }
        fs::remove_dir(&self.path).with_context(|| format!("removing {}", self.path.display()))?;
        let _ = fs::remove_dir(ROOT);
        Ok(true)
    }

    fn links(&self) -> Result<Vec<PathBuf>> {
        let mut links = Vec::new();
        for entry in
            fs::read_dir(&self.path).with_context(|| format!("reading {}", self.path.display()))?
        {
            let path = entry?.path();
            if path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("link-"))
            {
                links.push(path);
            }
        }
        Ok(links)
    }
}

/// Pins an attached program's link: it stays attached after this process exits.
pub fn pin_link(link: FdLink, path: &Path) -> Result<()> {
    link.pin(path)
        .map(drop)
        .map_err(|e| anyhow!("pinning {}: {e:#}", path.display()))
}

/// Unpins a link; the program detaches when its last holder (this) lets go.
fn detach(path: &Path) -> Result<()> {
    let link = PinnedLink::from_pin(path)
        .map_err(|e| anyhow!("opening the pinned link {}: {e}", path.display()))?;
    link.unpin()
        .map(drop)
        .with_context(|| format!("unpinning {}", path.display()))
}

/// Mounts bpffs at /sys/fs/bpf unless it is there (`--mount-bpffs`, and every `--state-dir`
/// run). Returns a note when it mounted it.
pub fn mount_bpffs() -> Result<Option<String>> {
    if is_bpffs(Path::new(BPFFS)) {
        return Ok(None);
    }
    // Every mount of bpffs is a filesystem of its own: two runs starting at once where none
    // is mounted (a fresh machine) would each mount one, the second over the first, and the
    // first's pins would go where nobody sees them (its next pin fails). The look and the
    // mount are one step under an exclusive lock on the directory mounted on, which a run
    // that opens it before the mount shares with the run that mounts (one that opens it
    // after opens the new bpffs and sees it mounted).
    let dir =
        fs::File::open(BPFFS).with_context(|| format!("opening {BPFFS} to mount bpffs there"))?;
    let _mounting = nix::fcntl::Flock::lock(dir, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| anyhow!("locking {BPFFS} to mount bpffs there: {e}"))?;
    if is_bpffs(Path::new(BPFFS)) {
        return Ok(None);
    }
    nix::mount::mount(
        Some("bpf"),
        BPFFS,
        Some("bpf"),
        nix::mount::MsFlags::MS_NOSUID
            | nix::mount::MsFlags::MS_NODEV
            | nix::mount::MsFlags::MS_NOEXEC,
        Some("mode=0700"),
    )
    .map_err(|e| {
        anyhow!(
            "bpffs is not mounted and mounting it at {BPFFS} failed: {e} (--state-dir pins the \
             probes there: mount it first, e.g. with `reaper-trace --mount-bpffs` as root, as the \
             DaemonSet's init container does)"
        )
    })?;
    if !is_bpffs(Path::new(BPFFS)) {
        bail!("mounted bpffs at {BPFFS} but it is not there");
    }
    Ok(Some(format!("mounted bpffs at {BPFFS} (left mounted)")))
}

/// Whether a bpffs is mounted at `path`.
pub fn is_bpffs(path: &Path) -> bool {
    nix::sys::statfs::statfs(path).is_ok_and(|fs| fs.filesystem_type().0 == BPF_FS_MAGIC)
}

/// A state directory's path as one file name, readable and unique: `/` becomes `-`, and
/// `-`, `\` and anything not printable ASCII become `\xNN` (as systemd-escape does).
fn escape(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_os_str().as_bytes();
    let trimmed = bytes.strip_prefix(b"/").unwrap_or(bytes);
    let mut out = String::new();
    for &b in trimmed {
        match b {
            b'/' => out.push('-'),
            b'-' | b'\\' => out.push_str(&format!("\\x{b:02x}")),
            b if b.is_ascii_graphic() => out.push(b as char),
            b => out.push_str(&format!("\\x{b:02x}")),
        }
    }
    if out.is_empty() {
        out.push('-');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_directory_names_one_pin_directory() {
        let name = |p: &str| escape(Path::new(p));
        assert_eq!(name("/var/lib/reaper-trace"), "var-lib-reaper\\x2dtrace");
        assert_ne!(name("/a/b"), name("/a-b"));
        assert_eq!(name("/tmp/x y"), "tmp-x\\x20y");
        assert_eq!(name("/"), "-");
    }

    #[test]
    fn a_recorded_pin_directory_is_taken_only_under_reapers_own() {
        let taken = |p: &str| PinDir::recorded(Path::new(p)).is_some();
        assert!(taken("/sys/fs/bpf/reaper-trace/var-lib-reaper\\x2dtrace"));
        assert!(!taken("/sys/fs/bpf/other"));
        assert!(!taken("/sys/fs/bpf/reaper-trace"));
        assert!(!taken("/sys/fs/bpf/reaper-trace/../other"));
        assert!(!taken("/sys/fs/bpf/reaper-trace/a/b"));
    }
}
