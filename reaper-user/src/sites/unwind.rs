//! Unwinding a copied stack (see `reaper_common::copy`) with the call frame information of the
//! objects its process maps (`.eh_frame`, through `.eh_frame_hdr`), as `perf --call-graph
//! dwarf` does. Code no object covers (a JIT's), and code an object has no such information
//! for (V8's builtins), is unwound by its frame pointer: V8 keeps one in every frame it makes.
use std::collections::HashMap;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;

use framehop::{ExplicitModuleSectionInfo, FrameAddress, Module, Unwinder as _};
use object::read::elf::{ElfFile64, ProgramHeader as _};
use object::{Object as _, ObjectSection as _};
use reaper_common::ExeKey;
use reaper_common::copy::ExeCode;

use crate::capture::decode::CopiedStack;
use crate::sites::mappings::{self, Mapping};
use crate::untrusted::Checked;

use arch::{Cache, Unwinder, start_regs};

/// This architecture's unwinder, the cache of its rules, and the registers it starts from.
#[cfg(target_arch = "x86_64")]
mod arch {
    use framehop::x86_64::UnwindRegsX86_64;
    pub use framehop::x86_64::{CacheX86_64 as Cache, UnwinderX86_64 as Unwinder};
    use reaper_common::copy::UserRegs;

    pub fn start_regs(regs: &UserRegs) -> UnwindRegsX86_64 {
        UnwindRegsX86_64::new(regs.pc, regs.sp, regs.fp)
    }
}

/// On aarch64 a return address may be signed (pointer authentication: code built with
/// `-mbranch-protection=standard`, as distributions now build their arm64 packages): its top
/// bits hold the signature, stripped here to the 48 bits of a user address, as the kernel's
/// own frame-pointer walk strips them.
#[cfg(target_arch = "aarch64")]
mod arch {
    pub use framehop::aarch64::{CacheAarch64 as Cache, UnwinderAarch64 as Unwinder};
    use framehop::aarch64::{PtrAuthMask, UnwindRegsAarch64};
    use reaper_common::copy::UserRegs;

    /// The bits of a user address: 48 (Linux's user address space on arm64 unless a process
    /// asks for more).
    const USER_ADDRESS: PtrAuthMask = PtrAuthMask(u64::MAX >> 16);

    pub fn start_regs(regs: &UserRegs) -> UnwindRegsAarch64 {
        UnwindRegsAarch64::new_with_ptr_auth_mask(USER_ADDRESS, regs.lr, regs.sp, regs.fp)
    }
}

/// Most frames kept from one unwind (innermost first).
pub const FRAMES_MAX: usize = 64;

/// What an object gives the unwinder, read once per file.
struct Object {
    eh_frame: Arc<[u8]>,
    eh_frame_svma: Range<u64>,
    eh_frame_hdr: Arc<[u8]>,
    eh_frame_hdr_svma: Range<u64>,
    text_svma: Option<Range<u64>>,
    got_svma: Option<Range<u64>>,
    /// Its loadable code segments: file offset, address (as the object states it), size.
    /// Code only: a page may hold the end of one segment and the start of the next, and
    /// only the code one places an executable mapping (lld lays them out so).
    loads: Vec<(u64, u64, u64)>,
}

impl Object {
    fn read(file: &Checked) -> Option<Object> {
        let reader = file.reader();
        let elf = ElfFile64::<object::Endianness, _>::parse(&reader).ok()?;
        let section = |name: &str| {
            let s = elf.section_by_name(name)?;
            // A header's fields are the file's: a range that overflows is no section.
            Some((s.address()..s.address().checked_add(s.size())?, s))
        };
        let (eh_frame_svma, eh_frame) = section(".eh_frame")?;
        let (eh_frame_hdr_svma, eh_frame_hdr) = section(".eh_frame_hdr")?;
        let endian = elf.endian();
        let loads = elf
            .elf_program_headers()
            .iter()
            .filter(|p| p.p_type(endian) == object::elf::PT_LOAD)
            .filter(|p| p.p_flags(endian) & object::elf::PF_X != 0)
            .map(|p| (p.p_offset(endian), p.p_vaddr(endian), p.p_filesz(endian)))
            .collect();
        Some(Object {
            eh_frame: Arc::from(eh_frame.data().ok()?),
            eh_frame_svma,
            eh_frame_hdr: Arc::from(eh_frame_hdr.data().ok()?),
            eh_frame_hdr_svma,
            text_svma: section(".text").map(|(r, _)| r),
            got_svma: section(".got").map(|(r, _)| r),
            loads,
        })
    }

