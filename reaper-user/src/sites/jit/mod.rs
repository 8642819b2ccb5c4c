//! JIT hosts' frames (`--spawn-stacks auto`): a Node host's JavaScript, and the native code
//! under it. Its native code keeps no frame pointers, so at each of its tracked forks the
//! kernel copies the forking thread's stack (`JIT_HOSTS` says whose), the slow side unwinds
//! it at once, while the host's mappings are there to read (see `sites::unwinding`), and it
//! is kept located (object and offset; an address for compiled JavaScript). Frames are named only when a flag
//! needs them: native ones from their objects, JavaScript ones from the host's perf map
//! (`--perf-basic-prof`; see [`perf_map`]).
use std::collections::{HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};

use aya::maps::{HashMap as BpfHashMap, MapData};

use super::native::Located;
use crate::lineage::graph::NodeId;
use crate::stream::evidence::Frame;

pub mod perf_map;

/// A stack as one host took it: a hash of its frames (each one's mapping and offset, as
/// unwound; its located frames, as a checkpoint kept them), and the host's node.
pub type Key = (u64, NodeId);

/// A host's copies with the slow side at once, at most (see `SpawnSites::unwind`).
pub const IN_FLIGHT: u32 = 16;

/// The kernel's list of JIT hosts, and the stacks unwound from their copies.
pub struct JitStacks {
    hosts: BpfHashMap<MapData, u32, u64>,
    /// The hosts whose copies went to the slow side (which keeps an unwinder for each), and
    /// how many of each are there now.
    unwound_for: HashMap<NodeId, u32>,
    /// Hosts let go whose unwinders the slow side was not told to forget yet.
    to_forget: Vec<NodeId>,
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
            unwound_for: HashMap::new(),
            to_forget: Vec::new(),
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

    /// Notes that a copy of host `host`'s stack goes to the slow side to be unwound; false,
    /// and it does not, when [`IN_FLIGHT`] of the host's are there already.
    pub fn unwinding(&mut self, host: NodeId) -> bool {
        let in_flight = self.unwound_for.entry(host).or_default();
        if *in_flight >= IN_FLIGHT {
            return false;
        }
        *in_flight += 1;
        true
    }

    /// A copy of host `host`'s stack is back from the slow side (or never got there).
    pub fn not_unwinding(&mut self, host: NodeId) {
        if let Some(in_flight) = self.unwound_for.get_mut(&host) {
            *in_flight = in_flight.saturating_sub(1);
        }
    }

    /// Hosts gone whose unwinders the slow side was not told to forget (its queue was full):
    /// told at the next [`JitStacks::retain`].
    pub fn forget_later(&mut self, mut hosts: Vec<NodeId>) {
        self.to_forget.append(&mut hosts);
    }

    /// Keeps the stack host `host` spawned `child` at, `frames` (see `sites::unwinding`),
    /// `stack` telling it apart: a stack this host spawned from before is kept once. None are
    /// kept for a host the graph let go meanwhile, nor when none were unwound.
    pub fn take_unwound(&mut self, host: NodeId, child: NodeId, stack: u64, frames: Vec<Located>) {
        let Some(in_flight) = self.unwound_for.get_mut(&host) else {
            return;
        };
        *in_flight = in_flight.saturating_sub(1);
        if frames.is_empty() {
            return;
        }
        let key = (stack, host);
        self.located.entry(key).or_insert(frames);
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
    /// was spawned at. Returns the hosts gone whose unwinders the slow side is to forget.
    pub fn retain(&mut self, holds: impl Fn(NodeId) -> bool) -> Vec<NodeId> {
        let mut gone = std::mem::take(&mut self.to_forget);
        gone.extend(
            self.unwound_for
                .keys()
                .copied()
                .filter(|&host| !holds(host)),
        );
        self.unwound_for.retain(|&host, _| holds(host));
        self.spawned.retain(|&child, _| holds(child));
        let kept: HashSet<Key> = self.spawned.values().copied().collect();
        self.located.retain(|key, _| kept.contains(key));
        self.named.retain(|key, _| kept.contains(key));
        gone
    }
}
