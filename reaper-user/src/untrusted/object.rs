//! A file a traced process maps or names (an executable, a library, a perf map), opened so that
//! the open neither blocks nor acts and what is read is the file checked, then read in bounded
//! pieces and never mapped.
use std::fs::{File, Metadata, OpenOptions};
use std::io;
use std::ops::Range;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use elsa::FrozenMap;
use object::ReadRef;
use reaper_common::ExeKey;

use super::caps;
use super::read::Capped;

/// A regular file, checked on its descriptor and open for reading.
pub struct Checked {
    file: File,
    meta: Metadata,
}

fn refused(why: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, why.into())
}

impl Checked {
    /// Opens the regular file at `path`: `O_PATH` first, not following a symlink at the last
    /// step (no wait for a FIFO's writer, no device opened, no link swapped in), checked to be
    /// a regular file on that descriptor, then opened for reading through the descriptor
    /// (`/proc/self/fd/N`): the inode checked, whatever the path names by then.
    pub fn open(path: &Path) -> io::Result<Checked> {
        let at = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_NOFOLLOW)
            .open(path)?;
        let meta = at.metadata()?;
        if !meta.file_type().is_file() {
            return Err(refused(format!("{} is not a regular file", path.display())));
        }
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(format!("/proc/self/fd/{}", at.as_raw_fd()))?;
        Ok(Checked { file, meta })
    }

    /// Opens the first of `paths` that is the file the kernel names `want` (see
    /// [`Checked::is`]); returns it and the path it was found at.
    pub fn open_as(
        paths: impl IntoIterator<Item = PathBuf>,
        want: ExeKey,
    ) -> io::Result<(Checked, PathBuf)> {
        let mut last = refused("no path to open");
        for path in paths {
            match Checked::open(&path) {
                Ok(file) if file.is(want) => return Ok((file, path)),
                Ok(_) => last = refused(format!("{} is another file now", path.display())),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Whether this is the file the kernel names `want` (the device and inode `maps` shows):
    /// the same inode number on the same device, or on a filesystem whose stat(2) shows another
    /// device than the kernel's (a btrfs subvolume's own; an overlay's, whose mapped files
    /// `maps` names by the file under it, with the same inode number).
    pub fn is(&self, want: ExeKey) -> bool {
        if self.meta.ino() != want.ino {
            return false;
        }
        if self.key().dev == want.dev {
            return true;
        }
        let mut fs = std::mem::MaybeUninit::<libc::statfs>::uninit();
        // SAFETY: a valid descriptor and a buffer of the right type, initialised on success.
        if unsafe { libc::fstatfs(self.file.as_raw_fd(), fs.as_mut_ptr()) } != 0 {
            return false;
        }
        // SAFETY: fstatfs succeeded.
        let kind = unsafe { fs.assume_init() }.f_type;
        kind == libc::BTRFS_SUPER_MAGIC || kind == libc::OVERLAYFS_SUPER_MAGIC
    }

    /// Its device (in the kernel's encoding, as `maps` and the exec probe have it) and inode,
    /// as stat(2) shows them.
    pub fn key(&self) -> ExeKey {
        let dev = self.meta.dev();
        ExeKey {
            dev: u64::from(libc::major(dev)) << 20 | u64::from(libc::minor(dev)),
            ino: self.meta.ino(),
        }
    }

    /// Its size when opened.
    pub fn len(&self) -> u64 {
        self.meta.len()
    }

    /// Its owner's uid.
    pub fn owner(&self) -> u32 {
        self.meta.uid()
    }

    /// Reads `buf.len()` bytes at `offset`; a file cut shorter meanwhile is an error.
    pub fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }

    /// The file from its start, up to `cap` bytes (and whether it is longer); a file cut
    /// shorter meanwhile gives what it still holds.
    pub fn read_head(&self, cap: usize) -> io::Result<Capped> {
        let len = usize::try_from(self.len()).unwrap_or(usize::MAX);
        let mut bytes = vec![0; len.min(cap)];
        let mut got = 0;
        while got < bytes.len() {
            match self.file.read_at(&mut bytes[got..], got as u64)? {
                0 => break,
                n => got += n,
            }
        }
        bytes.truncate(got);
        Ok(Capped {
            bytes,
            cut: len > cap,
        })
    }

    /// For the `object` crate's parsers (see [`Pieces`]): pass `&reader`.
    pub fn reader(&self) -> Pieces<'_> {
        Pieces::new(&self.file, self.len())
    }

    /// A private copy, sealed so that nothing can shrink, grow or write it: for a reader that
    /// maps what it reads (blazesym's symbolizer), whom a truncation of the file itself would
    /// fault. At most [`caps::OBJECT_COPY`] bytes, and only what is not zeros takes memory (a
    /// sparse file's holes stay holes). Its debug links are blinded (see [`blind_links`]): a
    /// reader that follows them opens no file the traced process named. The copy lives as
    /// long as the value.
    pub fn sealed_copy(&self) -> io::Result<Sealed> {
        if self.len() > caps::OBJECT_COPY {
            return Err(refused(format!("{} bytes, too large to copy", self.len())));
        }
        let name = c"reaper-object";
        // SAFETY: a valid C string; the result is checked.
        let fd = unsafe {
            libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a descriptor just made, owned by nothing else.
        let copy = unsafe { File::from_raw_fd(fd) };
        let mut buf = vec![0; 1 << 20];
        let mut at = 0;
        loop {
            let n = self.file.read_at(&mut buf, at)?;
            if n == 0 {
                break; // the end, or the file was cut meanwhile: the copy holds what was there
            }
            // Page by page: a page of zeros is left a hole.
            for (i, page) in buf[..n].chunks(4096).enumerate() {
                if page.iter().any(|&b| b != 0) {
                    copy.write_all_at(page, at + (i * 4096) as u64)?;
                }
            }
            at += n as u64;
            if at > caps::OBJECT_COPY {
                return Err(refused("the file grew too large to copy"));
            }
        }
        copy.set_len(at)?;
        blind_links(&copy)?;
        let seals =
            libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE | libc::F_SEAL_SEAL;
        // SAFETY: fcntl on a descriptor this value owns.
        if unsafe { libc::fcntl(copy.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Sealed(copy))
    }
}

/// The sections by which an ELF object names another file to read its debug information
/// from (the name is the object's, so the traced process's choice: a FIFO's, a device's).
const DEBUG_LINKS: [&[u8]; 3] = [b".gnu_debuglink", b".gnu_debugaltlink", b".debug_sup"];

/// Renames the debug-link sections of the ELF object in `copy` (the first byte of each name,
/// `.` to `!`), so a reader looking them up by name finds none. The symbolizer reads the
/// header its own way, so only a header both read alike is taken: a 64-bit object of this
/// machine's byte order, version 1, with section headers (what this machine's processes
/// map); another is refused. Not an ELF object at all: left as it is (the symbolizer refuses
/// it itself).
fn blind_links(copy: &File) -> io::Result<()> {
    use object::elf::{ELFCLASS64, ELFDATA2LSB, ELFDATA2MSB, EV_CURRENT, FileHeader64};
    use object::read::elf::{FileHeader, SectionHeader as _};
    let mut ident = [0u8; 16];
    if copy.read_exact_at(&mut ident, 0).is_err() || ident[..4] != *b"\x7fELF" {
        return Ok(());
    }
    let native = match cfg!(target_endian = "little") {
        true => ELFDATA2LSB,
        false => ELFDATA2MSB,
    };
    if ident[4] != ELFCLASS64 || ident[5] != native || ident[6] != EV_CURRENT {
        return Err(refused(
            "not a 64-bit ELF object of this machine's byte order",
        ));
    }
    let reader = Pieces::new(copy, copy.metadata()?.len());
    let bad = |e: object::Error| refused(format!("its headers do not read: {e}"));
    let header = FileHeader64::<object::Endianness>::parse(&reader).map_err(bad)?;
    let endian = header.endian().map_err(bad)?;
    if header.e_shoff(endian) == 0 {
        return Err(refused("it has no section headers"));
    }
    let sections = header.sections(endian, &reader).map_err(bad)?;
    let mut names = Vec::new();
    for section in sections.iter() {
        let name = sections.section_name(endian, section).map_err(bad)?;
        if DEBUG_LINKS.contains(&name) {
            names.push(u64::from(section.sh_name(endian)));
        }
    }
    if names.is_empty() {
        return Ok(());
    }
    let strings = header.shstrndx(endian, &reader).map_err(bad)?;
    let table = sections
        .section(object::SectionIndex(strings as usize))
        .map_err(bad)?;
    let table_at = table.sh_offset(endian);
    for name in names {
        let at = table_at
            .checked_add(name)
            .ok_or_else(|| refused("a section's name lies past the end"))?;
        copy.write_all_at(b"!", at)?;
    }
    Ok(())
}

/// A sealed private copy of a file (see [`Checked::sealed_copy`]).
pub struct Sealed(File);

impl Sealed {
    /// A path a reader opens the copy by, while this value lives.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.0.as_raw_fd()))
    }

    /// Refuses an object whose compressed sections say they inflate to more than `cap` bytes
    /// in all: a reader that inflates them (blazesym's, for debug information) allocates
    /// what their headers say, whatever the bytes hold.
    pub fn inflates_within(&self, cap: u64) -> io::Result<()> {
        use object::{CompressionFormat, Object as _, ObjectSection as _};
        let reader = Pieces::new(&self.0, self.0.metadata()?.len());
        let parsed = object::File::parse(&reader).map_err(|e| refused(e.to_string()))?;
        let mut total = 0u64;
        for section in parsed.sections() {
            let Ok(range) = section.compressed_file_range() else {
                return Err(refused("a section's compression header does not read"));
            };
            if range.format != CompressionFormat::None {
                total = total.saturating_add(range.uncompressed_size);
            }
        }
        match total <= cap {
            true => Ok(()),
            false => Err(refused(format!(
                "its compressed sections say they inflate to {total} bytes"
            ))),
        }
    }
}

/// A checked file as the `object` crate's parsers read it (see [`Checked::reader`]): each
/// piece they ask for is read when asked, against the size the file had when opened, and
/// kept until the reader is dropped (they hold on to what they were given). A piece larger
/// than [`caps::OBJECT_PIECE`], or past [`caps::OBJECT_PIECES`] kept in all, is refused before
/// anything is allocated for it: a section header may say any size, and a sparse file may be
/// any length.
pub struct Pieces<'f> {
    file: &'f File,
    /// The file's size when opened.
    len: u64,
    /// Bytes the pieces kept may still take (see [`caps::OBJECT_PIECES`]).
    budget: std::cell::Cell<u64>,
    pieces: FrozenMap<(u64, u64), Box<[u8]>>,
    strings: FrozenMap<(u64, u8), Box<[u8]>>,
}

