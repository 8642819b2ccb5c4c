//! A native site's frame-pointer walk located (see [`super::native`]): each frame the kernel
//! named by build id is kept as it is, each frame it gave as an address is placed in the
//! executable mappings of a process running the spawner's code, and where the files the
//! frames are in were found is learned (so a frame named by a build id alone is found when
//! it is named).
//!
//! Reading those mappings and files is the slow side's (see [`super::unwinding`]): a site
//! whose frames all name objects already known is located on the reader's thread with nothing
//! read; any other goes to the slow side at its first fork (or, for a checkpoint's live
//! processes, in one job at start-up), and comes back as a [`Location`]. The reader reads
//! none of them.
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use reaper_common::ExeKey;
use reaper_common::copy::ExeCode;
use reaper_common::native::{FRAME_ADDRESS, FRAME_BUILD_ID, NATIVE_FRAMES_MAX, NativeFrame};

use super::build_ids::{BuildId, read_build_id};
use super::mappings::{Mapping, mappings};
use super::native::Located;
use super::unwind::runs_code_of;

/// A site's stack as the kernel's frame-pointer walk gave it.
#[derive(Clone)]
pub struct Walk {
    frames: Vec<NativeFrame>,
    /// Whether the walk filled every slot (frames past them were not taken).
    full: bool,
}

/// A file a holder maps, as the slow side opened it: its build id (and the id's own length)
/// and where it was opened, each `None` when it could not be read.
#[derive(Clone)]
pub struct Learned {
    pub file: ExeKey,
    pub id: Option<(BuildId, usize)>,
    pub path: Option<PathBuf>,
}

/// A walk located on the slow side: its frames, whether frames past them were left out, and
/// what was learned of the files the holder read maps.
#[derive(Default)]
pub struct Location {
    pub frames: Vec<Located>,
    pub truncated: bool,
    pub learned: Vec<Learned>,
}

impl Location {
    /// The object its innermost frame is in (where the spawner forked), as located: the
    /// file's path (where it was opened, where this location or `files` saw a file of its
    /// build id), its build id and the frame's offset.
    pub fn forked_in(&self, files: &Files) -> Option<(PathBuf, BuildId, u64)> {
        let first = self.frames.first()?;
        let id = first.build_id?;
        let learned = || {
            let of_id = |l: &&Learned| l.id.is_some_and(|(i, _)| i == id);
            self.learned.iter().find(of_id)?.path.clone()
        };
        let path = (first.object.clone())
            .or_else(learned)
            .or_else(|| files.path_of_id(&id))?;
        Some((path, id, first.offset))
    }
}

impl Walk {
    /// The first `len` of `frames`, as the kernel's store holds them.
    pub fn new(frames: &[NativeFrame], len: u32) -> Walk {
        let frames = frames.get(..len as usize).unwrap_or_default();
        Walk {
            frames: frames.to_vec(),
            full: len as usize == frames.len() && frames.len() == NATIVE_FRAMES_MAX,
        }
    }

    /// Whether locating it reads a holder's mappings: a frame is an address, or names its
    /// object by a build id `known` does not know (its file is then looked for, to be named).
    pub fn wants_mappings(&self, known: impl Fn(&BuildId) -> bool) -> bool {
        self.frames.iter().any(|f| match f.status {
            FRAME_BUILD_ID => !known(&f.build_id),
            FRAME_ADDRESS => true,
            _ => false,
        })
    }

    /// Located with nothing read: each frame named by build id kept, the stack cut at the
    /// first address (what a walk the slow side could not locate keeps).
    pub fn unread(&self) -> Location {
        let (frames, truncated) = self.locate(None, |_, _| (None, None));
        Location {
            frames,
            truncated,
            learned: Vec::new(),
        }
    }

    /// The frame it forked in, when the kernel named its object by build id: the id and the
    /// frame's offset.
    pub fn innermost(&self) -> Option<(BuildId, u64)> {
        let first = self
            .frames
            .iter()
            .find(|f| f.status == FRAME_BUILD_ID || f.status == FRAME_ADDRESS)?;
        (first.status == FRAME_BUILD_ID).then_some((first.build_id, first.offset))
    }

