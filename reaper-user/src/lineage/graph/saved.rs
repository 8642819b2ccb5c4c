//! What a restart must not forget: the graph's live processes and every ancestor their lineage
//! passes through, as plain data for the lineage checkpoint (`--state-dir`), and taken back
//! by the next run. The kernel and /proc know only current parents; this keeps the spawner
//! edges, names and command lines of processes that escaped or whose ancestors died.
use base64::{Engine as _, engine::general_purpose::STANDARD};
use serde::{Deserialize, Serialize};

use super::{ExitInfo, LineageGraph, NodeId, SpawnStack, Start};
use crate::text::{Args, Comm};

/// Bytes from a process (a name, an argument), saved as base64: exact and compact.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Bytes(pub Vec<u8>);

impl Serialize for Bytes {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(&self.0))
    }
}

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        STANDARD
            .decode(text)
            .map(Bytes)
            .map_err(serde::de::Error::custom)
    }
}

impl From<&[u8]> for Bytes {
    fn from(b: &[u8]) -> Self {
        Bytes(b.to_vec())
    }
}

/// One process as the checkpoint keeps it. `spawner` is the index of its spawner in the same
/// list (spawners come first), not a pid: the pid may be another process's by the next run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedNode {
    pub pid: u32,
    pub start: SavedStart,
    pub spawner: Option<usize>,
    pub spawner_pid: Option<u32>,
    pub ppid: u32,
    pub sid: u32,
    pub pgid: u32,
    pub uid: Option<u32>,
    pub cgroup_id: Option<u64>,
    pub comm: Bytes,
    pub filename: Option<Bytes>,
    pub argv: Vec<Bytes>,
    pub execs: u32,
    pub forked_at: Option<u64>,
    pub spawning_thread: Option<(u32, Bytes)>,
    /// When it exited (boot-time ns) and its wait status, for a dead ancestor.
    pub exited: Option<(u64, Option<u32>)>,
    pub is_gateway: bool,
    pub seeded: bool,
    pub called_setsid: bool,
    /// The agent session that begins at it (see `graph::session`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<Bytes>,
    /// The keys of the stacks it was spawned at (`--spawn-stacks`), in the pinned stores:
    /// native, and its spawner's Python frames.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub native_stack: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python_stack: Option<u64>,
}

/// [`Start`], as saved.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SavedStart {
    Exact(u64),
    Ticks(u64),
}

impl From<Start> for SavedStart {
    fn from(s: Start) -> Self {
        match s {
            Start::Exact(ns) => SavedStart::Exact(ns),
            Start::Ticks(t) => SavedStart::Ticks(t),
        }
    }
}

impl From<SavedStart> for Start {
    fn from(s: SavedStart) -> Self {
        match s {
            SavedStart::Exact(ns) => Start::Exact(ns),
            SavedStart::Ticks(t) => Start::Ticks(t),
        }
    }
}

/// What became of the saved processes when a run took them back.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Restored {
    /// Alive now, with their lineage: to be tracked again in the kernel.
    pub alive: Vec<NodeId>,
    /// How many were alive at the save and are gone since (exits no run saw), kept or not.
    pub gone: usize,
}

impl LineageGraph {
    /// The live processes (zombies are left to /proc) and every node their lineage passes
    /// through, spawners first.
    pub fn save(&self) -> Vec<SavedNode> {
        let mut keep: Vec<NodeId> = Vec::new();
        let mut kept = std::collections::HashSet::new();
        for node in self.nodes.values().filter(|n| n.alive()) {
            let mut chain = Vec::new();
            let mut at = Some(node.id);
            while let Some(id) = at.filter(|id| !kept.contains(id)) {
                let Some(n) = self.nodes.get(id) else { break };
                chain.push(id);
                at = n.spawner;
            }
            for id in chain.into_iter().rev() {
                kept.insert(id);
                keep.push(id);
            }
        }
        // Ids sort by creation, so spawners come before what they spawned.
        keep.sort_unstable();
        let index: std::collections::HashMap<NodeId, usize> =
            keep.iter().enumerate().map(|(i, id)| (*id, i)).collect();
        keep.iter()
            .filter_map(|id| self.nodes.get(*id))
            .map(|n| SavedNode {
                pid: n.pid,
                start: n.start.into(),
                spawner: n.spawner.and_then(|s| index.get(&s).copied()),
                spawner_pid: n.spawner_pid,
                ppid: n.ppid,
                sid: n.sid,
                pgid: n.pgid,
                uid: n.uid,
                cgroup_id: n.cgroup_id,
                comm: n.comm.as_bytes().into(),
                filename: n.filename.as_deref().map(Bytes::from),
                argv: n.argv.iter().map(Bytes::from).collect(),
                execs: n.execs,
                forked_at: n.forked_at,
                spawning_thread: n
                    .spawning_thread
                    .map(|(tid, comm)| (tid, comm.as_bytes().into())),
                exited: n.exited.map(|e| (e.ts, e.status)),
                is_gateway: n.is_gateway,
                seeded: n.seeded,
                called_setsid: n.called_setsid,
                session: n.session.as_deref().map(Bytes::from),
                native_stack: n.spawn_stack.native,
                python_stack: n.spawn_stack.python,
            })
            .collect()
    }

