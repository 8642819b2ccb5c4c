//! Spawners' native stacks (see `reaper_common::native`): each frame the kernel named by build
//! id and file offset is located as it is; a frame it gave as an address is located in the
//! mappings of a process holding the spawner's code, while one runs (ASLR and the spawner's
//! exit no longer matter after that), on the slow side (see [`super::locating`]). Frames are
//! named only when a flag needs them.
//!
//! A site whose stack was copied (see `reaper_common::copy`) is located from the copy instead,
//! unwound with its objects' call frame information: the frame-pointer walk stops in code
//! built without frame pointers (the C library's fork, a Rust binary).
//!
//! Every frame kept is code: a frame-pointer walk that ran off its stack into data (an
//! address in no executable mapping, or an object no build id names) ends there, and the
//! stack says it was cut ([`Site::truncated`]).
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::path::{Path, PathBuf};

use aya::maps::{HashMap as KernelMap, MapData};
use blazesym::symbolize::source::{Elf, Source};
use blazesym::symbolize::{CodeInfo, Input, Sym, Symbolized, Symbolizer};
use reaper_common::native::NativeStack;
use serde::{Deserialize, Serialize};

use super::build_ids::{BuildId, BuildIds, has_build_id};
use super::locating::{Learned, Location, Walk};
use super::referrers::Referrers;
use super::unwinding::UnwoundFrame;
use crate::lineage::graph::NodeId;
use crate::stream::evidence::Frame;
use crate::untrusted::object::Sealed;
use crate::untrusted::{Checked, caps};

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

/// A site's stack, located.
struct Site {
    frames: Vec<Located>,
    /// Whether frames past the last were dropped: not code, or past the cap.
    truncated: bool,
    /// Whether they were unwound from a copy (see [`NativeStacks::take_unwound`]).
    unwound: bool,
}

impl Site {
    /// A site located from its frame-pointer walk (not unwound from a copy).
    fn walked(frames: Vec<Located>, truncated: bool) -> Site {
        Site {
            frames,
            truncated,
            unwound: false,
        }
    }
}

/// A site's stack, named: what a flag's `spawned_at` shows.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Named {
    pub frames: Vec<Frame>,
    /// Whether the stack was cut (see [`Site::truncated`]).
    pub truncated: bool,
}

/// A site's frames for naming (see [`NativeStacks::for_naming`]).
pub enum SiteFrames {
    Named(Named),
    Located {
        frames: Vec<(Located, Option<String>)>,
        truncated: bool,
        /// Where objects not found (or replaced since) are looked for (see
        /// [`NativeStacks::for_naming`]).
        holders: Vec<u32>,
    },
}

/// The native stacks of spawns, by [`SiteKey`].
pub struct NativeStacks {
    store: KernelMap<MapData, u64, NativeStack>,
    pub build_ids: BuildIds,
    located: HashMap<SiteKey, Site>,
    named: HashMap<SiteKey, Named>,
    /// The processes each kept stack spawned (a stack none of the graph's names is freed).
    spawned: Referrers<u64>,
}

