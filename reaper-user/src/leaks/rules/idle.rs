//! `idle`: it waits for input on a channel whose other end is open, and moved no data for
//! `--idle-after`.
use super::{About, Observed, Reason};

pub const ABOUT: About = About {
    reason: Reason::Idle,
    killable: true,
    counts_a_kind: false,
    live: Some(rule),
    cleared,
    why: |w| format!("waiting for input, no I/O for {}", w.held()),
};

fn rule(o: &Observed) -> Option<u64> {
    let quiet = o.now.saturating_sub(o.io_since) >= o.idle_after;
    let waits = o.waits_for_input || o.idle_held;
    (waits && o.has_live_peer && quiet).then_some(o.io_since)
}

fn cleared(o: &Observed) -> &'static str {
    // The peer going first: a server whose host closed its pipe reads EOF (a read call, so
    // its counters move), but what ended the wait is the peer.
    match o.has_live_peer {
        false => "no live peer on its channels now",
        true => "moved data",
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{SEC, waiting};
    use super::*;

    #[test]
    fn idle_ends_by_its_peer_before_the_eof_read_it_causes() {
        let mut o = waiting(false, 100 * SEC, None, false);
        assert_eq!(cleared(&o), "no live peer on its channels now");
        o.has_live_peer = true;
        assert_eq!(cleared(&o), "moved data");
    }

    #[test]
    fn idle_needs_a_live_peer_and_the_whole_quiet_time() {
        assert_eq!(rule(&waiting(true, 90 * SEC, None, false)), Some(90 * SEC));
        assert_eq!(
            rule(&waiting(true, 91 * SEC, None, false)),
            None,
            "9 s quiet"
        );
        assert_eq!(rule(&waiting(false, 0, None, false)), None, "no peer");
        let busy = Observed {
            waits_for_input: false,
            ..waiting(true, 0, None, false)
        };
        assert_eq!(rule(&busy), None, "running");
        let timer_fired = Observed {
            idle_held: true,
            ..busy
        };
        assert_eq!(
            rule(&timer_fired),
            Some(0),
            "caught on a CPU once it is idle: still idle, it moved no data"
        );
    }
}
