//! Which file each build id names. The kernel names a native frame by its object's build id
//! and the offset in that object's file (see `reaper_common::native`); naming the frame needs
//! the file. Files are learned from the mappings of processes that run them (a spawner, the
//! processes it shares its code with, each gateway when found), read on the slow side (see
//! `sites::locating`) and noted here, each file's build id read once, so a frame is named
//! after every process that mapped its object is gone. The index
//! is kept in the checkpoint (`--state-dir`): the next run names what this one learned.
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use object::Object as _;
use reaper_common::ExeKey;
use reaper_common::native::BUILD_ID_LEN;
use serde::{Deserialize, Serialize};

use crate::text::hex;
use crate::untrusted::Checked;

/// Files and build ids the index holds before it is pruned (see [`BuildIds::bound`]).
const KEPT: usize = 4096;

/// A build id as the kernel keeps it: padded with zeros to [`BUILD_ID_LEN`].
pub type BuildId = [u8; BUILD_ID_LEN];

/// The files build ids name, and the build id of each file read.
#[derive(Default)]
pub struct BuildIds {
    /// Each file's build id (none: it has none, or could not be read), by device and inode.
    files: HashMap<ExeKey, Option<BuildId>>,
    /// Where each build id's file can be opened, and the id's own length there.
    paths: HashMap<BuildId, (PathBuf, usize)>,
}

/// One build id and its file, as the checkpoint keeps them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedBuildId {
    /// In hex, as `readelf -n` and the NDJSON show it (its own length).
    pub build_id: String,
    pub path: PathBuf,
}

impl BuildIds {
    /// Notes that `file`, opened at `path`, has build id `id` (and the id's own length), as
    /// read elsewhere (see `sites::unwinding`); returns the id, or the one known for `file`
    /// when none was read there (a read that failed unlearns nothing).
    pub fn note(
        &mut self,
        file: ExeKey,
        id: Option<(BuildId, usize)>,
        path: Option<PathBuf>,
    ) -> Option<BuildId> {
        let Some((id, len)) = id else {
            let known = self.files.get(&file).copied().flatten();
            if known.is_none() {
                self.files.insert(file, None);
            }
            return known;
        };
        if let Some(path) = path {
            self.paths.entry(id).or_insert((path, len));
        }
        self.files.insert(file, Some(id));
        Some(id)
    }

    /// Keeps the index within [`KEPT`] files and build ids: past it, only the build ids
    /// `named()` gives (those of the sites located) are kept, and the files read are read
    /// again when met. A day of restarts, upgrades and containers meets ever new files.
    pub fn bound(&mut self, named: impl FnOnce() -> std::collections::HashSet<BuildId>) {
        if self.files.len() <= KEPT && self.paths.len() <= KEPT {
            return;
        }
        let named = named();
        self.files
            .retain(|_, id| id.is_some_and(|id| named.contains(&id)));
        self.paths.retain(|id, _| named.contains(id));
    }

    /// Where `file` was seen mapped (the path of its build id), when it was.
    pub fn path_of(&self, file: ExeKey) -> Option<PathBuf> {
        let id = self.files.get(&file)?.as_ref()?;
        self.paths.get(id).map(|(path, _)| path.clone())
    }

    /// Whether the file of `id` is known.
    pub fn knows(&self, id: &BuildId) -> bool {
        self.paths.contains_key(id)
    }

    /// Where the file of `id` was seen.
    pub fn path_of_id(&self, id: &BuildId) -> Option<&Path> {
        self.paths.get(id).map(|(path, _)| path.as_path())
    }

    /// `id` in hex, at its own length when its file is known; else as the kernel gave it
    /// (20 bytes: a shorter id is then followed by the kernel's zeros).
    pub fn show(&self, id: &BuildId) -> String {
        let len = self.paths.get(id).map_or(BUILD_ID_LEN, |&(_, len)| len);
        hex(id.get(..len).unwrap_or(id))
    }

    /// The index, for the checkpoint.
    pub fn save(&self) -> Vec<SavedBuildId> {
        let mut saved: Vec<SavedBuildId> = self
            .paths
            .iter()
            .map(|(id, (path, len))| SavedBuildId {
                build_id: hex(id.get(..*len).unwrap_or(id)),
                path: path.clone(),
            })
            .collect();
        saved.sort_by(|a, b| a.build_id.cmp(&b.build_id));
        saved
    }

    /// Takes back a checkpoint's index (entries that do not parse are left out).
    pub fn restore(&mut self, saved: &[SavedBuildId]) {
        for s in saved {
            if let Some(id) = parse_hex(&s.build_id) {
                let len = s.build_id.len() / 2;
                self.paths
                    .entry(id)
                    .or_insert_with(|| (s.path.clone(), len));
            }
        }
    }
}

