//! One process's kill sequence, through a pidfd opened and checked against the lineage
//! before any signal: SIGCONT if stopped, SIGTERM, a wait on the pidfd up to the term timeout,
//! SIGKILL, a wait for the exit; each step reported as it is taken.
use std::{
    io,
    time::{Duration, Instant},
};

use tokio::{
    io::{Interest, unix::AsyncFd},
    sync::mpsc,
};

use super::{Cause, KillReport, Outcome};
use crate::identity::{NotOpened, PidFd, PidRef};
use crate::lineage::graph::{Node, NodeId};
use crate::procfs::boottime_now;
use crate::text::Comm;

/// How long after SIGKILL the exit is waited for before the sequence gives up waiting.
const KILL_CONFIRM: Duration = Duration::from_secs(5);

/// A process cleared for signalling: its pidfd is verified to be the graph's process.
pub(super) struct Target {
    pub(super) node: NodeId,
    pub(super) pid: u32,
    pub(super) comm: Comm,
    pub(super) pidfd: PidFd,
    pub(super) stopped: bool,
}

/// A pidfd for `node`'s process, checked to be that process, and whether it is stopped.
pub(super) fn verify(node: &Node) -> Result<(PidFd, bool), Outcome> {
    match PidRef::open(node.process()) {
        // It exited on its own (a wrapper whose child was just killed): nothing to signal.
        Ok((_, stat)) if stat.state == b'Z' => Err(Outcome::Exited),
        Ok((handle, stat)) => Ok((handle.pidfd, matches!(stat.state, b'T' | b't'))),
        Err(NotOpened::PermissionDenied) => Err(Outcome::PermissionDenied),
        // Gone between the pick and the pidfd (the graph has not read its exit yet).
        Err(NotOpened::Gone) => Err(Outcome::Exited),
        Err(NotOpened::Reused | NotOpened::Unknown | NotOpened::ForeignNamespace) => {
            Err(Outcome::IdentityChanged)
        }
    }
}

/// SIGCONT if stopped, SIGTERM, up to `term_timeout` for the exit, SIGKILL, confirm.
pub(super) async fn run_sequence(
    t: Target,
    cause: Cause,
    term_timeout: Duration,
    tx: &mpsc::UnboundedSender<KillReport>,
) {
    let started = Instant::now();
    let report = |signal: &'static str, result: Outcome, done: bool| {
        let _ = tx.send(KillReport {
            node: t.node,
            pid: t.pid,
            comm: t.comm,
            reason: cause.reason,
            asked_by: cause.asked_by,
            signal,
            result,
            secs: done.then(|| started.elapsed().as_secs_f64()),
            at: boottime_now(),
        });
    };
    // `first`: no signal reached it before this one. An exit found then was no kill: it has
    // no duration (see `Killer::note`).
    let send = |signal: i32, name: &'static str, first: bool| -> bool {
        match t.pidfd.send_signal(signal) {
            Ok(()) => {
                report(name, Outcome::Sent, false);
                true
            }
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {
                report(name, Outcome::Exited, !first);
                false
            }
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                report(name, Outcome::PermissionDenied, true);
                false
            }
            Err(_) => {
                report(name, Outcome::IdentityChanged, true);
                false
            }
        }
    };
    if t.stopped && !send(libc::SIGCONT, "SIGCONT", true) {
        return;
    }
    if !send(libc::SIGTERM, "SIGTERM", !t.stopped) {
        return;
    }
    // SAFETY: the AsyncFd owns the pidfd, which stays open and unchanged as long as it does.
    let Ok(exit) = (unsafe { AsyncFd::register_with_interest(t.pidfd, Interest::READABLE) }) else {
        return;
    };
    if tokio::time::timeout(term_timeout, exit.readable())
        .await
        .is_ok()
    {
        report("SIGTERM", Outcome::Exited, true);
        return;
    }
    let send_kill = |fd: &PidFd| fd.send_signal(libc::SIGKILL);
    match send_kill(exit.get_ref()) {
        Ok(()) => report("SIGKILL", Outcome::Sent, false),
        Err(_) => {
            report("SIGKILL", Outcome::Exited, true);
            return;
        }
    }
    if tokio::time::timeout(KILL_CONFIRM, exit.readable())
        .await
        .is_ok()
    {
        report("SIGKILL", Outcome::Exited, true);
    }
}
