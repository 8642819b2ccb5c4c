//! How much of each thing a traced process controls is read at most. Each cap is well above
//! what a sane process has and well below what a hostile one can make, so that one look at a
//! process costs bounded time and memory whatever it did.

/// A small /proc text: `stat`, `status`, `io`, `statm`, `syscall`, `cgroup`, an `fdinfo`
/// (a few hundred bytes to a few KiB; `status` of a process in many groups is the longest).
pub const PROC_TEXT: usize = 64 * 1024;

/// `cmdline` and `environ`: the kernel takes up to a quarter of the stack limit
/// for them (2 MiB by default, 6 MiB at most); the arguments reaper-trace shows sit at their
/// start.
pub const ARGS: usize = 256 * 1024;

/// `maps`: about 80,000 mappings of some 100 bytes. A process with more is read up to here (its
/// last mappings, the highest addresses, then unread).
pub const MAPS: usize = 8 << 20;

/// File-backed mappings kept from one `maps` (a large program maps a few hundred).
pub const FILE_MAPPINGS: usize = 16_384;

/// A network namespace's socket table (`net/tcp`, `net/unix`, ...): some 150 bytes a socket.
pub const NET_TABLE: usize = 16 << 20;

/// The fds of one process read (`/proc/PID/fd`): a process may hold as many as its limit lets
/// it (a million, raised); those past this are not looked at.
pub const FDS: usize = 16_384;

/// The threads of one process read (`/proc/PID/task`) for what they are blocked in.
pub const THREADS: usize = 4096;

/// The largest piece of an object file read at once (a section: `.eh_frame`, `.dynsym`,
/// `.symtab`, a string table); a larger one is not read.
pub const OBJECT_PIECE: u64 = 64 << 20;

/// The most one reading of an object file keeps of its pieces in all (its headers, tables and
/// names); past that a piece is not read.
pub const OBJECT_PIECES: u64 = 256 << 20;

/// The most one naming round copies of objects in all ([`super::Checked::sealed_copy`]).
pub const OBJECT_COPIES: u64 = 2 << 30;

/// The largest object file copied for the symbolizer ([`super::Checked::sealed_copy`]).
pub const OBJECT_COPY: u64 = 1 << 30;

/// A JIT host's perf map (`/tmp/perf-PID.map`): some 60 bytes a function.
pub const PERF_MAP: usize = 64 << 20;