    /// Where address 0 of the object sits in a process that maps file offset `offset` at
    /// `start`, executable.
    fn base(&self, start: u64, offset: u64) -> Option<u64> {
        let &(p_offset, p_vaddr, _) = self
            .loads
            .iter()
            .find(|(o, _, size)| (o & !0xfff..o.saturating_add(*size)).contains(&offset))?;
        // File offset `offset` is at `start`, and at `p_vaddr + (offset - p_offset)` in the
        // object's own addresses (a mapping may begin on the page before the segment's first
        // byte, or inside the segment).
        start
            .checked_add(p_offset)?
            .checked_sub(p_vaddr.checked_add(offset)?)
    }

    /// The loadable code segment holding file offset `offset`, or with none given the first
    /// in the object's addresses: its file offset, address (as the object states it), size.
    fn code_segment(&self, offset: Option<u64>) -> Option<(u64, u64, u64)> {
        match offset {
            Some(offset) => self
                .loads
                .iter()
                .find(|(o, _, size)| (*o..o.saturating_add(*size)).contains(&offset))
                .copied(),
            None => self
                .loads
                .iter()
                .min_by_key(|(_, vaddr, _)| *vaddr)
                .copied(),
        }
    }

    /// How far its code reaches from the start of its first code segment, in its own
    /// addresses: what the kernel's `end_code` less `start_code` is for a process running it.
    fn code_span(&self) -> Option<u64> {
        let start = self.loads.iter().map(|&(_, vaddr, _)| vaddr).min()?;
        let end = self
            .loads
            .iter()
            .map(|&(_, vaddr, size)| vaddr.checked_add(size))
            .max()??;
        end.checked_sub(start)
    }

    fn module(&self, name: &str, range: Range<u64>, base: u64) -> Module<Arc<[u8]>> {
        let info = ExplicitModuleSectionInfo {
            base_svma: 0,
            text_svma: self.text_svma.clone(),
            got_svma: self.got_svma.clone(),
            eh_frame_svma: Some(self.eh_frame_svma.clone()),
            eh_frame: Some(self.eh_frame.clone()),
            eh_frame_hdr_svma: Some(self.eh_frame_hdr_svma.clone()),
            eh_frame_hdr: Some(self.eh_frame_hdr.clone()),
            ..Default::default()
        };
        Module::new(name.to_string(), range, base, info)
    }
}

/// A copy's frames, unwound in the mappings its process had then.
pub struct Unwound {
    pub maps: Vec<Mapping>,
    /// Innermost first: each frame's mapping (an index in `maps`) and its offset in the mapped
    /// file, or no file's mapping and its address (code in an anonymous executable mapping: a
    /// JIT's). The frames end before the first address in no executable mapping: a walk that
    /// read data as a return address (seen on aarch64 in a Node host's stack).
    pub frames: Vec<(Option<usize>, u64)>,
    /// Whether frames were left out: the walk stopped at [`FRAMES_MAX`], or at an address in
    /// no executable mapping, rather than at the outermost frame.
    pub truncated: bool,
}

/// The objects read so far, by file (device and inode): a process's libraries are read once.
#[derive(Default)]
pub struct Objects {
    read: HashMap<ExeKey, Option<Arc<Object>>>,
}

/// One host's unwinder, kept between its forks while its mappings stay the same: its rules
/// cache then serves every fork down the same path.
pub struct HostUnwinder {
    /// The `/proc/PID/maps` text it was set up from.
    maps: String,
    unwinder: Unwinder<Arc<[u8]>>,
    cache: Cache,
}

/// Objects read before [`Objects::bound`] lets go of those no kept unwinder uses.
const KEPT: usize = 256;

