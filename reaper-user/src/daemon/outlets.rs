//! Where a run's events and answers go: the output (the NDJSON stream to stdout or a file,
//! readable lines, the status line, notes) and the API's socket.
use std::io::Write;

use anyhow::{Context, Result};
use std::os::unix::net::UnixListener;

use crate::api::server::{Access, SocketFile};
use crate::cli::{Api, Cli};
use crate::output::{
    Output,
    lines::WholeLines,
    logfile::{LogFile, Rotation},
    outlet::Outlet,
    status::StatusLine,
};
use crate::procfs;

/// The output `cli` asks for, its times counted from `t0`. Each outlet (stdout, stderr, the
/// file) is one [`Outlet`], written on the caller's thread until [`Output::detach_outlets`].
pub(super) fn output_for(cli: &Cli, t0: u64) -> Result<Output> {
    // `-- CMD` writes to the same stdout and stderr: lines then go out whole, so neither
    // side splits the other's lines.
    let shared = !cli.command.is_empty();
    let outlet = |name: &str, w: Box<dyn Write + Send>| match shared {
        true => Outlet::new(name, Box::new(WholeLines::new(w))),
        false => Outlet::new(name, w),
    };
    // Stdout and stderr on one terminal (the usual interactive run) are written by one
    // thread, through stdout: the status line, wiped before each readable line and drawn
    // after them, then stays in place, as two threads could not keep it.
    let one_terminal = one_terminal();
    let stdout = match one_terminal {
        true => outlet("the terminal", Box::new(std::io::stdout())),
        false => outlet("stdout", Box::new(std::io::stdout())),
    };
    let stderr = match one_terminal {
        true => stdout.handle(),
        false => outlet("stderr", Box::new(std::io::stderr())),
    };
    let mut outlets = vec![stdout.handle()];
    if !one_terminal {
        outlets.push(stderr.handle());
    }
    let mut json: Vec<Box<dyn Write + Send>> = Vec::new();
    if cli.json {
        json.push(Box::new(stdout.handle()));
    }
    if let Some(path) = &cli.output {
        let rotation = cli.rotate_size.map(|size| Rotation {
            size,
            keep: cli.rotate_keep,
        });
        let file = Outlet::new(
            path.display().to_string(),
            Box::new(LogFile::open(path, rotation)?.say_on(Box::new(stderr.handle()))),
        );
        outlets.push(file.handle());
        json.push(Box::new(file));
    }
    let human = match (cli.quiet, cli.json) {
        (true, _) => None,
        (false, true) => Some(Box::new(stderr.handle()) as Box<dyn Write + Send>),
        (false, false) => Some(Box::new(stdout.handle()) as Box<_>),
    };
    let mut out = Output::new(json, human, t0);
    out.set_findings_only(cli.check && !cli.verbose);
    // No status line among the NDJSON lines on one terminal: they are written by a thread of
    // their own, and one would land on the line drawn.
    let json_on_the_terminal = cli.json && one_terminal;
    out.set_status(StatusLine::for_stderr(
        !cli.quiet && !json_on_the_terminal,
        Box::new(stderr.handle()),
    ));
    // Notes are lines of their own on stderr; with `--quiet` too: they are about the audit
    // itself (a checkpoint not written), not events.
    out.set_notes(Some(Box::new(stderr)));
    out.set_outlets(outlets);
    Ok(out)
}

/// Whether stdout and stderr are the same terminal.
fn one_terminal() -> bool {
    use std::io::IsTerminal;
    use std::os::fd::AsFd;
    let (out, err) = (std::io::stdout(), std::io::stderr());
    if !out.is_terminal() || !err.is_terminal() {
        return false;
    }
    let device = |fd| nix::sys::stat::fstat(fd).map(|s| s.st_rdev);
    matches!((device(out.as_fd()), device(err.as_fd())), (Ok(a), Ok(b)) if a == b)
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
