//! Python spawners' own frames (`--spawn-stacks auto`). Once per exec of an interpreter its
//! layout goes to the kernel (`PYTHONS`), so the fork probe can walk the forking thread's
//! frames; the stacks it reads are kept in the kernel (`PY_STACKS`, once per distinct stack)
//! and named here when the first fork from one is read, from the spawner's memory while it
//! still runs the code that forked (a flag raised after the spawner is gone, as `--check`'s
//! are, names them all the same).
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use aya::maps::{HashMap as BpfHashMap, MapData};
use reaper_common::ExeKey;
use reaper_common::python::{PyLayout, PyStack};

use super::referrers::Referrers;
use crate::lineage::graph::NodeId;
use crate::stream::evidence::Frame;

mod code;
mod debug_offsets;
mod locate;
mod versions;

use code::Memory;
use locate::{Binary, Found, Interpreter};

/// The kernel's side of Python stacks and what user space knows of each interpreter.
pub struct PythonStacks {
    layouts: BpfHashMap<MapData, u32, PyLayout>,
    stacks: BpfHashMap<MapData, u64, PyStack>,
    /// The interpreter executables read, for the exec probe (see `Interpreter::binary`).
    binaries: BpfHashMap<MapData, ExeKey, PyLayout>,
    /// The interpreter object files read so far.
    files: locate::Files,
    /// Each tracked interpreter, by its process's node (until its next exec or its end).
    interpreters: HashMap<NodeId, Interpreter>,
    /// The processes each kept stack spawned (a stack none of the graph's names is freed).
    spawned: Referrers<u64>,
    /// Each stack's frames as named from its spawner's memory, by (stack, spawner).
    named: HashMap<(u64, NodeId), Vec<Frame>>,
    /// The stacks whose frames named no function at a fork though their spawner's interpreter
    /// was known (its code objects unreadable): not read again at its next forks from there
    /// (a flag still tries).
    unnamed: HashSet<(u64, NodeId)>,
    /// Why interpreters were not read, each said once.
    refused: HashSet<String>,
    /// Interpreters to look at again (see [`PythonStacks::exec`]).
    pending: HashMap<NodeId, Pending>,
}

/// A `python3.N` process to look at, and how many more looks it gets while its libpython is
/// not mapped yet.
#[derive(Clone, Copy)]
struct Pending {
    pid: u32,
    start: u64,
    /// Looks left.
    looks: u32,
}

/// How many reasons why interpreters are not read are said, at most.
const REFUSALS: usize = 32;

/// Whether `e` says the process is gone (its /proc entry, or a zombie's empty mappings).
fn gone(e: &anyhow::Error) -> bool {
    e.downcast_ref::<std::io::Error>()
        .is_some_and(|e| e.kind() == std::io::ErrorKind::NotFound)
}

/// How many times an interpreter whose libpython is not mapped yet is looked at again (at
/// each batch's end, at its own forks, and at housekeeping brought 1 ms on: about a second).
const PENDING_LOOKS: u32 = 1000;

impl PythonStacks {
    pub fn new(
        layouts: BpfHashMap<MapData, u32, PyLayout>,
        stacks: BpfHashMap<MapData, u64, PyStack>,
        binaries: BpfHashMap<MapData, ExeKey, PyLayout>,
    ) -> PythonStacks {
        PythonStacks {
            layouts,
            stacks,
            binaries,
            files: locate::Files::default(),
            interpreters: HashMap::default(),
            spawned: Referrers::default(),
            named: HashMap::default(),
            unnamed: HashSet::default(),
            refused: HashSet::default(),
            pending: HashMap::default(),
        }
    }

    /// Forgets the interpreter process node `node` ran: it exec'd another program. (Its
    /// unnamed stacks were noted only while it ran an interpreter.)
    pub fn forget(&mut self, node: NodeId) {
        self.pending.remove(&node);
        if self.interpreters.remove(&node).is_some() {
            self.unnamed.retain(|&(_, spawner)| spawner != node);
        }
    }

    /// Looks at the program process `pid` (node `node`, started at `start`; 0: unknown) now
    /// runs, an executable named like an interpreter (`python3`, `python3.N`: a venv's
    /// `python` links to one): if it is a CPython 3.11–3.14 interpreter, its layout goes to
    /// the kernel and its name (e.g. `python3.12`) is returned. `Err` says, once per kind of
    /// interpreter, why a Python process's frames will not be read.
    pub fn exec(&mut self, node: NodeId, pid: u32, start: u64) -> Result<Option<String>, String> {
        self.forget(node);
        let looks = PENDING_LOOKS;
        self.look(node, Pending { pid, start, looks })
    }

    /// Looks again at the interpreters not mapped at their exec (see [`PythonStacks::exec`]);
    /// returns what to tell the operator.
    pub fn look_again(&mut self) -> Vec<String> {
        let pending: Vec<_> = self.pending.drain().collect();
        pending
            .into_iter()
            .filter_map(|(node, p)| self.look(node, p).err())
            .collect()
    }

    /// Looks again at interpreter `node`, if it is still to be looked at (see
    /// [`PythonStacks::look_again`]).
    pub fn look_again_at(&mut self, node: NodeId) -> Vec<String> {
        match self.pending.remove(&node) {
            Some(p) => self.look(node, p).err().into_iter().collect(),
            None => Vec::new(),
        }
    }

