//! Prometheus metrics: counters fed by the event stream itself (so they always agree with it)
//! and gauges set from what each leak scan found. `--metrics ADDR` serves them.
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::{
    counter::Counter, family::Family, gauge::Gauge, histogram::Histogram,
};
use prometheus_client::registry::{Registry, Unit};

use crate::leaks::Reason;
use crate::stream::events::{Event, Flag, Lifecycle, Lost, Name};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: Name,
}

/// A kind of process (`accumulating`), by its instances' command-line pattern.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PatternLabel {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KillLabel {
    reason: Name,
    result: Name,
}

/// Every metric, as handles onto the registry's atomics: updating one is an atomic add.
pub struct Metrics {
    registry: Arc<Registry>,
    events: [Counter; Lifecycle::ALL.len()],
    lost: Counter,
    flags: Family<ReasonLabel, Counter>,
    kills: Family<KillLabel, Counter>,
    flagged: Family<ReasonLabel, Gauge>,
    alive: Gauge,
    gateways: Gauge,
    zombies: Gauge,
    graph_nodes: Gauge,
    flagged_rss: Gauge,
    kind_instances: Family<PatternLabel, Gauge>,
    scan_seconds: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut reg = Registry::with_prefix("reaper");
        let events_family = Family::<KindLabel, Counter>::default();
        reg.register(
            "events",
            "Lifecycle events in the stream, by kind",
            events_family.clone(),
        );
        let events = Lifecycle::ALL.map(|kind| {
            let label = KindLabel { kind: kind.name() };
            events_family.get_or_create(&label).clone()
        });
        let lost = Counter::default();
        reg.register(
            "events_lost",
            "Kernel records lost (ring full) or children not followed (tracked map full)",
            lost.clone(),
        );
        let flags = Family::<ReasonLabel, Counter>::default();
        reg.register("flags", "Leak flags raised, by reason", flags.clone());
        let kills = Family::<KillLabel, Counter>::default();
        reg.register(
            "kills",
            "Steps of --kill sequences, by reason and result",
            kills.clone(),
        );
        let flagged = Family::<ReasonLabel, Gauge>::default();
        reg.register(
            "flagged",
            "Leak flags holding now, by reason",
            flagged.clone(),
        );
        for r in Reason::ALL {
            // Every reason shows, at 0 until it happens: a missing series is not a zero.
            let label = ReasonLabel {
                reason: r.name().into(),
            };
            let _ = flags.get_or_create(&label);
            let _ = flagged.get_or_create(&label);
        }
        let alive = Gauge::default();
        reg.register(
            "descendants_alive",
            "Tracked processes alive now, gateways included",
            alive.clone(),
        );
        let gateways = Gauge::default();
        reg.register(
            "gateways_alive",
            "Gateway instances alive now (each restart is a new instance)",
            gateways.clone(),
        );
        let zombies = Gauge::default();
        reg.register(
            "descendants_zombie",
            "Tracked processes exited and not yet reaped",
            zombies.clone(),
        );
        let graph_nodes = Gauge::default();
        reg.register(
            "graph_nodes",
            "Processes held in the lineage graph (alive, and dead ones kept for lineage)",
            graph_nodes.clone(),
        );
        let flagged_rss = Gauge::default();
        reg.register_with_unit(
            "flagged_resident",
            "Resident memory of the flagged live processes",
            Unit::Bytes,
            flagged_rss.clone(),
        );
        let kind_instances = Family::<PatternLabel, Gauge>::default();
        reg.register(
            "kind_instances",
            "Live instances of the kinds with the most under one gateway instance (the top \
             kinds; `other` is the most of any other kind)",
            kind_instances.clone(),
        );
        let scan_seconds = Histogram::new([
            0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
        ]);
        reg.register_with_unit(
            "scan_duration",
            "Time one leak-inspector round took",
            Unit::Seconds,
            scan_seconds.clone(),
        );
        Metrics {
            registry: Arc::new(reg),
            events,
            lost,
            flags,
            kills,
            flagged,
            alive,
            gateways,
            zombies,
            graph_nodes,
            flagged_rss,
            kind_instances,
            scan_seconds,
        }
    }

    /// Counts one event of the stream.
    pub fn observe(&self, ev: &Event) {
        if let Some(kind) = ev.lifecycle() {
            self.events[kind as usize].inc();
        }
        match ev {
            Event::Lost(Lost { count, .. }) => {
                self.lost.inc_by(*count);
            }
            Event::Flag(Flag { reason, .. }) => {
                let label = ReasonLabel {
                    reason: reason.name().into(),
                };
                self.flags.get_or_create(&label).inc();
            }
            Event::Kill(kill) => {
                let label = KillLabel {
                    reason: kill.cause().into(),
                    result: kill.result.clone(),
                };
                self.kills.get_or_create(&label).inc();
            }
            _ => {}
        }
    }

    /// Sets the gauges after a leak scan.
    pub fn set_state(&self, state: &ScanState) {
        self.alive.set(state.alive as i64);
        self.gateways.set(state.gateways as i64);
        self.zombies.set(state.zombies as i64);
        self.graph_nodes.set(state.graph_nodes as i64);
        // The memory first: a scrape between the two finds the new flags' memory with the
        // flags before them, never the new flags with the memory before them.
        self.flagged_rss.set(
            state
                .flagged_rss_kib
                .saturating_mul(1024)
                .min(i64::MAX as u64) as i64,
        );
        for (reason, n) in &state.flagged {
            self.flagged
                .get_or_create(&ReasonLabel {
                    reason: (*reason).into(),
                })
                .set(*n as i64);
        }
        if let Some(kinds) = &state.kinds {
            // Kinds come and go: the family holds only those of the last count.
            self.kind_instances.clear();
            for (kind, n) in kinds {
                self.kind_instances
                    .get_or_create(&PatternLabel { kind: kind.clone() })
                    .set(*n as i64);
            }
        }
        self.scan_seconds.observe(state.took.as_secs_f64());
    }

    /// What the one-line status shows.
    pub fn status(&self) -> StatusCounts {
        StatusCounts {
            alive: self.alive.get().max(0) as u64,
            events: self.events.iter().map(Counter::get).sum(),
            flagged: self.flagged_total(),
            lost: self.lost.get(),
        }
    }

    fn flagged_total(&self) -> u64 {
        Reason::ALL
            .iter()
            .map(|r| {
                let label = ReasonLabel {
                    reason: r.name().into(),
                };
                self.flagged.get_or_create(&label).get().max(0) as u64
            })
            .sum()
    }

    /// The registry, for the `/metrics` server.
    pub fn registry(&self) -> Arc<Registry> {
        self.registry.clone()
    }
}

