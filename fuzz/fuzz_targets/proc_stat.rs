//! `/proc/PID/stat`, whose comm may hold any byte, parentheses and newlines included.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(stat) = reaper_user::parse::parse_stat(data) {
        // The comm is what sits between the first `(` and the last `)`.
        assert!(stat.comm.as_bytes().len() <= data.len());
    }
});