    /// Its frames located in `holder`'s executable mappings (a pid and its mappings, when one
    /// was read), `object` giving each mapping's file's build id and path. Whether frames were
    /// left out: past one that is no code (an address no executable mapping holds: the walk
    /// read data as frame pointers), or past the walk's slots.
    pub fn locate(
        &self,
        holder: Option<&(u32, Vec<Mapping>)>,
        mut object: impl FnMut(u32, &Mapping) -> (Option<BuildId>, Option<PathBuf>),
    ) -> (Vec<Located>, bool) {
        let mut located = Vec::new();
        let mut truncated = self.full;
        for f in &self.frames {
            let frame = match f.status {
                FRAME_BUILD_ID => Some(Located {
                    build_id: Some(f.build_id),
                    object: None,
                    offset: f.offset,
                }),
                FRAME_ADDRESS => holder.and_then(|(pid, maps)| {
                    let (m, offset) = (maps.iter().filter(|m| m.executable))
                        .find_map(|m| Some((m, m.file_offset(f.offset)?)))?;
                    let (build_id, object) = object(*pid, m);
                    Some(Located {
                        build_id,
                        object,
                        offset,
                    })
                }),
                _ => continue,
            };
            let Some(frame) = frame else {
                truncated = true;
                break;
            };
            located.push(frame);
        }
        (located, truncated)
    }
}

/// Files whose build id the slow side keeps before it starts over (see [`Files`]).
const FILES_KEPT: usize = 4096;
/// Processes running a spawner's code whose mappings are read for one site at most.
pub const HOLDERS_READ: usize = 8;

/// The files the slow side opened for their build ids, by device and inode: each read once
/// where `maps` names it (one found only under a process's own root, a container's, is read
/// again for each process: that path is the process's), one not found looked for again; up
/// to [`FILES_KEPT`].
#[derive(Default)]
pub struct Files(HashMap<ExeKey, Learned>);

impl Files {
    /// Locates `walk` in the mappings of one of `holders` (at most [`HOLDERS_READ`] read),
    /// the build id of each file it maps read; what was learned of the files the frames are
    /// in (by build id, or by the mapping an address is in) goes with it. A holder read a
    /// moment after the fork may have exec'd since: with `runs`, the executable the kernel
    /// saw the spawner run at the fork (a site's copy says), a holder whose mappings do not
    /// run it is passed over (a walk of addresses alone, a Go spawner's, is then placed in
    /// none rather than in another program); of those left, the first that maps every object
    /// the walk names by build id is taken (one running another program maps other objects,
    /// mostly), else the first read (an object it maps may not be readable: a library
    /// deleted by an upgrade, a container's root out of reach).
    pub fn locate(&mut self, walk: &Walk, holders: &[u32], runs: Option<&ExeCode>) -> Location {
        let named: HashSet<BuildId> = (walk.frames.iter())
            .filter(|f| f.status == FRAME_BUILD_ID)
            .map(|f| f.build_id)
            .collect();
        let mut first = None;
        let mut read = None;
        for &pid in holders.iter().take(HOLDERS_READ) {
            let Ok(maps) = mappings(pid) else {
                continue;
            };
            if runs.is_some_and(|exe| !runs_code_of(&maps, exe)) {
                continue;
            }
            let learned = self.learn(pid, &maps);
            let ids: HashSet<BuildId> = learned.iter().filter_map(|l| Some(l.id?.0)).collect();
            if named.is_subset(&ids) {
                read = Some(((pid, maps), learned));
                break;
            }
            first.get_or_insert(((pid, maps), learned));
        }
        let read = read.or(first);
        let (holder, learned) = read.unzip();
        let learned = learned.unwrap_or_default();
        let by_file: HashMap<ExeKey, &Learned> = learned.iter().map(|l| (l.file, l)).collect();
        let (frames, truncated) = walk.locate(holder.as_ref(), |_, m| {
            by_file
                .get(&m.file)
                .map_or((None, None), |l| (l.id.map(|(id, _)| id), l.path.clone()))
        });
        let named: HashSet<BuildId> = (named.into_iter())
            .chain(frames.iter().filter_map(|l| l.build_id))
            .collect();
        let of_frames = |l: &Learned| l.id.is_some_and(|(id, _)| named.contains(&id));
        Location {
            frames,
            truncated,
            learned: learned.into_iter().filter(of_frames).collect(),
        }
    }

    /// Where a file of build id `id` was opened.
    pub fn path_of_id(&self, id: &BuildId) -> Option<PathBuf> {
        let file = self
            .0
            .values()
            .find(|l| l.id.is_some_and(|(i, _)| i == *id))?;
        file.path.clone()
    }

    /// Where `file` was opened.
    pub fn path_of(&self, file: ExeKey) -> Option<PathBuf> {
        self.0.get(&file)?.path.clone()
    }

