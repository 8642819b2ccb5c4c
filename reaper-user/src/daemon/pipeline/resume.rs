//! A run's lineage across a restart (`--state-dir`): what the pipeline saves, and how it takes
//! a checkpoint back before it looks at /proc.
use anyhow::Result;

use super::Pipeline;
use crate::capture::loader::{LossCounts, TakeOver};
use std::collections::HashMap;

use crate::lineage::graph::Start;
use crate::lineage::graph::saved::{SavedNode, SavedStart};
use crate::lineage::seed::{self, TrackedMap};
use crate::procfs::{self, Stat};
use crate::sites::SavedUnwound;
use crate::sites::build_ids::SavedBuildId;
use crate::stream::Stamped;
use crate::stream::events::{Event, Reparent};

/// What a run took back from a checkpoint (the `resumed` of `ready`).
#[derive(Debug, Default)]
pub struct Resumed {
    /// Processes alive again under this run, with their lineage.
    pub adopted: usize,
    /// Processes alive at the checkpoint and gone since.
    pub gone: usize,
}

/// Where a checkpoint written beside a kept kernel state stands against it.
#[derive(Clone, Copy, Debug)]
pub struct KeptState {
    /// Records taken from the ring by the runs before (the kernel's count).
    pub received: u64,
    /// Of those, how many the run before took in after writing the checkpoint (it did not
    /// stop: it was killed, or crashed).
    pub unsaved: u64,
    /// Losses the checkpoint says were reported.
    pub reported: LossCounts,
    /// The take-over of the probes.
    pub took_over: Option<TakeOver>,
}

/// The process (pid, start), if it still runs (a zombie does not).
fn running(pid: u32, start: Start) -> Option<Stat> {
    procfs::read_stat(pid)
        .ok()
        .filter(|s| s.start_ticks == start.ticks() && s.state != b'Z')
}

impl Pipeline {
    /// The lineage a checkpoint keeps: the live processes and their ancestors.
    pub fn saved(&self) -> Vec<SavedNode> {
        self.graph.save()
    }

    /// The build ids learned so far, with their files (see [`SpawnSites::save_build_ids`]).
    pub fn saved_build_ids(&self) -> Vec<SavedBuildId> {
        self.sites
            .as_ref()
            .map(|s| s.save_build_ids())
            .unwrap_or_default()
    }

    /// The live processes' stacks unwound from copies, for the checkpoint.
    pub fn saved_unwound(&self) -> Vec<SavedUnwound> {
        let Some(sites) = self.sites.as_ref() else {
            return Vec::new();
        };
        self.graph
            .alive()
            .filter_map(|n| {
                Some(SavedUnwound {
                    pid: n.pid,
                    start: n.start.into(),
                    frames: sites.unwound(n.id)?,
                })
            })
            .collect()
    }

    /// Takes back the build ids a checkpoint learned, and the stacks the processes it held
    /// alive (the graph, before /proc is looked at) were spawned at. A stack's key is a hash
    /// of its frames, so a key the kernel holds (its store pinned with the state) names that
    /// very stack; a Python spawner adopted so is looked at when a flag names its frames; an
    /// unwound stack comes back located.
    pub fn resume_spawn_sites(&mut self, build_ids: &[SavedBuildId], unwound: &[SavedUnwound]) {
        let Some(sites) = self.sites.as_mut() else {
            return;
        };
        sites.restore_build_ids(build_ids);
        let mut unwound: HashMap<(u32, SavedStart), &SavedUnwound> =
            unwound.iter().map(|u| ((u.pid, u.start), u)).collect();
        let graph = &self.graph;
        let children: Vec<_> = (graph.alive())
            .map(|n| {
                let kept = unwound.remove(&(n.pid, n.start.into()));
                (n.id, kept.map(|u| u.frames.clone()))
            })
            .collect();
        sites.take_back(graph, children);
    }

    /// Losses reported so far (a checkpoint keeps them, so the next run reports only new
    /// ones).
    pub fn reported_losses(&self) -> LossCounts {
        self.upkeep.reported_losses()
    }

    /// Takes back a checkpoint written beside the kernel state this run took over. The probes
    /// stayed attached through the gap and its records wait in the ring, so every process the
    /// checkpoint holds alive is alive to this run until a record says otherwise: nothing is
    /// looked up in /proc, and the gap's events come in order, from the ring. When the run
    /// before took in records after the checkpoint, the graph is re-read from /proc once the
    /// ring is drained.
    pub fn resume_kept(&mut self, saved: &[SavedNode], kept: KeptState) -> Resumed {
        let now = procfs::boottime_now();
        let restored = self.graph.restore(saved, |_, _| true, now);
        for &id in &restored.alive {
            if self.graph.node(id).is_some_and(|n| n.is_gateway) {
                self.gateways.adopted(id);
            }
        }
        self.reader.resume(kept.received, kept.took_over);
        self.upkeep.resume(kept.reported, kept.unsaved > 0);
        Resumed {
            adopted: restored.alive.len(),
            gone: 0,
        }
    }

    /// The pids of the live processes the graph holds (after [`Pipeline::resume`]: what /proc
    /// seeding starts from besides the gateways).
    pub fn alive_pids(&self) -> Vec<u32> {
        self.graph.alive().map(|n| n.pid).collect()
    }

    /// Takes back a checkpoint into a graph that holds nothing yet: the processes still alive
    /// keep their lineage and are tracked again in the kernel; gateways among them are not
    /// announced again; one whose parent changed while no run watched is reported
    /// reparented. /proc seeding then finds only what is new.
    pub fn resume(&mut self, saved: &[SavedNode], tracked: &mut TrackedMap) -> Result<Resumed> {
        let now = procfs::boottime_now();
        let restored = self
            .graph
            .restore(saved, |pid, start| running(pid, start).is_some(), now);
        let mut resumed = Resumed {
            adopted: 0,
            gone: restored.gone,
        };
        let mut found = Vec::new();
        for id in restored.alive {
            let Some(node) = self.graph.node(id) else {
                continue;
            };
            let (pid, ppid, start, gateway) = (node.pid, node.ppid, node.start, node.is_gateway);
            let stat = match running(pid, start) {
                Some(stat) if seed::track(tracked, &stat)? => stat,
                // Gone since it was looked at: an exit no run saw.
                _ => {
                    self.graph.mark_gone(id, now);
                    resumed.gone += 1;
                    continue;
                }
            };
            resumed.adopted += 1;
            if gateway {
                self.gateways.adopted(id);
            }
            if stat.ppid != ppid {
                self.graph.reparent(id, stat.ppid);
                let ev = Event::Reparent(Reparent {
                    pid,
                    old_ppid: ppid,
                    new_ppid: stat.ppid,
                });
                found.push(Stamped::new(now, ev));
            }
        }
        self.write(found)?;
        Ok(resumed)
    }
}
