//! What a traced process controls, read as hostile input: its /proc entries and the files it
//! maps. Every reader of them goes through here.
//!
//! A traced process may be buggy or hostile, and reaper-trace reads its files as root. So:
//! - **Nothing blocks or has side effects at open.** A path is opened `O_PATH` first, without
//!   following a symlink at its last step: that neither waits for a FIFO's writer nor opens a
//!   device (opening some, a watchdog, acts). The descriptor is checked (a regular file; for a
//!   mapped object, the device and inode the kernel named) and only then opened for reading,
//!   through the descriptor itself: what is read is the file that was checked, whatever the
//!   path names by then ([`object::Checked`]).
//! - **Nothing is mapped.** A mapping of a file that another process truncates raises SIGBUS at
//!   the next read of a page past the new end, which would end the tracer. Files are read with
//!   `pread`, in the pieces needed ([`object::Checked::reader`]), and a short read is an error.
//!   A reader that works only on mapped memory (blazesym's symbolizer) is given a private
//!   copy sealed against shrinking ([`object::Checked::sealed_copy`]).
//! - **Every read is capped** ([`caps`]): a /proc text, a directory listing (fds, threads),
//!   the mappings, a command line or environment, a socket table, an object's piece. What is
//!   past a cap is not read, and the caller is told it was cut.
pub mod caps;
pub mod object;
pub mod read;

pub use object::Checked;
pub use read::{list_dir, read, read_text};
