//! The eBPF toolchain, installed on demand: nightly's `rust-src` (for `-Z build-std=core`)
//! and `bpf-linker`, built against the nightly toolchain's own libLLVM so that the bitcode
//! rustc emits and the LLVM that links it always match.
use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context, Result, bail};

/// The toolchain the eBPF crate builds with.
pub const NIGHTLY: &str = "nightly";
/// The bpf-linker release known to work with this toolchain set (cargo install --locked).
const BPF_LINKER_VERSION: &str = "0.13.0";

/// Runs every check, installing what is missing.
pub fn ensure_all() -> Result<()> {
    let sysroot = nightly_sysroot()?;
    ensure_rust_src(&sysroot)?;
    ensure_bpf_linker(&sysroot)
}

fn output(cmd: &mut Command) -> Option<String> {
    let out = cmd.stderr(Stdio::null()).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn run(cmd: &mut Command, what: &str, fix: &str) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("{what}: cannot run {cmd:?}"))?;
    if !status.success() {
        bail!("{what} failed ({status}). To do it by hand: {fix}");
    }
    Ok(())
}

fn nightly_sysroot() -> Result<PathBuf> {
    match output(Command::new("rustup").args(["run", NIGHTLY, "rustc", "--print", "sysroot"])) {
        Some(s) => Ok(PathBuf::from(s)),
        None => bail!(
            "the `{NIGHTLY}` toolchain is missing (the eBPF programs need it). Install it with: \
             rustup toolchain install {NIGHTLY} --profile minimal --component rust-src"
        ),
    }
}

fn ensure_rust_src(sysroot: &Path) -> Result<()> {
    if sysroot.join("lib/rustlib/src/rust/library/core").is_dir() {
        return Ok(());
    }
    eprintln!("xtask: adding rust-src to the {NIGHTLY} toolchain");
    let fix = format!("rustup component add rust-src --toolchain {NIGHTLY}");
    run(
        Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", NIGHTLY]),
        "adding rust-src",
        &fix,
    )
}

/// A folder that outlives this run (bpf-linker's RUNPATH points into it).
fn llvm_prefix() -> Result<PathBuf> {
    let cargo_home = match std::env::var_os("CARGO_HOME") {
        Some(h) => PathBuf::from(h),
        None => PathBuf::from(std::env::var_os("HOME").context("HOME is not set")?).join(".cargo"),
    };
    Ok(cargo_home.join("reaper-llvm"))
}

/// The nightly toolchain's libLLVM (`libLLVM.so.<ver>-rust-<ver>`) and its major version.
fn nightly_llvm(sysroot: &Path) -> Result<(PathBuf, String)> {
    let lib = sysroot.join("lib");
    let found = std::fs::read_dir(&lib)
        .with_context(|| format!("reading {}", lib.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libLLVM.so."))
        });
    let Some(path) = found else {
        bail!(
            "no libLLVM.so.* in {}: this nightly does not ship LLVM as a shared library",
            lib.display()
        );
    };
    let vv =
        output(Command::new("rustup").args(["run", NIGHTLY, "rustc", "-vV"])).unwrap_or_default();
    let major = vv
        .lines()
        .find_map(|l| l.strip_prefix("LLVM version: "))
        .and_then(|v| v.split('.').next())
        .context("cannot tell the nightly toolchain's LLVM version")?
        .to_owned();
    Ok((path, major))
}

fn bpf_linker_works() -> bool {
    output(Command::new("bpf-linker").arg("--version")).is_some()
}

fn ensure_bpf_linker(sysroot: &Path) -> Result<()> {
    let (llvm, major) = nightly_llvm(sysroot)?;
    let prefix = llvm_prefix()?;
    // Both names: `libLLVM.so` for the build to link against, the soname for the loader.
    let lib = prefix.join("lib");
    std::fs::create_dir_all(&lib).with_context(|| format!("creating {}", lib.display()))?;
    for name in [
        std::ffi::OsStr::new("libLLVM.so"),
        llvm.file_name().context("libLLVM name")?,
    ] {
        let link = lib.join(name);
        if std::fs::read_link(&link).ok().as_deref() != Some(llvm.as_path()) {
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(&llvm, &link)
                .with_context(|| format!("linking {} to {}", link.display(), llvm.display()))?;
        }
    }
    if bpf_linker_works() {
        return Ok(());
    }
    eprintln!(
        "xtask: building bpf-linker {BPF_LINKER_VERSION} against {} (about a minute)",
        llvm.display()
    );
    let feature = format!("llvm-{major}");
    let fix = format!(
        "LLVM_PREFIX={} cargo install bpf-linker --version {BPF_LINKER_VERSION} --locked \
         --no-default-features --features {feature} --force",
        prefix.display()
    );
    run(
        Command::new("cargo")
            .args([
                "install",
                "bpf-linker",
                "--version",
                BPF_LINKER_VERSION,
                "--locked",
            ])
            .args(["--no-default-features", "--features", &feature, "--force"])
            .env("LLVM_PREFIX", &prefix),
        "building bpf-linker",
        &fix,
    )?;
    if !bpf_linker_works() {
        bail!(
            "bpf-linker was installed but `bpf-linker --version` still fails: is ~/.cargo/bin on \
             PATH? Its library folder is {}",
            lib.display()
        );
    }
    Ok(())
}