impl Objects {
    /// Keeps the objects read within [`KEPT`]: past it, those no kept unwinder uses (a host
    /// that is gone, a site unwound once) go, and are read again when met. A day of upgrades,
    /// containers and venvs maps ever new files, each object megabytes of `.eh_frame`.
    pub fn bound(&mut self) {
        if self.read.len() > KEPT {
            self.read.retain(|_, object| {
                object
                    .as_ref()
                    .is_some_and(|o| Arc::strong_count(&o.eh_frame) > 1)
            });
        }
    }

    /// An unwinder over the executable mappings of process `pid`, listed in `text` (parsed:
    /// `maps`); `kept`, when set up from the same text, is the one returned.
    fn unwinder(
        &mut self,
        pid: u32,
        text: String,
        maps: &[Mapping],
        kept: Option<HostUnwinder>,
    ) -> HostUnwinder {
        if let Some(kept) = kept.filter(|k| k.maps == text) {
            return kept;
        }
        let mut unwinder = Unwinder::new();
        for m in maps.iter().filter(|m| m.executable) {
            let Some(object) = self.object(pid, m) else {
                continue;
            };
            if let Some(base) = object.base(m.start, m.offset) {
                unwinder.add_module(object.module(&m.path, m.start..m.end, base));
            }
        }
        HostUnwinder {
            maps: text,
            unwinder,
            cache: Cache::new(),
        }
    }

    /// Unwinds `copy`, taken in process `pid`, in its mappings now: none once it is gone, or
    /// when they are not the copy's (the pid runs another program since: no mapping of the
    /// copy's executable holds its code where the kernel saw it, see [`runs_code_of`]).
    /// `kept`: the unwinder set up for the process before, reused while its mappings are the
    /// same; the one used is returned for the next copy.
    pub fn unwind(
        &mut self,
        pid: u32,
        copy: &CopiedStack,
        kept: Option<HostUnwinder>,
    ) -> Option<(Unwound, HostUnwinder)> {
        let text = mappings::text(pid).ok()?;
        let maps = mappings::parse(&text);
        if !runs_code_of(&maps, &copy.exe) {
            return None;
        }
        let code = mappings::executable_ranges(&text);
        let mut unwinder = self.unwinder(pid, text, &maps, kept);
        Some((unwinder.frames(copy, maps, &code), unwinder))
    }

    /// Unwinds `copy`, taken in process `pid` that is gone since (its mappings with it), in
    /// what was taken of it at the fork: its executable's code where `copy.exe` says (the
    /// file `exe`, opened as that one), and the object it forked in, `forked_in` (the file
    /// and the offset in it of `copy.regs.pc`, as the kernel's frame-pointer walk named that
    /// frame). Each is placed by its first code segment, or the one holding the offset; a
    /// frame anywhere else ends the walk.
    pub fn unwind_taken(
        &mut self,
        pid: u32,
        copy: &CopiedStack,
        exe: Option<(Checked, PathBuf)>,
        forked_in: Option<(Checked, PathBuf, u64)>,
    ) -> Option<Unwound> {
        let exe = exe.and_then(|(file, path)| {
            let placed = self.placed(file, path, copy.exe.start, None)?;
            // Its code spans what the kernel saw it span (`end_code`): the layout it had.
            let span = self.read.get(&placed.file)?.as_ref()?.code_span()?;
            (copy.exe.start.checked_add(span)? == copy.exe.end).then_some(placed)
        });
        let forked_in = forked_in
            .and_then(|(file, path, offset)| self.placed(file, path, copy.regs.pc, Some(offset)));
        let mut maps: Vec<Mapping> = exe.into_iter().chain(forked_in).collect();
        maps.sort_by_key(|m| m.start);
        // A static spawner forks in its executable: one mapping, placed alike both ways.
        maps.dedup_by(|a, b| a.file == b.file && a.start == b.start);
        // Two mappings of one process never overlap: these did not come from one layout (a
        // file rewritten since, its segments others).
        if maps.is_empty() || maps.windows(2).any(|w| w[0].end > w[1].start) {
            return None;
        }
        let code: Vec<Range<u64>> = maps.iter().map(|m| m.start..m.end).collect();
        let mut unwinder = self.unwinder(pid, String::new(), &maps, None);
        Some(unwinder.frames(copy, maps, &code))
    }