    /// What process `pid`, whose mappings are `maps`, runs: each executable mapping's file
    /// opened (once a file) for its build id.
    pub fn learn(&mut self, pid: u32, maps: &[Mapping]) -> Vec<Learned> {
        let mut seen = HashSet::new();
        let executable = maps.iter().filter(|m| m.executable);
        (executable.filter(|m| seen.insert(m.file)))
            .map(|m| self.learn_file(pid, m))
            .collect()
    }

    /// The file mapping `m` of process `pid` maps, opened for its build id (read once while
    /// kept: see [`Files`]).
    pub fn learn_file(&mut self, pid: u32, m: &Mapping) -> Learned {
        if let Some(kept) = self.0.get(&m.file) {
            return kept.clone();
        }
        let opened = m.open(pid);
        let read = Learned {
            file: m.file,
            id: opened.as_ref().and_then(|(file, _)| read_build_id(file)),
            path: opened.map(|(_, path)| path),
        };
        if read.path.as_deref() == Some(Path::new(&m.path)) {
            if self.0.len() >= FILES_KEPT {
                self.0.clear();
            }
            self.0.insert(m.file, read.clone());
        }
        read
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reaper_common::native::FRAME_EMPTY;

    fn frame(status: i32, build_id: BuildId, offset: u64) -> NativeFrame {
        NativeFrame {
            status,
            build_id,
            offset,
        }
    }

    /// An address in this test's own code.
    fn own_code() -> u64 {
        own_code as *const () as u64
    }

    #[test]
    fn an_address_is_placed_in_a_holders_mappings_and_its_files_build_id_learned() {
        let own = std::process::id();
        let walk = Walk::new(&[frame(FRAME_ADDRESS, [0; 20], own_code())], 1);
        assert!(
            walk.wants_mappings(|_| true),
            "an address is placed in mappings"
        );
        let location = Files::default().locate(&walk, &[u32::MAX, own], None);
        let exe = std::env::current_exe().unwrap();
        let learned = location
            .learned
            .iter()
            .find(|l| l.path.as_deref() == Some(&exe));
        let learned = learned.expect("this test binary is learned where it is");
        let (id, len) = learned.id.expect("this test binary has a build id");
        assert_eq!(
            Some(crate::text::hex(&id[..len])),
            super::super::build_ids::build_id_of(&exe)
        );
        let [placed] = location.frames.as_slice() else {
            panic!("one frame: {:?}", location.frames);
        };
        assert_eq!(placed.build_id, Some(id));
        assert_eq!(placed.object.as_deref(), Some(exe.as_path()));
        assert!(!location.truncated);
    }

    /// With the executable the spawner ran at its fork, a holder that runs another program
    /// (it exec'd since, or its pid is another process's) is passed over: an address is
    /// placed in none rather than in the wrong program.
    #[test]
    fn a_holder_not_running_the_spawners_executable_is_passed_over() {
        let own = std::process::id();
        let walk = Walk::new(&[frame(FRAME_ADDRESS, [0; 20], own_code())], 1);
        let maps = mappings(own).expect("own mappings");
        let code = (maps.iter())
            .find(|m| m.executable && (m.start..m.end).contains(&own_code()))
            .expect("this test's code is mapped");
        let ours = ExeCode {
            file: code.file,
            start: own_code(),
            end: own_code() + 1,
        };
        let placed = Files::default().locate(&walk, &[own], Some(&ours));
        assert_eq!(placed.frames.len(), 1, "runs its executable: placed");
        let another = ExeCode {
            file: ExeKey {
                dev: code.file.dev,
                ino: code.file.ino.wrapping_add(1),
            },
            ..ours
        };
        let passed_over = Files::default().locate(&walk, &[own], Some(&another));
        assert!(passed_over.frames.is_empty(), "{:?}", passed_over.frames);
        assert!(passed_over.truncated, "the stack is cut at the address");
    }

    #[test]
    fn frames_named_by_known_build_ids_need_no_reading_and_an_address_in_no_code_cuts() {
        let known = [7u8; 20];
        let walk = Walk::new(
            &[
                frame(FRAME_BUILD_ID, known, 0x10),
                frame(FRAME_ADDRESS, [0; 20], 8),
                frame(FRAME_EMPTY, [0; 20], 0),
            ],
            3,
        );
        assert!(!Walk::new(&walk.frames[..1], 1).wants_mappings(|id| *id == known));
        assert!(Walk::new(&walk.frames[..1], 1).wants_mappings(|_| false));
        assert_eq!(walk.innermost(), Some((known, 0x10)));
        // No holder runs: the address is placed nowhere, and the stack is cut there.
        let unread = walk.unread();
        assert_eq!(unread.frames.len(), 1);
        assert!(unread.truncated);
    }
}
