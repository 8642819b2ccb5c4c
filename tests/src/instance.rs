//! A reaper-trace left running while a test acts, read and stopped when the test says.
use std::process::{Command, Stdio};

use crate::*;

/// One gateway instance the test started: `reaper-shapes leak-orphan` (it forks A, which
/// calls setsid and forks B reading a pipe, then exits; the instance holds the pipe's write
/// end until its own release file appears).
pub struct Instance {
    child: std::process::Child,
    truth: std::path::PathBuf,
    release: std::path::PathBuf,
    go: std::path::PathBuf,
}

impl Instance {
    /// Starts `program ARGS... TRUTH` with its own release file; `prepare` runs in the child
    /// before exec. With `waits`, it makes its leak only at [`Instance::go`] (a process that
    /// is made a gateway after it started must not escape before).
    pub fn start(
        dir: &std::path::Path,
        name: &str,
        program: &std::path::Path,
        args: &[&str],
        prepare: Option<Box<dyn FnMut() -> std::io::Result<()> + Send + Sync>>,
        waits: bool,
    ) -> Instance {
        use std::os::unix::process::CommandExt;
        let truth = dir.join(format!("{name}.json"));
        let release = dir.join(format!("{name}.release"));
        let go = dir.join(format!("{name}.go"));
        if !waits {
            std::fs::write(&go, b"").expect("go file");
        }
        let mut command = Command::new(program);
        command
            .args(args)
            .arg(&truth)
            .env("REAPER_SHAPES_RELEASE", &release)
            .env("REAPER_SHAPES_GO", &go)
            .env("REAPER_SHAPES_BIN", shapes())
            .env(crate::HOLD_CAP, crate::hold_cap())
            .stdin(Stdio::null());
        if let Some(prepare) = prepare {
            // SAFETY: the closures given here only write(2) to a file.
            unsafe { command.pre_exec(prepare) };
        }
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", program.display()));
        Instance {
            child,
            truth,
            release,
            go,
        }
    }

    /// Lets an instance started with `Waits::ForGo` make its leak.
    pub fn go(&self) {
        std::fs::write(&self.go, b"").expect("go file");
    }

    pub fn pid(&self) -> u64 {
        u64::from(self.child.id())
    }

    /// Lets it end (the orphan reads EOF and exits too) and waits for it.
    pub fn finish(&mut self) {
        std::fs::write(&self.release, b"").expect("release file");
        self.child.wait().expect("wait for the instance");
    }

    /// Its orphan B, once the shape has written its truth.
    pub fn orphan(&self) -> u64 {
        wait_for_file(&self.truth, patience());
        pid(&read_json(&self.truth)["b"])
    }
}
