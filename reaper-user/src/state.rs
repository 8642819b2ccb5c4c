//! `--state-dir DIR`: the run's lineage kept across restarts. What the graph knows that the
//! kernel and /proc do not (the spawner of every live process, through dead ancestors; names
//! and command lines; which processes are gateways) is written to `DIR/lineage.json`
//! atomically every [`CHECKPOINT_EVERY`] and at the stop, and the next run with the same DIR
//! takes it back. A checkpoint of other gateways or another format is refused, with a message
//! naming `--release-state`; one from another boot is left for the next to replace (nothing in
//! it can still run), with a notice.
use std::{
    fs::{self, File, OpenOptions},
    io::Write,
    os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::capture::loader::LossCounts;
use crate::capture::pins::PinDir;
use crate::lineage::graph::saved::SavedNode;
use crate::sites::SavedUnwound;
use crate::sites::build_ids::SavedBuildId;
use reaper_common::{LAYOUT, ReaderMark};

/// The checkpoint's layout version: a run takes back only its own.
pub const FORMAT: u32 = 1;
/// How often the lineage is written while the run goes on: what a crash can lose at most.
pub const CHECKPOINT_EVERY: Duration = Duration::from_secs(1);
const CHECKPOINT: &str = "lineage.json";
const LOCK: &str = "lock";

/// A state held by this process (see [`StateDir::lock`]).
pub struct StateLock(#[allow(dead_code)] nix::fcntl::Flock<File>);

/// One checkpoint.
#[derive(Debug, Serialize, Deserialize)]
pub struct Checkpoint {
    pub format: u32,
    /// `/proc/sys/kernel/random/boot_id`: pids and start times mean nothing after a reboot.
    pub boot_id: String,
    /// The run's selectors, by name: the next run must trace the same.
    pub selectors: Vec<String>,
    /// Boot-time ns when it was written.
    pub written: u64,
    pub nodes: Vec<SavedNode>,
    /// The files of the build ids the run learned (`--spawn-stacks`): the next run names the
    /// frames of spawners gone in between.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub build_ids: Vec<SavedBuildId>,
    /// The live processes' spawn stacks unwound from copies (a Node host's children).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unwound: Vec<SavedUnwound>,
    /// Where the sessions it keeps were read (`Source::describe`; `none` when they were not):
    /// a run reading them elsewhere does not keep them. None from a run before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sessions: Option<String>,
    /// The kernel side it was written beside; none from a run whose kernel side was not kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<KernelKept>,
}

/// Where a checkpoint stands against the pinned kernel state (see [`pins`]).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct KernelKept {
    /// `reaper_common::LAYOUT` of the probes that recorded.
    pub layout: u8,
    /// Their generation (`ReaderMark::generation`).
    pub generation: u64,
    /// Records taken from the ring when it was written (`ReaderMark::received`): it includes
    /// every one of them, and none after.
    pub received: u64,
    /// Losses already reported, so the next run reports only new ones.
    pub losses: LossCounts,
    /// Where it is pinned (for the operator: the next run finds it by the state directory).
    pub pins: PathBuf,
}

/// A state directory: made 0700 if missing, refused if another user owns it or others may
/// write to it (a checkpoint decides what is traced and flagged).
#[derive(Clone, Debug)]
pub struct StateDir {
    path: PathBuf,
}

impl StateDir {
    pub fn open(path: &Path) -> Result<StateDir> {
        match fs::symlink_metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(path)
                    .with_context(|| format!("--state-dir {}: creating it", path.display()))?;
            }
            Err(e) => bail!("--state-dir {}: {e}", path.display()),
            Ok(meta) => {
                if !meta.is_dir() {
                    bail!("--state-dir {}: not a directory", path.display());
                }
                // SAFETY: plain syscall.
                let me = unsafe { libc::geteuid() };
                if meta.uid() != me {
                    bail!(
                        "--state-dir {}: owned by uid {}, not by reaper-trace's user ({me})",
                        path.display(),
                        meta.uid()
                    );
                }
                if meta.permissions().mode() & 0o022 != 0 {
                    bail!(
                        "--state-dir {}: writable by group or others (mode {:o}); \
                         chmod 700 it",
                        path.display(),
                        meta.permissions().mode() & 0o777
                    );
                }
            }
        }
        Ok(StateDir {
            path: path.to_owned(),
        })
    }

    fn open_existing(path: &Path) -> Result<StateDir> {
        if !path.is_dir() {
            bail!("--release-state {}: no such directory", path.display());
        }
        StateDir::open(path)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Holds the state for this process: one run (or `--release-state`) at a time, for as
    /// long as the returned lock lives. A second run would take the first's probes over from
    /// under it and read the same ring.
    pub fn lock(&self) -> Result<StateLock> {
        let path = self.path.join(LOCK);
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock)
            .map(StateLock)
            .map_err(|(_, e)| {
                anyhow::anyhow!(
                    "--state-dir {}: another reaper-trace uses it ({e})",
                    self.path.display()
                )
            })
    }

    /// Its kernel side's directory in bpffs.
    pub fn pins(&self) -> Result<PinDir> {
        let path = fs::canonicalize(&self.path)
            .with_context(|| format!("--state-dir {}", self.path.display()))?;
        Ok(PinDir::of(&path))
    }

    /// The checkpoint, if one was written.
    pub fn load(&self) -> Result<Option<Checkpoint>> {
        let file = self.path.join(CHECKPOINT);
        let text = match fs::read(&file) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            other => other.with_context(|| format!("reading {}", file.display()))?,
        };
        let checkpoint = serde_json::from_slice(&text).with_context(|| {
            format!(
                "{}: not a lineage checkpoint this build can read; \
                 `reaper-trace --release-state {}` removes it",
                file.display(),
                self.path.display()
            )
        })?;
        Ok(Some(checkpoint))
    }

    /// Writes an encoded checkpoint whole or not at all: a new file, synced, renamed over the
    /// old one, the directory synced.
    pub fn write(&self, text: &[u8]) -> Result<()> {
        let file = self.path.join(CHECKPOINT);
        let tmp = self.path.join(format!("{CHECKPOINT}.tmp"));
        let mut out = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .with_context(|| format!("writing {}", tmp.display()))?;
        out.write_all(text)
            .and_then(|()| out.sync_all())
            .with_context(|| format!("writing {}", tmp.display()))?;
        fs::rename(&tmp, &file).with_context(|| format!("replacing {}", file.display()))?;
        File::open(&self.path)
            .and_then(|d| d.sync_all())
            .with_context(|| format!("syncing {}", self.path.display()))?;
        Ok(())
    }
}

