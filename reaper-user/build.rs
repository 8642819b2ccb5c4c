//! Builds the eBPF object (crate `reaper-ebpf`) for `bpfel-unknown-none` with the nightly
//! toolchain and leaves it in `$OUT_DIR/reaper`, where `src/loader.rs` embeds it.
//!
//! This does what aya-build 0.2 does, plus one thing it cannot: `-C target-cpu=v3`. aya-build
//! replaces every outer RUSTFLAGS, and the sequence counter the probes share needs the BPF v3
//! atomic fetch-add (kernels 5.12 and later). `cargo xtask setup` installs what this needs.
use std::{
    env,
    path::{Path, PathBuf},
    process::Command,
};

const EBPF_CRATE: &str = "reaper-ebpf";
const EBPF_BIN: &str = "reaper";
const TOOLCHAIN: &str = "nightly";

fn main() {
    commit();
    if let Err(message) = build() {
        // A panic would bury the message under a backtrace; print it as the build's error.
        eprintln!("\nerror: {message}\n");
        std::process::exit(1);
    }
}

fn build() -> Result<(), String> {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").map_err(|e| e.to_string())?);
    let out_dir = PathBuf::from(env::var("OUT_DIR").map_err(|e| e.to_string())?);
    let ebpf_dir = manifest_dir.join("..").join(EBPF_CRATE);
    println!("cargo:rerun-if-changed={}", ebpf_dir.display());
    println!(
        "cargo:rerun-if-changed={}",
        manifest_dir.join("../reaper-common").display()
    );

    let dest = out_dir.join(EBPF_BIN);
    let target_dir = out_dir.join("ebpf-target");
    let arch = bpf_target_arch()?;
    let rustflags = [
        format!("--cfg=bpf_target_arch=\"{arch}\"").as_str(),
        "-Cdebuginfo=2",
        "-Clink-arg=--btf",
        "-Ctarget-cpu=v3",
    ]
    .join("\x1f");
    let mut cmd = Command::new("rustup");
    cmd.args(["run", TOOLCHAIN, "cargo", "build", "--package", EBPF_CRATE])
        .args(["--bins", "--release", "--target", "bpfel-unknown-none"])
        .args(["-Z", "build-std=core", "--target-dir"])
        .arg(&target_dir)
        .current_dir(&ebpf_dir)
        .env("CARGO_ENCODED_RUSTFLAGS", rustflags)
        // The outer build's compiler settings belong to the host toolchain.
        .env_remove("RUSTC")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("RUSTC_WRAPPER")
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_BUILD_TARGET");
    let output = cmd.output().map_err(|e| {
        format!("cannot run `rustup` to build the eBPF programs ({e}); run `cargo xtask setup`")
    })?;
    if !output.status.success() {
        return Err(format!(
            "building the eBPF programs failed:\n{}\n\
             If a tool is missing (nightly, rust-src, bpf-linker), `cargo xtask setup` installs it.",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let built = target_dir.join("bpfel-unknown-none/release").join(EBPF_BIN);
    copy_if_changed(&built, &dest)
}

/// The architecture the programs are built for (`bpf_target_arch`: where they find a
/// thread's saved registers): the one this crate is built for, which the kernel it loads
/// them into runs.
fn bpf_target_arch() -> Result<String, String> {
    let arch = env::var("CARGO_CFG_TARGET_ARCH").map_err(|e| e.to_string())?;
    match arch.as_str() {
        "x86_64" | "aarch64" => Ok(arch),
        other => Err(format!(
            "reaper-trace is built for x86_64 and aarch64, not {other}"
        )),
    }
}

/// `REAPER_COMMIT` for `--version`: the git commit this is built from (`$REAPER_COMMIT` when
/// set, as a build from a source archive sets it; `unknown` outside a checkout).
fn commit() {
    println!("cargo:rerun-if-env-changed=REAPER_COMMIT");
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    // Only files that exist: cargo takes a missing one as changed, and would build this crate
    // again on every run (a clone from a local path may have no packed-refs; a ref packed
    // later leaves refs/). In a worktree `.git` is a file naming a git directory whose HEAD
    // is not followed here: the commit embedded there is the one of the build that last ran
    // this script (`REAPER_COMMIT` names one exactly).
    let git = repo.join(".git");
    let watched: Vec<_> = if git.is_file() {
        vec![git]
    } else {
        ["HEAD", "refs", "packed-refs"].map(|f| git.join(f)).into()
    };
    for watched in watched.iter().filter(|w| w.exists()) {
        println!("cargo:rerun-if-changed={}", watched.display());
    }
    let commit = env::var("REAPER_COMMIT").ok().or_else(|| {
        let out = Command::new("git")
            .args(["rev-parse", "--short=12", "HEAD"])
            .current_dir(&repo)
            .output()
            .ok()?;
        let hash = String::from_utf8(out.stdout).ok()?;
        (out.status.success() && !hash.trim().is_empty()).then(|| hash.trim().to_owned())
    });
    println!(
        "cargo:rustc-env=REAPER_COMMIT={}",
        commit.as_deref().unwrap_or("unknown")
    );
}

fn copy_if_changed(from: &Path, to: &Path) -> Result<(), String> {
    let new = std::fs::read(from).map_err(|e| format!("reading {}: {e}", from.display()))?;
    if std::fs::read(to).ok().as_deref() != Some(&new[..]) {
        std::fs::write(to, &new).map_err(|e| format!("writing {}: {e}", to.display()))?;
    }
    Ok(())
}
