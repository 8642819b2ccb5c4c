//! The architectures reaper-trace is built for, and what each needs from this machine.
use std::{
    path::Path,
    process::{Command, Stdio},
};

use anyhow::{Context, Result, bail};

/// An architecture reaper-trace is built for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
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

    /// The one this machine does not run: reaper-trace is built for two, and each machine's
    /// tests meet the other's packages under emulation.
    pub fn other() -> Arch {
        match Arch::host() {
            Arch::X86_64 => Arch::Aarch64,
            Arch::Aarch64 => Arch::X86_64,
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

    /// Its name in Debian's packages (`linux-image-*-arm64-unsigned`, `_arm64.deb`).
    pub fn deb(self) -> &'static str {
        match self {
            Arch::X86_64 => "amd64",
            Arch::Aarch64 => "arm64",
        }
    }

    /// Its ELF `e_machine`.
    pub fn elf_machine(self) -> u16 {
        match self {
            Arch::X86_64 => 62,
            Arch::Aarch64 => 183,
        }
    }

    /// The binutils program `tool` (`strip`, `readelf`) for its files: this machine's own, or
    /// Debian's cross binutils (`aarch64-linux-gnu-strip`, which the cross gcc brings).
    pub fn binutil(self, tool: &str) -> String {
        match self == Arch::host() {
            true => tool.to_owned(),
            false => format!("{}-linux-gnu-{tool}", self.name()),
        }
    }

    /// The qemu that boots its kernels, and the machine it emulates: TCG, one thread (a lane
    /// is one host core; see vmtest). aarch64's `virt` board with the `max` CPU, its pointer
    /// authentication by the cheaper implementation-defined algorithm (QARMA, the default,
    /// costs TCG dearly on every signed return).
    pub fn qemu(self) -> (&'static str, &'static [&'static str]) {
        match self {
            Arch::X86_64 => ("qemu-system-x86_64", &["-cpu", "max"]),
            Arch::Aarch64 => (
                "qemu-system-aarch64",
                &["-M", "virt", "-cpu", "max,pauth-impdef=on"],
            ),
        }
    }

    /// The guest kernel's serial console.
    pub fn console(self) -> &'static str {
        match self {
            Arch::X86_64 => "ttyS0",
            Arch::Aarch64 => "ttyAMA0",
        }
    }

    /// Cargo's environment for building its binaries on this machine: none for this
    /// machine's own; for another, [`Arch::static_env`]'s, so that its binaries need no loader
    /// or library of theirs to run (in a guest, or here under qemu-user to list their tests).
    pub fn cargo_env(self) -> Vec<(String, String)> {
        match self == Arch::host() {
            true => Vec::new(),
            false => self.static_env(),
        }
    }

    /// Cargo's environment for its static-pie binaries (the packages'): the C library linked
    /// in (`crt-static`), another architecture's by Debian's cross gcc, and aarch64's through
    /// `xtask/static-pie-gcc`, since Rust's glibc target for aarch64 would link them at a
    /// fixed address (x86_64's links static-pie itself).
    pub fn static_env(self) -> Vec<(String, String)> {
        let var = self.triple().to_uppercase().replace('-', "_");
        let mut env = vec![(
            format!("CARGO_TARGET_{var}_RUSTFLAGS"),
            "-C target-feature=+crt-static".to_owned(),
        )];
        let gcc = match self == Arch::host() {
            true => "cc".to_owned(),
            false => format!("{}-linux-gnu-gcc", self.name()),
        };
        match self {
            Arch::Aarch64 => {
                let wrapper = Path::new(env!("CARGO_MANIFEST_DIR")).join("static-pie-gcc");
                env.push((
                    format!("CARGO_TARGET_{var}_LINKER"),
                    wrapper.display().to_string(),
                ));
                env.push(("REAPER_STATIC_PIE_CC".to_owned(), gcc));
            }
            Arch::X86_64 if self != Arch::host() => {
                env.push((format!("CARGO_TARGET_{var}_LINKER"), gcc));
            }
            Arch::X86_64 => {}
        }
        env
    }

    /// The command that runs one of its programs here: the program itself on this machine's
    /// architecture, qemu-user's emulator for another (a static binary of it).
    pub fn runner(self) -> Option<&'static str> {
        match (self == Arch::host(), self) {
            (true, _) => None,
            (false, Arch::Aarch64) => Some("qemu-aarch64-static"),
            (false, Arch::X86_64) => Some("qemu-x86_64-static"),
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
