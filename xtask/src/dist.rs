//! `cargo xtask dist`: what people install, in `target/dist/`, for x86_64 and for aarch64.
//!
//! - `reaper-trace-VERSION-ARCH-linux.tar.gz`: one static binary (the eBPF object inside, no
//!   runtime dependency, not even the C library's loader), its man pages and shell
//!   completions, the service unit and its defaults, the event schema, README and licences.
//! - `reaper-trace_VERSION_DEBARCH.deb` (`amd64`, `arm64`): the same binary as
//!   `/usr/bin/reaper-trace`, with man pages, completions, the unit and its
//!   `/etc/default/reaper-trace` (a conffile).
//! - `reaper-trace-VERSION-oci.tar` ([`image`]): an OCI image archive made from nothing but the binaries
//!   (no base image is pulled), one image index with an image for each platform, which podman
//!   and Kubernetes pick per node: `podman run oci-archive:...`, or `podman load -i`.
//!
//! The binaries are static-pie through glibc's `crt-static` (the only Rust standard library
//! this machine has is glibc's; `Arch::static_env`), aarch64's linked through
//! `xtask/static-pie-gcc` (by Debian's cross gcc on another machine): reaper-trace resolves no host names and loads no NSS module, which is what makes a static
//! glibc binary unsafe elsewhere.
use std::{
    fs,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use crate::{arch::Arch, cargo_env, setup};

mod image;
pub use image::image_binary;

pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// One architecture's packages.
pub struct Packages {
    pub arch: Arch,
    pub tarball: PathBuf,
    pub deb: PathBuf,
}

/// The artifacts of one `dist` run.
pub struct Artifacts {
    /// Each architecture's, in [`Arch::ALL`]'s order.
    pub packages: Vec<Packages>,
    pub image: PathBuf,
}

impl Artifacts {
    pub fn of(&self, arch: Arch) -> &Packages {
        self.packages
            .iter()
            .find(|p| p.arch == arch)
            .expect("dist packages every architecture")
    }
}

/// Where `dist` puts everything.
pub fn dir(root: &Path) -> PathBuf {
    root.join("target/dist")
}

pub fn run(root: &Path) -> Result<Artifacts> {
    setup::ensure_all()?;
    let out = dir(root);
    if out.exists() {
        fs::remove_dir_all(&out).with_context(|| format!("clearing {}", out.display()))?;
    }
    fs::create_dir_all(&out)?;
    let docs = out.join("docs");
    let docs_to = docs.to_str().context("path")?;
    let example = [
        "run",
        "-q",
        "--release",
        "-p",
        "reaper-user",
        "--example",
        "docs",
        "--",
    ];
    cargo_env(root, &[&example[..], &[docs_to]].concat(), &[])?;
    let mut packages = Vec::new();
    let mut binaries = Vec::new();
    for arch in Arch::ALL {
        let binary = static_binary(root, &out, arch)?;
        packages.push(Packages {
            arch,
            tarball: tarball(root, &out, arch, &binary, &docs)?,
            deb: deb(root, &out, arch, &binary, &docs)?,
        });
        binaries.push((arch, binary));
    }
    let artifacts = Artifacts {
        packages,
        image: image::image(&out, &binaries)?,
    };
    for p in &artifacts.packages {
        println!("{}\n{}", p.tarball.display(), p.deb.display());
    }
    println!("{}", artifacts.image.display());
    Ok(artifacts)
}

/// Builds reaper-trace for `arch`, statically linked, and strips a copy of it in `out`; checks
/// that the copy is static-pie (no program interpreter, position-independent: the kernel
/// loads it at a random address) and is code of `arch`.
fn static_binary(root: &Path, out: &Path, arch: Arch) -> Result<PathBuf> {
    let args = [
        "build",
        "--release",
        "-p",
        "reaper-user",
        "--bin",
        "reaper-trace",
        "--target",
        arch.triple(),
    ];
    // Only the target's flags: build scripts and the nested eBPF build stay as they are.
    // Another architecture's are `vmtest`'s own (one build serves both).
    let env = arch.static_env();
    if arch != Arch::host() {
        arch.ensure_std()?;
    }
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    cargo_env(root, &args, &env)?;
    let built = root
        .join("target")
        .join(arch.triple())
        .join("release/reaper-trace");
    let binary = out.join(arch.name()).join("reaper-trace");
    install(&built, &binary, 0o755)?;
    sh(Command::new(arch.binutil("strip")).arg(&binary))?;
    let elf = fs::read(&binary).with_context(|| format!("reading {}", binary.display()))?;
    let shape = elf_shape(&elf).context("reaper-trace is not a 64-bit ELF")?;
    if shape.interpreter {
        bail!("{} needs a dynamic loader: not static", binary.display());
    }
    if shape.machine != arch.elf_machine() {
        bail!(
            "{} is code of ELF machine {}, not {}'s",
            binary.display(),
            shape.machine,
            arch.name()
        );
    }
    if !shape.pie {
        bail!(
            "{} is not position-independent: its code would not be randomized",
            binary.display()
        );
    }
    Ok(binary)
}

/// What [`static_binary`] checks of an executable.
struct ElfShape {
    /// Whether it names a program interpreter (`PT_INTERP`): a dynamically linked executable
    /// does, a static (or static-pie) one does not.
    interpreter: bool,
    /// `e_machine`: the architecture it is code of.
    machine: u16,
    /// Whether it is position-independent (`e_type` `ET_DYN`).
    pie: bool,
}

/// The shape of a little-endian ELF64 file; none for anything else.
fn elf_shape(elf: &[u8]) -> Option<ElfShape> {
    const PT_INTERP: u32 = 3;
    if elf.get(..6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let u16_at = |o: usize| Some(u16::from_le_bytes(elf.get(o..o + 2)?.try_into().ok()?));
    let u64_at = |o: usize| Some(u64::from_le_bytes(elf.get(o..o + 8)?.try_into().ok()?));
    let phoff = usize::try_from(u64_at(0x20)?).ok()?;
    let (entsize, count) = (usize::from(u16_at(0x36)?), usize::from(u16_at(0x38)?));
    let mut interpreter = false;
    for i in 0..count {
        let at = phoff.checked_add(i.checked_mul(entsize)?)?;
        interpreter |= u32::from_le_bytes(elf.get(at..at + 4)?.try_into().ok()?) == PT_INTERP;
    }
    const ET_DYN: u16 = 3;
    Some(ElfShape {
        interpreter,
        machine: u16_at(0x12)?,
        pie: u16_at(0x10)? == ET_DYN,
    })
}

/// The files every artifact carries besides the binary: (path in the workspace, name).
const SHIPPED: &[(&str, &str)] = &[
    ("contrib/reaper-trace.service", "reaper-trace.service"),
    ("contrib/reaper-trace.default", "reaper-trace.default"),
    ("schema/events.schema.json", "events.schema.json"),
    ("README.md", "README.md"),
    ("LICENSE-MIT", "LICENSE-MIT"),
    ("LICENSE-APACHE", "LICENSE-APACHE"),
];

fn tarball(root: &Path, out: &Path, arch: Arch, binary: &Path, docs: &Path) -> Result<PathBuf> {
    let name = format!("reaper-trace-{VERSION}-{}-linux", arch.name());
    let stage = out.join(&name);
    install(binary, &stage.join("reaper-trace"), 0o755)?;
    for (from, to) in SHIPPED {
        install(&root.join(from), &stage.join(to), 0o644)?;
    }
    copy_tree(&docs.join("man"), &stage.join("man"))?;
    copy_tree(&docs.join("completions"), &stage.join("completions"))?;
    let tarball = out.join(format!("{name}.tar.gz"));
    tar(&tarball, out, &name)?;
    Ok(tarball)
}

fn deb(root: &Path, out: &Path, arch: Arch, binary: &Path, docs: &Path) -> Result<PathBuf> {
    let stage = out.join(format!("deb-{}", arch.deb()));
    install(binary, &stage.join("usr/bin/reaper-trace"), 0o755)?;
    for page in ["reaper-trace.1", "reaper-trace-report.1"] {
        let to = stage.join("usr/share/man/man1").join(page);
        install(&docs.join("man").join(page), &to, 0o644)?;
        gzip(&to)?;
    }
    let completions = docs.join("completions");
    for (from, to) in [
        (
            "reaper-trace.bash",
            "usr/share/bash-completion/completions/reaper-trace",
        ),
        (
            "_reaper-trace",
            "usr/share/zsh/vendor-completions/_reaper-trace",
        ),
        (
            "reaper-trace.fish",
            "usr/share/fish/vendor_completions.d/reaper-trace.fish",
        ),
    ] {
        install(&completions.join(from), &stage.join(to), 0o644)?;
    }
    // The unit as shipped names a binary installed by hand; the package's is in /usr/bin.
    let unit = fs::read_to_string(root.join("contrib/reaper-trace.service"))?
        .replace("/usr/local/bin/reaper-trace", "/usr/bin/reaper-trace");
    write(
        &stage.join("lib/systemd/system/reaper-trace.service"),
        &unit,
        0o644,
    )?;
    install(
        &root.join("contrib/reaper-trace.default"),
        &stage.join("etc/default/reaper-trace"),
        0o644,
    )?;
    let doc = stage.join("usr/share/doc/reaper-trace");
    write(&doc.join("copyright"), &copyright(root)?, 0o644)?;
    write(&doc.join("changelog"), &changelog()?, 0o644)?;
    gzip(&doc.join("changelog"))?;
    install(&root.join("README.md"), &doc.join("README.md"), 0o644)?;
    install(
        &root.join("schema/events.schema.json"),
        &doc.join("events.schema.json"),
        0o644,
    )?;
    // Static on purpose (one binary for every Debian release, nothing to keep in step): a
    // static-pie executable looks to lintian like a library that names no C library.
    write(
        &stage.join("usr/share/lintian/overrides/reaper-trace"),
        "# Static on purpose: it needs no shared library at all.\n\
         reaper-trace: shared-library-lacks-prerequisites [usr/bin/reaper-trace]\n",
        0o644,
    )?;
    let control = stage.join("DEBIAN");
    write(
        &control.join("control"),
        &control_file(&stage, arch)?,
        0o644,
    )?;
    write(&control.join("md5sums"), &md5sums(&stage)?, 0o644)?;
    write(
        &control.join("conffiles"),
        "/etc/default/reaper-trace\n",
        0o644,
    )?;
    write(&control.join("prerm"), PRERM, 0o755)?;
    let deb = out.join(format!("reaper-trace_{VERSION}_{}.deb", arch.deb()));
    sh(Command::new("dpkg-deb")
        .args(["--root-owner-group", "-Zxz", "--build"])
        .arg(&stage)
        .arg(&deb))?;
    Ok(deb)
}

/// The package's removal (not an upgrade, which keeps the audit going) leaves no probe
/// attached and nothing pinned: the service's state is released (docs/operations.md).
const PRERM: &str = "#!/bin/sh
set -e
if [ \"$1\" = remove ] && [ -d /var/lib/reaper-trace ]; then
    if [ -d /run/systemd/system ] && command -v deb-systemd-invoke >/dev/null; then
        deb-systemd-invoke stop reaper-trace.service >/dev/null || true
    fi
    /usr/bin/reaper-trace --release-state /var/lib/reaper-trace || true
fi
exit 0
";

/// `DEBIAN/md5sums`: every file of the package, by its path from the root.
fn md5sums(stage: &Path) -> Result<String> {
    let out = Command::new("sh")
        .args([
            "-c",
            "find . -type f ! -path './DEBIAN/*' -printf '%P\\0' | sort -z | xargs -0 md5sum",
        ])
        .current_dir(stage)
        .output()?;
    if !out.status.success() {
        bail!("md5sum failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8(out.stdout)?)
}

const MAINTAINER: &str = "reaper developers <reaper@users.noreply.github.com>";

fn control_file(stage: &Path, arch: Arch) -> Result<String> {
    let out = Command::new("du")
        .args(["-sk", "--exclude=DEBIAN"])
        .arg(stage)
        .output()?;
    let kib = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or("0")
        .to_owned();
    let deb_arch = arch.deb();
    Ok(format!(
        "Package: reaper-trace
Version: {VERSION}
Architecture: {deb_arch}
Maintainer: {MAINTAINER}
Installed-Size: {kib}
Section: admin
Priority: optional
Description: exact process-lineage tracer that flags leaked helper processes
 reaper-trace follows every descendant of gateway processes (AI-agent
 gateways, MCP hosts, CI runners) with eBPF tracepoints, however they
 escaped (setsid, double fork, reparenting), flags the leaked ones with
 evidence (orphaned, idle, deaf, zombie) and can kill them safely. It
 writes NDJSON, Prometheus metrics and an HTML report.
 .
 Needs Linux 5.12 or later with BTF. The service is installed disabled:
 choose the gateways in /etc/default/reaper-trace, then enable it.
"
    ))
}

/// The Debian copyright file (machine-readable format).
fn copyright(root: &Path) -> Result<String> {
    let mit = fs::read_to_string(root.join("LICENSE-MIT"))?;
    let mit: String = mit
        .lines()
        .skip_while(|l| l.starts_with("Copyright") || l.is_empty())
        .map(|l| match l.trim() {
            "" => " .\n".to_owned(),
            t => format!(" {t}\n"),
        })
        .collect();
    Ok(format!(
        "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: reaper

Files: *
Copyright: 2026 The reaper developers
License: MIT or Apache-2.0
Comment: The binary is statically linked with the Rust crates named in the
 source's Cargo.lock, each under its own licence (MIT, Apache-2.0 or
 compatible), and with the GNU C Library (LGPL-2.1+).

License: MIT
{mit}
License: Apache-2.0
 On Debian systems, the full text of the Apache License, Version 2.0 can be
 found in /usr/share/common-licenses/Apache-2.0.
"
    ))
}

/// A native package's changelog, dated by the commit it is built from.
fn changelog() -> Result<String> {
    let out = Command::new("git")
        .args(["log", "-1", "--format=%cD"])
        .output();
    let date = match out {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_owned(),
        _ => String::from_utf8_lossy(&Command::new("date").arg("-R").output()?.stdout)
            .trim()
            .to_owned(),
    };
    Ok(format!(
        "reaper-trace ({VERSION}) unstable; urgency=medium

  * Release {VERSION}.

 -- {MAINTAINER}  {date}
"
    ))
}

fn sh(cmd: &mut Command) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("running {:?}", cmd.get_program()))?;
    if !status.success() {
        bail!("{cmd:?} failed ({status})");
    }
    Ok(())
}

/// Archives `what` in `dir` as `archive` (gzipped for `.gz`), the same bytes from the same
/// files: sorted names, owned by root.
fn tar(archive: &Path, dir: &Path, what: &str) -> Result<()> {
    let create = match archive.extension().is_some_and(|e| e == "gz") {
        true => "-czf",
        false => "-cf",
    };
    sh(Command::new("tar")
        .args([
            "--sort=name",
            "--owner=0",
            "--group=0",
            "--numeric-owner",
            create,
        ])
        .arg(archive)
        .arg("-C")
        .arg(dir)
        .arg(what))
}

fn gzip(file: &Path) -> Result<()> {
    sh(Command::new("gzip").args(["-9nf"]).arg(file))
}

fn install(from: &Path, to: &Path, mode: u32) -> Result<()> {
    let bytes = fs::read(from).with_context(|| format!("reading {}", from.display()))?;
    write(to, bytes, mode)
}

/// Writes `to` (and the directories above it) with exactly `mode`.
fn write(to: &Path, contents: impl AsRef<[u8]>, mode: u32) -> Result<()> {
    if let Some(dir) = to.parent() {
        fs::create_dir_all(dir)?;
    }
    fs::write(to, contents).with_context(|| format!("writing {}", to.display()))?;
    fs::set_permissions(to, fs::Permissions::from_mode(mode))?;
    Ok(())
}

fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    for entry in fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let entry = entry?;
        install(&entry.path(), &to.join(entry.file_name()), 0o644)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dynamic_executable_names_its_interpreter_and_machine() {
        let own = fs::read(std::env::current_exe().unwrap()).unwrap();
        let shape = elf_shape(&own).unwrap();
        assert!(shape.interpreter);
        assert_eq!(shape.machine, Arch::host().elf_machine());
        assert!(elf_shape(b"#!/bin/sh\n").is_none());
    }
}