    /// Whether an interpreter is still to be looked at again.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Looks at process `p`: a `python3.N` whose libpython the dynamic loader has not mapped
    /// yet is looked at again within milliseconds (see [`PENDING_LOOKS`]), until it is.
    fn look(&mut self, node: NodeId, p: Pending) -> Result<Option<String>, String> {
        let Pending { pid, start, looks } = p;
        let interpreter = match self.files.find(pid, start) {
            Ok(Found::Python(found)) => found,
            Ok(Found::Loading) => {
                if looks > 1 {
                    let looks = looks - 1;
                    self.pending.insert(node, Pending { looks, ..p });
                }
                return Ok(None);
            }
            Ok(Found::NotPython) => return Ok(None),
            // Gone already (or a zombie, which maps nothing): nothing to say about a process
            // that ended.
            Err(e) if gone(&e) || !crate::procfs::proc_path(pid, "maps").exists() => {
                return Ok(None);
            }
            Err(e) => return self.refuse(pid, format!("{e:#}")),
        };
        if let Err(e) = self.layouts.insert(pid, interpreter.probe, 0) {
            let why = format!("the interpreters' map: {e}");
            return self.refuse(pid, why);
        }
        if let Some(binary) = interpreter.binary {
            self.give(binary);
        }
        let name = interpreter.name.clone();
        self.interpreters.insert(node, interpreter);
        Ok(Some(name))
    }

    /// Says why process `pid`'s frames are not read, once for each reason (and no more than
    /// [`REFUSALS`] reasons in all: a reason may name a file, and files are many).
    fn refuse(&mut self, pid: u32, why: String) -> Result<Option<String>, String> {
        if self.refused.len() >= REFUSALS || !self.refused.insert(why.clone()) {
            return Ok(None);
        }
        let more = match self.refused.len() == REFUSALS {
            true => " (the last such note: more reasons are not said)",
            false => "",
        };
        Err(format!(
            "pid {pid}: its Python frames are not read: {why}{more}"
        ))
    }

    /// Hands the exec probe an interpreter executable: from here an exec of that file gets
    /// its layout in the kernel at once, before its program can fork (the reader's look at
    /// the exec record comes later, and a program may fork first). A full map (64 files)
    /// leaves the rest to that look.
    fn give(&mut self, binary: Binary) {
        let _ = self.binaries.insert(binary.key, binary.layout, 0);
    }

    /// Hands the exec probe the Python interpreters on `path` (a `PATH` value: `python3` and
    /// `python3.N` in each directory; a venv's `python` is a link to one), so that a gateway
    /// started as one, or starting one, gets its Python frames from its first fork. Any
    /// other interpreter file is handed over once the reader has seen it run.
    pub fn give_interpreters_on(&mut self, path: &std::ffi::OsStr) {
        for dir in std::env::split_paths(path) {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let name = entry.file_name();
                if !locate::names_an_interpreter(&name.to_string_lossy()) {
                    continue;
                }
                // A file that cannot be read is looked at when a process runs it, as before.
                if let Ok(Some(binary)) = self.files.executable(&entry.path()) {
                    self.give(binary);
                }
            }
        }
    }

    /// Notes that stack `key` spawned process `child`.
    pub fn spawned(&mut self, key: u64, child: NodeId) {
        self.spawned.note(key, child);
    }

    /// Names stack `key`, which spawner `(node, pid)` just forked from, the first time it does:
    /// its memory holds the code objects now.
    pub fn name_at_fork(&mut self, key: u64, (spawner, pid): (NodeId, u32)) {
        let site = (key, spawner);
        if self.named.contains_key(&site) || self.unnamed.contains(&site) {
            return;
        }
        let frames = self.frames(key, spawner, pid, true);
        if frames.iter().any(|f| f.function.is_some()) {
            self.named.insert(site, frames);
        } else if self.interpreters.contains_key(&spawner) {
            self.unnamed.insert(site);
        }
        // Else the spawner was gone, or its interpreter not found yet: its next fork tries
        // again, and a flag does, as for a stack adopted.
    }

    /// Forgets what concerns processes the graph no longer holds, and the kernel's copies of
    /// stacks that spawned none of those it does.
    pub fn retain(&mut self, holds: impl Fn(NodeId) -> bool) {
        self.interpreters.retain(|&node, _| holds(node));
        self.pending.retain(|&node, _| holds(node));
        self.named.retain(|&(_, spawner), _| holds(spawner));
        self.unnamed.retain(|&(_, spawner)| holds(spawner));
        let freed: HashSet<u64> = self.spawned.retain(holds).into_iter().collect();
        for key in &freed {
            let _ = self.stacks.remove(key);
        }
        if !freed.is_empty() {
            self.named.retain(|(stack, _), _| !freed.contains(stack));
            self.unnamed.retain(|(stack, _)| !freed.contains(stack));
        }
    }

    /// The Python frames of stack `key`, innermost first, named from the memory of `spawner`
    /// (process `pid`) while it runs (`alive`); unnamed frames once it is gone. A spawner this
    /// run did not see exec (found in /proc, or adopted from the run before) is looked at now.
    pub fn frames(&mut self, key: u64, spawner: NodeId, pid: u32, alive: bool) -> Vec<Frame> {
        if let Some(named) = self.named.get(&(key, spawner)) {
            return named.clone();
        }
        let Ok(stack) = self.stacks.get(&key, 0) else {
            return Vec::new();
        };
        let frames = stack.frames.iter().take(stack.len as usize);
        if alive
            && !self.interpreters.contains_key(&spawner)
            && let Ok(Found::Python(found)) = self.files.find(pid, 0)
        {
            self.interpreters.insert(spawner, found);
        }
        let (Some(interpreter), true) = (self.interpreters.get(&spawner), alive) else {
            return frames.map(|_| code::unnamed()).collect();
        };
        let memory = Memory::open(pid);
        frames
            .map(|f| code::name(memory.as_ref(), &interpreter.code, f))
            .collect()
    }
}
