//! Writes reaper-trace's man pages and shell completions from its command line, for `cargo
//! xtask dist`: `cargo run -p reaper-user --example docs -- OUT_DIR` makes
//! `OUT_DIR/man/reaper-trace.1`, `OUT_DIR/man/reaper-trace-report.1` and
//! `OUT_DIR/completions/{reaper-trace.bash,_reaper-trace,reaper-trace.fish}`.
//!
//! An example, not a binary: the generators are dev-dependencies and never in reaper-trace.
use std::{fs, path::PathBuf};

use anyhow::{Context, Result};
use clap::CommandFactory;
use clap_complete::Shell;
use reaper_user::docs::{Cli, EventsCli, KillCli, ReportCli, SessionsCli, TopCli, TreeCli, WhyCli};

fn main() -> Result<()> {
    let out = PathBuf::from(std::env::args_os().nth(1).context("usage: docs OUT_DIR")?);
    // `report` and the API's clients (`why`, `tree`, `sessions`, `kill`, `events`, `top`) are parsed apart from the
    // tracer's command line (which ends with any CMD); people meet them as subcommands, so
    // the pages and completions show them so.
    let report = ReportCli::command().name("report");
    let full = Cli::command()
        .subcommand(report.clone())
        .subcommand(WhyCli::command().name("why"))
        .subcommand(TreeCli::command().name("tree"))
        .subcommand(SessionsCli::command().name("sessions"))
        .subcommand(KillCli::command().name("kill"))
        .subcommand(EventsCli::command().name("events"))
        .subcommand(TopCli::command().name("top"));

    let man = out.join("man");
    fs::create_dir_all(&man)?;
    let mut page = Vec::new();
    clap_mangen::Man::new(full.clone()).render(&mut page)?;
    fs::write(man.join("reaper-trace.1"), page)?;
    let mut page = Vec::new();
    clap_mangen::Man::new(report.name("reaper-trace-report")).render(&mut page)?;
    fs::write(man.join("reaper-trace-report.1"), page)?;

    let completions = out.join("completions");
    fs::create_dir_all(&completions)?;
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        clap_complete::generate_to(shell, &mut full.clone(), "reaper-trace", &completions)
            .with_context(|| format!("{shell} completions"))?;
    }
    Ok(())
}
