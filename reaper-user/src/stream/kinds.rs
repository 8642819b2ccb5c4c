//! What the stream says about a kind of event: its wire name, whether it is a lifecycle event
//! (counted in `summary.counts` and `reaper_events_total{kind}`) and whether it is a finding.
//! The rows themselves are [`super::events`]'s table, next to the variants.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize, ser::SerializeMap};

use super::events::{Event, KINDS};

/// The lifecycle events: counted by kind in the summary's `counts` and in the metrics'
/// `reaper_events_total{kind}`, both from [`Event::lifecycle`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lifecycle {
    Fork,
    Exec,
    Exit,
    Reaped,
    Setsid,
    Reparent,
    Snapshot,
}

impl Lifecycle {
    pub const ALL: [Lifecycle; 7] = [
        Lifecycle::Fork,
        Lifecycle::Exec,
        Lifecycle::Exit,
        Lifecycle::Reaped,
        Lifecycle::Setsid,
        Lifecycle::Reparent,
        Lifecycle::Snapshot,
    ];

    /// The event's name (from [`KINDS`]), which is also its key in `counts` and its metric
    /// label.
    pub fn name(self) -> &'static str {
        KINDS
            .iter()
            .find(|k| k.lifecycle == Some(self))
            .map_or("unknown", |k| k.name)
    }
}

/// Counts in the closing summary: one per [`Lifecycle`] kind, an object keyed by its name.
#[derive(Clone, Debug, Default)]
pub struct Counts([u64; Lifecycle::ALL.len()]);

impl Counts {
    /// Counts one event of the stream, if it is a lifecycle event.
    pub fn observe(&mut self, ev: &Event) {
        if let Some(kind) = ev.lifecycle() {
            self.0[kind as usize] += 1;
        }
    }

    pub fn get(&self, kind: Lifecycle) -> u64 {
        self.0[kind as usize]
    }
}

/// Read back: the kinds this build knows (a later build's new kinds are skipped).
impl<'de> Deserialize<'de> for Counts {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let by_name = BTreeMap::<String, u64>::deserialize(d)?;
        let mut counts = Counts::default();
        for kind in Lifecycle::ALL {
            counts.0[kind as usize] = by_name.get(kind.name()).copied().unwrap_or(0);
        }
        Ok(counts)
    }
}

impl Serialize for Counts {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(Lifecycle::ALL.len()))?;
        for kind in Lifecycle::ALL {
            map.serialize_entry(kind.name(), &self.get(kind))?;
        }
        map.end()
    }
}

/// What the stream says about one kind of event, wherever it is asked: its wire name (the
/// `event` field, the report's list of known events), its lifecycle kind (counted in
/// `summary.counts` and `reaper_events_total{kind}`), and whether it is a finding (a
/// readable line under `--check`). Its readable line is its struct's ([`Readable`]).
#[derive(Debug)]
pub struct Kind {
    pub name: &'static str,
    pub lifecycle: Option<Lifecycle>,
    pub finding: bool,
}

pub(super) const fn lifecycle(name: &'static str, kind: Lifecycle) -> Kind {
    Kind {
        name,
        lifecycle: Some(kind),
        finding: false,
    }
}

pub(super) const fn other(name: &'static str, finding: bool) -> Kind {
    Kind {
        name,
        lifecycle: None,
        finding,
    }
}

/// What a person reads for one event: one line (or, for `--check`'s verdict, a line and one
/// per leaked process), every string that came from a process escaped for a terminal; `ts` is
/// the event's time (a flag says how long ago its condition started). Each kind's is beside
/// its struct (`stream/events/*.rs`); the table of kinds requires one.
pub trait Readable {
    fn readable(&self, ts: u64) -> String;
}

impl<T: Readable> Readable for Box<T> {
    fn readable(&self, ts: u64) -> String {
        (**self).readable(ts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_its_own_name_and_every_lifecycle_kind_one_row() {
        let mut names: Vec<&str> = KINDS.iter().map(|k| k.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), KINDS.len(), "a name used twice");
        for kind in Lifecycle::ALL {
            let rows = KINDS.iter().filter(|k| k.lifecycle == Some(kind)).count();
            assert_eq!(rows, 1, "{kind:?}");
            assert_ne!(kind.name(), "unknown");
        }
    }
}
