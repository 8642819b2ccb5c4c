//! reaper-trace's own resident memory. The C library's allocator keeps freed heap pages
//! mapped (for reuse), so a run's resident size follows its peak rather than what it holds:
//! the start-up's parse of the kernel's BTF and a round of naming spawn sites (an object's
//! symbols and line tables) each allocate megabytes they free at once. Those pages go back to
//! the kernel after each, so a long audit holds what it holds.
//!
//! Large blocks are kept out of the heap altogether: glibc raises its mmap threshold each time
//! a mapped block is freed (up to 32 MiB), so after the BTF parse every later large block (a
//! debug file's line tables, a grown table) came from the heap, where a long-lived small block
//! allocated beside it pins its pages once it is freed.

/// Returns the allocator's free pages to the kernel (glibc's `malloc_trim`; other C
/// libraries give them back as they free).
pub fn give_back_freed() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Serves every block of [`LARGE`] or more from a mapping of its own, unmapped when it is
/// freed, for the whole run (glibc's `M_MMAP_THRESHOLD`, which also stops the threshold from
/// rising). Called before anything large is allocated.
pub fn keep_large_blocks_apart() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets the allocator's own parameter.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, LARGE as i32);
    }
}

/// Gives back the resident pages of `bytes`, a part of the executable read once (the embedded
/// eBPF object, once loaded: half a MiB). Its whole pages leave this process's memory; they
/// stay in the page cache and come back from the file if read again, so nothing is lost.
pub fn drop_read_once(bytes: &'static [u8]) {
    let page = crate::procfs::page_size();
    let start = (bytes.as_ptr() as usize).next_multiple_of(page);
    let end = (bytes.as_ptr() as usize + bytes.len()) / page * page;
    if end > start {
        // SAFETY: the range is whole pages of a read-only mapping of the executable, which
        // nothing writes: dropped, they read back the same bytes from the file.
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED);
        }
    }
}

/// What counts as a large block: glibc's own default threshold.
const LARGE: usize = 128 << 10;
