//! The code that spawned each process (`--spawn-stacks`). The kernel keeps the spawning
//! thread's user stack at each tracked fork, once per distinct stack, and a Python spawner's
//! own frames (see [`python`]); a fork record names both. Each native frame names its object
//! by build id and a file offset (see [`native`]), and is named only when a flag needs it;
//! Python frames are named then, from the spawner's memory.
//! A JIT host's stack is copied instead and unwound (see [`jit`]), as is a native site's first
//! (see [`native`]), on the slow side (see [`unwinding`]), where a native site's walk is also
//! located when that reads its spawner's mappings (see [`locating`]). What reads objects and
//! perf maps to name frames runs on the slow side too (see [`naming`]).
use build_ids::SavedBuildId;
use jit::JitStacks;
pub use naming::{Asked, NamedSites, Naming};
pub use native::Located;
use native::{NativeStacks, SiteKey};
use python::PythonStacks;
use reaper_common::interpreter::Interpreter;
use rustc_hash::FxHashSet as HashSet;
use serde::{Deserialize, Serialize};
use std::path::Path;
pub use unwinding::{ToLocate, Unwind, Unwinder, Unwound};

use crate::capture::decode::CopiedStack;
use crate::capture::loader::StackMaps;
use crate::lineage::graph::saved::SavedStart;
use crate::lineage::graph::{LineageGraph, NodeId};
use crate::procfs::proc_path;

pub mod build_ids;
mod jit;
mod locating;
mod mappings;
mod naming;
mod native;
mod needed;
pub mod python;
mod referrers;
mod spawns;
mod unwind;
mod unwinding;

