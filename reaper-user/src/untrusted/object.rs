//! A file a traced process maps or names (an executable, a library, a perf map), opened so that
//! the open neither blocks nor acts and what is read is the file checked, then read in bounded
//! pieces and never mapped.
use std::fs::{File, Metadata, OpenOptions};
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use object::{ReadCache, ReadCacheOps};
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

    /// For the `object` crate's parsers: each piece they ask for read when asked (none larger
    /// than [`caps::OBJECT_PIECE`]), against the size the file had when opened.
    pub fn reader(&self) -> ReadCache<Pieces<'_>> {
        ReadCache::new(Pieces { file: self, at: 0 })
    }

    /// A private copy, sealed so that nothing can shrink, grow or write it: for a reader that
    /// maps what it reads (blazesym's symbolizer), whom a truncation of the file itself would
    /// fault. At most [`caps::OBJECT_COPY`] bytes; the copy lives as long as the value.
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
        let mut copy = unsafe { File::from_raw_fd(fd) };
        let mut buf = vec![0; 1 << 20];
        let mut at = 0;
        loop {
            let n = self.file.read_at(&mut buf, at)?;
            if n == 0 {
                break; // the end, or the file was cut meanwhile: the copy holds what was there
            }
            copy.write_all(&buf[..n])?;
            at += n as u64;
            if at > caps::OBJECT_COPY {
                return Err(refused("the file grew too large to copy"));
            }
        }
        let seals =
            libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE | libc::F_SEAL_SEAL;
        // SAFETY: fcntl on a descriptor this value owns.
        if unsafe { libc::fcntl(copy.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Sealed(copy))
    }
}

/// A sealed private copy of a file (see [`Checked::sealed_copy`]).
pub struct Sealed(File);

impl Sealed {
    /// A path a reader opens the copy by, while this value lives.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.0.as_raw_fd()))
    }
}

/// A checked file as the `object` crate reads it (see [`Checked::reader`]).
pub struct Pieces<'a> {
    file: &'a Checked,
    at: u64,
}

impl ReadCacheOps for Pieces<'_> {
    fn len(&mut self) -> Result<u64, ()> {
        Ok(self.file.len())
    }

    fn seek(&mut self, pos: u64) -> Result<u64, ()> {
        self.at = pos;
        Ok(pos)
    }

    fn read(&mut self, buf: &mut [u8]) -> Result<usize, ()> {
        let n = self.file.file.read_at(buf, self.at).map_err(|_| ())?;
        self.at += n as u64;
        Ok(n)
    }

    fn read_exact(&mut self, buf: &mut [u8]) -> Result<(), ()> {
        if buf.len() as u64 > caps::OBJECT_PIECE {
            return Err(());
        }
        self.file.read_exact_at(buf, self.at).map_err(|_| ())?;
        self.at += buf.len() as u64;
        Ok(())
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
}
