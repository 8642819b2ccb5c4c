//! The kinds that accumulated (`accumulating` flags), as the report shows them: per gateway and
//! kind, its pattern, the most instances seen alive, how many older instances were flagged, and
//! the count of live instances over time (each flag carries the count when it was raised).
use std::collections::BTreeMap;

use crate::stream::events::LeakDetail;

/// At most this many kinds are followed (the rest are counted).
pub const MAX_KINDS: usize = 200;
/// At most this many points are kept per kind: past it, every other one goes.
pub const MAX_POINTS: usize = 512;

/// One kind under one gateway instance.
#[derive(Clone, Debug, Default)]
pub struct Crowd {
    pub gateway: u32,
    pub pattern: String,
    pub exe: String,
    /// The most instances alive at one raise.
    pub peak: u64,
    /// Older instances flagged.
    pub flagged: u64,
    /// (ts, live instances) at each raise, oldest first, thinned past [`MAX_POINTS`].
    pub counts: Vec<(u64, u64)>,
}

/// The kinds that accumulated, by gateway and pattern.
#[derive(Clone, Debug, Default)]
pub struct Crowds {
    pub kinds: BTreeMap<(u32, String), Crowd>,
    pub omitted: u64,
}

impl Crowds {
    /// Takes in an `accumulating` flag raised at `ts`.
    pub fn flag(&mut self, ts: u64, leak: &LeakDetail) {
        let Some(kind) = &leak.kind else {
            return;
        };
        let gateway = leak.lineage.first().copied().unwrap_or(0);
        let key = (gateway, kind.pattern.clone());
        if self.kinds.len() >= MAX_KINDS && !self.kinds.contains_key(&key) {
            self.omitted += 1;
            return;
        }
        let c = self.kinds.entry(key).or_insert_with(|| Crowd {
            gateway,
            pattern: kind.pattern.clone(),
            exe: kind.exe.clone(),
            ..Crowd::default()
        });
        let instances = leak.instances.unwrap_or(0);
        c.peak = c.peak.max(instances);
        c.flagged += 1;
        if c.counts.last().is_some_and(|&(_, n)| n == instances) {
            return; // the same count again: the step plot needs no new point
        }
        c.counts.push((ts, instances));
        if c.counts.len() > MAX_POINTS {
            let mut i = 0;
            c.counts.retain(|_| {
                i += 1;
                i % 2 == 1
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::evidence::KindEvidence;

    fn flag(pattern: &str, instances: u64) -> LeakDetail {
        LeakDetail {
            lineage: vec![7, 8],
            kind: Some(KindEvidence {
                exe: "/bin/srv".into(),
                pattern: pattern.into(),
            }),
            instances: Some(instances),
            ..LeakDetail::default()
        }
    }

    #[test]
    fn a_kind_keeps_its_peak_its_flags_and_a_bounded_count_over_time() {
        let mut c = Crowds::default();
        for n in 0..2000u64 {
            c.flag(n, &flag("srv serve", 9 + n % 7));
        }
        c.flag(5000, &flag("other", 9));
        assert_eq!(c.kinds.len(), 2);
        let serve = &c.kinds[&(7, "srv serve".to_owned())];
        assert_eq!((serve.peak, serve.flagged), (15, 2000));
        assert!(serve.counts.len() <= MAX_POINTS);
        assert!(serve.counts.windows(2).all(|w| w[0].0 < w[1].0));
    }
}
