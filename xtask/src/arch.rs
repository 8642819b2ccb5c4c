//! The architectures reaper-trace is built for, and what each needs from this machine.
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

/// An architecture reaper-trace is built for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    X86_64,
    Aarch64,
}

impl Arch {
    pub const ALL: [Arch; 2] = [Arch::X86_64, Arch::Aarch64];

    /// The one this machine runs (and xtask was built for).
    pub fn host() -> Arch {
        match std::env::consts::ARCH {
            "aarch64" => Arch::Aarch64,
            _ => Arch::X86_64,
        }
    }

    /// Its name as the kernel (`uname -m`) and the kernel programs' `bpf_target_arch` say it.
    pub fn name(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64",
            Arch::Aarch64 => "aarch64",
        }
    }

    /// The Rust target its binaries are built for.
    pub fn triple(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64-unknown-linux-gnu",
            Arch::Aarch64 => "aarch64-unknown-linux-gnu",
        }
    }

    /// Adds its standard library to the toolchain that builds the workspace, unless there.
    pub fn ensure_std(self) -> Result<()> {
        let installed = Command::new("rustup")
            .args(["target", "list", "--installed"])
            .stderr(Stdio::inherit())
            .output()
            .context("running rustup target list")?;
        if String::from_utf8_lossy(&installed.stdout)
            .lines()
            .any(|l| l.trim() == self.triple())
        {
            return Ok(());
        }
        eprintln!(
            "xtask: adding the Rust standard library for {} (rustup target add)",
            self.triple()
        );
        let status = Command::new("rustup")
            .args(["target", "add", self.triple()])
            .status()
            .context("running rustup target add")?;
        if !status.success() {
            bail!(
                "rustup target add {} failed ({status}); run it by hand",
                self.triple()
            );
        }
        Ok(())
    }
}
