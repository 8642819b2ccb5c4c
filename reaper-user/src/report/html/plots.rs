//! The report's SVG step plots: the timeline section (process counts and flagged RSS, sharing
//! the time axis, with the gateway instances that started later marked across both) and each
//! accumulated kind's live instances over time.
use std::fmt::Write as _;

use super::{at, esc, restarts};
use crate::report::{audit::Audit, timeline::Point};
use crate::stream::words::human_duration;

/// Two stacked SVG plots sharing the time axis: process counts, and flagged RSS.
pub(super) fn timeline(h: &mut String, a: &Audit) {
    let pts = a.timeline.points();
    if pts.is_empty() {
        h.push_str("<p>No events.</p>\n");
        return;
    }
    let _ = writeln!(
        h,
        "<p class=\"legend\"><span><i class=\"sw\" style=\"background:#2a6fdb\"></i>live \
         descendants</span><span><i class=\"sw\" style=\"background:#d3461e\"></i>flagged \
         processes</span><span><i class=\"sw\" style=\"background:#7b3fb5\"></i>flagged RSS \
         (MiB, at flag time)</span>{} (each point: the peak within {}).</p>",
        match restarts(a).next() {
            Some(_) =>
                "<span><i class=\"sw\" style=\"border-left:2px dashed #888\"></i>\
                        a gateway instance started</span>",
            None => "",
        },
        esc(&human_duration(a.timeline.span()))
    );
    let counts = [
        (
            pts.iter().map(|p| p.alive as f64).collect::<Vec<_>>(),
            "#2a6fdb",
        ),
        (pts.iter().map(|p| p.flagged as f64).collect(), "#d3461e"),
    ];
    plot(h, a, pts, &counts, "processes", "plot-counts");
    let rss = [(
        pts.iter()
            .map(|p| p.flagged_rss_kib as f64 / 1024.0)
            .collect::<Vec<_>>(),
        "#7b3fb5",
    )];
    plot(h, a, pts, &rss, "MiB", "plot-rss");
}

/// One plot per kind that accumulated: its live instances at each raise, held to the end.
pub(super) fn crowds(h: &mut String, a: &Audit) {
    h.push_str(
        "<p>More instances of one kind (same executable, positional arguments and option \
         names) alive under one gateway instance than <code>--max-instances</code>: the older \
         ones are flagged <code>accumulating</code>.</p>\n",
    );
    for (i, c) in a.crowds.kinds.values().enumerate() {
        let _ = writeln!(
            h,
            "<h3 class=\"kind\"><code>{}</code> under gateway {}</h3>\n<p>{} &middot; at most \
             {} alive at once &middot; {} older instances flagged</p>",
            esc(&c.pattern),
            c.gateway,
            esc(&c.exe),
            c.peak,
            c.flagged
        );
        let mut pts: Vec<Point> = c
            .counts
            .iter()
            .map(|&(ts, alive)| Point {
                ts,
                alive,
                ..Point::default()
            })
            .collect();
        // The last count holds until the audit ends.
        if let Some(&last) = pts.last().filter(|p| p.ts < a.last_ts) {
            pts.push(Point {
                ts: a.last_ts,
                ..last
            });
        }
        let values = pts.iter().map(|p| p.alive as f64).collect();
        plot(
            h,
            a,
            &pts,
            &[(values, "#c77c02")],
            "instances",
            &format!("plot-kind-{i}"),
        );
    }
    if a.crowds.omitted > 0 {
        let _ = writeln!(
            h,
            "<p>{} flags of further kinds not shown.</p>",
            a.crowds.omitted
        );
    }
}