/// The build id of ELF file `file` (its `.note.gnu.build-id`), padded as the kernel pads it
/// (a longer one cut to its first 20 bytes: the kernel names no frame by such an id), and its
/// own length.
pub fn read_build_id(file: &Checked) -> Option<(BuildId, usize)> {
    let reader = file.reader();
    let elf = object::File::parse(&reader).ok()?;
    let bytes = elf.build_id().ok()??;
    let len = bytes.len().min(BUILD_ID_LEN);
    let mut id = [0; BUILD_ID_LEN];
    id[..len].copy_from_slice(&bytes[..len]);
    Some((id, len))
}

/// Whether ELF file `file` has build id `id` (padded as the kernel pads it).
pub fn has_build_id(file: &Checked, id: &BuildId) -> bool {
    read_build_id(file).is_some_and(|(read, _)| read == *id)
}

/// The build id of the ELF file at `path`, in hex as frames show it.
pub fn build_id_of(path: &std::path::Path) -> Option<String> {
    let file = Checked::open(path).ok()?;
    read_build_id(&file).map(|(id, len)| hex(&id[..len]))
}

/// A build id from [`hex`]'s text, padded.
fn parse_hex(text: &str) -> Option<BuildId> {
    if !text.len().is_multiple_of(2) || text.len() > 2 * BUILD_ID_LEN {
        return None;
    }
    let mut id = [0; BUILD_ID_LEN];
    for (i, byte) in id.iter_mut().take(text.len() / 2).enumerate() {
        *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_build_id_goes_to_hex_and_back_at_its_own_length() {
        let mut id = [0; BUILD_ID_LEN];
        id[..16].copy_from_slice(&[0xab; 16]);
        assert_eq!(parse_hex(&"ab".repeat(16)), Some(id), "padded");
        assert_eq!(parse_hex("abc"), None);
        assert_eq!(parse_hex(&"00".repeat(21)), None);
        let mut ids = BuildIds::default();
        let unknown = [0x5a; BUILD_ID_LEN];
        assert_eq!(ids.show(&unknown), "5a".repeat(20), "as the kernel gave it");
        ids.restore(&[SavedBuildId {
            build_id: "ab".repeat(16),
            path: PathBuf::from("/nonexistent"),
        }]);
        assert_eq!(ids.show(&id), "ab".repeat(16), "a known file's length");
        // A 20-byte id may end in a zero byte: it is not taken for padding.
        let mut ends_in_zero = [0x11; BUILD_ID_LEN];
        ends_in_zero[19] = 0;
        assert_eq!(ids.show(&ends_in_zero), format!("{}00", "11".repeat(19)));
    }

    #[test]
    fn this_test_binary_is_found_by_its_own_build_id() {
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let Some((id, _)) = read_build_id(&Checked::open(&exe).unwrap()) else {
            panic!("{} has a build id (the linker's default)", exe.display());
        };
        // Learned as the slow side learns a holder's files, and noted as the reader does.
        let maps = crate::sites::mappings::mappings(std::process::id()).expect("own mappings");
        let mut ids = BuildIds::default();
        for l in crate::sites::locating::Files::default().learn(std::process::id(), &maps) {
            ids.note(l.file, l.id, l.path);
        }
        assert!(ids.knows(&id));
        assert_eq!(ids.path_of_id(&id), Some(exe.as_path()));
        let mut next = BuildIds::default();
        next.restore(&ids.save());
        let taken_back = next.path_of_id(&id);
        assert_eq!(
            taken_back,
            Some(exe.as_path()),
            "taken back from a checkpoint"
        );
    }

    #[test]
    fn a_build_id_read_elsewhere_is_learned_and_a_failed_read_unlearns_nothing() {
        let file = ExeKey { dev: 8, ino: 42 };
        let id = [0x42; BUILD_ID_LEN];
        let mut ids = BuildIds::default();
        assert_eq!(
            ids.note(file, None, None),
            None,
            "nothing known, nothing read"
        );
        let path = PathBuf::from("/usr/lib/libexample.so");
        assert_eq!(ids.note(file, Some((id, 20)), Some(path.clone())), Some(id));
        assert_eq!(ids.path_of(file), Some(path.clone()));
        assert_eq!(ids.path_of_id(&id), Some(path.as_path()));
        // The file could not be opened this time (its process's root gone): still known.
        assert_eq!(ids.note(file, None, None), Some(id));
        assert_eq!(ids.path_of(file), Some(path));
    }
}
