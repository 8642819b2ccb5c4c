//! What the tests take from npm: the MCP TypeScript SDK, for a real Node MCP host.
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

/// The SDK release the Node MCP host test connects through.
const MCP_SDK: &str = "@modelcontextprotocol/sdk@1.32.2";

/// The SDK installed at `target/test-tools/mcp-sdk/` (its `node_modules/`), made once; returns
/// the directory. The test finds it through `REAPER_MCP_SDK`.
pub fn mcp_sdk(root: &Path) -> Result<PathBuf> {
    let dir = root.join("target/test-tools/mcp-sdk");
    let stdio = dir.join("node_modules/@modelcontextprotocol/sdk/dist/cjs/client/stdio.js");
    if stdio.is_file() {
        return Ok(dir);
    }
    eprintln!(
        "xtask: installing {MCP_SDK} from npm into {} for the Node MCP host test",
        dir.display()
    );
    std::fs::create_dir_all(&dir)?;
    let npm = Command::new("npm")
        .args(["install", "--no-audit", "--no-fund", "--silent", "--prefix"])
        .arg(&dir)
        .arg(MCP_SDK)
        .status()
        .context("running npm")?;
    if !npm.success() || !stdio.is_file() {
        bail!("`npm install {MCP_SDK}` failed ({npm})");
    }
    Ok(dir)
}
