//! JIT hosts' frames (`--spawn-stacks auto`): a Node host's JavaScript, and the native code
//! under it. Its native code keeps no frame pointers, so at each of its tracked forks the
//! kernel copies the forking thread's stack (`JIT_HOSTS` says whose) and here it is unwound
//! at once, while the host's mappings are there to read (see [`unwind`]), and kept located
//! (object and offset; an address for compiled JavaScript). Frames are named only when a flag
//! needs them: native ones from their objects, JavaScript ones from the host's perf map
//! (`--perf-basic-prof`; see [`perf_map`]).
use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::PathBuf;

use aya::maps::{HashMap as BpfHashMap, MapData};

use super::native::Located;
use super::unwind::{self, Objects};
use crate::capture::decode::CopiedStack;
use crate::lineage::graph::NodeId;
use crate::stream::evidence::Frame;

pub mod perf_map;

/// A stack as one host took it: a hash of its located frames, and the host's node.
pub type Key = (u64, NodeId);

/// The kernel's list of JIT hosts, and the stacks unwound from their copies.
pub struct JitStacks {
    hosts: BpfHashMap<MapData, u32, u64>,
    /// Each host's unwinder, kept while its mappings stay the same.
    unwinders: HashMap<NodeId, unwind::HostUnwinder>,
    /// Each distinct stack, located.
    located: HashMap<Key, Vec<Located>>,
    named: HashMap<Key, Vec<Frame>>,
    /// The stack each process was spawned at.
    spawned: HashMap<NodeId, Key>,
    /// Whether the hosts' map refused a host already (said once: it refuses every one then).
    refused: bool,
}

impl JitStacks {
    pub fn new(hosts: BpfHashMap<MapData, u32, u64>) -> JitStacks {
        JitStacks {
            hosts,
            unwinders: HashMap::new(),
            located: HashMap::new(),
            named: HashMap::new(),
            spawned: HashMap::new(),
            refused: false,
        }
    }

    /// Process `pid` (started at `start`; 0: unknown) now runs Node: its forks' stacks are
    /// copied from now on. Returns what the exec event names it.
    pub fn host(&mut self, pid: u32, start: u64) -> Result<Option<String>, String> {
        match self.hosts.insert(pid, start, 0) {
            Ok(()) => Ok(Some("node".to_string())),
            Err(_) if self.refused => Ok(None),
            Err(e) => {
                self.refused = true;
                Err(format!(
                    "pid {pid} (node): the JIT hosts' map: {e} (said once: the next hosts \
                     refused are not said)"
                ))
            }
        }
    }

    /// Unwinds `copy`, the stack host `spawner` (process `pid`) spawned `child` at, with the
    /// objects read so far, and keeps it located. A host already gone leaves the child
    /// without frames.
    pub fn unwind(
        &mut self,
        objects: &mut Objects,
        copy: &CopiedStack,
        (spawner, pid): (NodeId, u32),
        child: NodeId,
    ) {
        let kept = self.unwinders.remove(&spawner);
        let Some((unwound, unwinder)) = objects.unwind(pid, copy, kept) else {
            return;
        };
        self.unwinders.insert(spawner, unwinder);
        // Each frame in its mapping (its offset in the mapped file), or an address.
        let maps = &unwound.maps;
        let frames: Vec<_> = unwound
            .frames
            .iter()
            .map(|&(m, offset)| (m.map(|i| &maps[i]), offset))
            .collect();
        if frames.is_empty() {
            return;
        }
        let mut hasher = DefaultHasher::new();
        for (m, offset) in &frames {
            (m.map(|m| &m.path), offset).hash(&mut hasher);
        }
        let key = (hasher.finish(), spawner);
        // A stack this host spawned from before is kept already: its files are not looked
        // for again.
        if let Entry::Vacant(slot) = self.located.entry(key) {
            let mut files: HashMap<&str, Option<PathBuf>> = HashMap::new();
            let located = frames
                .iter()
                .map(|&(m, offset)| Located {
                    build_id: None,
                    object: m.and_then(|m| {
                        files
                            .entry(m.path.as_str())
                            .or_insert_with(|| m.file(pid))
                            .clone()
                    }),
                    offset,
                })
                .collect();
            slot.insert(located);
        }
        self.spawned.insert(child, key);
    }

    /// The stack `child` was spawned at, if its stack was unwound here, and its frames if
    /// they were named already (see `sites::naming`).
    pub fn for_naming(&self, child: NodeId) -> Option<(Key, Option<Vec<Frame>>)> {
        let key = *self.spawned.get(&child)?;
        Some((key, self.named.get(&key).cloned()))
    }

    /// Stack `key`'s frames, located: its compiled JavaScript's addresses (named from the
    /// host's perf map while it runs), then its native frames.
    pub fn located(&self, key: Key) -> (Vec<u64>, Vec<Located>) {
        let located = self.located.get(&key).map_or(&[][..], Vec::as_slice);
        let (compiled, native): (Vec<&Located>, Vec<&Located>) =
            located.iter().partition(|l| l.object.is_none());
        let addrs = compiled.iter().map(|l| l.offset).collect();
        (addrs, native.into_iter().cloned().collect())
    }

    /// Keeps stack `key`'s frames as a round named them: named while the host runs, nothing
    /// better will come; unnamed (the host gone), nothing better either.
    pub fn remember(&mut self, key: Key, frames: Vec<Frame>) {
        self.named.insert(key, frames);
    }

    /// The located frames `child` was spawned at, if its stack was unwound here.
    pub fn unwound(&self, child: NodeId) -> Option<&[Located]> {
        self.located
            .get(self.spawned.get(&child)?)
            .map(Vec::as_slice)
    }

    /// Takes back the located frames a checkpoint kept for `child`, spawned by host
    /// `spawner`: named when a flag needs them, as if unwound by this run.
    pub fn take_back(&mut self, child: NodeId, spawner: NodeId, frames: Vec<Located>) {
        let mut hasher = DefaultHasher::new();
        for f in &frames {
            (&f.object, f.offset).hash(&mut hasher);
        }
        let key = (hasher.finish(), spawner);
        self.located.entry(key).or_insert(frames);
        self.spawned.insert(child, key);
    }

    /// Forgets the stacks of processes the graph no longer holds, and stacks none it holds
    /// was spawned at.
    pub fn retain(&mut self, holds: impl Fn(NodeId) -> bool) {
        self.unwinders.retain(|&host, _| holds(host));
        self.spawned.retain(|&child, _| holds(child));
        let kept: HashSet<Key> = self.spawned.values().copied().collect();
        self.located.retain(|key, _| kept.contains(key));
        self.named.retain(|key, _| kept.contains(key));
    }
}
