//! The leak rules, one function each. A rule reads what one look at a process found (and what
//! the inspector remembers of it) and answers whether its flag holds and since when; the
//! inspector decides when to look (see [`super::Inspector`]) and turns the answers into `flag`
//! and `cleared` events. A rule reads no /proc and keeps no state of its own.
use super::{Reason, Sample};
use crate::lineage::graph::Node;

/// What the rules see of one live process at one look.
pub struct Observed<'a> {
    pub sample: &'a Sample,
    /// A process on its spawn chain (the gateway included) has exited.
    pub chain_broken: bool,
    /// Boot-time ns since when its I/O counters have not changed.
    pub io_since: u64,
    /// Boot-time ns since when a pipe it reads has had no writers.
    pub eof_since: Option<u64>,
    pub now: u64,
    /// `--idle-after`, ns.
    pub idle_after: u64,
}

/// A rule: `Some(since)` while its flag holds.
pub type Rule = fn(&Observed) -> Option<u64>;

/// The rules about live processes, in the order their flags are raised.
pub const LIVE: [(Reason, Rule); 3] = [
    (Reason::Orphaned, orphaned),
    (Reason::Idle, idle),
    (Reason::Deaf, deaf),
];

/// `orphaned`: its spawn chain is broken and it still holds a pipe or socket (it can still be
/// waiting on, or keeping open, a channel of a session that is gone).
pub fn orphaned(o: &Observed) -> Option<u64> {
    (o.chain_broken && o.sample.holds_pipe_or_socket()).then_some(o.now)
}

/// `idle`: it waits for input on a pipe or socket whose other end is open, and moved no data
/// for `--idle-after`.
pub fn idle(o: &Observed) -> Option<u64> {
    let quiet = o.now.saturating_sub(o.io_since) >= o.idle_after;
    (o.sample.waits_for_input() && o.sample.has_live_peer() && quiet).then_some(o.io_since)
}

/// `deaf`: a pipe it reads has had no writers (EOF pending, ignored) for `--idle-after`.
pub fn deaf(o: &Observed) -> Option<u64> {
    o.eof_since
        .filter(|&t| o.now.saturating_sub(t) >= o.idle_after)
}

/// `zombie`: it exited and its parent has not reaped it for `after` ns. `Some(exit time)`.
pub fn zombie(node: &Node, now: u64, after: u64) -> Option<u64> {
    let exited = node.exited.map_or(now, |e| e.ts);
    (node.zombie() && now.saturating_sub(exited) >= after).then_some(exited)
}

/// Why the flag `reason` stopped holding for a live process, for the `cleared` event.
pub fn cleared_because(reason: Reason, o: &Observed) -> &'static str {
    match reason {
        Reason::Orphaned => "holds no pipe or socket now",
        Reason::Idle if o.io_since == o.now => "moved data",
        Reason::Idle => "no longer waits for input from a live peer",
        Reason::Deaf => "its pipe has a writer again",
        Reason::Zombie | Reason::Respawning => "reaped",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::leaks::FdFact;
    use crate::procfs::facts::{Blocked, End, FdKind, OpenFd};

    const SEC: u64 = 1_000_000_000;

    fn stdin(end: End, other_end_open: Option<bool>) -> FdFact {
        FdFact {
            fd: OpenFd {
                fd: 0,
                kind: FdKind::Pipe,
                inode: Some(7),
                end,
            },
            other_end_open,
        }
    }

    fn seen(sample: &Sample, io_since: u64, eof_since: Option<u64>, broken: bool) -> Observed<'_> {
        Observed {
            sample,
            chain_broken: broken,
            io_since,
            eof_since,
            now: 100 * SEC,
            idle_after: 10 * SEC,
        }
    }

    fn waiting_reader(other_end_open: Option<bool>) -> Sample {
        Sample {
            pid: 5,
            state: b'S',
            blocked: Some(Blocked::WaitingForInput {
                syscall: 0,
                fd: Some(0),
            }),
            fds: vec![stdin(End::Read, other_end_open)],
            ..Sample::default()
        }
    }

    #[test]
    fn orphaned_needs_a_broken_chain_and_a_channel() {
        let reader = waiting_reader(Some(true));
        assert_eq!(orphaned(&seen(&reader, 0, None, true)), Some(100 * SEC));
        assert_eq!(orphaned(&seen(&reader, 0, None, false)), None);
        let no_fds = Sample::default();
        assert_eq!(orphaned(&seen(&no_fds, 0, None, true)), None);
    }

    #[test]
    fn idle_needs_a_live_peer_and_the_whole_quiet_time() {
        let reader = waiting_reader(Some(true));
        assert_eq!(idle(&seen(&reader, 90 * SEC, None, false)), Some(90 * SEC));
        assert_eq!(
            idle(&seen(&reader, 91 * SEC, None, false)),
            None,
            "9 s quiet"
        );
        let deaf_reader = waiting_reader(Some(false));
        assert_eq!(idle(&seen(&deaf_reader, 0, None, false)), None, "no peer");
    }

    #[test]
    fn deaf_counts_from_the_last_writer_gone() {
        let reader = waiting_reader(Some(false));
        assert_eq!(
            deaf(&seen(&reader, 0, Some(90 * SEC), false)),
            Some(90 * SEC)
        );
        assert_eq!(deaf(&seen(&reader, 0, Some(95 * SEC), false)), None);
        assert_eq!(deaf(&seen(&reader, 0, None, false)), None);
    }
}
