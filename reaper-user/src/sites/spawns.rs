//! Spawn sites and the lineage: what a record's change means for them (a fork's stacks noted
//! and located while its spawner runs, an exec's program looked at). The graph is only read
//! here: it answers who runs a spawner's code ([`LineageGraph::code_holders`]).
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use reaper_common::interpreter::Interpreter;

use super::native::SiteKey;
use super::{Located, SpawnSites, ToLocate, Unwind};
use crate::capture::decode::{CopiedStack, KernelEvent, What};
use crate::lineage::graph::{Change, LineageGraph, NodeId, SpawnStack};

/// What a record's change told the spawn sites.
#[derive(Default)]
pub struct Seen {
    /// An exec's interpreter, by name (`python3.12`, `node`), for its event.
    pub interpreter: Option<String>,
    /// What to tell the operator (why a Python process's frames will not be read).
    pub notes: Vec<String>,
}

impl SpawnSites {
    /// Takes in record `ev`'s change to `graph`: a fork's stacks (its copy taken, for the slow
    /// side), an exec's program.
    pub fn on_change(
        &mut self,
        graph: &LineageGraph,
        change: &Change,
        ev: &mut KernelEvent,
    ) -> Seen {
        let mut seen = Seen::default();
        match (change, &mut ev.what) {
            (
                &Change::Forked { node, .. },
                What::Fork {
                    spawner,
                    stack,
                    copy,
                    ..
                },
            ) => {
                self.forked(graph, node, *spawner, *stack, copy.take());
                // A pending interpreter's own fork: it runs, so the loader may be done.
                if let (Some(python), Some(spawner)) =
                    (self.python.as_mut(), graph.current(*spawner))
                {
                    seen.notes = python.look_again_at(spawner.id);
                }
            }
            (&Change::Execed { node, .. }, What::Exec { interpreter, .. }) => {
                match self.exec(node, ev.pid, ev.start, *interpreter) {
                    Ok(found) => seen.interpreter = found,
                    Err(note) => seen.notes.push(note),
                }
            }
            _ => {}
        }
        seen
    }

    /// A fork's stacks: the native one located in its spawner's mappings (on the slow side
    /// when they are read, with its copy), a JIT host's copy handed to the slow side to
    /// unwind, each noted as having spawned the
    /// child (a stack is kept while a process it spawned is).
    fn forked(
        &mut self,
        graph: &LineageGraph,
        child: NodeId,
        spawner: u32,
        stack: SpawnStack,
        copy: Option<Box<CopiedStack>>,
    ) {
        let spawner = graph.current(spawner).map(|n| (n.id, n.pid));
        match (stack.native, spawner, copy) {
            // A native site's stack, located; copied at its first fork, unwound too, as deep
            // as it goes.
            (Some(native), Some((node, pid)), copy) => {
                let spawner = (pid, exec_path(graph, node));
                self.locate_at_fork(graph, (native, node), spawner, copy);
            }
            // A JIT host's stack, copied at each fork.
            (None, Some((node, pid)), Some(copy)) => self.unwind(copy, node, pid, child),
            _ => {}
        }
        if let Some(native) = stack.native {
            self.spawned(native, child);
        }
        if let (Some(key), Some(python), Some(spawner)) =
            (stack.python, self.python.as_mut(), spawner)
        {
            python.spawned(key, child);
            python.name_at_fork(key, spawner);
        }
    }

    /// Takes back what a checkpoint kept of the spawns of `children`, live processes: each
    /// one's unwound frames, and its stacks as having spawned it. The native stacks not
    /// located yet are located while their spawners run: here when that reads nothing, else
    /// in one job for the slow side (see [`ToLocate`]), handed on before the ring is read.
    pub fn take_back(
        &mut self,
        graph: &LineageGraph,
        children: impl IntoIterator<Item = (NodeId, Option<Vec<Located>>)>,
    ) {
        let mut to_locate = Vec::new();
        for (child, unwound) in children {
            let Some(node) = graph.node(child) else {
                continue;
            };
            let (stack, spawner) = (node.spawn_stack, node.spawner);
            if let (Some(frames), Some(spawner)) = (unwound, spawner) {
                self.take_back_unwound(child, spawner, frames);
            }
            if let (Some(key), Some(python)) = (stack.python, self.python.as_mut()) {
                python.spawned(key, child);
            }
            if let (Some(key), Some(spawner)) = (stack.native, spawner) {
                self.spawned(key, child);
                to_locate.extend(self.walk_to_locate((key, spawner), graph));
            }
        }
        if !to_locate.is_empty() {
            self.hand_on(Unwind::Locate(to_locate));
        }
    }

    /// The walk of site `key` for the slow side to locate, when it is neither located nor
    /// there already and locating it reads a holder's mappings (else it is located here,
    /// reading nothing).
    fn walk_to_locate(&mut self, key: SiteKey, graph: &LineageGraph) -> Option<ToLocate> {
        if self.knows(key) || self.locating.contains(&key) {
            return None;
        }
        let walk = self.native.walk(key)?;
        let walk = self.native.locate_known(key, walk)?;
        self.locating.insert(key);
        Some(ToLocate {
            key,
            holders: graph.code_holders(key.1),
            walk,
        })
    }

    /// Looks at the program of process `pid`, found in /proc as node `node` (its exec not
    /// seen): see [`SpawnSites::exec`].
    pub fn found(&mut self, node: NodeId, pid: u32, program: Option<Interpreter>) -> Seen {
        // Its start is known to the clock tick only: 0 tells the probe to take the entry
        // for whatever process has the pid (its free removes it).
        match self.exec(node, pid, 0, program) {
            Ok(interpreter) => Seen {
                interpreter,
                notes: Vec::new(),
            },
            Err(note) => Seen {
                interpreter: None,
                notes: vec![note],
            },
        }
    }

    /// Interpreters whose library was not mapped at their exec, looked at again; returns
    /// what to tell the operator.
    pub fn look_again(&mut self) -> Vec<String> {
        match self.python.as_mut() {
            Some(python) if python.has_pending() => python.look_again(),
            _ => Vec::new(),
        }
    }

    /// Interpreters wait to be looked at again (their libpython not mapped at their exec).
    pub fn has_pending(&self) -> bool {
        self.python.as_ref().is_some_and(|p| p.has_pending())
    }
}

/// The path process `node` was exec'd from, when absolute (a relative one was relative to a
/// directory it was in then).
fn exec_path(graph: &LineageGraph, node: NodeId) -> Option<&Path> {
    let filename = graph.node(node)?.filename.as_deref()?;
    let path = Path::new(std::ffi::OsStr::from_bytes(filename));
    path.is_absolute().then_some(path)
}
