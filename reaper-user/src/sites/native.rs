//! Spawners' native stacks (see `reaper_common::native`): each frame the kernel named by build
//! id and file offset is located as it is; a frame it gave as an address is located in the
//! mappings of a process holding the spawner's code, while one runs (ASLR and the spawner's
//! exit no longer matter after that). Frames are named only when a flag needs them.
use std::collections::HashMap;
use std::path::PathBuf;

use aya::maps::{HashMap as KernelMap, MapData};
use blazesym::symbolize::source::{Elf, Source};
use blazesym::symbolize::{Input, Symbolized, Symbolizer};
use reaper_common::native::{FRAME_ADDRESS, FRAME_BUILD_ID, NativeStack};
use serde::{Deserialize, Serialize};

use super::build_ids::{BuildId, BuildIds};
use super::mappings::Mapping;
use super::referrers::Referrers;
use crate::lineage::graph::NodeId;
use crate::stream::evidence::Frame;

/// One frame of a stack, located in its object (as the checkpoint keeps it, too).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Located {
    /// The object's build id, when the kernel could read it.
    pub build_id: Option<BuildId>,
    /// The object, once found (by its mapping, or by its build id).
    pub object: Option<PathBuf>,
    /// The file offset in the object, or the raw address when there is none.
    pub offset: u64,
}

/// A stack as one spawner took it: its key in `STACKS` and the spawner's node (never reused:
/// a pid reused by another program is another node). Address frames differ by spawner.
pub type SiteKey = (u64, NodeId);

/// The native stacks of spawns, by [`SiteKey`].
pub struct NativeStacks {
    store: KernelMap<MapData, u64, NativeStack>,
    pub build_ids: BuildIds,
    located: HashMap<SiteKey, Vec<Located>>,
    named: HashMap<SiteKey, Vec<Frame>>,
    /// The processes each kept stack spawned (a stack none of the graph's names is freed).
    spawned: Referrers<u64>,
}

impl NativeStacks {
    pub fn new(store: KernelMap<MapData, u64, NativeStack>) -> NativeStacks {
        NativeStacks {
            store,
            build_ids: BuildIds::default(),
            located: HashMap::new(),
            named: HashMap::new(),
            spawned: Referrers::default(),
        }
    }

    /// Notes that stack `stack` spawned process `child`.
    pub fn spawned(&mut self, stack: u64, child: NodeId) {
        self.spawned.note(stack, child);
    }

    /// Forgets the stacks of spawners the graph no longer holds, and frees in the kernel the
    /// stacks that spawned no process it holds.
    pub fn retain(&mut self, holds: impl Fn(NodeId) -> bool) {
        self.located.retain(|&(_, node), _| holds(node));
        self.named.retain(|&(_, node), _| holds(node));
        for key in self.spawned.retain(&holds) {
            let _ = self.store.remove(&key);
            self.located.retain(|&(stack, _), _| stack != key);
            self.named.retain(|&(stack, _), _| stack != key);
        }
    }

    /// Whether the stack of `key` was located.
    pub fn knows(&self, key: SiteKey) -> bool {
        self.located.contains_key(&key)
    }

    /// Locates the stack of `key`. `holders` run the spawner's code (the spawner, then the
    /// processes it shares its code with: one that has not exec'd since its fork runs its
    /// spawner's); the first still running is read when a frame is an address, or names an
    /// object not yet known.
    pub fn locate(&mut self, key: SiteKey, holders: &[u32]) {
        let Ok(stack) = self.store.get(&key.0, 0) else {
            return;
        };
        let frames = stack.frames.get(..stack.len as usize).unwrap_or_default();
        let wanted = frames.iter().any(|f| match f.status {
            FRAME_BUILD_ID => !self.build_ids.knows(&f.build_id),
            FRAME_ADDRESS => true,
            _ => false,
        });
        let maps = match wanted {
            true => holders
                .iter()
                .find_map(|&pid| Some((pid, self.build_ids.learn(pid)?))),
            false => None,
        };
        let located = frames
            .iter()
            .filter_map(|f| match f.status {
                FRAME_BUILD_ID => Some(Located {
                    build_id: Some(f.build_id),
                    object: None,
                    offset: f.offset,
                }),
                FRAME_ADDRESS => Some(self.address(f.offset, maps.as_ref())),
                _ => None,
            })
            .collect();
        self.located.insert(key, located);
    }

    /// An address frame, located in the mappings of `holder` (pid, mappings) when it has one.
    fn address(&mut self, addr: u64, holder: Option<&(u32, Vec<Mapping>)>) -> Located {
        let unlocated = Located {
            build_id: None,
            object: None,
            offset: addr,
        };
        let Some((pid, maps)) = holder else {
            return unlocated;
        };
        let Some((m, offset)) = maps.iter().find_map(|m| Some((m, m.file_offset(addr)?))) else {
            return unlocated;
        };
        Located {
            build_id: self.build_ids.build_id(*pid, m),
            object: m.file(*pid),
            offset,
        }
    }

    /// The frames of the stack of `key`, named from their objects' symbols and debug
    /// information (once; later flags reuse them). `holders` as for [`NativeStacks::locate`]:
    /// objects not known yet are looked for in theirs.
    pub fn frames(&mut self, symbolizer: &Symbolizer, key: SiteKey, holders: &[u32]) -> Vec<Frame> {
        if let Some(named) = self.named.get(&key) {
            return named.clone();
        }
        let Some(located) = self.located.get(&key) else {
            return Vec::new();
        };
        let unknown = |l: &Located| l.build_id.is_some_and(|id| !self.build_ids.knows(&id));
        if located.iter().any(unknown) {
            for &pid in holders {
                self.build_ids.learn(pid);
            }
        }
        let named: Vec<Frame> = located
            .iter()
            .map(|l| {
                let mut frame = match (l.build_id, &l.object) {
                    (Some(id), None) => name(
                        symbolizer,
                        &Located {
                            object: self.build_ids.path(&id),
                            ..l.clone()
                        },
                    ),
                    _ => name(symbolizer, l),
                };
                frame.build_id = l.build_id.map(|id| self.build_ids.show(&id));
                frame
            })
            .collect();
        self.named.insert(key, named.clone());
        named
    }
}

/// A frame named from its object's symbols (no object: the frame says only its offset, or its
/// address; the caller adds the build id).
pub fn name(symbolizer: &Symbolizer, l: &Located) -> Frame {
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
