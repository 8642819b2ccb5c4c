//! Least privilege once the probes are attached: reaper-trace runs as root for days, so what it
//! no longer needs, it gives up.
//!
//! Loading and attaching needed CAP_BPF and CAP_PERFMON, and CAP_SYS_ADMIN only to mount
//! tracefs or to open the setsid tracepoint where `perf_event_paranoid` is 3 (Debian's)
//! (kernels from 5.11 charge BPF memory to the cgroup, not to RLIMIT_MEMLOCK, so no
//! CAP_SYS_RESOURCE); from then on the maps and the ring are used through fds it already holds,
//! which needs no capability. What stays: CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH (reading other
//! users' /proc/PID/fd, fdinfo, io and syscall, and `pidfd_getfd`), and CAP_KILL with `--kill`
//! or while the API is served (root may ask it to end another user's process).
//! Everything else leaves the effective, permitted, inheritable, ambient and bounding sets, and
//! no_new_privs is set, so nothing it could ever exec regains privileges. A bounding set can
//! only be narrowed with CAP_SETPCAP: a service manager that started it with a bounding set
//! of its own and without that capability (the package's unit) keeps the set as it gave it,
//! which no_new_privs and the emptied other sets make moot; so does one that refuses it (a
//! seccomp filter, an LSM), and the rest is given up all the same.
use anyhow::{Context, Result, bail};
use caps::{CapSet, Capability, CapsHashSet};

/// The capabilities kept after attach.
pub fn runtime_needs(kill: bool) -> CapsHashSet {
    let mut keep: CapsHashSet = [Capability::CAP_SYS_PTRACE, Capability::CAP_DAC_READ_SEARCH]
        .into_iter()
        .collect();
    if kill {
        keep.insert(Capability::CAP_KILL);
    }
    keep
}

/// Drops every capability but `keep` from this process and sets no_new_privs. Capabilities
/// belong to threads: this must run while the process has one thread. Returns why the
/// bounding set could not be narrowed, when it was refused: everything else was dropped.
pub fn drop_all_but(keep: &CapsHashSet) -> Result<Option<anyhow::Error>> {
    let threads = std::fs::read_dir("/proc/self/task")
        .map(|d| d.count())
        .unwrap_or(1);
    if threads != 1 {
        bail!("dropping privileges with {threads} threads would leave some privileged");
    }
    // The bounding set first: dropping from it needs CAP_SETPCAP, which goes next. Without
    // it, the set is the one the service manager chose (see the module's doc).
    let narrows = caps::has_cap(None, CapSet::Effective, Capability::CAP_SETPCAP)
        .context("reading the effective capabilities")?;
    let refused = match narrows {
        true => narrow_bounding(keep).err(),
        false => None,
    };
    caps::clear(None, CapSet::Ambient).context("clearing the ambient capabilities")?;
    caps::clear(None, CapSet::Inheritable).context("clearing the inheritable capabilities")?;
    let permitted = caps::read(None, CapSet::Permitted).context("reading capabilities")?;
    let kept: CapsHashSet = keep.intersection(&permitted).copied().collect();
    caps::set(None, CapSet::Effective, &kept).context("setting the effective capabilities")?;
    caps::set(None, CapSet::Permitted, &kept).context("setting the permitted capabilities")?;
    // SAFETY: plain prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        bail!("setting no_new_privs: {}", std::io::Error::last_os_error());
    }
    Ok(refused)
}

/// Drops every capability but `keep` from the bounding set, each tried (a refusal of one,
/// an LSM's, leaves the others dropped); an error names those refused.
fn narrow_bounding(keep: &CapsHashSet) -> Result<()> {
    let mut refused = Vec::new();
    let mut first = None;
    for cap in caps::all() {
        if !keep.contains(&cap)
            && caps::has_cap(None, CapSet::Bounding, cap).unwrap_or(false)
            && let Err(e) = caps::drop(None, CapSet::Bounding, cap)
        {
            refused.push(cap.to_string());
            first.get_or_insert(e);
        }
    }
    let Some(e) = first else {
        return Ok(());
    };
    refused.sort();
    let what = format!("dropping {} from the bounding set", refused.join(", "));
    Err(anyhow::Error::new(e).context(what))
}
