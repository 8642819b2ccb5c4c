//! Unwinding stack copies away from the ring's reader: a native site's (copied at its first
//! fork from there) and a JIT host's (copied at each of its forks). Unwinding one reads the
//! spawner's `/proc/PID/maps`, the call frame information of the objects it maps (megabytes of
//! `.eh_frame` in files a traced process chose) and walks the copy; none of that is the
//! reader's. The reader hands on an [`Unwind`] (see [`SpawnSites::take_to_unwind`]), a thread of
//! the slow side holding an [`Unwinder`] does it, and the reader takes back what it gives
//! ([`SpawnSites::take_unwound`]): the frames are the site's, or the child's, from then on.
//! It also locates native sites' frame-pointer walks that read their spawner's mappings, and
//! learns the objects gateways run (see [`super::locating`]).
//!
//! The spawner's mappings are read a moment after its fork, not at it (and used only while
//! they hold the copy's executable where the kernel saw it: a pid that runs another program
//! since is not read as the spawner). A native spawner gone by then is unwound in what the
//! kernel took of it (see [`Objects::unwind_taken`]), as one gone before its fork's record
//! was read always was; a JIT host gone by then leaves its child without frames.
//!
//! [`SpawnSites::take_to_unwind`]: super::SpawnSites::take_to_unwind
//! [`SpawnSites::take_unwound`]: super::SpawnSites::take_unwound
use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::PathBuf;

use reaper_common::ExeKey;

use super::build_ids::{BuildId, has_build_id, read_build_id};
use super::locating::{Files, Learned, Location, Walk};
use super::mappings::mappings;
use super::native::{Located, SiteKey};
use super::needed::library_of;
use super::unwind::{HostUnwinder, Objects, Unwound as Walked};
use crate::capture::decode::CopiedStack;
use crate::lineage::graph::NodeId;
use crate::untrusted::Checked;

/// What the slow side is to unwind, and what of the spawner the reader knew.
pub enum Unwind {
    /// Native site `key`'s copy. `holders` run the spawner's code (its mappings are the
    /// copy's, first one still running); failing them, `spawner` (its pid) is unwound in what
    /// the kernel took of it: its executable, `copy.exe.file`, found at the path it was exec'd
    /// from (`exec_path`, links resolved) or where a process seen mapping it did (`seen_at`),
    /// and the object its innermost frame is in, `forked_in` (where the build id of the
    /// kernel's frame-pointer walk was seen, that id, and the frame's offset). `walk`: the
    /// site's frame-pointer walk when it is yet to be located (see [`Unwind::Locate`]): it is
    /// located first, and names `forked_in` when the reader could not.
    Site {
        key: SiteKey,
        holders: Vec<u32>,
        spawner: u32,
        exec_path: Option<PathBuf>,
        seen_at: Option<PathBuf>,
        forked_in: Option<(PathBuf, BuildId, u64)>,
        walk: Option<Walk>,
        copy: Box<CopiedStack>,
    },
    /// Native sites' frame-pointer walks, each to be located in the mappings of one of its
    /// holders (see [`Files::locate`]): a site without a copy at its fork, or every site of a
    /// checkpoint's live processes at start-up (one job, so none waits for room).
    Locate(Vec<ToLocate>),
    /// The build ids of the files process `pid` (a gateway) maps, learned so that its spawns
    /// are named once it, and every process sharing its code, is gone.
    Learn(u32),
    /// JIT host `host`'s (process `pid`) copy, taken as it spawned `child`.
    Host {
        host: NodeId,
        pid: u32,
        child: NodeId,
        copy: Box<CopiedStack>,
    },
    /// Hosts the graph no longer holds: their unwinders go.
    Forget(Vec<NodeId>),
}

/// A native site's frame-pointer walk to locate: `holders` run its spawner's code.
pub struct ToLocate {
    pub key: SiteKey,
    pub holders: Vec<u32>,
    pub walk: Walk,
}

/// What an [`Unwind`] gave.
pub enum Unwound {
    /// Native site `key`'s frames, innermost first, up to the first that is no file's code
    /// (none when nothing could be read: the site keeps its frame-pointer walk, as located).
    /// `located`: its walk, when it was located here.
    Site {
        key: SiteKey,
        frames: Vec<UnwoundFrame>,
        truncated: bool,
        located: Option<Location>,
    },
    /// Native sites' walks located, each with its key.
    Located(Vec<(SiteKey, Location)>),
    /// What a gateway's files were learned to be.
    Learned(Vec<Learned>),
    /// The stack host `host` spawned `child` at: `stack` tells its stacks apart (the same
    /// frames, the same hash), `frames` are its frames located (none when the host was gone,
    /// or ran another program, before its mappings were read).
    Host {
        host: NodeId,
        child: NodeId,
        stack: u64,
        frames: Vec<Located>,
    },
}

/// A native frame unwound: its file (device and inode), where it was opened, the file's build
/// id and the id's own length (read from it), and the frame's offset in it.
pub struct UnwoundFrame {
    pub file: ExeKey,
    pub object: Option<PathBuf>,
    pub build_id: Option<(BuildId, usize)>,
    pub offset: u64,
}

