//! The leak rules, one function each. A rule reads what one look at a server found (a process,
//! or a process and the wrappers it shares a channel with, see [`super::channels`]) and what
//! the inspector remembers of it, and answers whether its flag holds and since when; the
//! inspector decides when to look (see [`super::Inspector`]) and turns the answers into `flag`
//! and `cleared` events. A rule reads no /proc and keeps no state of its own. A channel is a
//! pipe or socket to another process: internal ones count for nothing.
use super::Reason;
use crate::lineage::graph::Node;

/// What the rules see of one live server at one look.
pub struct Observed {
    /// One of its processes holds a channel.
    pub holds_channel: bool,
    /// None of its processes runs, and one waits in a read, poll, select or epoll.
    pub waits_for_input: bool,
    /// One of its channels has its other end open.
    pub has_live_peer: bool,
    /// It is flagged `idle` already. A look that catches it on a CPU or in another system call
    /// (a timer firing) does not clear the flag; only moving data or losing its peer does.
    pub idle_held: bool,
    /// Since when its spawn chain is broken: a process on it (the gateway included) exited,
    /// and that exit has let go of its files.
    pub broken_since: Option<u64>,
    /// `--orphan-grace`, ns.
    pub orphan_grace: u64,
    /// Boot-time ns since when no process of it moved data.
    pub io_since: u64,
    /// Boot-time ns since when a channel it reads has had no other end.
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

/// `orphaned`: its spawn chain broke at least `--orphan-grace` ago and it still holds a
/// channel (it can still be waiting on, or keeping open, a channel of a session that is
/// gone). One that exits within the grace (a server reading EOF when its host crashed) never
/// holds. `Some(now)`: it holds from the look that confirmed it (so `--kill`'s `--grace`
/// counts from the flag, as it always did).
pub fn orphaned(o: &Observed) -> Option<u64> {
    let broke = o.broken_since?;
    (o.holds_channel && o.now.saturating_sub(broke) >= o.orphan_grace).then_some(o.now)
}

/// `idle`: it waits for input on a channel whose other end is open, and moved no data for
/// `--idle-after`.
pub fn idle(o: &Observed) -> Option<u64> {
    let quiet = o.now.saturating_sub(o.io_since) >= o.idle_after;
    let waits = o.waits_for_input || o.idle_held;
    (waits && o.has_live_peer && quiet).then_some(o.io_since)
}

/// `deaf`: a pipe it reads has had no writers, or a socket it reads no peer (EOF pending,
/// ignored), for `--idle-after`.
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
        Reason::Orphaned => "holds no pipe or socket to another process now",
        // The peer going first: a server whose host closed its pipe reads EOF (a read call,
        // so its counters move), but what ended the wait is the peer.
        Reason::Idle if !o.has_live_peer => "no live peer on its channels now",
        Reason::Idle => "moved data",
        Reason::Deaf => "its pipe has a writer again",
        Reason::Zombie | Reason::Respawning => "reaped",
        Reason::Other => "no longer holds",
        Reason::Accumulating => "no more than --max-instances of its kind alive now",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = 1_000_000_000;

    /// A server waiting for input on a channel whose other end is `peer_open`.
    fn waiting(peer_open: bool, io_since: u64, eof_since: Option<u64>, broken: bool) -> Observed {
        Observed {
            holds_channel: true,
            waits_for_input: true,
            has_live_peer: peer_open,
            idle_held: false,
            broken_since: broken.then_some(97 * SEC),
            orphan_grace: 2 * SEC,
            io_since,
            eof_since,
            now: 100 * SEC,
            idle_after: 10 * SEC,
        }
    }

    #[test]
    fn idle_ends_by_its_peer_before_the_eof_read_it_causes() {
        let mut o = waiting(false, 100 * SEC, None, false);
        assert_eq!(
            cleared_because(Reason::Idle, &o),
            "no live peer on its channels now"
        );
        o.has_live_peer = true;
        assert_eq!(cleared_because(Reason::Idle, &o), "moved data");
    }

    #[test]
    fn orphaned_needs_a_broken_chain_and_a_channel() {
        assert_eq!(orphaned(&waiting(true, 0, None, true)), Some(100 * SEC));
        assert_eq!(orphaned(&waiting(true, 0, None, false)), None);
        let only_plumbing = Observed {
            holds_channel: false,
            ..waiting(true, 0, None, true)
        };
        assert_eq!(orphaned(&only_plumbing), None);
    }

    #[test]
    fn a_server_still_exiting_within_the_grace_is_not_orphaned() {
        let just_broken = Observed {
            broken_since: Some(99 * SEC),
            ..waiting(true, 0, None, true)
        };
        assert_eq!(orphaned(&just_broken), None, "broken 1 s ago, grace 2 s");
        let confirmed = Observed {
            now: 101 * SEC,
            ..just_broken
        };
        assert_eq!(
            orphaned(&confirmed),
            Some(101 * SEC),
            "still holding at 2 s"
        );
    }

    #[test]
    fn idle_needs_a_live_peer_and_the_whole_quiet_time() {
        assert_eq!(idle(&waiting(true, 90 * SEC, None, false)), Some(90 * SEC));
        assert_eq!(
            idle(&waiting(true, 91 * SEC, None, false)),
            None,
            "9 s quiet"
        );
        assert_eq!(idle(&waiting(false, 0, None, false)), None, "no peer");
        let busy = Observed {
            waits_for_input: false,
            ..waiting(true, 0, None, false)
        };
        assert_eq!(idle(&busy), None, "running");
        let timer_fired = Observed {
            idle_held: true,
            ..busy
        };
        assert_eq!(
            idle(&timer_fired),
            Some(0),
            "caught on a CPU once it is idle: still idle, it moved no data"
        );
    }

    #[test]
    fn deaf_counts_from_the_last_writer_gone() {
        assert_eq!(
            deaf(&waiting(false, 0, Some(90 * SEC), false)),
            Some(90 * SEC)
        );
        assert_eq!(deaf(&waiting(false, 0, Some(95 * SEC), false)), None);
        assert_eq!(deaf(&waiting(false, 0, None, false)), None);
    }
}
