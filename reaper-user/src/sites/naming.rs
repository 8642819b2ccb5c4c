//! Naming the frames that spawned a process, in three steps, so that what symbolizes objects
//! and reads perf maps runs on the slow side, never on the ring's reader:
//!
//! 1. [`SpawnSites::ask`], on the reader's thread, takes out of what the sites hold what
//!    naming a process's spawn needs, owned: its frames located (each object found, its build
//!    id in words), a Python spawner's frames (named at its fork, or now from its memory: a
//!    few small reads), what was named already. Of the objects, it reads nothing: an object
//!    known by its build id alone is where a file of that id was seen. A round (a scan's
//!    flags, `--check`'s verdict, an answer) asks once a site ([`Naming`]).
//! 2. [`Naming::name`], wherever it is called (a thread of the slow side), reads each object
//!    (a sealed copy, symbolized: megabytes of symbols and line tables, see [`Namer`]) and a
//!    JIT host's perf map (up to 64 MiB); an object no longer the file of its build id, or
//!    whose build id no file was seen with, is looked for in the mappings of the processes
//!    running the spawner's code (see [`Holders`]).
//! 3. [`SpawnSites::remember`], back on the reader's thread, keeps what was named (a site is
//!    named once) and gives each process its frames.
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustc_hash::FxHashMap as HashMap;

use super::SpawnSites;
use super::build_ids::{BuildId, has_build_id};
use super::jit::{self, perf_map};
use super::locating::{Files, HOLDERS_READ, Learned};
use super::mappings::{Mapping, mappings};
use super::native::{Located, Named, Namer, SiteFrames, SiteKey};
use crate::lineage::graph::{LineageGraph, NodeId};
use crate::stream::evidence::Frame;
use crate::untrusted::Checked;

/// How a round tells sites apart: the stack a JIT host's copy was unwound to, or a
/// spawner's Python and native stacks (the instances of one site share one naming).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum SiteOf {
    Jit(jit::Key),
    Native(NodeId, Option<u64>, Option<u64>),
}

/// One part of a spawn's frames, innermost first: to be named, or named already.
enum Part {
    Known(Vec<Frame>),
    /// A JIT host's stack: its compiled JavaScript's addresses, named from its perf map while
    /// it runs (`host`, `alive`), then its native frames.
    Jit {
        key: jit::Key,
        host: u32,
        alive: bool,
        compiled: Vec<u64>,
        native: Vec<Located>,
    },
    /// A native site's frames, each located in its object, with its build id in words; an
    /// object not found yet is looked for among the files `holders` map.
    Native {
        site: SiteKey,
        frames: Vec<(Located, Option<String>)>,
        truncated: bool,
        holders: Vec<u32>,
    },
}

/// A part named.
enum NamedPart {
    Known(Vec<Frame>),
    Jit(jit::Key, Vec<Frame>),
    Native(SiteKey, Named),
}

/// One site's naming: its parts, and whether its stack was cut.
struct Site {
    parts: Vec<Part>,
    truncated: bool,
}

/// What a round names (see the module documentation): one naming a site, each process asked
/// about pointing at its site's.
#[derive(Default)]
pub struct Naming {
    sites: Vec<Site>,
    by_site: HashMap<SiteOf, usize>,
}

/// What a round named, to be remembered ([`SpawnSites::remember`]).
pub struct NamedSites {
    sites: Vec<(Vec<NamedPart>, bool)>,
}

/// Where a process's frames are in its round's naming (see [`SpawnSites::ask`]).
#[derive(Clone, Copy, Debug)]
pub struct Asked(Option<usize>);

impl Naming {
    /// Whether there is anything to read.
    pub fn is_empty(&self) -> bool {
        self.sites.is_empty()
    }

    /// Names every site: reads objects and perf maps (a thread of the slow side's work). The
    /// symbolizer's caches (megabytes) go when it is done, and their pages back to the
    /// system (see `resident`).
    pub fn name(self) -> NamedSites {
        let mut namer = Namer::default();
        let mut files = Files::default();
        let sites = self.sites.into_iter().map(|site| {
            let parts: Vec<NamedPart> = (site.parts.into_iter())
                .map(|part| part.name(&mut namer, &mut files))
                .collect();
            // A native part is cut where an object was not found.
            let cut = |part: &NamedPart| matches!(part, NamedPart::Native(_, n) if n.truncated);
            let truncated = site.truncated || parts.iter().any(cut);
            (parts, truncated)
        });
        let named = NamedSites {
            sites: sites.collect(),
        };
        drop(namer);
        crate::resident::give_back_freed();
        named
    }
}