impl Unwind {
    /// What the reader is given back when this job gives nothing (it panicked): the site
    /// keeps what its frame-pointer walk names with nothing read (see [`Walk::unread`]), the
    /// child has no frames, and the job is no longer counted as under way.
    pub fn nothing(&self) -> Option<Unwound> {
        match *self {
            Unwind::Site { key, ref walk, .. } => Some(Unwound::Site {
                key,
                frames: Vec::new(),
                truncated: false,
                located: walk.as_ref().map(Walk::unread),
            }),
            Unwind::Locate(ref sites) => Some(Unwound::Located(
                (sites.iter())
                    .map(|site| (site.key, site.walk.unread()))
                    .collect(),
            )),
            Unwind::Host { host, child, .. } => Some(Unwound::Host {
                host,
                child,
                stack: 0,
                frames: Vec::new(),
            }),
            Unwind::Forget(_) | Unwind::Learn(_) => None,
        }
    }
}

/// The slow side's part: the objects read so far (for their call frame information, and for
/// their build ids), and what is kept of each JIT host.
#[derive(Default)]
pub struct Unwinder {
    objects: Objects,
    files: Files,
    hosts: HashMap<NodeId, Host>,
    /// A panic caught while locating one site of a job, for the worker to start over with
    /// a fresh unwinder once the job's other sites are given back (see [`Unwinder::take_panic`]).
    panicked: Option<Box<dyn std::any::Any + Send>>,
}

/// Files a host's cache holds before it starts over (see [`Host::files`]).
const HOST_FILES: usize = 1024;

/// A JIT host's unwinder, kept while its mappings stay the same (its rules cache then serves
/// every fork down the same path), and where each file it maps was found (looked for until
/// found).
struct Host {
    unwinder: HostUnwinder,
    files: HashMap<ExeKey, PathBuf>,
}

impl Unwinder {
    /// Does `job`; what it gave, for the reader (nothing for [`Unwind::Forget`]).
    pub fn unwind(&mut self, job: Unwind) -> Option<Unwound> {
        let unwound = match job {
            Unwind::Site {
                key,
                holders,
                spawner,
                exec_path,
                seen_at,
                forked_in,
                walk,
                copy,
            } => {
                let innermost = walk.as_ref().and_then(Walk::innermost);
                let located = walk.map(|walk| self.files.locate(&walk, &holders, Some(&copy.exe)));
                // What the reader did not know yet may have been learned here since.
                let taken = Taken {
                    spawner,
                    exec_path,
                    seen_at: seen_at.or_else(|| self.files.path_of(copy.exe.file)),
                    forked_in: forked_in.or_else(|| located.as_ref()?.forked_in(&self.files)),
                    innermost,
                };
                Some(self.site(key, &holders, taken, &copy, located))
            }
            Unwind::Locate(sites) => Some(Unwound::Located(
                (sites.into_iter())
                    .map(|site| (site.key, self.locate_one(&site)))
                    .collect(),
            )),
            Unwind::Learn(pid) => {
                (mappings(pid).ok()).map(|maps| Unwound::Learned(self.files.learn(pid, &maps)))
            }
            Unwind::Host {
                host,
                pid,
                child,
                copy,
            } => Some(self.host(host, pid, child, &copy)),
            Unwind::Forget(hosts) => {
                for host in hosts {
                    self.hosts.remove(&host);
                }
                None
            }
        };
        self.objects.bound();
        unwound
    }

    /// `site`'s walk located; one that panics keeps what its walk names with nothing read
    /// (the other sites of its job are located all the same: a start-up job holds many), and
    /// its panic is kept for the worker.
    fn locate_one(&mut self, site: &ToLocate) -> Location {
        let files = &mut self.files;
        let locating =
            std::panic::AssertUnwindSafe(|| files.locate(&site.walk, &site.holders, None));
        std::panic::catch_unwind(locating).unwrap_or_else(|panic| {
            self.panicked.get_or_insert(panic);
            site.walk.unread()
        })
    }

    /// A panic caught within the last job (see [`Unwinder::locate_one`]), to go on with once
    /// what the job gave is given back.
    pub fn take_panic(&mut self) -> Option<Box<dyn std::any::Any + Send>> {
        self.panicked.take()
    }

    /// Native site `key`'s copy, unwound in the mappings of the first of `holders` still
    /// running, else in what the kernel took of its spawner (see [`Unwind::Site`]). Read once
    /// per site: the unwinder is not kept (the objects it read are).
    fn site(
        &mut self,
        key: SiteKey,
        holders: &[u32],
        taken: Taken,
        copy: &CopiedStack,
        located: Option<Location>,
    ) -> Unwound {
        let unwound = holders
            .iter()
            .find_map(|&pid| Some((pid, self.objects.unwind(pid, copy, None)?.0)))
            .or_else(|| {
                let exe = taken.executable(copy.exe.file);
                let forked_in = taken.forked_in(exe.as_ref());
                let walked = (self.objects).unwind_taken(taken.spawner, copy, exe, forked_in)?;
                Some((taken.spawner, walked))
            });
        let (frames, truncated) = match unwound {
            Some((pid, walked)) => native_frames(pid, &walked),
            None => (Vec::new(), false),
        };
        Unwound::Site {
            key,
            frames,
            truncated,
            located,
        }
    }

