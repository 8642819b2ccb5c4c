//! `respawning`: with `--kill`, it forked a child with the same argv again after its child was
//! killed. Raised by the killer (see `crate::kill`), not by a look: held until it exits.
use super::{About, Reason};

pub const ABOUT: About = About {
    reason: Reason::Respawning,
    killable: false,
    counts_a_kind: false,
    live: None,
    // Never cleared by a look: its flag goes with its exit.
    cleared: |_| "exited",
    why: |_| "respawning".to_owned(),
};