/// The longest string a parser may ask for up to a delimiter (a symbol's or a section's name).
const STRING_MAX: u64 = 4096;

impl<'f> Pieces<'f> {
    fn new(file: &'f File, len: u64) -> Pieces<'f> {
        Pieces {
            file,
            len,
            budget: std::cell::Cell::new(caps::OBJECT_PIECES),
            pieces: FrozenMap::new(),
            strings: FrozenMap::new(),
        }
    }
}

impl Pieces<'_> {
    /// Takes `size` bytes of the budget, or refuses.
    fn take(&self, size: u64) -> Result<(), ()> {
        let left = self.budget.get().checked_sub(size).ok_or(())?;
        self.budget.set(left);
        Ok(())
    }
}

impl<'a> ReadRef<'a> for &'a Pieces<'_> {
    fn len(self) -> Result<u64, ()> {
        Ok(self.len)
    }

    fn read_bytes_at(self, offset: u64, size: u64) -> Result<&'a [u8], ()> {
        if size == 0 {
            return Ok(&[]);
        }
        let end = offset.checked_add(size).ok_or(())?;
        if size > caps::OBJECT_PIECE || end > self.len {
            return Err(());
        }
        if let Some(piece) = self.pieces.get(&(offset, size)) {
            return Ok(piece);
        }
        self.take(size)?;
        let mut piece = vec![0; usize::try_from(size).map_err(|_| ())?];
        self.file
            .read_exact_at(&mut piece, offset)
            .map_err(|_| ())?;
        Ok(self.pieces.insert((offset, size), piece.into_boxed_slice()))
    }

    fn read_bytes_at_until(self, range: Range<u64>, delimiter: u8) -> Result<&'a [u8], ()> {
        if let Some(string) = self.strings.get(&(range.start, delimiter)) {
            return Ok(string);
        }
        if range.end > self.len {
            return Err(());
        }
        let most = range
            .end
            .checked_sub(range.start)
            .ok_or(())?
            .min(STRING_MAX);
        self.take(most)?;
        let mut bytes = vec![0; most as usize];
        let mut got = 0;
        while got < bytes.len() {
            match self
                .file
                .read_at(&mut bytes[got..], range.start + got as u64)
            {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(_) => return Err(()),
            }
        }
        let len = bytes[..got]
            .iter()
            .position(|&b| b == delimiter)
            .ok_or(())?;
        bytes.truncate(len);
        Ok(self
            .strings
            .insert((range.start, delimiter), bytes.into_boxed_slice()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object::Object as _;

    #[test]
    fn only_a_regular_file_is_opened_and_never_through_a_symlink_or_a_fifo() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        // Would block for a writer, were it opened to read.
        let e = Checked::open(&fifo).err().unwrap();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        let e = Checked::open(Path::new("/dev/null")).err().unwrap();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        let file = dir.path().join("file");
        std::fs::write(&file, b"contents").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        // O_PATH with O_NOFOLLOW opens the link itself, which is no regular file.
        let e = Checked::open(&link).err().unwrap();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        let opened = Checked::open(&file).unwrap();
        assert_eq!(opened.read_head(100).unwrap().bytes, b"contents");
        let head = opened.read_head(4).unwrap();
        assert_eq!((head.bytes.as_slice(), head.cut), (&b"cont"[..], true));
    }

    #[test]
    fn the_file_read_is_the_one_checked_whatever_the_path_names_later() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lib.so");
        std::fs::write(&path, b"first").unwrap();
        let opened = Checked::open(&path).unwrap();
        let key = opened.key();
        std::fs::remove_file(&path).unwrap();
        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        assert_eq!(opened.read_head(100).unwrap().bytes, b"first");
        // By key: the path now names something else.
        let e = Checked::open_as([path.clone()], key).err().unwrap();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, b"second").unwrap();
        let e = Checked::open_as([path.clone()], key).err().unwrap();
        assert!(e.to_string().contains("another file"), "{e}");
        let (again, at) = Checked::open_as(
            [dir.path().join("none"), path.clone()],
            Checked::open(&path).unwrap().key(),
        )
        .unwrap();
        assert_eq!(
            (again.read_head(100).unwrap().bytes, at),
            (b"second".to_vec(), path)
        );
    }

    #[test]
    fn a_file_cut_short_is_an_error_to_the_parser_not_a_fault() {
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let copy = dir.path().join("copy");
        std::fs::copy(&exe, &copy).unwrap();
        let opened = Checked::open(&copy).unwrap();
        let reader = opened.reader();
        assert!(object::File::parse(&reader).is_ok());
        let copy_of_it = opened.sealed_copy().unwrap();
        // Cut: every piece past the cut is a short read, which the parser refuses.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&copy)
            .unwrap()
            .set_len(64)
            .unwrap();
        let reader = opened.reader();
        let parsed = object::File::parse(&reader);
        assert!(parsed.is_err() || parsed.unwrap().sections().count() == 0);
        // The sealed copy is as it was, and cannot be cut.
        let sealed = std::fs::OpenOptions::new()
            .write(true)
            .open(copy_of_it.path())
            .unwrap();
        assert_eq!(
            sealed.metadata().unwrap().len(),
            std::fs::metadata(&exe).unwrap().len()
        );
        assert!(sealed.set_len(64).is_err(), "sealed against shrinking");
    }

    #[test]
    fn a_copy_names_no_debug_file_and_keeps_a_sparse_files_holes() {
        use object::ObjectSection as _;
        // Debian's /bin/true names its debug file in a .gnu_debuglink section.
        let original = Checked::open(Path::new("/bin/true")).unwrap();
        let reader = original.reader();
        let parsed = object::File::parse(&reader).unwrap();
        let link = parsed.section_by_name(".gnu_debuglink");
        assert!(link.is_some(), "/bin/true has a debug link");
        let copy = original.sealed_copy().unwrap();
        let reader = Pieces::new(&copy.0, copy.0.metadata().unwrap().len());
        let parsed = object::File::parse(&reader).unwrap();
        assert!(parsed.section_by_name(".gnu_debuglink").is_none());
        let blinded = parsed.section_by_name("!gnu_debuglink").expect("renamed");
        assert_eq!(
            blinded.size(),
            link.unwrap().size(),
            "only the name changed"
        );

        // A header the symbolizer would read otherwise than the parser: refused.
        let dir = tempfile::tempdir().unwrap();
        let odd = |what: &str, at: u64, bytes: &[u8]| {
            let path = dir.path().join(what);
            std::fs::copy("/bin/true", &path).unwrap();
            let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            file.write_all_at(bytes, at).unwrap();
            Checked::open(&path).unwrap().sealed_copy().err()
        };
        assert!(odd("big-endian", 5, &[object::elf::ELFDATA2MSB]).is_some());
        assert!(odd("32-bit", 4, &[object::elf::ELFCLASS32]).is_some());
        // e_shoff, at 0x28 in a 64-bit header.
        let e = odd("no-sections", 0x28, &[0; 8]).expect("refused");
        assert!(e.to_string().contains("no section headers"), "{e}");

        // 256 MiB of which 5 bytes are data: the copy takes a page or so.
        let path = dir.path().join("sparse");
        let file = File::create(&path).unwrap();
        file.set_len(256 << 20).unwrap();
        file.write_all_at(b"hello", 100 << 20).unwrap();
        let copy = Checked::open(&path).unwrap().sealed_copy().unwrap();
        let meta = copy.0.metadata().unwrap();
        assert_eq!(meta.len(), 256 << 20);
        assert!(meta.blocks() * 512 <= 2 << 20, "{} blocks", meta.blocks());
        let mut read = [0; 5];
        copy.0.read_exact_at(&mut read, 100 << 20).unwrap();
        assert_eq!(&read, b"hello");
    }

    #[test]
    fn a_piece_past_the_cap_or_the_end_is_refused_before_it_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sparse");
        let file = File::create(&path).unwrap();
        // 8 GiB that cost nothing on disk: a section header may say any size within them.
        file.set_len(8 << 30).unwrap();
        file.write_all_at(b"name\0rest", 1 << 20).unwrap();
        let opened = Checked::open(&path).unwrap();
        let reader = opened.reader();
        assert!((&reader).read_bytes_at(0, caps::OBJECT_PIECE + 1).is_err());
        assert!((&reader).read_bytes_at((8 << 30) - 4, 8).is_err());
        assert!((&reader).read_bytes_at(u64::MAX, 2).is_err());
        assert_eq!((&reader).read_bytes_at(1 << 20, 4).unwrap(), b"name");
        let name = (&reader).read_bytes_at_until((1 << 20)..(2 << 20), 0);
        assert_eq!(name.unwrap(), b"name");
        // No delimiter within the longest string asked for; a range past the end.
        assert!((&reader).read_bytes_at_until(0..(1 << 20), 0xff).is_err());
        let past = ((8 << 30) - 2)..((8 << 30) + 10);
        assert!((&reader).read_bytes_at_until(past, 0).is_err());
    }
}
