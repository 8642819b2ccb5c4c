//! The reader's slice: how long the scheduler lets it run before another task may take the
//! CPU, and so how soon a record's wake-up puts it on one.
//!
//! Under EEVDF (Linux 6.6 and later) a task woken runs at once only when its virtual deadline
//! comes before the running task's; the deadline is its eligible time plus its slice. With
//! the default slice (0.75 ms times 1 + log2 of the CPUs, at most 8 counted), one wake-up of
//! the reader in 35 waited behind the traced workload itself (`sh`, `true`, `sleep` measured
//! as what ran while it waited) or a kernel thread for over 1 ms, up to 16 ms, while a
//! round's looks kept the other core busy.
//! A shorter slice (`sched_attr.sched_runtime` of a SCHED_OTHER task, Linux 6.12 and later)
//! gives the reader earlier deadlines, not a larger share of the CPU: its weight, and so what
//! it may take from the processes it watches in a storm, is unchanged. An older kernel
//! ignores the field for SCHED_OTHER.

/// The slice asked for: the scheduler's least.
const SLICE_NS: u64 = 100_000;

/// Asks the scheduler for a short slice for the calling thread (the reader's, once), not for
/// the threads it starts; a refusal is said on stderr and the run goes on with the default.
pub(super) fn ask_short_slice() {
    let attr = libc::sched_attr {
        size: std::mem::size_of::<libc::sched_attr>() as u32,
        sched_policy: libc::SCHED_OTHER as u32,
        // What this thread starts later (the checkpoints' writer) starts with the default.
        sched_flags: libc::SCHED_FLAG_RESET_ON_FORK as u64,
        sched_nice: current_nice(),
        sched_priority: 0,
        sched_runtime: SLICE_NS,
        sched_deadline: 0,
        sched_period: 0,
    };
    // SAFETY: sched_setattr(2) on the calling thread (tid 0) with an attr of the size it says.
    let done = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &attr, 0) };
    if done != 0 {
        eprintln!(
            "reaper-trace: the reader's short slice was refused ({}); it runs with the default",
            std::io::Error::last_os_error()
        );
    }
}

/// The calling thread's nice value, kept as it is (sched_setattr sets every field).
fn current_nice() -> i32 {
    // SAFETY: getpriority(2) of the calling thread; errno is cleared first, as -1 is a
    // valid nice value.
    unsafe {
        *libc::__errno_location() = 0;
        let nice = libc::getpriority(libc::PRIO_PROCESS, 0);
        if *libc::__errno_location() != 0 {
            0
        } else {
            nice
        }
    }
}
