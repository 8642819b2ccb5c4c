//! `cargo xtask dist`: what people install, in `target/dist/`.
//!
//! - `reaper-trace-VERSION-x86_64-linux.tar.gz`: one static binary (the eBPF object inside, no
//!   runtime dependency, not even the C library's loader), its man pages and shell
//!   completions, the service unit and its defaults, the event schema, README and licences.
//! - `reaper-trace_VERSION_amd64.deb`: the same binary as `/usr/bin/reaper-trace`, with man
//!   pages, completions, the unit and its `/etc/default/reaper-trace` (a conffile).
//! - `reaper-trace-VERSION-oci.tar`: an OCI image archive made from nothing but the binary (no
//!   base image is pulled): `podman run oci-archive:...`, or `podman load -i`.
//!
//! The binary is static through glibc's `crt-static` (the only Rust standard library this
//! machine has is glibc's): reaper-trace resolves no host names and loads no NSS module, which
//! is what makes a static glibc binary unsafe elsewhere.
use std::{
    fs,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use crate::{cargo_env, setup};

pub const VERSION: &str = env!("CARGO_PKG_VERSION");
const TARGET: &str = "x86_64-unknown-linux-gnu";

/// The artifacts of one `dist` run.
pub struct Artifacts {
    pub tarball: PathBuf,
    pub deb: PathBuf,
    pub image: PathBuf,
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
    let binary = static_binary(root)?;
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
    let artifacts = Artifacts {
        tarball: tarball(root, &out, &binary, &docs)?,
        deb: deb(root, &out, &binary, &docs)?,
        image: image(&out, &binary)?,
    };
    for a in [&artifacts.tarball, &artifacts.deb, &artifacts.image] {
        println!("{}", a.display());
    }
    Ok(artifacts)
}

/// Builds reaper-trace statically linked and checks that it is: no program interpreter.
fn static_binary(root: &Path) -> Result<PathBuf> {
    cargo_env(
        root,
        &[
            "build",
            "--release",
            "-p",
            "reaper-user",
            "--bin",
            "reaper-trace",
            "--target",
            TARGET,
        ],
        // Only the target's flags: build scripts and the nested eBPF build stay as they are.
        &[(
            "CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS",
            "-C target-feature=+crt-static -C strip=symbols",
        )],
    )?;
    let binary = root
        .join("target")
        .join(TARGET)
        .join("release/reaper-trace");
    let elf = fs::read(&binary).with_context(|| format!("reading {}", binary.display()))?;
    if has_interpreter(&elf).context("reaper-trace is not a 64-bit ELF")? {
        bail!("{} needs a dynamic loader: not static", binary.display());
    }
    Ok(binary)
}

/// Whether a little-endian ELF64 file names a program interpreter (`PT_INTERP`): a
/// dynamically linked executable does, a static (or static-pie) one does not.
fn has_interpreter(elf: &[u8]) -> Option<bool> {
    const PT_INTERP: u32 = 3;
    if elf.get(..5)? != b"\x7fELF\x02" {
        return None;
    }
    let u16_at = |o: usize| Some(u16::from_le_bytes(elf.get(o..o + 2)?.try_into().ok()?));
    let u64_at = |o: usize| Some(u64::from_le_bytes(elf.get(o..o + 8)?.try_into().ok()?));
    let phoff = usize::try_from(u64_at(0x20)?).ok()?;
    let (entsize, count) = (usize::from(u16_at(0x36)?), usize::from(u16_at(0x38)?));
    for i in 0..count {
        let at = phoff + i * entsize;
        if u32::from_le_bytes(elf.get(at..at + 4)?.try_into().ok()?) == PT_INTERP {
            return Some(true);
        }
    }
    Some(false)
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

fn tarball(root: &Path, out: &Path, binary: &Path, docs: &Path) -> Result<PathBuf> {
    let name = format!("reaper-trace-{VERSION}-x86_64-linux");
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

fn deb(root: &Path, out: &Path, binary: &Path, docs: &Path) -> Result<PathBuf> {
    let stage = out.join("deb");
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
        "# A static-pie executable: it needs no shared library at all.\n\
         reaper-trace: shared-library-lacks-prerequisites [usr/bin/reaper-trace]\n",
        0o644,
    )?;
    let control = stage.join("DEBIAN");
    write(&control.join("control"), &control_file(&stage)?, 0o644)?;
    write(&control.join("md5sums"), &md5sums(&stage)?, 0o644)?;
    write(
        &control.join("conffiles"),
        "/etc/default/reaper-trace\n",
        0o644,
    )?;
    write(&control.join("prerm"), PRERM, 0o755)?;
    let deb = out.join(format!("reaper-trace_{VERSION}_amd64.deb"));
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

fn control_file(stage: &Path) -> Result<String> {
    let out = Command::new("du")
        .args(["-sk", "--exclude=DEBIAN"])
        .arg(stage)
        .output()?;
    let kib = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or("0")
        .to_owned();
    Ok(format!(
        "Package: reaper-trace
Version: {VERSION}
Architecture: amd64
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

/// An OCI image of the binary alone (umoci: no daemon, no base image), as an OCI archive.
fn image(out: &Path, binary: &Path) -> Result<PathBuf> {
    let layout = out.join("oci");
    // The reference a `podman load` names the image by: reaper-trace:VERSION.
    let tag = format!("{}:reaper-trace:{VERSION}", layout.display());
    sh(Command::new("umoci")
        .args(["init", "--layout"])
        .arg(&layout))?;
    sh(Command::new("umoci").args(["new", "--image", &tag]))?;
    sh(Command::new("umoci")
        .args(["insert", "--image", &tag])
        .arg(binary)
        .arg("/usr/bin/reaper-trace"))?;
    sh(Command::new("umoci").args([
        "config",
        "--image",
        &tag,
        "--config.entrypoint",
        "/usr/bin/reaper-trace",
        "--config.user",
        "0",
        "--config.workingdir",
        "/",
        "--config.label",
        &format!("org.opencontainers.image.version={VERSION}"),
        "--config.label",
        "org.opencontainers.image.title=reaper-trace",
        "--config.label",
        "org.opencontainers.image.licenses=MIT OR Apache-2.0",
        "--os",
        "linux",
        "--architecture",
        "amd64",
    ]))?;
    sh(Command::new("umoci").args(["gc", "--layout"]).arg(&layout))?;
    // An OCI archive is the layout in a tar.
    let archive = out.join(format!("reaper-trace-{VERSION}-oci.tar"));
    tar(&archive, &layout, ".")?;
    Ok(archive)
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
    fn a_dynamic_executable_names_its_interpreter() {
        let own = fs::read(std::env::current_exe().unwrap()).unwrap();
        assert_eq!(has_interpreter(&own), Some(true));
        assert_eq!(has_interpreter(b"#!/bin/sh\n"), None);
    }
}
