//! A round of the leak rules in steps (see [`crate::leaks::Round`]), each reading only what
//! the run holds: the looks and the new flags' evidence are read from /proc between them,
//! wherever the caller has them read (`daemon/rounds.rs`: the slow side's thread).
use std::time::Instant;

use anyhow::Result;

use super::Pipeline;
use crate::leaks::{Evidence, Look, Near, Reason, Round, Sample};
use crate::lineage::graph::NodeId;
use crate::procfs::boottime_now;

/// A round under way.
pub struct ScanRound {
    round: Round,
    began: Instant,
}

/// The new flags' evidence, taken out of a round to be read elsewhere, then put back by
/// [`Pipeline::commit_round`] (see [`Round::evidence`]).
pub struct Unread {
    pub with_peers: Vec<Evidence>,
    pub without: Vec<Evidence>,
    /// Where the other ends of `with_peers`' channels are looked for.
    pub near: Near,
}

impl ScanRound {
    /// The looks due, to be sampled and given back to [`Pipeline::judge_round`].
    pub fn take_looks(&mut self) -> Vec<Look> {
        std::mem::take(&mut self.round.looks)
    }
}

impl Pipeline {
    /// A round's first step: the flags of processes that exited cleared (written now), and
    /// the looks due.
    pub fn plan_round(&mut self) -> Result<ScanRound> {
        let began = Instant::now();
        let mut round = self.inspector.plan(&self.graph, boottime_now());
        let cleared = std::mem::take(&mut round.changes);
        self.write_scan(&cleared, None)?;
        Ok(ScanRound { round, began })
    }

    /// The next step, the looks sampled: the rules applied. The flags raised are held from
    /// here and written at [`Pipeline::commit_round`], unless their process exits first (see
    /// [`Pipeline::record`]). Returns their evidence to be read.
    pub fn judge_round(
        &mut self,
        scan: &mut ScanRound,
        sampled: Vec<(Look, Option<Sample>)>,
    ) -> Option<Unread> {
        self.inspector
            .judge_round(&self.graph, &mut scan.round, sampled);
        self.unwritten = (scan.round.changes.iter())
            .filter_map(|c| match c {
                crate::leaks::Change::Flag(f) => Some((f.node, f.reason)),
                _ => None,
            })
            .collect();
        let (with_peers, without) = scan.round.evidence();
        if with_peers.is_empty() && without.is_empty() {
            return None;
        }
        let take = |each: Vec<&mut Evidence>| each.into_iter().map(std::mem::take).collect();
        let near = match with_peers.is_empty() {
            true => Near::default(),
            false => Near::every_live(&self.graph),
        };
        Some(Unread {
            with_peers: take(with_peers),
            without: take(without),
            near,
        })
    }

    /// The last step, the evidence read (`read`, as [`Pipeline::judge_round`] returned it):
    /// the flags that started or stopped holding written, but for those whose process exited
    /// meanwhile; the gauges set; `--kill`'s decisions; the status line.
    pub fn commit_round(&mut self, mut scan: ScanRound, read: Option<Unread>) -> Result<()> {
        if let Some(read) = read {
            let (with_peers, without) = scan.round.evidence();
            let back = with_peers.into_iter().zip(read.with_peers);
            for (slot, e) in back.chain(without.into_iter().zip(read.without)) {
                *slot = e;
            }
        }
        let unwritten = std::mem::take(&mut self.unwritten);
        scan.round.changes.retain(|c| match c {
            crate::leaks::Change::Flag(f) => unwritten.contains(&(f.node, f.reason)),
            _ => true,
        });
        self.write_scan(&scan.round.changes, Some(scan.began))?;
        self.decide_kills()?;
        self.out.draw_status()?;
        Ok(self.out.flush()?)
    }

    /// Whether the flag `reason` of process `id`, cleared by its exit, was raised by a round
    /// not yet written: then neither it nor its clearing is written.
    pub(super) fn never_written(&mut self, id: NodeId, reason: Reason) -> bool {
        let Some(at) = self.unwritten.iter().position(|&f| f == (id, reason)) else {
            return false;
        };
        self.unwritten.swap_remove(at);
        self.inspector.never_written(reason);
        true
    }
}
