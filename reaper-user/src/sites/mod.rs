//! The code that spawned each process (`--spawn-stacks`). The kernel keeps the spawning
//! thread's user stack at each tracked fork, once per distinct stack, and a Python spawner's
//! own frames (see [`python`]); a fork record names both. Here each native stack is located
//! once per spawner, while a process holding the spawner's mappings still runs (addresses
//! become an object and an offset in it: ASLR and the spawner's exit no longer matter), and
//! named only when a flag needs it; Python frames are named then, from the spawner's memory.
//! A JIT host's stack is copied instead and unwound here (see [`jit`]).
use std::collections::HashMap;
use std::path::PathBuf;

use aya::maps::{MapData, StackTraceMap};
use blazesym::Pid;
use blazesym::normalize::{NormalizeOpts, Normalizer, UserMeta};
use blazesym::symbolize::source::{Elf, Source};
use blazesym::symbolize::{Input, Symbolized, Symbolizer};
use jit::JitStacks;
use python::PythonStacks;

use crate::capture::decode::CopiedStack;
use crate::capture::loader::StackMaps;
use crate::lineage::graph::NodeId;
use crate::procfs::proc_path;
use crate::stream::evidence::Frame;

mod jit;
mod mappings;
pub mod python;
mod referrers;

use referrers::Referrers;

/// One frame of a stack, located in its object.
#[derive(Clone, Debug)]
struct Located {
    object: Option<PathBuf>,
    /// The file offset in `object`, or the raw address when there is none.
    offset: u64,
}

/// A stack as one spawner took it: the kernel's stack id and the spawner's node (never reused:
/// a pid reused by another program is another node).
pub type SiteKey = (u32, NodeId);

/// Spawn stacks, by [`SiteKey`].
pub struct SpawnSites {
    stacks: StackTraceMap<MapData>,
    /// `--spawn-stacks auto`: Python spawners' frames.
    pub python: Option<PythonStacks>,
    /// `--spawn-stacks auto`: JIT hosts' frames.
    jit: Option<JitStacks>,
    normalizer: Normalizer,
    symbolizer: Symbolizer,
    located: HashMap<SiteKey, Vec<Located>>,
    named: HashMap<SiteKey, Vec<Frame>>,
    /// The processes each kept native stack spawned (a stack none of the graph's names is
    /// freed: its id may then name another stack).
    spawned: Referrers<u32>,
}

impl SpawnSites {
    /// `interpreters`: read Python spawners' and JIT hosts' frames too.
    pub fn new(maps: StackMaps, interpreters: bool) -> SpawnSites {
        SpawnSites {
            stacks: maps.native,
            python: interpreters.then(|| PythonStacks::new(maps.interpreters, maps.python)),
            jit: interpreters.then(|| JitStacks::new(maps.jit_hosts)),
            normalizer: Normalizer::new(),
            symbolizer: Symbolizer::new(),
            located: HashMap::new(),
            named: HashMap::new(),
            spawned: Referrers::default(),
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
    pub fn spawned(&mut self, stack: u32, child: NodeId) {
        self.spawned.note(stack, child);
    }

    /// Forgets the stacks of spawners the graph no longer holds (no flag can name them), and
    /// frees in the kernel the stacks that spawned no process it holds.
    pub fn retain(&mut self, holds: impl Fn(NodeId) -> bool) {
        self.located.retain(|&(_, node), _| holds(node));
        self.named.retain(|&(_, node), _| holds(node));
        for id in self.spawned.retain(&holds) {
            let _ = self.stacks.remove(&id);
            self.located.retain(|&(stack, _), _| stack != id);
            self.named.retain(|&(stack, _), _| stack != id);
        }
        if let Some(jit) = self.jit.as_mut() {
            jit.retain(&holds);
        }
        if let Some(python) = self.python.as_mut() {
            python.retain(holds);
        }
    }

    /// Whether the stack of `key` was located.
    pub fn knows(&self, key: SiteKey) -> bool {
        self.located.contains_key(&key)
    }

    /// Locates the stack of `key` in the mappings of the first of `holders` still running
    /// (the spawner, then the processes it shares its code with: a process that has not
    /// exec'd since its fork runs its spawner's).
    pub fn locate(&mut self, key: SiteKey, holders: &[u32]) {
        let Ok(trace) = self.stacks.get(&key.0, 0) else {
            return;
        };
        let addrs: Vec<u64> = trace.frames().iter().map(|f| f.ip).collect();
        let opts = NormalizeOpts {
            map_files: false,
            ..Default::default()
        };
        let located = holders.iter().find_map(|&pid| {
            let out = self
                .normalizer
                .normalize_user_addrs_opts(Pid::from(pid), &addrs, &opts)
                .ok()?;
            Some(
                out.outputs
                    .iter()
                    .zip(&addrs)
                    .map(|(&(offset, meta), &addr)| match out.meta.get(meta) {
                        Some(UserMeta::Elf(elf)) => Located {
                            object: Some(elf.path.clone()),
                            offset,
                        },
                        _ => Located {
                            object: None,
                            offset: addr,
                        },
                    })
                    .collect(),
            )
        });
        // Unlocated (every holder gone): the raw addresses, so the flag still says so.
        let located = located.unwrap_or_else(|| {
            addrs
                .iter()
                .map(|&addr| Located {
                    object: None,
                    offset: addr,
                })
                .collect()
        });
        self.located.insert(key, located);
    }

    /// The frames of the stack of `key`, named from their objects' symbols and debug
    /// information (once; later flags reuse them).
    pub fn frames(&mut self, key: SiteKey) -> Vec<Frame> {
        if let Some(named) = self.named.get(&key) {
            return named.clone();
        }
        let Some(located) = self.located.get(&key) else {
            return Vec::new();
        };
        let named: Vec<Frame> = located.iter().map(|l| name(&self.symbolizer, l)).collect();
        self.named.insert(key, named.clone());
        named
    }
}

/// The file name of the executable process `pid` runs (empty when it cannot be read).
fn executable_name(pid: u32) -> String {
    std::fs::read_link(proc_path(pid, "exe"))
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_default()
}

fn name(symbolizer: &Symbolizer, l: &Located) -> Frame {
    let mut frame = Frame {
        object: l.object.as_ref().map(|p| p.display().to_string()),
        offset: l.offset,
        ..Frame::default()
    };
    let Some(object) = &l.object else {
        return frame;
    };
    let source = Source::Elf(Elf::new(object));
    if let Ok(Symbolized::Sym(sym)) =
        symbolizer.symbolize_single(&source, Input::FileOffset(l.offset))
    {
        frame.function = Some(sym.name.to_string());
        if let Some(code) = sym.code_info {
            let file = match &code.dir {
                Some(dir) => dir.join(&*code.file).display().to_string(),
                None => PathBuf::from(&*code.file).display().to_string(),
            };
            frame.file = Some(file);
            frame.line = code.line;
        }
    }
    frame
}