    /// Host `host`'s (process `pid`) copy, taken as it spawned `child`, unwound in its
    /// mappings with the unwinder kept for it while they are the same: no frames once it is
    /// gone, or runs another program.
    fn host(&mut self, host: NodeId, pid: u32, child: NodeId, copy: &CopiedStack) -> Unwound {
        let kept = self.hosts.remove(&host);
        let (kept, mut files) =
            kept.map_or((None, HashMap::new()), |h| (Some(h.unwinder), h.files));
        let Some((walked, unwinder)) = self.objects.unwind(pid, copy, kept) else {
            return Unwound::Host {
                host,
                child,
                stack: 0,
                frames: Vec::new(),
            };
        };
        // A host that maps ever new files (a day of plugins) looks for them again.
        if files.len() > HOST_FILES {
            files.clear();
        }
        // Each frame in its mapping's file, or an address: code in no file (compiled
        // JavaScript). A file found is kept for the next forks, one not found looked for again.
        let mut hasher = DefaultHasher::new();
        let frames: Vec<Located> = (walked.frames.iter())
            .map(|&(m, offset)| {
                let object = m.and_then(|i| {
                    let map = &walked.maps[i];
                    if let Some(found) = files.get(&map.file) {
                        return Some(found.clone());
                    }
                    let found = map.file(pid)?;
                    files.insert(map.file, found.clone());
                    Some(found)
                });
                (m.map(|i| &walked.maps[i].path), offset).hash(&mut hasher);
                Located {
                    build_id: None,
                    object,
                    offset,
                }
            })
            .collect();
        self.hosts.insert(host, Host { unwinder, files });
        Unwound::Host {
            host,
            child,
            stack: hasher.finish(),
            frames,
        }
    }
}

/// What the kernel took of a native site's spawner (see [`Unwind::Site`]).
struct Taken {
    spawner: u32,
    exec_path: Option<PathBuf>,
    seen_at: Option<PathBuf>,
    forked_in: Option<(PathBuf, BuildId, u64)>,
    /// The frame it forked in as the kernel's walk named it (build id and offset), for a
    /// `forked_in` whose file no process the run read mapped.
    innermost: Option<(BuildId, u64)>,
}

impl Taken {
    /// The spawner's executable `file`, opened while it is that file: at the path it was
    /// exec'd from, its links resolved (`/bin/sh` is a link to dash), or where a process seen
    /// mapping it mapped it.
    fn executable(&self, file: ExeKey) -> Option<(Checked, PathBuf)> {
        let resolved = self
            .exec_path
            .as_deref()
            .and_then(|p| std::fs::canonicalize(p).ok());
        let paths = resolved.into_iter().chain(self.seen_at.clone());
        Checked::open_as(paths, file).ok()
    }

    /// The object the spawner forked in, opened while it has the build id the kernel named,
    /// and the frame's offset in it: where a file of that id was seen, else, none seen, the
    /// library of that id its executable `exe` names (see [`library_of`]).
    fn forked_in(&self, exe: Option<&(Checked, PathBuf)>) -> Option<(Checked, PathBuf, u64)> {
        let Some((path, id, offset)) = self.forked_in.as_ref() else {
            let (id, offset) = self.innermost?;
            let (exe, exe_path) = exe?;
            let (file, path) = library_of(exe, exe_path, &id)?;
            return Some((file, path, offset));
        };
        let file = Checked::open(path).ok()?;
        has_build_id(&file, id).then(|| (file, path.clone(), *offset))
    }
}

/// A mapped file as opened: where, and its build id (and the id's own length).
type Opened = (Option<PathBuf>, Option<(BuildId, usize)>);

/// A native site's frames as `walked` in process `pid`'s mappings: up to the first that is
/// no file's code, each file opened once for its path and build id. Whether frames were left
/// out.
fn native_frames(pid: u32, walked: &Walked) -> (Vec<UnwoundFrame>, bool) {
    let mut truncated = walked.truncated;
    let mut files: HashMap<usize, Opened> = HashMap::new();
    let mut frames = Vec::new();
    for &(m, offset) in &walked.frames {
        let Some(i) = m.filter(|&i| walked.maps[i].executable) else {
            truncated = true;
            break;
        };
        let map = &walked.maps[i];
        let (object, build_id) = files
            .entry(i)
            .or_insert_with(|| match map.open(pid) {
                Some((file, path)) => (Some(path), read_build_id(&file)),
                None => (None, None),
            })
            .clone();
        frames.push(UnwoundFrame {
            file: map.file,
            object,
            build_id,
            offset,
        });
    }
    (frames, truncated)
}
