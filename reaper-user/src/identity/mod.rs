//! Which process a pid names. A pid is reused as soon as its process is gone (`pid_max` may be
//! 32768, so a day-long run sees every pid many times); a pid and its start time are not. Every
//! place that trusts a pid asks here: the lineage graph (an event about a reused pid is a new
//! process), the leak inspector (a sample is of the process that was flagged), `--kill` (a
//! signal reaches that process or none) and the stop condition (a zombie is still there).
//!
//! Modelled on systemd's `PidRef`: [`ProcessId`] is the pair, [`PidRef::open`] turns it into a
//! handle that cannot be redirected: a pidfd first, the start time checked second. If they
//! match then, the pidfd is that process for good, whatever later happens to the pid.
mod pidfd;

use std::{
    os::unix::fs::MetadataExt,
    path::Path,
    sync::{
        OnceLock,
        atomic::{AtomicBool, Ordering},
    },
};

pub use pidfd::PidFd;

use crate::procfs::{self, Stat};

/// When a process started: exact from the kernel (`CLOCK_BOOTTIME` ns), or in the clock ticks
/// of `/proc/PID/stat` when it was found in /proc before any kernel event named it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Start {
    Exact(u64),
    Ticks(u64),
}

impl Start {
    /// The start in the clock ticks `/proc/PID/stat` shows.
    pub fn ticks(self) -> u64 {
        match self {
            Start::Exact(ns) => boottime_to_ticks(ns),
            Start::Ticks(t) => t,
        }
    }

    /// The start in boot-time ns: exact, or the start of its clock tick.
    pub fn boottime_ns(self) -> u64 {
        match self {
            Start::Exact(ns) => ns,
            Start::Ticks(t) => t * (1_000_000_000 / ticks_per_second().max(1)).max(1),
        }
    }

    /// Whether an exact kernel start time is this start (to the precision this one has).
    pub fn matches_exact(self, ns: u64) -> bool {
        match self {
            Start::Exact(own) => own == ns,
            Start::Ticks(t) => t == boottime_to_ticks(ns),
        }
    }
}

/// `PROC_PID_INIT_INO`: the inode number the kernel fixes for the initial (host's) pid
/// namespace; a namespace created later has another.
const PROC_PID_INIT_INO: u64 = 0xEFFF_FFFC;

/// Set when this process runs in a pid namespace of its own and reads the host's processes in
/// the host's /proc mounted elsewhere (`--proc-root`).
static FOREIGN_PID_NAMESPACE: AtomicBool = AtomicBool::new(false);

/// Whether this process's pid namespace is the host's: then a pid the kernel reports names the
/// same process for `pidfd_open`, signals and this process's own /proc.
pub fn own_pids_are_hosts() -> bool {
    !FOREIGN_PID_NAMESPACE.load(Ordering::Relaxed)
}

/// Checks that the pids the kernel reports (the host's) can be found. In the host's pid
/// namespace, always. In a pid namespace of its own (a container without the host's), only
/// through the host's /proc mounted elsewhere (`proc_root`), and then without pidfds or
/// signals, whose pids are this namespace's ([`own_pids_are_hosts`] says which).
pub fn check_pid_namespace(proc_root: Option<&Path>) -> anyhow::Result<()> {
    let own = std::fs::metadata("/proc/self/ns/pid")
        .map_err(|e| anyhow::anyhow!("reading /proc/self/ns/pid: {e}"))?;
    if own.ino() == PROC_PID_INIT_INO {
        return Ok(());
    }
    let Some(root) = proc_root else {
        anyhow::bail!(
            "reaper-trace runs in a pid namespace of its own (a container without the host's \
             pid namespace): the kernel reports the host's pids, which this namespace's pidfds, \
             signals and /proc do not name. Run it in the host's pid namespace (`docker run \
             --pid=host`, `podman run --pid=host`, Kubernetes `hostPID: true`), or mount the \
             host's /proc and name it with --proc-root"
        );
    };
    // The namespace that /proc's processes are in, as the first of them that may be asked
    // shows it (pid 1 may refuse: `ns` links need ptrace access; pid 2 is the kernel's
    // kthreadd, always in the host's namespace).
    let entries = std::fs::read_dir(root).map_err(|e| {
        anyhow::anyhow!(
            "--proc-root {}: {e} (mount the host's /proc there)",
            root.display()
        )
    })?;
    let pids = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .take(64);
    let ns = pids
        .filter_map(|pid| std::fs::metadata(root.join(format!("{pid}/ns/pid"))).ok())
        .map(|m| m.ino())
        .next();
    match ns {
        Some(PROC_PID_INIT_INO) => {
            FOREIGN_PID_NAMESPACE.store(true, Ordering::Relaxed);
            Ok(())
        }
        Some(_) => anyhow::bail!(
            "--proc-root {}: that /proc is not the host's (its processes are not in the host's \
             pid namespace), so the pids the kernel reports cannot be found there",
            root.display()
        ),
        None => anyhow::bail!(
            "--proc-root {}: no process there shows its pid namespace (mount the host's /proc \
             there, and keep CAP_SYS_PTRACE)",
            root.display()
        ),
    }
}

