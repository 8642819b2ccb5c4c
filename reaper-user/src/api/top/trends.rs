//! Each kind's count of live instances as `top`'s refreshes saw it over the last minutes,
//! drawn as a row of bars beside the kind.
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use crate::api::KindCount;

/// How far back a kind's trend goes, and in how many columns it is drawn.
const TREND: Duration = Duration::from_secs(300);
const TREND_COLUMNS: usize = 10;

/// Each kind's live instances as the refreshes counted them over the last [`TREND`].
#[derive(Default)]
pub(super) struct Trends(HashMap<String, VecDeque<(Instant, u64)>>);

impl Trends {
    /// Adds a refresh's counts; forgets what is older than [`TREND`].
    pub(super) fn add(&mut self, at: Instant, kinds: &[KindCount]) {
        for k in kinds {
            self.0
                .entry(k.kind.clone())
                .or_default()
                .push_back((at, k.instances));
        }
        self.0.retain(|_, samples| {
            while samples
                .front()
                .is_some_and(|(t, _)| at.duration_since(*t) > TREND)
            {
                samples.pop_front();
            }
            !samples.is_empty()
        });
    }

    /// `kind`'s trend up to `at`: a column each tenth of [`TREND`], oldest first, each the
    /// most instances counted then, in eighths of the most counted in the whole trend; a
    /// blank where nothing was counted.
    pub(super) fn of(&self, kind: &str, at: Instant) -> String {
        let Some(samples) = self.0.get(kind) else {
            return " ".repeat(TREND_COLUMNS);
        };
        let mut columns = [None::<u64>; TREND_COLUMNS];
        for &(t, n) in samples {
            let age = at.saturating_duration_since(t);
            let back = (age.as_secs_f64() / TREND.as_secs_f64() * TREND_COLUMNS as f64) as usize;
            let column = TREND_COLUMNS - 1 - back.min(TREND_COLUMNS - 1);
            columns[column] = Some(columns[column].unwrap_or(0).max(n));
        }
        let most = columns.iter().flatten().copied().max().unwrap_or(0).max(1);
        const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
        columns
            .iter()
            .map(|c| match c {
                Some(n) => BARS[((n * 8).div_ceil(most) as usize).clamp(1, 8) - 1],
                None => ' ',
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counted(kind: &str, instances: u64) -> Vec<KindCount> {
        vec![KindCount {
            kind: kind.into(),
            instances,
        }]
    }

    #[test]
    fn a_kinds_trend_is_a_column_each_half_minute_scaled_to_its_peak() {
        let start = Instant::now();
        let mut trends = Trends::default();
        for (secs, n) in [(0, 2), (60, 4), (150, 8), (299, 8)] {
            trends.add(start + Duration::from_secs(secs), &counted("node", n));
        }
        let end = start + Duration::from_secs(299);
        assert_eq!(trends.of("node", end), "▂ ▄  █   █");
        assert_eq!(trends.of("python", end), " ".repeat(TREND_COLUMNS));
        // Five minutes on, the oldest counts are gone, and a kind counted no more with them.
        trends.add(start + Duration::from_secs(400), &counted("python", 1));
        assert_eq!(trends.0.len(), 2);
        trends.add(start + Duration::from_secs(700), &counted("python", 1));
        assert!(!trends.0.contains_key("node"));
    }
}
