//! `reaper-shapes orphan-later`, run on its own for the restart tests: a gateway whose child A
//! forks B (setsid, reading the gateway's pipe), and exits only when the test says, between two
//! runs of reaper-trace.
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::*;

pub struct OrphanLater {
    child: Child,
    release: PathBuf,
    /// The gateway, its child A and A's child B.
    pub gateway: u64,
    pub a: u64,
    pub b: u64,
}

impl OrphanLater {
    /// Starts it in `dir` and waits until B exists.
    pub fn start(dir: &Path) -> OrphanLater {
        let (truth, release) = (dir.join("truth.json"), dir.join("release"));
        let child = Command::new(shapes())
            .arg("orphan-later")
            .arg(&truth)
            .env("REAPER_SHAPES_RELEASE", &release)
            .env(
                "REAPER_SHAPES_HOLD_CAP_SECS",
                patience().as_secs().to_string(),
            )
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
        }
    }

    /// Its release file: once it exists, the gateway closes the pipe (B reads EOF and exits)
    /// and exits.
    pub fn release(&self) -> &Path {
        &self.release
    }

    /// A exits, and B is reparented: what happens while no run watches.
    pub fn orphan_b(&self) {
        std::fs::write(format!("{}.a", self.release.display()), b"").expect("release A");
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
