//! The leak rules, one module per reason, and the table of them ([`TABLE`]). A reason's module
//! holds all of what it is: the rule that raises its flag, what clears it and the words its
//! `cleared` event says, its readable "why", and whether `--kill` may act on it. Its name is
//! the stream's ([`Reason`], in `stream::reason`: the events name it). Adding a reason is its
//! module, its row in [`TABLE`], its variant of [`Reason`], the schema's `reason` enum, and
//! its rows in docs/leaks.md and the README (tests hold all of them to the table).
//!
//! Each reason judges on its own facts, and its module owns what it keeps of them: `orphaned`,
//! `idle` and `deaf` on one look at a live server (a process, or a process and the wrappers
//! it shares a channel with, see [`super::channels`]: [`Observed`], its row's `live` rule),
//! `orphaned` also on the breaks of spawn chains it waits on (`orphaned::Breaks`); `zombie`
//! on the graph alone, at every round; `accumulating` on a count of each kind's instances
//! kept across looks (`accumulating::Crowds`); `respawning` on what the killer found
//! (`respawning::Respawners`). The inspector only schedules the looks (whom to sample, and
//! when: see [`super::Inspector`]) and holds the flags ([`super::held::HeldFlags`]). No rule
//! reads /proc. A channel is a pipe or socket to another process: internal ones count for
//! nothing.
use crate::stream::events::LeakDetail;
pub use crate::stream::reason::Reason;

pub mod accumulating;
mod deaf;
mod idle;
pub mod line;
pub mod orphaned;
pub mod respawning;
pub mod zombie;

/// What a reason is (each reason's module has one: its `ABOUT`).
pub struct About {
    pub reason: Reason,
    /// Whether `--kill` may act on it (`--kill-reasons` may name it).
    pub killable: bool,
    /// Whether its flags name a kind and how many of it are alive (a crowd): the readable
    /// lines fold one scan's flags of one kind into one line, and the report draws each
    /// kind's count over time.
    pub counts_a_kind: bool,
    /// The rule a look at a live server applies, for the reasons that are one.
    pub live: Option<Rule>,
    /// Why its flag stopped holding for a process still alive (the `cleared` event's
    /// `because`).
    pub cleared: fn(&Observed) -> &'static str,
    /// Why it was flagged, for the readable line.
    pub why: fn(&Why) -> String,
}

/// Every reason, in the order the stream's schema and the docs list them.
pub const TABLE: [&About; 6] = [
    &orphaned::ABOUT,
    &idle::ABOUT,
    &deaf::ABOUT,
    &zombie::ABOUT,
    &respawning::ABOUT,
    &accumulating::ABOUT,
];

/// What the rules say of a reason (its row of [`TABLE`]).
pub trait Rules {
    /// Its row of [`TABLE`] (none for [`Reason::Other`]).
    fn about(self) -> Option<&'static About>;

    /// Whether its flags name a crowd (see [`About::counts_a_kind`]).
    fn counts_a_kind(self) -> bool;

    /// Why its flag stopped holding for a process still alive, as seen in `o`.
    fn cleared_because(self, o: &Observed) -> &'static str;

    /// Why it was flagged, for the readable line.
    fn why(self, why: &Why) -> String;
}

impl Rules for Reason {
    fn about(self) -> Option<&'static About> {
        TABLE.iter().copied().find(|a| a.reason == self)
    }

    fn counts_a_kind(self) -> bool {
        self.about().is_some_and(|a| a.counts_a_kind)
    }

    fn cleared_because(self, o: &Observed) -> &'static str {
        self.about().map_or("no longer holds", |a| (a.cleared)(o))
    }

    fn why(self, why: &Why) -> String {
        self.about()
            .map_or_else(|| self.name().to_owned(), |a| (a.why)(why))
    }
}

/// A `--kill-reasons` name: the rules a kill may follow (zombies cannot be killed).
pub fn killable(name: &str) -> Option<Reason> {
    TABLE
        .iter()
        .find(|a| a.killable && a.reason.name() == name)
        .map(|a| a.reason)
}

/// The `--kill-reasons` names, for a message.
pub fn killable_names() -> Vec<&'static str> {
    TABLE
        .iter()
        .filter(|a| a.killable)
        .map(|a| a.reason.name())
        .collect()
}

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

/// A rule about a live server: `Some(since)` while its flag holds.
pub type Rule = fn(&Observed) -> Option<u64>;

/// The rules about live servers, in the order their flags are raised.
pub fn live() -> impl Iterator<Item = (Reason, Rule)> {
    TABLE.iter().filter_map(|a| Some((a.reason, a.live?)))
}

/// What a flag's readable "why" is told from: the flag raised at `ts`, holding since `since`.
pub struct Why<'a> {
    pub ts: u64,
    pub since: u64,
    pub detail: &'a LeakDetail,
}

impl Why<'_> {
    /// How long the flag's condition has held, for people.
    fn held(&self) -> String {
        crate::stream::words::human_duration(self.ts.saturating_sub(self.since))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub const SEC: u64 = 1_000_000_000;

    /// A server waiting for input on a channel whose other end is `peer_open`.
    pub fn waiting(
        peer_open: bool,
        io_since: u64,
        eof_since: Option<u64>,
        broken: bool,
    ) -> Observed {
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
    fn the_table_holds_each_reason_once_in_the_order_of_all() {
        let listed: Vec<Reason> = TABLE.iter().map(|a| a.reason).collect();
        assert_eq!(listed, Reason::ALL);
        for reason in Reason::ALL {
            assert_eq!(reason.about().unwrap().reason, reason);
        }
        assert!(Reason::Other.about().is_none());
        let live: Vec<Reason> = live().map(|(r, _)| r).collect();
        assert_eq!(live, [Reason::Orphaned, Reason::Idle, Reason::Deaf]);
    }

    #[test]
    fn kill_reasons_are_the_killable_rows() {
        let names: Vec<&str> = TABLE
            .iter()
            .filter_map(|a| killable(a.reason.name()).map(Reason::name))
            .collect();
        assert_eq!(names, ["orphaned", "idle", "deaf", "accumulating"]);
        assert_eq!(killable("zombie"), None);
    }
}