/// What a run does with the checkpoint it found.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Take it back.
    Adopt,
    /// Leave it (the next checkpoint replaces it), saying why: it is from another boot, so
    /// nothing in it can still run (a service's state after every reboot).
    Stale(String),
}

/// Whether `checkpoint` may be taken back by a run of `selectors` on this boot. Another
/// format, or other gateways, are refused with a message naming `--release-state`: taking a
/// state back must never widen what is traced, nor misread what it says.
pub fn check(checkpoint: &Checkpoint, dir: &Path, selectors: &[String]) -> Result<Verdict> {
    let release = format!(
        "`reaper-trace --release-state {}` removes it",
        dir.display()
    );
    if checkpoint.format != FORMAT {
        bail!(
            "--state-dir {}: a checkpoint of format {} (this build reads {FORMAT}); {release}",
            dir.display(),
            checkpoint.format
        );
    }
    let (mut saved, mut now) = (checkpoint.selectors.clone(), selectors.to_vec());
    saved.sort();
    now.sort();
    if saved != now {
        bail!(
            "--state-dir {}: the checkpoint traced {}, this run traces {}; {release}",
            dir.display(),
            saved.join(", "),
            now.join(", ")
        );
    }
    if checkpoint.boot_id != boot_id()? {
        return Ok(Verdict::Stale(format!(
            "--state-dir {}: the checkpoint is from another boot, so nothing in it still runs; \
             starting afresh",
            dir.display()
        )));
    }
    Ok(Verdict::Adopt)
}

/// What a run takes back from its state directory.
pub enum Taken {
    /// Nothing: a first run, or a state from another boot.
    Nothing,
    /// The lineage only: the kernel side it was written beside is not there (a run that kept
    /// none); /proc says what became of each process.
    Lineage(Checkpoint),
    /// The lineage and the kernel side it was written beside, as the last run left it (the
    /// gap's records wait in its ring).
    Whole {
        checkpoint: Checkpoint,
        kept: KernelKept,
        mark: ReaderMark,
    },
}