    /// The executable mapping a process had of `file` (found at `path`) with the code at
    /// file offset `offset` at address `addr`, or with no offset given its first code segment
    /// at `addr`: the segment's whole span.
    fn placed(
        &mut self,
        file: Checked,
        path: PathBuf,
        addr: u64,
        offset: Option<u64>,
    ) -> Option<Mapping> {
        let key = file.key();
        let object = self
            .read
            .entry(key)
            .or_insert_with(|| Object::read(&file).map(Arc::new))
            .clone()?;
        let (p_offset, _, size) = object.code_segment(offset)?;
        let start = addr.checked_sub(offset.map_or(Some(0), |o| o.checked_sub(p_offset))?)?;
        Some(Mapping {
            start,
            end: start.checked_add(size)?,
            offset: p_offset,
            executable: true,
            writable: false,
            file: key,
            path: path.to_str()?.to_string(),
        })
    }

    fn object(&mut self, pid: u32, m: &Mapping) -> Option<Arc<Object>> {
        self.read
            .entry(m.file)
            .or_insert_with(|| {
                let (file, _) = m.open(pid)?;
                Object::read(&file).map(Arc::new)
            })
            .clone()
    }
}

/// Whether mappings `maps` hold the code of executable `exe` where the kernel saw it at the
/// copy: an executable mapping of that file holding its `start_code`. A copy that says
/// nothing of its executable (the probe could not read it) is taken as theirs.
pub(super) fn runs_code_of(maps: &[Mapping], exe: &ExeCode) -> bool {
    exe.end == 0
        || maps
            .iter()
            .any(|m| m.executable && m.file == exe.file && (m.start..m.end).contains(&exe.start))
}

impl HostUnwinder {
    /// `copy`'s frames in mappings `maps`, whose code is at `code` (in address order): up to
    /// the first address that is no code.
    fn frames(&mut self, copy: &CopiedStack, maps: Vec<Mapping>, code: &[Range<u64>]) -> Unwound {
        let addrs = self.unwind(copy);
        let is_code = |addr: u64| {
            // The first range that ends past `addr`.
            let at = code.partition_point(|r| r.end <= addr);
            code.get(at).is_some_and(|r| r.contains(&addr))
        };
        let frames: Vec<_> = addrs
            .iter()
            .take_while(|&&addr| is_code(addr))
            .map(|&addr| {
                maps.iter()
                    .enumerate()
                    .find_map(|(i, m)| Some((Some(i), m.file_offset(addr)?)))
                    .unwrap_or((None, addr))
            })
            .collect();
        let truncated = addrs.len() == FRAMES_MAX || frames.len() < addrs.len();
        Unwound {
            maps,
            frames,
            truncated,
        }
    }

