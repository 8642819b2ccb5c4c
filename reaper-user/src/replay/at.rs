//! `--at TIME`: the moment of an audit a replay stops at, as a person or a tool names it.
use std::time::{Duration, UNIX_EPOCH};

use anyhow::{Context, Result, bail};

/// Runs whose boot-time 0 differ by more than this were on different boots.
const SAME_BOOT: u64 = 1_000_000_000;

/// A moment of an audit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum At {
    /// A wall-clock time, ns since the UNIX epoch: `2026-11-29T14:02:00Z` (UTC).
    Wall(u64),
    /// This long after the audit's first line: `+90s`, `+1h 30m`.
    Since(Duration),
    /// A boot-time ns, as the stream's `ts` and the API's `now` give it.
    Boot(u64),
}

impl std::str::FromStr for At {
    type Err = anyhow::Error;

    fn from_str(text: &str) -> Result<At> {
        let text = text.trim();
        if let Some(after) = text.strip_prefix('+') {
            let span = crate::cli::parse_duration(after).map_err(|e| {
                anyhow::anyhow!("`+{}` is not a time into the audit: {e}", after.trim())
            })?;
            return Ok(At::Since(span));
        }
        if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
            let ns = text
                .parse()
                .with_context(|| format!("{text} is past the largest boot-time ns"))?;
            return Ok(At::Boot(ns));
        }
        let Ok(time) = humantime::parse_rfc3339_weak(text) else {
            bail!(
                "{text:?} is not a time: give a wall-clock time in UTC (`2026-11-29T14:02:00Z`), \
                 a time into the audit (`+90s`), or the stream's boot-time ns (a line's `ts`)"
            );
        };
        let ns = time
            .duration_since(UNIX_EPOCH)
            .map_err(|_| anyhow::anyhow!("{text} is before 1970"))?
            .as_nanos();
        Ok(At::Wall(
            u64::try_from(ns).context("a time past the year 2554")?,
        ))
    }
}

/// What a replay knows of the clocks when it meets a run: the audit's first line and the
/// first run's boot.
#[derive(Clone, Copy, Debug, Default)]
pub struct Clocks {
    /// The audit's first line's `ts`.
    pub first_ts: Option<u64>,
    /// The first run's `booted_at_unix_ns`.
    pub first_boot: Option<u64>,
}

impl At {
    /// The boot-time ns, on the clock of a run whose boot-time 0 was `run_boot` (its
    /// `ready`'s `booted_at_unix_ns`), that this moment is. A boot-time ns given is on the
    /// first run's clock: a run of another boot has it moved by the difference of the boots.
    pub fn on_run_clock(self, clocks: Clocks, run_boot: Option<u64>) -> Result<u64> {
        let first_boot_ns = |ns: u64| match (clocks.first_boot, run_boot) {
            (Some(first), Some(run)) if first.abs_diff(run) > SAME_BOOT => {
                (first + ns).saturating_sub(run)
            }
            _ => ns,
        };
        match self {
            At::Boot(ns) => Ok(first_boot_ns(ns)),
            At::Since(span) => {
                let first = clocks.first_ts.unwrap_or(0);
                let span = u64::try_from(span.as_nanos()).unwrap_or(u64::MAX);
                Ok(first_boot_ns(first.saturating_add(span)))
            }
            At::Wall(wall) => match run_boot {
                Some(boot) => Ok(wall.saturating_sub(boot)),
                None => bail!(
                    "this audit does not say its wall-clock time (its `ready` line has no \
                     `booted_at_unix_ns`: written by an older reaper-trace, or the file begins \
                     mid-run): give --at as a time into the audit (`+90s`) or as the stream's \
                     boot-time ns (a line's `ts`)"
                ),
            },
        }
    }
}

/// `2026-11-29T14:02:03Z` for a wall-clock ns.
pub fn wall_text(unix_ns: u64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_nanos(unix_ns)).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_form_reads_as_its_kind_and_a_bad_one_says_the_forms() {
        assert_eq!(
            "+90s".parse::<At>().unwrap(),
            At::Since(Duration::from_secs(90))
        );
        assert_eq!(
            "+1h 2m".parse::<At>().unwrap(),
            At::Since(Duration::from_secs(3720))
        );
        assert_eq!(
            "81621096371638".parse::<At>().unwrap(),
            At::Boot(81621096371638)
        );
        assert_eq!(
            "1970-01-01T00:00:02Z".parse::<At>().unwrap(),
            At::Wall(2_000_000_000)
        );
        let err = "at noon".parse::<At>().unwrap_err().to_string();
        assert!(err.contains("2026-11-29T14:02:00Z"), "{err}");
        let err = "+soon".parse::<At>().unwrap_err().to_string();
        assert!(err.contains("not a time into the audit"), "{err}");
        let err = "+18446744073709551615s 1000ms".parse::<At>().unwrap_err();
        assert!(err.to_string().contains("too long"), "{err}");
        assert!("99999999999999999999999".parse::<At>().is_err());
    }

    #[test]
    fn a_moment_is_put_on_each_runs_clock() {
        let clocks = Clocks {
            first_ts: Some(100),
            first_boot: Some(50_000_000_000),
        };
        // The same boot: as given.
        let same = Some(50_000_000_001);
        assert_eq!(At::Boot(7).on_run_clock(clocks, same).unwrap(), 7);
        assert_eq!(
            At::Since(Duration::from_nanos(5))
                .on_run_clock(clocks, same)
                .unwrap(),
            105
        );
        // A later boot (10 s later): its clock started 10 s after the first run's.
        let later = Some(60_000_000_000);
        assert_eq!(
            At::Boot(12_000_000_000)
                .on_run_clock(clocks, later)
                .unwrap(),
            2_000_000_000
        );
        assert_eq!(
            At::Wall(61_000_000_000)
                .on_run_clock(clocks, later)
                .unwrap(),
            1_000_000_000
        );
        let err = At::Wall(1).on_run_clock(clocks, None).unwrap_err();
        assert!(err.to_string().contains("booted_at_unix_ns"), "{err}");
        assert_eq!(wall_text(2_000_000_000), "1970-01-01T00:00:02Z");
    }
}