/// Clock ticks per second of `/proc` start times (USER_HZ), read once.
pub fn ticks_per_second() -> u64 {
    static TICKS: OnceLock<u64> = OnceLock::new();
    *TICKS.get_or_init(|| {
        // SAFETY: sysconf has no memory-safety preconditions.
        let n = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        if n > 0 { n as u64 } else { 100 }
    })
}

/// A kernel `start_boottime` (ns) in the ticks `/proc/PID/stat` shows.
pub fn boottime_to_ticks(ns: u64) -> u64 {
    ns / (1_000_000_000 / ticks_per_second().max(1)).max(1)
}

/// One process for good: a pid and when it started.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ProcessId {
    pub pid: u32,
    pub start: Start,
}

impl ProcessId {
    /// The process `stat` describes, as /proc saw it.
    pub fn of_stat(stat: &Stat) -> ProcessId {
        ProcessId {
            pid: stat.pid,
            start: Start::Ticks(stat.start_ticks),
        }
    }

    /// Whether `stat` (read from /proc) is of this process.
    pub fn matches(&self, stat: &Stat) -> bool {
        stat.pid == self.pid && stat.start_ticks == self.start.ticks()
    }

    /// Its `/proc/PID/stat` while the pid still names this process (alive, or a zombie not yet
    /// reaped); `None` once it is gone or the pid was reused.
    pub fn still_same(&self) -> Option<Stat> {
        procfs::read_stat(self.pid)
            .ok()
            .filter(|stat| self.matches(stat))
    }

    /// Whether the process has exited *and let go of what it held*: the kernel announces a
    /// process's exit before its threads close their files, so a pipe or socket it held can
    /// still be open for a moment after. Settled once it is gone, or a zombie whose threads
    /// have all been released (every one of them is past closing its files then).
    pub fn exit_settled(&self) -> bool {
        self.still_same()
            .is_none_or(|stat| stat.state == b'Z' && stat.threads <= 1)
    }
}

/// Why a [`PidRef`] could not be had.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotOpened {
    /// The process exited: no process has its pid now.
    Gone,
    /// The process exited and its pid names another process now.
    Reused,
    /// Not known: the pidfd or the process's stat could not be had for another reason (out
    /// of fds or memory, a stat not understood).
    Unknown,
    /// Not allowed to open a pidfd for it.
    PermissionDenied,
    /// No pidfd can name it: this process's pid namespace is not the host's.
    ForeignNamespace,
}

/// A verified handle on one process: a pidfd opened first and its process checked second.
pub struct PidRef {
    pub pidfd: PidFd,
}

impl PidRef {
    /// Opens a pidfd for `id.pid`, then checks the start time: on success the pidfd is `id`'s
    /// process for good. Also returns the stat read for the check.
    pub fn open(id: ProcessId) -> Result<(PidRef, Stat), NotOpened> {
        if !own_pids_are_hosts() {
            return Err(NotOpened::ForeignNamespace);
        }
        let pidfd = PidFd::open(id.pid).map_err(|e| match e.raw_os_error() {
            Some(libc::ESRCH) => NotOpened::Gone,
            Some(libc::EPERM | libc::EACCES) => NotOpened::PermissionDenied,
            _ => NotOpened::Unknown,
        })?;
        // The pidfd names the process that had the pid when it was opened; its stat, read
        // after, is that process's if it names the same start.
        let stat = match procfs::read_stat(id.pid) {
            Ok(stat) => stat,
            // Reaped between the two (its pidfd polls readable), or unreadable.
            Err(_) if pidfd.has_exited() => return Err(NotOpened::Gone),
            Err(_) => return Err(NotOpened::Unknown),
        };
        if !id.matches(&stat) {
            return Err(NotOpened::Reused);
        }
        Ok((PidRef { pidfd }, stat))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pid_is_the_same_process_only_with_its_start_time() {
        let me = procfs::read_stat(std::process::id()).unwrap();
        let id = ProcessId::of_stat(&me);
        assert!(id.still_same().is_some());
        let reused = ProcessId {
            start: Start::Ticks(me.start_ticks + 1),
            ..id
        };
        assert!(reused.still_same().is_none(), "same pid, another start");
        assert_eq!(PidRef::open(reused).err(), Some(NotOpened::Reused));
        let (handle, stat) = PidRef::open(id).unwrap();
        assert_eq!(stat.pid, me.pid);
        assert!(std::os::fd::AsRawFd::as_raw_fd(&handle.pidfd) >= 0);
    }

    #[test]
    fn exact_and_tick_starts_agree_to_the_tick() {
        let tick_ns = 1_000_000_000 / ticks_per_second();
        let ns = 12_345 * tick_ns + tick_ns / 2;
        assert_eq!(Start::Exact(ns).ticks(), 12_345);
        assert!(Start::Ticks(12_345).matches_exact(ns));
        assert!(!Start::Ticks(12_346).matches_exact(ns));
        assert!(Start::Exact(ns).matches_exact(ns));
        assert!(!Start::Exact(ns).matches_exact(ns + 1));
    }
}
