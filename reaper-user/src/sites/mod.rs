//! The code that spawned each process (`--spawn-stacks`). The kernel keeps the spawning
//! thread's user stack at each tracked fork, once per distinct stack, and a Python spawner's
//! own frames (see [`python`]); a fork record names both. Each native frame names its object
//! by build id and a file offset (see [`native`]), and is named only when a flag needs it;
//! Python frames are named then, from the spawner's memory.
//! A JIT host's stack is copied instead and unwound here (see [`jit`]). What reads objects
//! and perf maps to name frames runs on the slow side (see [`naming`]).
use build_ids::SavedBuildId;
use jit::JitStacks;
pub use naming::{Asked, NamedSites, Naming};
pub use native::Located;
use native::{NativeStacks, SiteKey};
use python::PythonStacks;
use reaper_common::{ExeKey, interpreter::Interpreter};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

use crate::capture::decode::CopiedStack;
use crate::capture::loader::StackMaps;
use crate::lineage::graph::NodeId;
use crate::lineage::graph::saved::SavedStart;
use crate::procfs::proc_path;
use crate::untrusted::Checked;

pub mod build_ids;
mod jit;
mod mappings;
mod naming;
mod native;
pub mod python;
mod referrers;
mod spawns;
mod unwind;

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
    python: Option<PythonStacks>,
    /// `--spawn-stacks auto`: JIT hosts' frames.
    jit: Option<JitStacks>,
    /// The objects copies were unwound with (JIT hosts' and native spawners').
    objects: unwind::Objects,
}

impl SpawnSites {
    /// `interpreters`: read Python spawners' and JIT hosts' frames too.
    pub fn new(maps: StackMaps, interpreters: bool) -> SpawnSites {
        SpawnSites {
            native: NativeStacks::new(maps.native),
            python: interpreters.then(|| {
                let mut python = PythonStacks::new(maps.interpreters, maps.python, maps.binaries);
                if let Some(path) = std::env::var_os("PATH") {
                    python.give_interpreters_on(&path);
                }
                python
            }),
            jit: interpreters.then(|| JitStacks::new(maps.jit_hosts)),
            objects: unwind::Objects::default(),
        }
    }

    /// Looks at the program process `pid` (node `node`, started at `start`; 0: unknown) now
    /// runs, the interpreter `program` (the exec record's, or [`program_of`]'s): a Python
    /// interpreter's layout goes to the kernel, a Node host is marked for copies of its
    /// stacks. Returns the interpreter's name for the exec event (`python3.12`, `node`).
    /// `Err` says why a Python process's frames will not be read.
    ///
    /// Only an executable named like one is looked into (its mappings read only then): a
    /// program embedding libpython under another name gives native frames.
    fn exec(
        &mut self,
        node: NodeId,
        pid: u32,
        start: u64,
        program: Option<Interpreter>,
    ) -> Result<Option<String>, String> {
        if let Some(python) = self.python.as_mut() {
            if program == Some(Interpreter::Python) {
                return python.exec(node, pid, start);
            }
            python.forget(node);
        }
        match self.jit.as_mut() {
            Some(jit) if program == Some(Interpreter::Node) => jit.host(pid, start),
            _ => Ok(None),
        }
    }

    /// Unwinds a JIT host's stack copied at the fork of `child` (see [`jit`]).
    fn unwind(&mut self, copy: &CopiedStack, spawner: NodeId, pid: u32, child: NodeId) {
        if let Some(jit) = self.jit.as_mut() {
            jit.unwind(&mut self.objects, copy, (spawner, pid), child);
        }
    }

    /// Unwinds the stack of native site `key` copied at its first fork from there (see
    /// `reaper_common::copy`), in the mappings of the first of `holders` still running (they
    /// run the spawner's code: see [`NativeStacks::locate`]; a double fork's middle process
    /// is gone by now, its parent is not): the site's frames from now on. Failing that (a
    /// spawner that forked and exited at once, `spawner_pid`, exec'd from `exec_path`), in
    /// what the kernel took of it at the fork: its executable's code (see [`Self::executable`])
    /// and the object its innermost frame is in (see [`NativeStacks::forked_in`]). Failing
    /// both, the site keeps its frame-pointer walk (located first: see
    /// [`NativeStacks::take_unwound`]).
    fn unwind_site(
        &mut self,
        key: SiteKey,
        holders: &[u32],
        (spawner_pid, exec_path): (u32, Option<&Path>),
        copy: &CopiedStack,
    ) {
        if self.native.unwound(key) {
            return;
        }
        // Read once per site: the unwinder is not kept (the objects it read are).
        let unwound = holders
            .iter()
            .find_map(|&pid| Some((pid, self.objects.unwind(pid, copy, None)?.0)))
            .or_else(|| {
                let exe = self.executable(copy.exe.file, exec_path);
                let forked_in = self.native.forked_in(key);
                let unwound = self
                    .objects
                    .unwind_taken(spawner_pid, copy, exe, forked_in)?;
                Some((spawner_pid, unwound))
            });
        if let Some((pid, unwound)) = unwound {
            self.native.take_unwound(key, pid, &unwound);
        }
    }

    /// The executable `file` of a spawner that is gone, opened while it is that file: at the
    /// path it was exec'd from, its links resolved (`/bin/sh` is a link to dash), or where a
    /// process seen mapping it mapped it. Neither names it when it was exec'd by a relative
    /// path or in another root (a container's), and no process seen since maps it.
    fn executable(&self, file: ExeKey, exec_path: Option<&Path>) -> Option<(Checked, PathBuf)> {
        let resolved = exec_path.and_then(|path| std::fs::canonicalize(path).ok());
        let paths = resolved
            .into_iter()
            .chain(self.native.build_ids.path_of(file));
        Checked::open_as(paths, file).ok()
    }

    /// Notes that native stack `stack` spawned process `child`.
    fn spawned(&mut self, stack: u64, child: NodeId) {
        self.native.spawned(stack, child);
    }

    /// Forgets the stacks of spawners the graph no longer holds (no flag can name them), and
    /// frees in the kernel the stacks that spawned no process it holds.
    pub fn retain(&mut self, holds: impl Fn(NodeId) -> bool) {
        self.native.retain(&holds);
        self.objects.bound();
        if let Some(jit) = self.jit.as_mut() {
            jit.retain(&holds);
        }
        if let Some(python) = self.python.as_mut() {
            python.retain(holds);
        }
    }

    /// Whether the native stack of `key` was located.
    fn knows(&self, key: SiteKey) -> bool {
        self.native.knows(key)
    }

    /// Locates the native stack of `key` (see [`NativeStacks::locate`]).
    fn locate(&mut self, key: SiteKey, holders: &[u32]) {
        self.native.locate(key, holders);
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
    fn take_back_unwound(&mut self, child: NodeId, spawner: NodeId, frames: Vec<Located>) {
        if let Some(jit) = self.jit.as_mut() {
            jit.take_back(child, spawner, frames);
        }
    }
}

/// The interpreter process `pid` runs, told by its executable's file name, for a process
/// whose exec this run did not see (found in /proc at start).
pub fn program_of(pid: u32) -> Option<Interpreter> {
    let exe = std::fs::read_link(proc_path(pid, "exe")).ok()?;
    Interpreter::of_program(exe.file_name()?.as_encoded_bytes())
}
