//! Where a run's events and answers go: the output (the NDJSON stream to stdout or a file,
//! readable lines, the status line, notes) and the API's socket.
use std::io::{BufWriter, Write};

use anyhow::{Context, Result};
use tokio::net::UnixListener;

use crate::api::server::{Access, SocketFile};
use crate::cli::{Api, Cli};
use crate::output::{
    Output,
    lines::WholeLines,
    logfile::{LogFile, Rotation},
    status::StatusLine,
};
use crate::procfs;

/// The output `cli` asks for, its times counted from `t0`.
pub(super) fn output_for(cli: &Cli, t0: u64) -> Result<Output> {
    let stdout =
        || Box::new(BufWriter::with_capacity(64 << 10, std::io::stdout())) as Box<dyn Write + Send>;
    let stderr =
        || Box::new(BufWriter::with_capacity(64 << 10, std::io::stderr())) as Box<dyn Write + Send>;
    let mut json = Vec::new();
    if cli.json {
        json.push(stdout());
    }
    if let Some(path) = &cli.output {
        let rotation = cli.rotate_size.map(|size| Rotation {
            size,
            keep: cli.rotate_keep,
        });
        json.push(Box::new(LogFile::open(path, rotation)?) as Box<dyn Write + Send>);
    }
    // `-- CMD` writes to the same stdout and stderr: readable lines then go out whole, so
    // neither side splits the other's lines.
    let shared = !cli.command.is_empty();
    let human = match (cli.quiet, cli.json, shared) {
        (true, _, _) => None,
        (false, true, false) => Some(stderr()),
        (false, false, false) => Some(stdout()),
        (false, true, true) => Some(Box::new(WholeLines::new(std::io::stderr())) as Box<_>),
        (false, false, true) => Some(Box::new(WholeLines::new(std::io::stdout())) as Box<_>),
    };
    let mut out = Output::new(json, human, t0);
    out.set_findings_only(cli.check && !cli.verbose);
    out.set_status(StatusLine::for_stderr(!cli.quiet));
    // Notes are lines of their own on stderr, whole (`-- CMD` may write there too); with
    // `--quiet` too: they are about the audit itself (a checkpoint not written), not events.
    out.set_notes(Some(Box::new(WholeLines::new(std::io::stderr()))));
    Ok(out)
}

/// Questions of the API waiting for the event loop; a client past them waits its turn.
pub(super) const API_QUEUE: usize = 16;

/// Binds `--api`'s socket (given to `--api-group`): `auto`'s failure is a note (the run goes
/// on without it), a socket asked for by path that cannot be made fails the run.
pub(super) fn api_socket(
    cli: &Cli,
    output: &mut Output,
) -> Result<Option<(UnixListener, SocketFile)>> {
    let access = Access {
        group: cli.api_group,
    };
    match &cli.api {
        Api::Off => Ok(None),
        Api::At(path) => Ok(Some(
            crate::api::server::bind(path, access)
                .with_context(|| format!("--api {}", path.display()))?,
        )),
        Api::Auto => {
            let path = crate::api::default_path(procfs::own_pid());
            let gone = crate::api::sockets::remove_dead(&path);
            if !gone.is_empty() {
                let names: Vec<String> = gone.iter().map(|p| p.display().to_string()).collect();
                let note = format!(
                    "removed the sockets of runs that are gone: {}",
                    names.join(", ")
                );
                output.note(&note)?;
            }
            match crate::api::server::bind(&path, access) {
                Ok(bound) => Ok(Some(bound)),
                Err(e) => {
                    output.note(&format!("no API socket: {e:#} (--api PATH or --api off)"))?;
                    Ok(None)
                }
            }
        }
    }
}
