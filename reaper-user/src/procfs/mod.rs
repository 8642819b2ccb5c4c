//! Reads of `/proc`: only what seeding and resynchronisation need, off the event path, and
//! reaper-trace's own view (its mounts, the kernel release).
//!
//! A process can vanish between any two reads; callers treat `Err` as "gone", never as fatal.
pub mod environ;
pub mod facts;
pub mod placement;
pub mod sockets;

use std::{
    collections::HashMap,
    fs, io,
    path::{Path, PathBuf},
    sync::OnceLock,
};

use crate::text::{Args, Comm};
use crate::untrusted::{self, caps};

/// Fields of `/proc/PID/stat`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stat {
    pub pid: u32,
    pub comm: Comm,
    pub state: u8,
    pub ppid: u32,
    pub pgrp: u32,
    pub session: u32,
    /// The kernel's `PF_*` flags of the task.
    pub flags: u64,
    /// Its threads that have not been released yet (a zombie leader counts itself).
    pub threads: u32,
    /// Start time in clock ticks since boot (`USER_HZ`).
    pub start_ticks: u64,
}

/// The kernel's largest `pid_max` on 64-bit machines (`PID_MAX_LIMIT`): no process has a pid
/// this high; a file that says one (a damaged checkpoint, an odd audit) is wrong.
pub const PID_MAX_LIMIT: u32 = 1 << 22;

/// `PF_KTHREAD`: a kernel thread.
pub const PF_KTHREAD: u64 = 0x0020_0000;

/// Where the processes' /proc is (`--proc-root`; `/proc` by default). Set once at start.
static ROOT: OnceLock<PathBuf> = OnceLock::new();

/// Reads processes' /proc at `root` from now on (the host's /proc mounted in a container).
/// Only the first call counts.
pub fn set_root(root: &Path) {
    let _ = ROOT.set(root.to_owned());
}

/// The /proc the processes are read in.
pub fn root() -> &'static Path {
    ROOT.get().map_or(Path::new("/proc"), PathBuf::as_path)
}

/// `file` of process `pid` in the processes' /proc (see [`root`]).
pub fn proc_path(pid: u32, file: &str) -> PathBuf {
    root().join(pid.to_string()).join(file)
}

/// reaper-trace's own mount table (`/proc/self/mountinfo`: its mount namespace's, whatever
/// `--proc-root` says), for the cgroup v2 mounts and an executable's superblock.
pub fn own_mountinfo() -> io::Result<String> {
    fs::read_to_string("/proc/self/mountinfo")
}

/// The running kernel's release (`6.12.48+deb13-amd64`), or `unknown`.
pub fn kernel_release() -> String {
    fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "unknown".into())
}

/// The kernel's page size in bytes (4096 where the C library cannot say).
pub fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(page).unwrap_or(0).max(4096)
}

/// This process's own pid as the processes' /proc names it (the host's pid, when that /proc
/// is the host's and this process runs in a pid namespace of its own).
pub fn own_pid() -> u32 {
    static OWN: OnceLock<u32> = OnceLock::new();
    *OWN.get_or_init(|| {
        fs::read_link(root().join("self"))
            .ok()
            .and_then(|p| p.to_str()?.parse().ok())
            .unwrap_or_else(std::process::id)
    })
}

/// Parses the text of `/proc/PID/stat`. The comm sits between the first `(` and the *last*
/// `)`: it may itself contain parentheses, spaces and newlines.
pub fn parse_stat(text: &[u8]) -> Option<Stat> {
    let open = text.iter().position(|&b| b == b'(')?;
    let close = text.iter().rposition(|&b| b == b')')?;
    if close < open {
        return None;
    }
    let pid = std::str::from_utf8(&text[..open])
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let comm = Comm::from_c(&text[open + 1..close]);
    let rest = std::str::from_utf8(text.get(close + 1..)?).ok()?;
    // Fields after comm, numbered from 3 (state) as in proc(5).
    let fields: Vec<&str> = rest.split_ascii_whitespace().collect();
    let field = |n: usize| fields.get(n - 3).copied();
    Some(Stat {
        pid,
        comm,
        state: *field(3)?.as_bytes().first()?,
        ppid: field(4)?.parse().ok()?,
        pgrp: field(5)?.parse().ok()?,
        session: field(6)?.parse().ok()?,
        flags: field(9)?.parse().ok()?,
        threads: field(20)?.parse().ok()?,
        start_ticks: field(22)?.parse().ok()?,
    })
}