    /// The code addresses of `copy`'s frames, innermost first (a return address is given as
    /// the call's: one byte back).
    pub fn unwind(&mut self, copy: &CopiedStack) -> Vec<u64> {
        let regs = start_regs(&copy.regs);
        let mut read_stack = |addr: u64| -> Result<u64, ()> {
            let at = usize::try_from(addr.checked_sub(copy.base).ok_or(())?).map_err(|_| ())?;
            let bytes = copy.bytes.get(at..at.checked_add(8).ok_or(())?).ok_or(())?;
            Ok(u64::from_le_bytes(bytes.try_into().map_err(|_| ())?))
        };
        let mut frames =
            self.unwinder
                .iter_frames(copy.regs.pc, regs, &mut self.cache, &mut read_stack);
        let mut addrs = Vec::new();
        // The walk ends at the outermost frame, at a frame past the copy, or at the cap.
        while let Ok(Some(frame)) = frames.next() {
            addrs.push(match frame {
                FrameAddress::InstructionPointer(ip) => ip,
                FrameAddress::ReturnAddress(_) => frame.address_for_lookup(),
            });
            if addrs.len() == FRAMES_MAX {
                break;
            }
        }
        addrs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This process as the kernel sees its executable: its path, the mapping of its code that
    /// holds `here`, and its mm's `start_code` and `end_code` (`/proc/self/stat`'s 26th and
    /// 27th fields; those after the command's `)` start at the third).
    fn own_code(here: u64) -> (PathBuf, Mapping, u64, u64) {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .unwrap()
            .1
            .split_whitespace()
            .collect();
        let field = |n: usize| fields[n - 3].parse().unwrap();
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let maps = mappings::mappings(std::process::id()).unwrap();
        let code = maps
            .into_iter()
            .find(|m| m.executable && m.file_offset(here).is_some())
            .unwrap();
        assert_eq!(std::path::Path::new(&code.path), exe);
        (exe, code, field(26), field(27))
    }

    /// An executable placed from where its mm says its code starts, or from one code address
    /// and its file offset, puts each address of its code at the file offset its process's
    /// mappings do, and its code spans what the mm says.
    #[test]
    fn an_executable_is_placed_where_its_mappings_put_its_code() {
        let here = an_executable_is_placed_where_its_mappings_put_its_code as fn() as usize as u64;
        let (exe, code, start_code, end_code) = own_code(here);
        let mut objects = Objects::default();
        let open = || Checked::open(&exe).unwrap();
        let by_start = objects
            .placed(open(), exe.clone(), start_code, None)
            .unwrap();
        let by_offset = code.file_offset(here).unwrap();
        let by_frame = objects
            .placed(open(), exe.clone(), here, Some(by_offset))
            .unwrap();
        for placed in [&by_start, &by_frame] {
            assert_eq!(placed.file, code.file);
            assert_eq!(placed.file_offset(here), Some(by_offset));
            assert_eq!(placed.file_offset(start_code), code.file_offset(start_code));
        }
        assert_eq!(
            objects
                .placed(open(), exe, here, Some(u64::MAX))
                .map(|m| m.start),
            None,
            "an offset in no code segment places nothing"
        );
        let object = objects.read.get(&code.file).unwrap().as_ref().unwrap();
        assert_eq!(Some(end_code - start_code), object.code_span(), "end_code");
    }

    /// A copy of a process that forked in its own executable (a static one) unwinds in its
    /// executable, placed from `start_code` and from the innermost frame alike: one mapping.
    #[test]
    fn an_executable_placed_both_ways_is_one_mapping() {
        let here = an_executable_placed_both_ways_is_one_mapping as fn() as usize as u64;
        let (exe, code, start, end) = own_code(here);
        let copy = CopiedStack {
            regs: reaper_common::copy::UserRegs {
                pc: here,
                ..Default::default()
            },
            exe: reaper_common::copy::ExeCode {
                file: code.file,
                start,
                end,
            },
            base: 0,
            bytes: Vec::new(),
        };
        let open = || Checked::open(&exe).unwrap();
        let offset = code.file_offset(here).unwrap();
        let unwound = Objects::default()
            .unwind_taken(
                std::process::id(),
                &copy,
                Some((open(), exe.clone())),
                Some((open(), exe.clone(), offset)),
            )
            .expect("unwound");
        assert_eq!(unwound.maps.len(), 1, "one mapping");
        assert_eq!(unwound.frames.first(), Some(&(Some(0), offset)), "pc in it");
    }

    /// A process's mappings are a copy's while they hold its executable's code where the
    /// kernel saw it; another program's (a pid reused, an exec since) are not.
    #[test]
    fn mappings_are_a_copys_only_while_they_hold_its_executables_code() {
        let here =
            mappings_are_a_copys_only_while_they_hold_its_executables_code as fn() as usize as u64;
        let (_, code, start, end) = own_code(here);
        let maps = mappings::mappings(std::process::id()).unwrap();
        let exe = ExeCode {
            file: code.file,
            start,
            end,
        };
        assert!(runs_code_of(&maps, &exe), "this process's own");
        let elsewhere = ExeCode {
            start: start ^ (1 << 40),
            ..exe
        };
        assert!(
            !runs_code_of(&maps, &elsewhere),
            "its code elsewhere: another layout"
        );
        let other = ExeCode {
            file: ExeKey {
                ino: code.file.ino ^ 1,
                ..code.file
            },
            ..exe
        };
        assert!(!runs_code_of(&maps, &other), "another executable");
        assert!(
            runs_code_of(&maps, &ExeCode::default()),
            "a copy that says nothing"
        );
    }
}