/// Jobs waiting to be handed to the slow side (see [`SpawnSites::take_to_unwind`]); past them, a
/// copy is not unwound (its site keeps its frame-pointer walk, its child has no JIT frames), and
/// a walk is located at its spawner's next fork from there.
pub const UNWINDS_WAITING: usize = 64;

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
    /// Copies for the slow side to unwind, and what it is to forget.
    to_unwind: Vec<Unwind>,
    /// Native sites with the slow side (their copy to unwind, or their walk to locate): one
    /// job a site at a time.
    unwinding: HashSet<SiteKey>,
    /// Native sites of a checkpoint's live processes whose walks the slow side locates (one
    /// job at start-up): a fork from one meanwhile still hands on its copy, without the walk.
    locating: HashSet<SiteKey>,
    /// Jobs the slow side did not take: [`UNWINDS_WAITING`] waited already, its queue was
    /// full, or a copy's host had [`jit::IN_FLIGHT`] there already.
    refused: u64,
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
            to_unwind: Vec::new(),
            unwinding: HashSet::default(),
            locating: HashSet::default(),
            refused: 0,
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

    /// Hands a JIT host's stack copied at the fork of `child` to the slow side (see [`jit`]),
    /// unless [`jit::IN_FLIGHT`] of its copies are there already: a host forking without
    /// pause takes no more than its share of the queue.
    fn unwind(&mut self, copy: Box<CopiedStack>, host: NodeId, pid: u32, child: NodeId) {
        if let Some(jit) = self.jit.as_mut() {
            if !jit.unwinding(host) {
                self.refused += 1;
                return;
            }
            let job = Unwind::Host {
                host,
                pid,
                child,
                copy,
            };
            self.hand_on(job);
        }
    }

    /// Locates the native stack of `key` at a fork of its spawner (`spawner_pid`, exec'd from
    /// `exec_path`), once: here when that reads nothing (see [`NativeStacks::locate_known`]),
    /// else on the slow side, with the stack copied at the site's first fork when there is
    /// one (see `reaper_common::copy`), handed on with what the slow side needs to unwind it
    /// when the processes running the spawner's code are gone (see [`Unwind::Site`]). The
    /// copy's frames replace the frame-pointer walk when they go deeper (see
    /// [`NativeStacks::take_unwound`]).
    fn locate_at_fork(
        &mut self,
        graph: &LineageGraph,
        key: SiteKey,
        (spawner_pid, exec_path): (u32, Option<&Path>),
        copy: Option<Box<CopiedStack>>,
    ) {
        if self.unwinding.contains(&key) {
            return;
        }
        let walk = match self.native.knows(key) || self.locating.contains(&key) {
            true => None,
            false => self
                .native
                .walk(key)
                .and_then(|walk| self.native.locate_known(key, walk)),
        };
        let copy = copy.filter(|_| !self.native.unwound(key));
        let unlocated = match walk.is_none() && copy.is_some() && self.locating.contains(&key) {
            true => self.native.walk(key),
            false => None,
        };
        let job = match (walk, copy) {
            (walk, Some(copy)) => Unwind::Site {
                key,
                holders: graph.code_holders(key.1),
                spawner: spawner_pid,
                exec_path: exec_path.map(Path::to_path_buf),
                seen_at: self.native.build_ids.path_of(copy.exe.file),
                // Named from the walk itself while it is with the slow side (start-up's).
                forked_in: (self.native).forked_in(key, walk.as_ref().or(unlocated.as_ref())),
                walk,
                copy,
            },
            (Some(walk), None) => Unwind::Locate(vec![ToLocate {
                key,
                holders: graph.code_holders(key.1),
                walk,
            }]),
            (None, None) => return,
        };
        self.unwinding.insert(key);
        self.hand_on(job);
    }

    /// Queues `job` for the slow side, unless [`UNWINDS_WAITING`] wait already.
    fn hand_on(&mut self, job: Unwind) {
        match self.to_unwind.len() < UNWINDS_WAITING {
            true => self.to_unwind.push(job),
            false => self.not_handed(job),
        }
    }

    /// What waits for the slow side to unwind (see [`unwinding`]), taken.
    pub fn take_to_unwind(&mut self) -> Vec<Unwind> {
        std::mem::take(&mut self.to_unwind)
    }

    /// Whether copies wait for the slow side.
    pub fn has_to_unwind(&self) -> bool {
        !self.to_unwind.is_empty()
    }

    /// `job` never reached the slow side (its queue was full): a site's copy is not unwound
    /// and its walk is located at the spawner's next fork from there, a gateway's objects are
    /// not learned, and hosts to forget are asked again at the next [`SpawnSites::retain`].
    pub fn not_handed(&mut self, job: Unwind) {
        match job {
            // A walk the slow side did not take is located at the spawner's next fork from
            // there; until then it is named by what needs no reading (see
            // `NativeStacks::for_naming`).
            Unwind::Site { key, .. } => {
                self.unwinding.remove(&key);
                self.refused += 1;
            }
            Unwind::Locate(sites) => {
                for site in &sites {
                    if !self.locating.remove(&site.key) {
                        self.unwinding.remove(&site.key);
                    }
                }
                self.refused += 1;
            }
            Unwind::Learn(_) => self.refused += 1,
            Unwind::Host { host, .. } => {
                if let Some(jit) = self.jit.as_mut() {
                    jit.not_unwinding(host);
                }
                self.refused += 1;
            }
            Unwind::Forget(hosts) => {
                if let Some(jit) = self.jit.as_mut() {
                    jit.forget_later(hosts);
                }
            }
        }
    }

    /// Jobs the slow side did not take so far (see [`SpawnSites::not_handed`]).
    pub fn refused(&self) -> u64 {
        self.refused
    }

    /// Takes back what the slow side unwound: a site's frames, a JIT host's stack.
    pub fn take_unwound(&mut self, unwound: Unwound) {
        match unwound {
            // A site whose spawner the graph let go meanwhile is not taken back.
            Unwound::Site {
                key,
                frames,
                truncated,
                located,
            } => {
                if self.unwinding.remove(&key) {
                    if let Some(location) = located {
                        self.native.take_located(key, location);
                    }
                    self.native.take_unwound(key, frames, truncated);
                }
            }
            Unwound::Located(sites) => {
                for (key, location) in sites {
                    // A start-up job's, or a fork's without a copy.
                    if self.locating.remove(&key) || self.unwinding.remove(&key) {
                        self.native.take_located(key, location);
                    }
                }
            }
            Unwound::Learned(learned) => self.native.take_learned(learned),
            Unwound::Host {
                host,
                child,
                stack,
                frames,
            } => {
                if let Some(jit) = self.jit.as_mut() {
                    jit.take_unwound(host, child, stack, frames);
                }
            }
        }
    }

    /// Notes that native stack `stack` spawned process `child`.
    fn spawned(&mut self, stack: u64, child: NodeId) {
        self.native.spawned(stack, child);
    }

    /// Forgets the stacks of spawners the graph no longer holds (no flag can name them), and
    /// frees in the kernel the stacks that spawned no process it holds.
    pub fn retain(&mut self, holds: impl Fn(NodeId) -> bool) {
        self.native.retain(&holds);
        self.unwinding.retain(|&(_, spawner)| holds(spawner));
        self.locating.retain(|&(_, spawner)| holds(spawner));
        let gone = self.jit.as_mut().map(|jit| jit.retain(&holds));
        if let Some(gone) = gone.filter(|gone| !gone.is_empty()) {
            self.hand_on(Unwind::Forget(gone));
        }
        if let Some(python) = self.python.as_mut() {
            python.retain(holds);
        }
    }

    /// Whether the native stack of `key` was located.
    fn knows(&self, key: SiteKey) -> bool {
        self.native.knows(key)
    }

    /// Learns the objects a gateway runs (on the slow side), so its spawns are named after it
    /// is gone.
    pub fn gateway_found(&mut self, pid: u32) {
        self.hand_on(Unwind::Learn(pid));
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
