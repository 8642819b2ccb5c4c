//! The code that spawned each process (`--spawn-stacks`). The kernel keeps the spawning
//! thread's user stack at each tracked fork, once per distinct stack, and a Python spawner's
//! own frames (see [`python`]); a fork record names both. Each native frame names its object
//! by build id and a file offset (see [`native`]), and is named only when a flag needs it;
//! Python frames are named then, from the spawner's memory.
//! A JIT host's stack is copied instead and unwound here (see [`jit`]).
use blazesym::symbolize::Symbolizer;
use build_ids::SavedBuildId;
use jit::JitStacks;
pub use native::Located;
use native::{NativeStacks, SiteKey};
use python::PythonStacks;
use serde::{Deserialize, Serialize};

use crate::capture::decode::CopiedStack;
use crate::capture::loader::StackMaps;
use crate::lineage::graph::NodeId;
use crate::lineage::graph::saved::SavedStart;
use crate::procfs::proc_path;
use crate::stream::evidence::Frame;

pub mod build_ids;
mod jit;
mod mappings;
mod native;
pub mod python;
mod referrers;

/// A live process's unwound spawn stack (see [`jit`]), as the checkpoint keeps it: the next run
/// names it as this one would have.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedUnwound {
    pub pid: u32,
    pub start: SavedStart,
    pub frames: Vec<Located>,
}

/// Spawn stacks: native ones, Python spawners' frames, JIT hosts' copies.
pub struct SpawnSites {
    native: NativeStacks,
    /// `--spawn-stacks auto`: Python spawners' frames.
    pub python: Option<PythonStacks>,
    /// `--spawn-stacks auto`: JIT hosts' frames.
    jit: Option<JitStacks>,
    symbolizer: Symbolizer,
}

impl SpawnSites {
    /// `interpreters`: read Python spawners' and JIT hosts' frames too.
    pub fn new(maps: StackMaps, interpreters: bool) -> SpawnSites {
        SpawnSites {
            native: NativeStacks::new(maps.native),
            python: interpreters.then(|| PythonStacks::new(maps.interpreters, maps.python)),
            jit: interpreters.then(|| JitStacks::new(maps.jit_hosts)),
            symbolizer: Symbolizer::new(),
        }
    }

    /// Looks at the program process `pid` (node `node`, started at `start`; 0: unknown) now
    /// runs: a Python interpreter's layout goes to the kernel, a Node host is marked for
    /// copies of its stacks. Returns the interpreter's name for the exec event (`python3.12`,
    /// `node`). `Err` says why a Python process's frames will not be read.
    ///
    /// Only an executable named like one is looked into (one readlink per exec; mappings are
    /// read only then): a program embedding libpython under another name gives native frames.
    pub fn exec(&mut self, node: NodeId, pid: u32, start: u64) -> Result<Option<String>, String> {
        let program = executable_name(pid);
        if let Some(python) = self.python.as_mut() {
            if program.starts_with("python3") {
                return python.exec(node, pid, start);
            }
            python.forget(node);
        }
        match self.jit.as_mut() {
            Some(jit) if jit::is_node(&program) => jit.host(pid, start),
            _ => Ok(None),
        }
    }

    /// Unwinds a JIT host's stack copied at the fork of `child` (see [`jit`]).
    pub fn unwind(&mut self, copy: &CopiedStack, spawner: NodeId, pid: u32, child: NodeId) {
        if let Some(jit) = self.jit.as_mut() {
            jit.unwind(copy, spawner, pid, child);
        }
    }

    /// The frames `child` was spawned at, when they were unwound from a copy (see
    /// [`jit`]): its host's JavaScript frames, then its native ones. `pid` is the host's,
    /// `alive` whether it still runs.
    pub fn unwound_frames(&mut self, child: NodeId, pid: u32, alive: bool) -> Option<Vec<Frame>> {
        self.jit
            .as_mut()?
            .frames(&self.symbolizer, child, pid, alive)
    }

    /// Notes that native stack `stack` spawned process `child`.
    pub fn spawned(&mut self, stack: u64, child: NodeId) {
        self.native.spawned(stack, child);
    }

    /// Forgets the stacks of spawners the graph no longer holds (no flag can name them), and
    /// frees in the kernel the stacks that spawned no process it holds.
    pub fn retain(&mut self, holds: impl Fn(NodeId) -> bool) {
        self.native.retain(&holds);
        if let Some(jit) = self.jit.as_mut() {
            jit.retain(&holds);
        }
        if let Some(python) = self.python.as_mut() {
            python.retain(holds);
        }
    }

    /// Whether the native stack of `key` was located.
    pub fn knows(&self, key: SiteKey) -> bool {
        self.native.knows(key)
    }

    /// Locates the native stack of `key` (see [`NativeStacks::locate`]).
    pub fn locate(&mut self, key: SiteKey, holders: &[u32]) {
        self.native.locate(key, holders);
    }

    /// The native frames of the stack of `key`, named (see [`NativeStacks::frames`]).
    pub fn frames(&mut self, key: SiteKey, holders: &[u32]) -> Vec<Frame> {
        self.native.frames(&self.symbolizer, key, holders)
    }

    /// Learns the objects a gateway runs, so its spawns are named after it is gone.
    pub fn gateway_found(&mut self, pid: u32) {
        self.native.build_ids.learn(pid);
    }

    /// The build ids learned, for the checkpoint.
    pub fn save_build_ids(&self) -> Vec<SavedBuildId> {
        self.native.build_ids.save()
    }

    /// Takes back a checkpoint's build ids.
    pub fn restore_build_ids(&mut self, saved: &[SavedBuildId]) {
        self.native.build_ids.restore(saved);
    }

    /// The located frames `child` was spawned at when they were unwound from a copy (see
    /// [`jit`]), for the checkpoint.
    pub fn unwound(&self, child: NodeId) -> Option<Vec<Located>> {
        Some(self.jit.as_ref()?.unwound(child)?.to_vec())
    }

    /// Takes back the unwound frames a checkpoint kept for `child`, spawned by `spawner`.
    pub fn take_back_unwound(&mut self, child: NodeId, spawner: NodeId, frames: Vec<Located>) {
        if let Some(jit) = self.jit.as_mut() {
            jit.take_back(child, spawner, frames);
        }
    }
}

/// The file name of the executable process `pid` runs (empty when it cannot be read).
fn executable_name(pid: u32) -> String {
    std::fs::read_link(proc_path(pid, "exe"))
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_default()
}
