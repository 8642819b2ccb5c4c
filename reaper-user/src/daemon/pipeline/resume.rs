//! A run's lineage across a restart (`--state-dir`): what the pipeline saves, and how it takes
//! a checkpoint back before it looks at /proc.
use anyhow::Result;

use super::Pipeline;
use crate::lineage::graph::{Start, saved::SavedNode};
use crate::lineage::seed::{self, TrackedMap};
use crate::procfs::{self, Stat};
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