impl Taken {
    /// Whether the lineage taken back holds `pid` as a gateway (alive at the checkpoint, or
    /// kept dead because what it spawned lives on).
    pub fn holds_gateway(&self, pid: u32) -> bool {
        let checkpoint = match self {
            Taken::Nothing => return false,
            Taken::Lineage(c) | Taken::Whole { checkpoint: c, .. } => c,
        };
        checkpoint
            .nodes
            .iter()
            .any(|n| n.pid == pid && n.is_gateway)
    }
}

/// What `--state-dir` holds for a run of `selectors`, with notices for the user. A kernel side
/// that does not go with the checkpoint (none was written beside it, or it is older) is
/// released: its records cannot be told apart from what the checkpoint holds.
pub fn take(dir: &StateDir, selectors: &[String]) -> Result<(Taken, Vec<String>)> {
    let mut notices = Vec::new();
    let mut checkpoint = dir.load()?;
    if let Some(found) = &checkpoint
        && let Verdict::Stale(why) = check(found, dir.path(), selectors)?
    {
        notices.push(why);
        checkpoint = None;
    }
    let pins = dir.pins()?;
    let mark = pins.mark()?;
    let release = |why: &str, notices: &mut Vec<String>| -> Result<()> {
        pins.release()?;
        notices.push(format!(
            "--state-dir {}: {why}: its probes were detached and its records dropped",
            dir.path().display()
        ));
        Ok(())
    };
    let taken = match (checkpoint, mark) {
        (None, None) => Taken::Nothing,
        (None, Some(_)) => {
            release("a kernel state with no lineage checkpoint", &mut notices)?;
            Taken::Nothing
        }
        (Some(checkpoint), None) => Taken::Lineage(checkpoint),
        (Some(checkpoint), Some(mark)) => match checkpoint.kernel.clone() {
            Some(kept) if kept.layout != LAYOUT => bail!(
                "--state-dir {}: kept by probes of record layout {} (this build reads {LAYOUT}); \
                 `reaper-trace --release-state {}` removes it",
                dir.path().display(),
                kept.layout,
                dir.path().display()
            ),
            // A later run may have taken over and died before its first checkpoint: its
            // generation is newer, and it took in more.
            Some(kept) if mark.generation >= kept.generation && mark.received >= kept.received => {
                Taken::Whole {
                    checkpoint,
                    kept,
                    mark,
                }
            }
            _ => {
                release(
                    "a kernel state the checkpoint was not written beside",
                    &mut notices,
                )?;
                Taken::Lineage(checkpoint)
            }
        },
    };
    Ok((taken, notices))
}

/// This boot's id.
pub fn boot_id() -> Result<String> {
    let id = fs::read_to_string("/proc/sys/kernel/random/boot_id").context("reading boot_id")?;
    Ok(id.trim().to_owned())
}

/// `--release-state DIR`: detaches and unpins what `--state-dir DIR` kept in the kernel and
/// removes its checkpoint. Returns what was removed.
pub fn release(path: &Path) -> Result<String> {
    let dir = StateDir::open_existing(path)?;
    let _held = dir.lock()?;
    let mut removed = Vec::new();
    // The pins named by this path, and those the checkpoint names (the same, unless the state
    // was made in a container that saw this directory elsewhere).
    let recorded = dir.load().ok().flatten().and_then(|c| c.kernel);
    let recorded = recorded.and_then(|k| PinDir::recorded(&k.pins));
    for pins in std::iter::once(dir.pins()?).chain(recorded) {
        if pins.release()? {
            removed.push(format!("{} (probes detached)", pins.path().display()));
        }
    }
    for name in [CHECKPOINT, &format!("{CHECKPOINT}.tmp")] {
        let file = dir.path.join(name);
        match fs::remove_file(&file) {
            Ok(()) => removed.push(file.display().to_string()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => bail!("removing {}: {e}", file.display()),
        }
    }
    // Held until this returns; nothing is left for the next run to wait on.
    let _ = fs::remove_file(dir.path.join(LOCK));
    if removed.is_empty() {
        bail!("--release-state {}: no state kept there", path.display());
    }
    // The directory goes too when nothing else is in it (a unit's StateDirectory may hold it).
    let _ = fs::remove_dir(&dir.path);
    Ok(removed.join(", "))
}

#[cfg(test)]
mod tests;
