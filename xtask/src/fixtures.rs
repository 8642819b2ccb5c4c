//! What the tests use besides programs (see [`crate::prereqs`]): the JUnit schema, the Hermes
//! venvs, the MCP SDK, the Debian roots and the matrix's kernels, each made once and cached.
//! They are fetched on a thread of their own while the lints and builds run: fetching waits
//! on the network and the build on the CPU, so on a fresh machine the two overlap instead of
//! adding up (about four minutes).
use std::{ffi::OsString, path::Path, thread::JoinHandle};

use anyhow::{Context, Result};

use crate::{arch::Arch, debian, npm, pypi, vmtest};

/// The Debian kernel series the package's roots are booted on, with systemd starting its unit
/// (`tests/tests/dist/booted.rs`): one of the matrix's, so that it is fetched once.
const UNIT_KERNEL_SERIES: &str = "6.12";

/// The variables that name the fixtures to the tests.
pub type TestEnv = Vec<(&'static str, OsString)>;

/// Starts fetching; `dist` and `vm` as for `cargo xtask test`.
pub fn fetch(root: &Path, dist: bool, vm: bool) -> JoinHandle<Result<TestEnv>> {
    let root = root.to_owned();
    std::thread::spawn(move || {
        pypi::junit_schema(&root)?;
        let mut env: TestEnv = vec![
            // The real Hermes gateway, with stdio MCP servers written with the mcp SDK.
            (
                "REAPER_HERMES_VENV",
                pypi::hermes_venv(&root, pypi::HERMES, "hermes-venv")?.into(),
            ),
            (
                "REAPER_HERMES_LEAKING_VENV",
                pypi::hermes_venv(&root, pypi::HERMES_LEAKING, "hermes-0.14-venv")?.into(),
            ),
            // CPython 3.13 and 3.14 for the Python spawn-site tests.
            (
                "REAPER_PYTHON_ROOT",
                debian::python_root(Arch::host())?.into(),
            ),
            // The MCP TypeScript SDK for the Node MCP host's spawn-site test.
            ("REAPER_MCP_SDK", npm::mcp_sdk(&root)?.into()),
        ];
        if dist {
            // Fresh Debian roots for the package's tests: this machine's architecture's, and
            // the other's (whose packages `dist` makes too).
            let own = debian::test_root(&root, Arch::host())?;
            env.push(("REAPER_DEBIAN_ROOT", own.into()));
            let other = debian::test_root(&root, Arch::other())?;
            env.push(("REAPER_OTHER_DEBIAN_ROOT", other.into()));
            // The kernels those roots boot on, with systemd starting the package's unit.
            for (arch, variable) in [
                (Arch::host(), "REAPER_DEBIAN_KERNEL"),
                (Arch::other(), "REAPER_OTHER_DEBIAN_KERNEL"),
            ] {
                let series = vmtest::Kernel::Debian {
                    series: UNIT_KERNEL_SERIES.into(),
                    arch,
                };
                for (_, _, kernel) in vmtest::debian_kernels(&[series])? {
                    env.push((variable, kernel.image.into()));
                }
            }
        }
        if vm {
            vmtest::debian_kernels(&vmtest::default_kernels()?)?;
        }
        Ok(env)
    })
}

/// Waits for [`fetch`] to end.
pub fn wait(fetching: JoinHandle<Result<TestEnv>>) -> Result<TestEnv> {
    fetching
        .join()
        .map_err(|_| anyhow::anyhow!("the fixtures' thread panicked"))?
        .context("preparing the tests' fixtures")
}
