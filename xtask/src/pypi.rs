//! What the tests take from PyPI: command-line tools, and the JUnit schema from pytest's source
//! release (pytest's own tests validate its reports against it).
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

/// Installs `pkg` from PyPI (its programs land on the PATH of the `python3` that runs pip).
pub fn install(pkg: &str) {
    let _ = Command::new("python3")
        .args(["-m", "pip", "install", "-q", pkg])
        .status();
    // pyenv's shims appear only after a rehash.
    let _ = Command::new("sh")
        .args(["-c", "command -v pyenv >/dev/null && pyenv rehash"])
        .status();
}

/// The Hermes agent release the real-gateway tests drive, with the `mcp` SDK its stdio
/// servers are written with.
pub const HERMES: &str = "hermes-agent[mcp]==0.19.0";

/// The Hermes release whose connect timeout leaks its stdio server (the spawn-site test
/// names the code that spawned it).
pub const HERMES_LEAKING: &str = "hermes-agent[mcp]==0.14.0";

/// A virtual environment with `release` (one of [`HERMES`], [`HERMES_LEAKING`]) installed at
/// `target/test-tools/DIR/`, made once; returns its directory. The tests find them through
/// `REAPER_HERMES_VENV` and `REAPER_HERMES_LEAKING_VENV`.
pub fn hermes_venv(root: &Path, release: &str, dir: &str) -> Result<PathBuf> {
    let venv = root.join("target/test-tools").join(dir);
    let python = venv.join("bin/python3");
    let installed = Command::new(&python)
        .args(["-c", "import gateway.run, mcp.server.fastmcp"])
        .status()
        .is_ok_and(|s| s.success());
    if installed {
        return Ok(venv);
    }
    eprintln!(
        "xtask: installing {release} from PyPI into {} for the Hermes gateway tests",
        venv.display()
    );
    let made = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .status()
        .context("running python3 -m venv")?;
    if !made.success() {
        bail!("`python3 -m venv {}` failed ({made})", venv.display());
    }
    let pip = Command::new(&python)
        .args(["-m", "pip", "install", "-q", release])
        .status()
        .context("running pip in the Hermes venv")?;
    if !pip.success() {
        bail!("`pip install {release}` failed ({pip})");
    }
    Ok(venv)
}

/// The pytest release whose source carries the schema.
const PYTEST_SDIST: &str = "pytest==8.3.4";
const SCHEMA_IN_SDIST: &str = "pytest-8.3.4/testing/example_scripts/junit-10.xsd";

/// The Jenkins/Ant JUnit schema (`junit-10.xsd`, MIT) at `target/test-tools/`, fetched once.
pub fn junit_schema(root: &Path) -> Result<PathBuf> {
    let dir = root.join("target/test-tools");
    let xsd = dir.join("junit-10.xsd");
    if xsd.is_file() {
        return Ok(xsd);
    }
    let sdists = dir.join("pypi");
    fs::create_dir_all(&sdists)?;
    eprintln!("xtask: fetching the JUnit schema from {PYTEST_SDIST}'s source on PyPI");
    let fetched = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--no-binary",
            ":all:",
        ])
        .arg("-d")
        .arg(&sdists)
        .arg(PYTEST_SDIST)
        .status()
        .context("running pip download")?;
    if !fetched.success() {
        bail!("`pip download {PYTEST_SDIST}` failed ({fetched})");
    }
    let out = Command::new("tar")
        .arg("-xzOf")
        .arg(sdists.join("pytest-8.3.4.tar.gz"))
        .arg(SCHEMA_IN_SDIST)
        .output()
        .context("running tar")?;
    if !out.status.success() || out.stdout.is_empty() {
        bail!("{SCHEMA_IN_SDIST} is not in the pytest source release");
    }
    fs::write(&xsd, out.stdout)?;
    Ok(xsd)
}
