//! `reaper-trace`'s command line, word by word: the tracer (see [`crate::cli::Cli`]), and the
//! words of its own: `report` ([`crate::report::ReportCli`]), `why`, `tree`, `sessions`,
//! `kill`, `events` ([`crate::api::client`]) and `top` ([`crate::api::top`]).
use std::future::Future;

use clap::Parser;

use crate::api::client::{self, EventsCli, KillCli, SessionsCli, TreeCli, WhyCli};
use crate::api::top::{self, TopCli};
use crate::{cli::Cli, daemon, exit_status, report};

/// `reaper-trace`: the tracer, or one of its words.
pub fn main() {
    // `why` and `tree` are words of their own, as `report` is.
    let word = std::env::args_os().nth(1);
    let rest = |name: &str| std::iter::once(name.into()).chain(std::env::args_os().skip(2));
    if word.as_ref().is_some_and(|a| a == "why") {
        let cli = WhyCli::parse_from(rest("reaper-trace why"));
        std::process::exit(ask(client::why(&cli)));
    }
    if word.as_ref().is_some_and(|a| a == "tree") {
        let cli = TreeCli::parse_from(rest("reaper-trace tree"));
        std::process::exit(ask(client::tree(&cli)));
    }
    if word.as_ref().is_some_and(|a| a == "sessions") {
        let cli = SessionsCli::parse_from(rest("reaper-trace sessions"));
        std::process::exit(ask(client::sessions(&cli)));
    }
    if word.as_ref().is_some_and(|a| a == "kill") {
        let cli = KillCli::parse_from(rest("reaper-trace kill"));
        std::process::exit(ask(client::kill(&cli)));
    }
    if word.as_ref().is_some_and(|a| a == "top") {
        let cli = TopCli::parse_from(rest("reaper-trace top"));
        std::process::exit(on_runtime(top::top(&cli)).unwrap_or_else(|e| {
            eprintln!("reaper-trace: error: {e:#}");
            exit_status::FAILURE
        }));
    }
    if word.as_ref().is_some_and(|a| a == "events") {
        let cli = EventsCli::parse_from(rest("reaper-trace events"));
        std::process::exit(on_runtime(client::events(&cli)).unwrap_or_else(|e| {
            eprintln!("reaper-trace: error: {e:#}");
            exit_status::FAILURE
        }));
    }
    // `report` is a word of its own: the tracer's command line ends with an arbitrary CMD.
    if std::env::args_os().nth(1).is_some_and(|a| a == "report") {
        let args = std::iter::once("reaper-trace report".into()).chain(std::env::args_os().skip(2));
        let cli = report::ReportCli::parse_from(args);
        match report::run(&cli) {
            Ok(account) => {
                eprintln!("reaper-trace: {account}");
                return;
            }
            Err(e) => {
                eprintln!("reaper-trace: error: {e:#}");
                std::process::exit(exit_status::FAILURE);
            }
        }
    }
    let cli = Cli::parse();
    if let Err(e) = cli.validate() {
        eprintln!("reaper-trace: error: {e}");
        std::process::exit(exit_status::USAGE);
    }
    if cli.mount_bpffs {
        match crate::capture::pins::mount_bpffs() {
            Ok(Some(note)) => eprintln!("reaper-trace: {note}"),
            Ok(None) => eprintln!("reaper-trace: bpffs is already mounted at /sys/fs/bpf"),
            Err(e) => {
                eprintln!("reaper-trace: error: {e:#}");
                std::process::exit(exit_status::FAILURE);
            }
        }
        return;
    }
    if let Some(dir) = &cli.release_state {
        match crate::state::release(dir) {
            Ok(removed) => {
                eprintln!("reaper-trace: removed {removed}");
                return;
            }
            Err(e) => {
                eprintln!("reaper-trace: error: {e:#}");
                std::process::exit(exit_status::FAILURE);
            }
        }
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("reaper-trace: error: cannot start the runtime: {e}");
            std::process::exit(exit_status::FAILURE);
        }
    };
    match runtime.block_on(daemon::run(cli)) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("reaper-trace: error: {e:#}");
            std::process::exit(exit_status::FAILURE);
        }
    }
}

/// Runs a client's `future` to its end.
fn on_runtime<T>(future: impl Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|rt| rt.block_on(future))
}

/// A client of the running audits (`why`, `tree`): prints the answer; returns the exit
/// status.
fn ask(question: impl Future<Output = anyhow::Result<(String, i32)>>) -> i32 {
    match on_runtime(question) {
        Ok((text, code)) => {
            println!("{text}");
            code
        }
        Err(e) => {
            eprintln!("reaper-trace: error: {e:#}");
            exit_status::FAILURE
        }
    }
}