impl NativeStacks {
    pub fn new(store: KernelMap<MapData, u64, NativeStack>) -> NativeStacks {
        NativeStacks {
            store,
            build_ids: BuildIds::default(),
            located: HashMap::default(),
            named: HashMap::default(),
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
        let freed: HashSet<u64> = self.spawned.retain(&holds).into_iter().collect();
        for key in &freed {
            let _ = self.store.remove(key);
        }
        if !freed.is_empty() {
            self.located.retain(|(stack, _), _| !freed.contains(stack));
            self.named.retain(|(stack, _), _| !freed.contains(stack));
        }
        let located = &self.located;
        self.build_ids.bound(|| {
            let frames = located.values().flat_map(|site| &site.frames);
            frames.filter_map(|l| l.build_id).collect()
        });
    }

    /// Whether the stack of `key` was located.
    pub fn knows(&self, key: SiteKey) -> bool {
        self.located.contains_key(&key)
    }

    /// The kernel's frame-pointer walk of the stack of `key`, when its store holds it.
    pub fn walk(&self, key: SiteKey) -> Option<Walk> {
        let stack = self.store.get(&key.0, 0).ok()?;
        Some(Walk::new(&stack.frames, stack.len))
    }

    /// Locates `walk`, the stack of `key`, here when that reads nothing (every frame names
    /// its object by a build id known); gives it back when a holder's mappings are to be read
    /// (on the slow side: see [`Files::locate`] and [`NativeStacks::take_located`]).
    ///
    /// [`Files::locate`]: super::locating::Files::locate
    pub fn locate_known(&mut self, key: SiteKey, walk: Walk) -> Option<Walk> {
        if walk.wants_mappings(|id| self.build_ids.knows(id)) {
            return Some(walk);
        }
        let (frames, truncated) = walk.locate(None, |_, _| (None, None));
        self.keep_located(key, Site::walked(frames, truncated));
        None
    }

    /// Keeps `location`, the walk of `key` located on the slow side: the build id of each
    /// file it read, and the frames (unless they are there already).
    pub fn take_located(&mut self, key: SiteKey, location: Location) {
        self.take_learned(location.learned);
        if !self.knows(key) {
            let site = Site::walked(location.frames, location.truncated);
            self.keep_located(key, site);
        }
    }

    /// Keeps what the slow side learned of files a holder maps: their build ids, and where
    /// each was found.
    pub fn take_learned(&mut self, learned: Vec<Learned>) {
        for l in learned {
            self.build_ids.note(l.file, l.id, l.path);
        }
    }

    /// Keeps the frames site `key` was located at; a name given it before (from what its walk
    /// names with nothing read, see [`NativeStacks::for_naming`]) is dropped, to be named
    /// again from them.
    fn keep_located(&mut self, key: SiteKey, site: Site) {
        self.located.insert(key, site);
        self.named.remove(&key);
    }

    /// The object site `key`'s innermost frame is in (where its spawner forked: the C
    /// library's fork, mostly), as the kernel named it: where a file of its build id was seen,
    /// the id, and the frame's offset. `walk`: the site's walk, when it is not located yet.
    pub fn forked_in(&self, key: SiteKey, walk: Option<&Walk>) -> Option<(PathBuf, BuildId, u64)> {
        let (id, offset) = match walk {
            Some(walk) => walk.innermost()?,
            None => {
                let first = self.located.get(&key)?.frames.first()?;
                (first.build_id?, first.offset)
            }
        };
        let path = self.build_ids.path_of_id(&id)?;
        Some((path.to_path_buf(), id, offset))
    }

    /// Whether the stack of `key` was unwound from a copy already.
    pub fn unwound(&self, key: SiteKey) -> bool {
        self.located.get(&key).is_some_and(|site| site.unwound)
    }

    /// Keeps `frames`, site `key`'s copy unwound (see `sites::unwinding`), as the site's
    /// stack, each file's build id learned. The frame-pointer walk stays when it went as deep
    /// (code that keeps frame pointers but describes no frame to an unwinder: Go's).
    pub fn take_unwound(&mut self, key: SiteKey, frames: Vec<UnwoundFrame>, truncated: bool) {
        let walked = self.located.get(&key).map_or(0, |site| site.frames.len());
        if frames.len() <= walked {
            return;
        }
        let frames = (frames.into_iter())
            .map(|f| Located {
                build_id: self.build_ids.note(f.file, f.build_id, f.object.clone()),
                object: f.object,
                offset: f.offset,
            })
            .collect();
        let site = Site {
            frames,
            truncated,
            unwound: true,
        };
        self.keep_located(key, site);
    }

    /// The frames of site `key` for naming (see `sites::naming`): named already, or each
    /// located in its object, with its build id in words. Nothing is read here: an object
    /// known by its build id alone is the file where one of that id was seen; the naming
    /// checks each is still that file, and looks for one not found (or replaced) among those
    /// mapped by the processes running the spawner's code, `holders`.
    pub fn for_naming(&self, key: SiteKey, holders: &[u32]) -> SiteFrames {
        if let Some(named) = self.named.get(&key) {
            return SiteFrames::Named(named.clone());
        }
        // A site not located yet (its job with the slow side, or refused there) is named by
        // what its walk names with nothing read.
        let unread;
        let (located, truncated) = match self.located.get(&key) {
            Some(site) => (&site.frames, site.truncated),
            None => {
                let Some(walk) = self.walk(key) else {
                    return SiteFrames::Named(Named::default());
                };
                unread = walk.unread();
                (&unread.frames, unread.truncated)
            }
        };
        let frames: Vec<(Located, Option<String>)> = (located.iter())
            .map(|l| {
                let object = match (l.build_id, &l.object) {
                    (Some(id), None) => self.build_ids.path_of_id(&id).map(Path::to_path_buf),
                    _ => l.object.clone(),
                };
                let build_id = l.build_id.map(|id| self.build_ids.show(&id));
                let located = Located {
                    object,
                    ..l.clone()
                };
                (located, build_id)
            })
            .collect();
        SiteFrames::Located {
            frames,
            truncated,
            holders: holders.to_vec(),
        }
    }

    /// Keeps site `key`'s frames as a round named them: it is named once.
    pub fn remember(&mut self, key: SiteKey, named: Named) {
        self.named.insert(key, named);
    }
}

/// Names frames for one round (a scan's flags, `--check`'s verdict, an answer), and is
/// dropped after it: the symbolizer's caches (an object's symbols, its debug information's
/// line tables: megabytes) and the copies of the objects it read.
///
/// The symbolizer maps what it reads, so it reads a sealed copy of each object (see
/// [`Checked::sealed_copy`]), made once a round: a truncation of the file itself cannot
/// fault it. It reads nothing else: no debug directory is searched and the copy's debug
/// links are renamed (see [`Checked::sealed_copy`]), so a debug file the object names (a
/// name the traced process chose: a FIFO's, a device's) is never looked for; an object whose
/// compressed sections say they inflate past [`caps::OBJECT_COPY`] is not read, and a round
/// copies [`caps::OBJECT_COPIES`] at most.
pub struct Namer {
    symbolizer: Symbolizer,
    /// Each object's copy, by its path and the build id it must have; none for one that is
    /// not the file the kernel named any more (or cannot be read).
    copies: HashMap<(PathBuf, Option<BuildId>), Option<Sealed>>,
    /// Bytes copied this round (at most [`caps::OBJECT_COPIES`]).
    copied: u64,
}

impl Default for Namer {
    fn default() -> Namer {
        let none: [PathBuf; 0] = [];
        Namer {
            symbolizer: Symbolizer::builder().set_debug_dirs(Some(none)).build(),
            copies: HashMap::default(),
            copied: 0,
        }
    }
}

impl Namer {
    /// The copy of `path`, while it is the file of `build_id` (when the kernel named one).
    fn copy(&mut self, path: &std::path::Path, build_id: Option<BuildId>) -> Option<&Sealed> {
        let copied = &mut self.copied;
        self.copies
            .entry((path.to_owned(), build_id))
            .or_insert_with(|| {
                let file = Checked::open(path).ok()?;
                if build_id.is_some_and(|id| !has_build_id(&file, &id)) {
                    return None;
                }
                *copied = copied
                    .checked_add(file.len())
                    .filter(|&n| n <= caps::OBJECT_COPIES)?;
                let copy = file.sealed_copy().ok()?;
                copy.inflates_within(caps::OBJECT_COPY).ok()?;
                Some(copy)
            })
            .as_ref()
    }

