//! reaper-trace's own resident memory. The C library's allocator keeps freed heap pages
//! mapped (for reuse), so a run's resident size follows its peak rather than what it holds:
//! the start-up's parse of the kernel's BTF and a round of naming spawn sites (an object's
//! symbols and line tables) each allocate megabytes they free at once. Those pages go back to
//! the kernel after each, so a long audit holds what it holds.

/// Returns the allocator's free pages to the kernel (glibc's `malloc_trim`; other C
/// libraries give them back as they free).
pub fn give_back_freed() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}
