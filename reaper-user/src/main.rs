//! `reaper-trace`: see `reaper_user::cli::Cli` for the command line.
use clap::Parser;
use reaper_user::{cli::Cli, daemon};

fn main() {
    let cli = Cli::parse();
    if let Err(e) = cli.validate() {
        eprintln!("reaper-trace: error: {e}");
        std::process::exit(daemon::EXIT_USAGE);
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("reaper-trace: error: cannot start the runtime: {e}");
            std::process::exit(daemon::EXIT_FAILURE);
        }
    };
    match runtime.block_on(daemon::run(cli)) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("reaper-trace: error: {e:#}");
            std::process::exit(daemon::EXIT_FAILURE);
        }
    }
}
