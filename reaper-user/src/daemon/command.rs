//! The `-- CMD` gateway: started tracked before its first instruction, waited on, and ended
//! like timeout(1) when the run stops first.
use std::{
    ffi::OsString,
    os::fd::AsFd,
    process::{ExitStatus, Stdio},
    time::Duration,
};

use anyhow::{Context, Result};
use reaper_common::Tracked;
use tokio::process::{Child, Command};

use super::descriptors::Inherited;
use super::pipeline::Pipeline;
use crate::lineage::seed::TrackedMap;
use crate::procfs::{self, boottime_now};
use crate::stream::{
    Stamped,
    events::{Event, StopCommand},
};

/// The command reaper-trace started as its gateway (`-- CMD`), if any, and how it ended.
pub(super) struct GatewayCommand {
    pub(super) child: Option<Child>,
    pub(super) status: Option<ExitStatus>,
}

/// Why the event loop stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Stop {
    /// `--duration` passed.
    Duration,
    /// SIGINT or SIGTERM.
    Signal(&'static str),
    /// Every gateway exited and nothing tracked is left (or `--check`'s settle time passed).
    Done,
}

impl Stop {
    /// For the `stop_command` event.
    fn because(self) -> &'static str {
        match self {
            Stop::Duration => "duration",
            Stop::Signal(name) => name,
            Stop::Done => "done",
        }
    }
}

impl GatewayCommand {
    /// Started and not yet reaped.
    pub(super) fn running(&self) -> bool {
        self.child.is_some() && self.status.is_none()
    }

    /// Ends the command because the run stopped: SIGTERM, then SIGKILL after `term_timeout`,
    /// each signal a `stop_command` event. Its exit is its own record in the stream; its
    /// status does not become reaper-trace's (the run ended it).
    pub(super) async fn end(
        &mut self,
        run: &mut Pipeline,
        stop: Stop,
        term_timeout: Duration,
    ) -> Result<()> {
        let Some(child) = self.child.as_mut() else {
            return Ok(());
        };
        // Not reaped yet (only `wait` reaps it), so the pid is still the command's own.
        let Some(pid) = child.id() else {
            return Ok(());
        };
        for (signal, number) in [("SIGTERM", libc::SIGTERM), ("SIGKILL", libc::SIGKILL)] {
            // SAFETY: a plain signal to our own unreaped child.
            unsafe { libc::kill(pid as i32, number) };
            let ev = Event::StopCommand(StopCommand {
                pid,
                signal: signal.into(),
                because: stop.because().into(),
            });
            run.write([Stamped::new(boottime_now(), ev)])?;
            let wait = match number {
                libc::SIGTERM => term_timeout,
                _ => Duration::MAX,
            };
            if let Ok(status) = tokio::time::timeout(wait, child.wait()).await {
                status.context("waiting for the gateway command")?;
                self.child = None;
                return Ok(());
            }
        }
        Ok(())
    }

    /// Its exit status; never, without a command.
    pub(super) async fn wait(&mut self) -> Result<ExitStatus> {
        match self.child.as_mut() {
            Some(c) => c.wait().await.context("waiting for the gateway command"),
            None => std::future::pending().await,
        }
    }
}

/// Starts the gateway command so that it is tracked before its first instruction: reaper-trace
/// tracks itself for the moment of the fork, so the kernel inserts the child at fork time.
pub(super) fn spawn_gateway(
    tracked: &mut TrackedMap,
    argv: &[OsString],
    json: bool,
    limits: Option<Inherited>,
) -> Result<Child> {
    let me = procfs::own_pid();
    tracked
        .insert(me, Tracked { start: 0 }, 0)
        .context("tracking the gateway command")?;
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]);
    if let Some(limits) = limits {
        limits.give_back(&mut cmd);
    }
    if json {
        // Keep stdout for the NDJSON stream.
        let stderr = std::io::stderr().as_fd().try_clone_to_owned()?;
        cmd.stdout(Stdio::from(stderr));
    }
    let spawned = cmd.spawn();
    let _ = tracked.remove(&me);
    spawned.with_context(|| format!("cannot start {:?}", argv[0]))
}

/// The shell convention: the exit code, or 128 + the signal that killed it.
pub(super) fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}
