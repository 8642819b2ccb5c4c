//! `reaper-trace report AUDIT.ndjson [-o report.html]`: an audit as one self-contained HTML
//! page for a person who was not watching.
pub mod audit;
pub mod crowds;
pub mod html;
pub mod leak_sites;
pub mod timeline;

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Parser;

use crate::stream::reading;
use audit::Audit;

/// Turn an audit (the NDJSON of `--json` or `--output`) into one HTML file: a timeline of live,
/// flagged and flagged-RSS, the leak table with lineage and evidence, the spawn tree at the
/// end, and counts by executable. Nothing in it is fetched from the network.
#[derive(Debug, Parser)]
#[command(name = "reaper-trace report", version = crate::cli::VERSION)]
pub struct ReportCli {
    /// The audit: one file, or a rotated set oldest first (audit.ndjson.2 audit.ndjson.1
    /// audit.ndjson); `-` reads stdin.
    #[arg(value_name = "AUDIT", required = true)]
    pub inputs: Vec<PathBuf>,

    /// Where to write the page.
    #[arg(short, long, value_name = "FILE", default_value = "report.html")]
    pub output: PathBuf,

    /// The page's title (default: the audit's file name).
    #[arg(long)]
    pub title: Option<String>,
}

/// Reads the audit, writes the page; returns a one-line account for stderr.
pub fn run(cli: &ReportCli) -> Result<String> {
    let mut audit: Option<Audit> = None;
    for input in &cli.inputs {
        let reader = reading::open(input)?;
        let name = || format!("reading {}", input.display());
        match audit.as_mut() {
            None => audit = Some(Audit::read(reader).with_context(name)?),
            Some(a) => a.add(reader).with_context(name)?,
        }
    }
    let audit = audit.unwrap_or_default();
    if audit.events.is_empty() {
        return Err(reading::no_events(&cli.inputs[0], audit.lines));
    }
    let title = cli.title.clone().unwrap_or_else(|| {
        cli.inputs[cli.inputs.len() - 1]
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "stdin".into())
    });
    let page = html::render(&audit, &title);
    write_atomically(&cli.output, page.as_bytes())?;
    Ok(format!(
        "wrote {} ({} lines, {} flags, {} alive at the end{})",
        cli.output.display(),
        audit.lines,
        audit.flags.len() as u64 + audit.flags_omitted,
        audit.live.len(),
        match audit.unreadable {
            0 => String::new(),
            n => format!(", {n} unreadable lines skipped"),
        }
    ))
}

/// Writes next to `path` then renames, so a reader never sees half a page.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let write = || -> std::io::Result<()> {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().with_context(|| format!("cannot write {}", path.display()))
}