fn plot(
    h: &mut String,
    a: &Audit,
    pts: &[Point],
    series: &[(Vec<f64>, &str)],
    unit: &str,
    id: &str,
) {
    const W: f64 = 1100.0;
    const H: f64 = 220.0;
    const LEFT: f64 = 60.0;
    const BOTTOM: f64 = 24.0;
    let t0 = pts[0].ts as f64;
    let t1 = (pts[pts.len() - 1].ts as f64).max(t0 + 1.0);
    let peak = series
        .iter()
        .flat_map(|(v, _)| v.iter().copied())
        .fold(0.0_f64, f64::max);
    let step = nice_step(peak / 4.0);
    let top = step * 4.0;
    let x = |ts: u64| LEFT + (ts as f64 - t0) / (t1 - t0) * (W - LEFT - 10.0);
    let y = |v: f64| 10.0 + (1.0 - v / top) * (H - BOTTOM - 10.0);
    let _ = write!(
        h,
        "<svg id=\"{id}\" viewBox=\"0 0 {W} {H}\" width=\"100%\" role=\"img\" \
         aria-label=\"{unit} over time\">\n<rect x=\"{LEFT}\" y=\"10\" width=\"{}\" \
         height=\"{}\" fill=\"#fcfcfc\" stroke=\"#ccc\"/>\n",
        W - LEFT - 10.0,
        H - BOTTOM - 10.0
    );
    for i in 0..=4 {
        let v = step * i as f64;
        let _ = writeln!(
            h,
            "<line x1=\"{LEFT}\" x2=\"{}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#eee\"/>\
             <text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            W - 10.0,
            LEFT - 6.0,
            y(v) + 4.0,
            trim_number(v),
            y = y(v)
        );
    }
    for i in 0..=5 {
        let ts = (t0 + (t1 - t0) * i as f64 / 5.0) as u64;
        let _ = writeln!(
            h,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            x(ts),
            H - 6.0,
            esc(&at(a, ts))
        );
    }
    let _ = writeln!(
        h,
        "<text x=\"12\" y=\"{}\" transform=\"rotate(-90 12 {})\" text-anchor=\"middle\">{unit}</text>",
        H / 2.0,
        H / 2.0
    );
    for i in restarts(a) {
        let _ = writeln!(
            h,
            "<line class=\"restart\" x1=\"{x:.1}\" x2=\"{x:.1}\" y1=\"10\" y2=\"{}\" \
             stroke=\"#888\" stroke-dasharray=\"4 3\"><title>gateway {} started ({})</title></line>",
            H - BOTTOM,
            i.pid,
            esc(&i.selector),
            x = x(i.ts.clamp(pts[0].ts, pts[pts.len() - 1].ts))
        );
    }
    for (values, color) in series {
        // Steps, not slopes: a value holds until the next point changes it.
        let mut d = String::with_capacity(values.len() * 16);
        for (i, (p, v)) in pts.iter().zip(values).enumerate() {
            match i {
                0 => write!(d, "M{:.1},{:.1}", x(p.ts), y(*v)),
                _ => write!(d, " H{:.1} V{:.1}", x(p.ts), y(*v)),
            }
            .ok();
        }
        let _ = writeln!(
            h,
            "<path class=\"series\" d=\"{d}\" fill=\"none\" stroke=\"{color}\" stroke-width=\"1.5\"/>"
        );
    }
    h.push_str("</svg>\n");
}

/// The smallest of 1, 2, 2.5, 5 × 10^k that is at least `x` (at least 1: counts are whole).
fn nice_step(x: f64) -> f64 {
    let x = x.max(0.25);
    let mag = 10f64.powf(x.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= x)
        .unwrap_or(10.0 * mag)
        .max(0.25)
}

fn trim_number(v: f64) -> String {
    match v.fract() == 0.0 {
        true => format!("{v:.0}"),
        false => format!("{v:.1}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_steps_are_round() {
        assert_eq!(nice_step(1.25), 2.0);
        assert_eq!(nice_step(0.0), 0.25);
        assert_eq!(nice_step(3.0), 5.0);
        assert_eq!(nice_step(30.0), 50.0);
        assert_eq!(nice_step(2.2), 2.5);
    }
}
