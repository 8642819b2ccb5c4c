//! `reaper-shapes orphan-later` and `spawn-later`, run on their own for the restart tests: a
//! gateway whose child A forks B (setsid, reading the gateway's pipe), and exits only when the
//! test says, between two runs of reaper-trace; with `spawn-later`, A forks B only then.
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::*;

pub struct OrphanLater {
    child: Child,
    release: PathBuf,
    truth: PathBuf,
    /// The gateway, its child A and A's child B.
    pub gateway: u64,
    pub a: u64,
    pub b: u64,
}

impl OrphanLater {
    /// Starts it in `dir` and waits until B exists.
    pub fn start(dir: &Path) -> OrphanLater {
        OrphanLater::shape(dir, "orphan-later")
    }

    /// Starts it in `dir`, B not yet forked (`b` is 0 until [`OrphanLater::orphan_b`]).
    pub fn start_late(dir: &Path) -> OrphanLater {
        OrphanLater::shape(dir, "spawn-later")
    }

    fn shape(dir: &Path, shape: &str) -> OrphanLater {
        let (truth, release) = (dir.join("truth.json"), dir.join("release"));
        let child = Command::new(shapes())
            .arg(shape)
            .arg(&truth)
            .env("REAPER_SHAPES_RELEASE", &release)
            .env(crate::HOLD_CAP, crate::hold_cap())
            .stdin(Stdio::null())
            .spawn()
            .expect("start the gateway");
        wait_for_file(&truth, patience());
        let found = read_json(&truth);
        OrphanLater {
            gateway: u64::from(child.id()),
            a: pid(&found["a"]),
            b: pid(&found["b"]),
            child,
            release,
            truth,
        }
    }

    /// Its release file: once it exists, the gateway closes the pipe (B reads EOF and exits)
    /// and exits.
    pub fn release(&self) -> &Path {
        &self.release
    }

    /// A exits (having forked B first, when started late), and B is reparented: what
    /// happens while no run watches.
    pub fn orphan_b(&mut self) {
        std::fs::write(format!("{}.a", self.release.display()), b"").expect("release A");
        if self.b == 0 {
            let b_truth = PathBuf::from(format!("{}.b", self.truth.display()));
            wait_for_file(&b_truth, patience());
            self.b = pid(&read_json(&b_truth)["b"]);
        }
        wait_until("the helper to be reparented", || {
            parent_of(self.b) != Some(self.a)
        });
    }

    /// Lets it end, and waits for it.
    pub fn finish(&mut self) {
        std::fs::write(&self.release, b"").expect("release the gateway");
        let _ = self.child.wait();
    }
}
