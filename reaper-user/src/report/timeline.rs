//! The audit's timeline, downsampled in one pass: each point holds the peaks of what was
//! alive and flagged within its span, and when the points are too many, neighbours merge and
//! the span doubles. Memory is bounded however long the audit.

/// Points kept; when full, neighbours merge and the span of a point doubles.
pub const MAX_POINTS: usize = 1_500;

/// One point of the timeline: the peaks within its time span.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Point {
    pub ts: u64,
    pub alive: u64,
    pub flagged: u64,
    pub flagged_rss_kib: u64,
}

impl Point {
    /// Keeps the peaks of both.
    fn absorb(&mut self, other: &Point) {
        self.alive = self.alive.max(other.alive);
        self.flagged = self.flagged.max(other.flagged);
        self.flagged_rss_kib = self.flagged_rss_kib.max(other.flagged_rss_kib);
    }
}

#[derive(Debug)]
pub struct Timeline {
    points: Vec<Point>,
    /// The span of one point, in ns.
    span: u64,
}

impl Default for Timeline {
    fn default() -> Self {
        Timeline {
            points: Vec::new(),
            span: 1_000_000_000,
        }
    }
}

impl Timeline {
    pub fn points(&self) -> &[Point] {
        &self.points
    }

    /// The span of one point, in ns.
    pub fn span(&self) -> u64 {
        self.span
    }

    /// Folds in the state `now` (at `now.ts`), with points counted from `start`.
    pub fn add(&mut self, start: u64, now: Point) {
        let slot = start + (now.ts.saturating_sub(start) / self.span) * self.span;
        match self.points.last_mut() {
            Some(last) if last.ts == slot => last.absorb(&now),
            _ => {
                self.points.push(Point { ts: slot, ..now });
                if self.points.len() > MAX_POINTS {
                    self.coarsen(start);
                }
            }
        }
    }

    /// Doubles the span of a point, merging neighbours (keeping each one's peaks).
    fn coarsen(&mut self, start: u64) {
        self.span *= 2;
        let span = self.span;
        let mut merged: Vec<Point> = Vec::with_capacity(self.points.len() / 2 + 1);
        for p in self.points.drain(..) {
            let ts = start + (p.ts - start) / span * span;
            match merged.last_mut() {
                Some(m) if m.ts == ts => m.absorb(&p),
                _ => merged.push(Point { ts, ..p }),
            }
        }
        self.points = merged;
    }
}