/// Where a native site's objects are, for naming: an object named at its location is used
/// while it is still the file of its build id; one not found there (or replaced since) is
/// looked for in the files mapped by the processes running the spawner's code, read a file
/// at a time (at most [`HOLDERS_READ`] processes) until one of its build id is found.
struct Holders<'a> {
    pids: std::iter::Take<std::vec::IntoIter<u32>>,
    /// The files read this round (each read once where `maps` names it).
    files: &'a mut Files,
    /// The holder being read: its pid, and its executable mappings not read yet.
    reading: Option<(u32, std::vec::IntoIter<Mapping>)>,
    /// Where a file of each build id read so far is, and the id's own length.
    found: HashMap<BuildId, (PathBuf, usize)>,
    /// Whether each object named so far is still the file of its build id.
    checked: HashMap<(PathBuf, BuildId), bool>,
}

impl Holders<'_> {
    fn new(pids: Vec<u32>, files: &mut Files) -> Holders<'_> {
        Holders {
            pids: pids.into_iter().take(HOLDERS_READ),
            files,
            reading: None,
            found: HashMap::default(),
            checked: HashMap::default(),
        }
    }

    /// Frame `located` with its object found (with its build id in words, at the id's own
    /// length when its file was found here). One with an object that is no longer its build
    /// id's file, found nowhere else, is kept as it is (it is named by its offset); one with
    /// no object found gives none.
    fn find(
        &mut self,
        located: Located,
        build_id: Option<String>,
    ) -> Option<(Located, Option<String>)> {
        let Some(id) = located.build_id else {
            // Placed in its mapping with no build id read: as it was found.
            return located.object.is_some().then_some((located, build_id));
        };
        if let Some(path) = &located.object
            && self.still(path, &id)
        {
            return Some((located, build_id));
        }
        loop {
            if let Some((path, len)) = self.found.get(&id) {
                let shown = crate::text::hex(id.get(..*len).unwrap_or(&id));
                let object = Some(path.clone());
                return Some((Located { object, ..located }, Some(shown)));
            }
            let Some(file) = self.next_file() else {
                return located.object.is_some().then_some((located, build_id));
            };
            if let (Some((file_id, len)), Some(path)) = (file.id, file.path) {
                self.found.entry(file_id).or_insert((path, len));
            }
        }
    }

    /// The next file a holder maps, read for its build id; none once every holder was read.
    fn next_file(&mut self) -> Option<Learned> {
        loop {
            if let Some((pid, maps)) = &mut self.reading
                && let Some(m) = maps.next()
            {
                return Some(self.files.learn_file(*pid, &m));
            }
            let pid = self.pids.next()?;
            let maps = mappings(pid).unwrap_or_default();
            let executable: Vec<Mapping> = maps.into_iter().filter(|m| m.executable).collect();
            self.reading = Some((pid, executable.into_iter()));
        }
    }

    /// Whether `path` is still a file of build id `id` (an upgrade may have replaced it).
    fn still(&mut self, path: &Path, id: &BuildId) -> bool {
        *(self.checked.entry((path.to_owned(), *id)))
            .or_insert_with(|| Checked::open(path).is_ok_and(|file| has_build_id(&file, id)))
    }
}

impl Part {
    fn name(self, namer: &mut Namer, files: &mut Files) -> NamedPart {
        match self {
            Part::Known(frames) => NamedPart::Known(frames),
            Part::Jit {
                key,
                host,
                alive,
                compiled,
                native,
            } => {
                let mut frames = match alive {
                    true => perf_map::name(host, &compiled),
                    false => compiled
                        .iter()
                        .map(|&addr| perf_map::unnamed(addr))
                        .collect(),
                };
                frames.extend(native.iter().flat_map(|l| namer.name(l)));
                NamedPart::Jit(key, frames)
            }
            Part::Native {
                site,
                frames,
                truncated,
                holders,
            } => {
                let mut named = Named {
                    frames: Vec::new(),
                    truncated,
                };
                let mut holders = Holders::new(holders, files);
                for (located, build_id) in frames {
                    // A frame whose object is not found ends the stack, which is then cut.
                    let Some((located, build_id)) = holders.find(located, build_id) else {
                        named.truncated = true;
                        break;
                    };
                    for mut frame in namer.name(&located) {
                        frame.build_id = build_id.clone();
                        named.frames.push(frame);
                    }
                }
                NamedPart::Native(site, named)
            }
        }
    }
}