    /// Takes back saved processes into an empty graph. `alive(pid, start)` says whether that
    /// process still runs; one alive at the save and gone now exited at `now` (status
    /// unknown). A dead process is kept only while the lineage of a live one passes through
    /// it.
    pub fn restore(
        &mut self,
        saved: &[SavedNode],
        alive: impl Fn(u32, Start) -> bool,
        now: u64,
    ) -> Restored {
        let alive_now: Vec<bool> = saved
            .iter()
            .map(|s| s.exited.is_none() && alive(s.pid, s.start.into()))
            .collect();
        let gone = saved
            .iter()
            .zip(&alive_now)
            .filter(|(s, alive)| s.exited.is_none() && !**alive)
            .count();
        // Which saved nodes a live one descends from (spawners come first, so one backward
        // pass marks every ancestor).
        let mut needed = alive_now.clone();
        for i in (0..saved.len()).rev() {
            if needed[i]
                && let Some(s) = saved[i].spawner.filter(|&s| s < i)
            {
                needed[s] = true;
            }
        }
        let mut ids: Vec<Option<NodeId>> = vec![None; saved.len()];
        let mut out = Restored {
            alive: Vec::new(),
            gone,
        };
        let mut dead = Vec::new();
        for (i, s) in saved.iter().enumerate() {
            if !needed[i] {
                continue;
            }
            let mut node = self.blank(s.pid, s.start.into());
            node.spawner = s.spawner.filter(|&p| p < i).and_then(|p| ids[p]);
            node.spawner_pid = s.spawner_pid;
            node.ppid = s.ppid;
            node.sid = s.sid;
            node.pgid = s.pgid;
            node.uid = s.uid;
            node.cgroup_id = s.cgroup_id;
            node.comm = Comm::from_c(&s.comm.0);
            node.filename = s.filename.as_ref().map(|f| f.0.as_slice().into());
            node.argv = Args::from_list(s.argv.iter().map(|a| &a.0));
            node.execs = s.execs;
            node.forked_at = s.forked_at;
            node.spawning_thread = s
                .spawning_thread
                .as_ref()
                .map(|(tid, comm)| (*tid, Comm::from_c(&comm.0)));
            node.is_gateway = s.is_gateway;
            node.seeded = s.seeded;
            node.called_setsid = s.called_setsid;
            node.session = s.session.as_ref().map(|v| v.0.as_slice().into());
            node.spawn_stack = SpawnStack {
                native: s.native_stack,
                python: s.python_stack,
            };
            let id = self.insert(node);
            ids[i] = Some(id);
            match (s.exited, alive_now[i]) {
                (_, true) => out.alive.push(id),
                (Some((ts, status)), false) => self.set_exited(id, ExitInfo { ts, status }),
                (None, false) => {
                    let info = ExitInfo {
                        ts: now,
                        status: None,
                    };
                    self.set_exited(id, info);
                }
            }
            if !alive_now[i] {
                dead.push(id);
            }
        }
        // A dead ancestor is no zombie: nothing will reap it in this run. Marked once all are
        // in, so that none is pruned before what it spawned holds it.
        for id in dead {
            self.mark_reaped(id, now);
        }
        out
    }
}