/// Reads `/proc/PID/stat`.
pub fn read_stat(pid: u32) -> io::Result<Stat> {
    let text = untrusted::read(&proc_path(pid, "stat"), caps::PROC_TEXT)?;
    parse_stat(&text.bytes).ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "bad stat"))
}

/// Reads `/proc/PID/cmdline`: at most `max_args` arguments, and whether any were cut (by
/// number, or by [`caps::ARGS`]).
pub fn read_cmdline(pid: u32, max_args: usize) -> io::Result<(Args, bool)> {
    let block = untrusted::read(&proc_path(pid, "cmdline"), caps::ARGS)?;
    let (args, more) = Args::from_block(&block.bytes, max_args);
    Ok((args, more || block.cut))
}

/// Reads a small text of `/proc/PID` (`status`, `io`, `statm`, `cgroup`, ...), capped at
/// [`caps::PROC_TEXT`].
pub fn read_text(pid: u32, file: &str) -> io::Result<String> {
    untrusted::read_text(&proc_path(pid, file), caps::PROC_TEXT)
}

/// Reads a small file of `/proc/PID` as its bytes, capped at [`caps::PROC_TEXT`].
pub fn read_bytes(pid: u32, file: &str) -> io::Result<untrusted::read::Capped> {
    untrusted::read(&proc_path(pid, file), caps::PROC_TEXT)
}

/// The path of the program `/proc/PID/exe` names (for a process seen first in /proc, whose
/// exec was not seen). None when it is gone or a kernel thread.
pub fn read_exe(pid: u32) -> Option<Vec<u8>> {
    use std::os::unix::ffi::OsStringExt;
    fs::read_link(proc_path(pid, "exe"))
        .ok()
        .map(|p| p.into_os_string().into_vec())
}

/// Every pid in `/proc` right now (thread-group leaders only).
pub fn all_pids() -> io::Result<Vec<u32>> {
    Ok(fs::read_dir(root())?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect())
}

/// `stat` of every process, keyed by pid. Processes that vanish while being read are skipped.
pub fn snapshot_all() -> io::Result<HashMap<u32, Stat>> {
    Ok(all_pids()?
        .into_iter()
        .filter_map(|pid| read_stat(pid).ok().map(|s| (pid, s)))
        .collect())
}

/// `CLOCK_BOOTTIME` now, in ns: the clock of every event's `ts`.
pub fn boottime_now() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The wall-clock time of boot-time 0, ns since the UNIX epoch (`None` with a clock before
/// the epoch): read between two readings of the boot-time clock, so it is off by no more than
/// the time those take.
pub fn booted_at_unix_ns() -> Option<u64> {
    let before = boottime_now();
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_nanos();
    let after = boottime_now();
    let boot = u128::from(before / 2 + after / 2);
    u64::try_from(wall.checked_sub(boot)?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_with_parentheses_and_spaces_in_comm() {
        let text =
            b"4711 (a) (b c)) S 1 4711 4711 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 987654 1000 10";
        let s = parse_stat(text).unwrap();
        assert_eq!(s.pid, 4711);
        assert_eq!(s.comm.as_bytes(), b"a) (b c)");
        assert_eq!((s.state, s.ppid, s.pgrp, s.session), (b'S', 1, 4711, 4711));
        assert_eq!(s.start_ticks, 987654);
    }

    #[test]
    fn stat_truncated_is_rejected_not_panicking() {
        assert_eq!(parse_stat(b"12 (x) S 1"), None);
        assert_eq!(parse_stat(b")("), None);
        assert_eq!(parse_stat(b""), None);
    }

    #[test]
    fn own_process_reads_back() {
        let me = std::process::id();
        let s = read_stat(me).unwrap();
        assert_eq!(s.pid, me);
        let now_ticks = crate::identity::boottime_to_ticks(boottime_now());
        assert!(s.start_ticks <= now_ticks);
    }
}
