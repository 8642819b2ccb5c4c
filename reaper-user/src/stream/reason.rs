//! Why a process is flagged, as the stream names it: the `reason` of the `flag`, `cleared`
//! and `kill` events. The names are the wire's; what each reason means (its rule, what clears
//! it, the words of its readable line, whether `--kill` may act on it) is its rule's module
//! in `leaks::rules`, whose table holds a row for each variant here (a test of the table
//! says so).
use serde::{Deserialize, Serialize};

/// Why a process is flagged, written by its name (`orphaned`, ...).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    Orphaned,
    Idle,
    Deaf,
    Zombie,
    Respawning,
    Accumulating,
    /// A reason this build does not know, read back from a later build's stream; never
    /// raised (so never written).
    #[default]
    #[serde(other)]
    Other,
}

impl Reason {
    /// Every reason this build raises, in the order the schema and the docs list them.
    pub const ALL: [Reason; 6] = [
        Reason::Orphaned,
        Reason::Idle,
        Reason::Deaf,
        Reason::Zombie,
        Reason::Respawning,
        Reason::Accumulating,
    ];

    /// Its name on the wire and for `--kill-reasons`.
    pub const fn name(self) -> &'static str {
        match self {
            Reason::Orphaned => "orphaned",
            Reason::Idle => "idle",
            Reason::Deaf => "deaf",
            Reason::Zombie => "zombie",
            Reason::Respawning => "respawning",
            Reason::Accumulating => "accumulating",
            Reason::Other => "other",
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reasons_name_is_the_one_serde_writes_and_reads() {
        for reason in Reason::ALL.into_iter().chain([Reason::Other]) {
            let json = serde_json::to_string(&reason).unwrap();
            assert_eq!(json, format!("\"{}\"", reason.name()));
            assert_eq!(serde_json::from_str::<Reason>(&json).unwrap(), reason);
        }
        let later: Reason = serde_json::from_str("\"a_later_builds\"").unwrap();
        assert_eq!(later, Reason::Other);
    }
}