impl SpawnSites {
    /// What naming the frames that spawned process `pid` needs, added to `naming` (once a
    /// site); where its frames will be.
    pub fn ask(&mut self, graph: &LineageGraph, pid: u32, naming: &mut Naming) -> Asked {
        let Some(node) = graph.current(pid) else {
            return Asked(None);
        };
        let Some(spawner) = node.spawner.and_then(|s| graph.node(s)) else {
            return Asked(None);
        };
        // A JIT host's stack is copied and unwound for each fork: its own.
        let jit = self.jit.as_ref().and_then(|jit| jit.for_naming(node.id));
        let stack = node.spawn_stack;
        let site_of = match jit {
            Some((key, _)) => SiteOf::Jit(key),
            None => SiteOf::Native(spawner.id, stack.python, stack.native),
        };
        if let Some(&at) = naming.by_site.get(&site_of) {
            return Asked(Some(at));
        }
        let site = match jit {
            Some((_, Some(frames))) => Site {
                parts: vec![Part::Known(frames)],
                truncated: false,
            },
            Some((key, None)) => {
                let located = self.jit.as_ref().map(|j| j.located(key));
                let (compiled, native) = located.unwrap_or_default();
                Site {
                    parts: vec![Part::Jit {
                        key,
                        host: spawner.pid,
                        alive: spawner.alive(),
                        compiled,
                        native,
                    }],
                    truncated: false,
                }
            }
            None => {
                let mut parts = Vec::new();
                if let (Some(key), Some(python)) = (stack.python, self.python.as_mut()) {
                    let frames = python.frames(key, spawner.id, spawner.pid, spawner.alive());
                    parts.push(Part::Known(frames));
                }
                let mut truncated = false;
                if let Some(native) = stack.native {
                    let site = (native, spawner.id);
                    let part = match self
                        .native
                        .for_naming(site, &graph.code_holders(spawner.id))
                    {
                        SiteFrames::Named(named) => {
                            truncated = named.truncated;
                            Part::Known(named.frames)
                        }
                        SiteFrames::Located {
                            frames,
                            truncated: cut,
                            holders,
                        } => {
                            truncated = cut;
                            Part::Native {
                                site,
                                frames,
                                truncated: cut,
                                holders,
                            }
                        }
                    };
                    parts.push(part);
                }
                Site { parts, truncated }
            }
        };
        naming.sites.push(site);
        naming.by_site.insert(site_of, naming.sites.len() - 1);
        Asked(Some(naming.sites.len() - 1))
    }

    /// Keeps what a round named (a site is named once), and gives back each site's frames
    /// and whether they were cut, by [`Asked`] ([`Remembered::of`]).
    pub fn remember(&mut self, named: NamedSites) -> Remembered {
        let sites = named.sites.into_iter().map(|(parts, truncated)| {
            let mut frames = Vec::new();
            for part in parts {
                match part {
                    NamedPart::Known(mut known) => frames.append(&mut known),
                    NamedPart::Jit(key, mut named) => {
                        if let Some(jit) = self.jit.as_mut() {
                            jit.remember(key, named.clone());
                        }
                        frames.append(&mut named);
                    }
                    NamedPart::Native(site, named) => {
                        frames.extend(named.frames.iter().cloned());
                        self.native.remember(site, named);
                    }
                }
            }
            (Arc::from(frames), truncated)
        });
        Remembered(sites.collect())
    }
}

/// Each site's frames, as a round named them.
#[derive(Default)]
pub struct Remembered(Vec<(Arc<[Frame]>, bool)>);

impl Remembered {
    /// The frames of the process asked about as `asked`, and whether they were cut; none
    /// when it has no spawn stack.
    pub fn of(&self, asked: Asked) -> (Arc<[Frame]>, bool) {
        asked
            .0
            .and_then(|at| self.0.get(at).cloned())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_object_known_by_its_build_id_alone_is_found_among_its_holders_files() {
        let exe = std::env::current_exe().unwrap();
        let read = super::super::build_ids::read_build_id(&Checked::open(&exe).unwrap());
        let (id, len) = read.expect("this test binary has a build id");
        let frame = || Located {
            build_id: Some(id),
            object: None,
            offset: 0x40,
        };
        let mut files = Files::default();
        // The first holder is gone; the second (this test) maps the object.
        let mut holders = Holders::new(vec![u32::MAX, std::process::id()], &mut files);
        let (found, shown) = holders.find(frame(), None).expect("found in a holder");
        assert_eq!(found.object.as_deref(), Some(exe.as_path()));
        assert_eq!(found.offset, 0x40);
        assert_eq!(
            shown,
            Some(crate::text::hex(&id[..len])),
            "at the id's own length"
        );
        assert!(
            Holders::new(Vec::new(), &mut files)
                .find(frame(), None)
                .is_none(),
            "no holder: cut"
        );
        // An object the index named that is no longer a file of its build id is looked for.
        let replaced = Located {
            object: Some("/nonexistent".into()),
            ..frame()
        };
        let mut holders = Holders::new(vec![std::process::id()], &mut files);
        let (found, _) = holders
            .find(replaced.clone(), None)
            .expect("found in a holder");
        assert_eq!(found.object.as_deref(), Some(exe.as_path()));
        let kept = Holders::new(Vec::new(), &mut files).find(replaced.clone(), None);
        assert_eq!(
            kept.map(|(l, _)| l),
            Some(replaced),
            "found nowhere: kept, named by offset"
        );
        // One placed in its mapping with no build id read is kept as it was found.
        let unread = Located {
            build_id: None,
            object: Some("/nonexistent".into()),
            offset: 8,
        };
        let kept = Holders::new(Vec::new(), &mut files).find(unread.clone(), None);
        assert_eq!(kept.map(|(l, _)| l), Some(unread));
    }
}