    /// A frame named from its object's symbols and debug information, as the frames it
    /// stands for, innermost first: the functions inlined where it is (each with the line it
    /// is at in that function), then its own function. No object, or an object that is no
    /// longer the file the kernel named (another build id now, not a regular file): one frame
    /// that says only its offset, or its address. The caller adds the build id.
    pub fn name(&mut self, l: &Located) -> Vec<Frame> {
        let frame = Frame {
            object: l.object.as_ref().map(|p| p.display().to_string()),
            offset: l.offset,
            ..Frame::default()
        };
        let Some(copy) = l
            .object
            .as_ref()
            .and_then(|path| self.copy(path, l.build_id))
        else {
            return vec![frame];
        };
        let source = Source::Elf(Elf::new(copy.path()));
        match self
            .symbolizer
            .symbolize_single(&source, Input::FileOffset(l.offset))
        {
            Ok(Symbolized::Sym(sym)) => named(frame, &sym),
            _ => vec![frame],
        }
    }
}

/// `frame` as the symbol `sym` names it, and the functions inlined there.
fn named(frame: Frame, sym: &Sym<'_>) -> Vec<Frame> {
    let at = |function: &str, code: Option<&CodeInfo>| {
        let mut named = Frame {
            function: Some(function.to_string()),
            ..frame.clone()
        };
        if let Some(code) = code {
            let file = match &code.dir {
                Some(dir) => dir.join(&*code.file),
                None => PathBuf::from(&*code.file),
            };
            named.file = Some(file.display().to_string());
            named.line = code.line;
        }
        named
    };
    // blazesym lists the inlined functions outermost first, each with where it is in it.
    let mut frames: Vec<Frame> = sym
        .inlined
        .iter()
        .rev()
        .map(|f| at(&f.name, f.code_info.as_ref()))
        .collect();
    frames.push(at(&sym.name, sym.code_info.as_deref()));
    frames
}
