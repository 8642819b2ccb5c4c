//! `deaf`: a pipe it reads has had no writers, or a socket it reads no peer (EOF pending,
//! ignored), for `--idle-after`.
use super::{About, Observed, Reason};

pub const ABOUT: About = About {
    reason: Reason::Deaf,
    killable: true,
    counts_a_kind: false,
    live: Some(rule),
    cleared: |_| "its pipe has a writer again",
    why: |w| {
        let held = w.held();
        format!("a channel it reads has had no other end for {held} (EOF ignored)")
    },
};

fn rule(o: &Observed) -> Option<u64> {
    o.eof_since
        .filter(|&t| o.now.saturating_sub(t) >= o.idle_after)
}

#[cfg(test)]
mod tests {
    use super::super::tests::{SEC, waiting};
    use super::*;

    #[test]
    fn deaf_counts_from_the_last_writer_gone() {
        assert_eq!(
            rule(&waiting(false, 0, Some(90 * SEC), false)),
            Some(90 * SEC)
        );
        assert_eq!(rule(&waiting(false, 0, Some(95 * SEC), false)), None);
        assert_eq!(rule(&waiting(false, 0, None, false)), None);
    }
}