/// Renders a registry in the OpenMetrics text format.
pub fn encode(registry: &Registry) -> String {
    let mut text = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut text, registry);
    text
}

/// The same exposition in the Prometheus text format (0.0.4), for a client that does not ask
/// for OpenMetrics (`curl`, `promtool check metrics`, older scrapers): a counter family's
/// `HELP`/`TYPE` lines name its `_total` samples, and OpenMetrics' `UNIT` and `EOF` lines go.
pub fn to_prometheus_text(openmetrics: &str) -> String {
    let counters: Vec<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|kind| {
            let rest = line.strip_prefix(kind)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .contains(&name)
                .then(|| format!("{kind}{name}_total {tail}"))
        });
        out.push_str(renamed.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

/// What a leak scan found, for the gauges: the graph's counts and the flags holding now.
#[derive(Clone, Debug, Default)]
pub struct ScanState {
    pub alive: usize,
    /// Gateway instances alive.
    pub gateways: usize,
    pub zombies: usize,
    pub graph_nodes: usize,
    /// Flags holding, by reason.
    pub flagged: BTreeMap<&'static str, u64>,
    /// Resident memory of the flagged live processes.
    pub flagged_rss_kib: u64,
    /// Live instances of the kinds with the most, when the scan counted them anew (see
    /// `Inspector::kinds`).
    pub kinds: Option<Vec<(String, u64)>>,
    /// How long the scan took.
    pub took: Duration,
}

/// The counts behind the terminal's status line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatusCounts {
    pub alive: u64,
    pub events: u64,
    pub flagged: u64,
    pub lost: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::events::{Reaped, Setsid};
    use std::collections::BTreeMap;

    #[test]
    fn counters_follow_the_stream() {
        let m = Metrics::new();
        m.observe(&Event::Reaped(Reaped {
            pid: 7,
            from_proc: false,
        }));
        m.observe(&Event::Reaped(Reaped {
            pid: 8,
            from_proc: true,
        }));
        m.observe(&Event::Setsid(Setsid { pid: 8, sid: 8 }));
        m.observe(&Event::Lost(Lost {
            count: 3,
            kinds: BTreeMap::new(),
            affected: vec![],
        }));
        let text = encode(&m.registry());
        assert!(
            text.contains("reaper_events_total{kind=\"reaped\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("reaper_events_total{kind=\"setsid\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("reaper_events_total{kind=\"fork\"} 0\n"),
            "{text}"
        );
        assert!(text.contains("reaper_events_lost_total 3\n"), "{text}");
        assert!(
            text.contains("reaper_flags_total{reason=\"orphaned\"} 0\n"),
            "{text}"
        );
        assert!(
            text.contains("reaper_flagged{reason=\"deaf\"} 0\n"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"));
        let classic = to_prometheus_text(&text);
        assert!(
            classic.contains("# TYPE reaper_events_total counter\n"),
            "{classic}"
        );
        assert!(classic.contains("# HELP reaper_flags_total "), "{classic}");
        assert!(
            classic.contains("# TYPE reaper_flagged gauge\n"),
            "{classic}"
        );
        assert!(!classic.contains("# EOF") && !classic.contains("# UNIT"));
        assert!(
            classic.contains("reaper_events_lost_total 3\n"),
            "the samples stay"
        );
        assert_eq!(m.status().events, 3);
        assert_eq!(m.status().lost, 3);
    }
}
