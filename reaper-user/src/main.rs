//! `reaper-trace`: see `reaper_user::cli::Cli` for the command line,
//! `reaper_user::report::ReportCli` for `reaper-trace report`, and
//! `reaper_user::api::client::WhyCli` for `reaper-trace why`.
use clap::Parser;
use reaper_user::{api::client::WhyCli, cli::Cli, daemon, exit_status, report};

fn main() {
    // `why` is a word of its own, as `report` is.
    if std::env::args_os().nth(1).is_some_and(|a| a == "why") {
        let args = std::iter::once("reaper-trace why".into()).chain(std::env::args_os().skip(2));
        std::process::exit(why(&WhyCli::parse_from(args)));
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
        match reaper_user::state::pins::mount_bpffs() {
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
        match reaper_user::state::release(dir) {
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

/// `reaper-trace why`: prints the answer; returns the exit status.
fn why(cli: &WhyCli) -> i32 {
    let answer = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|rt| rt.block_on(reaper_user::api::client::why(cli)));
    match answer {
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
