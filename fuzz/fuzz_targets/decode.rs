//! Ring-buffer records: any bytes decode to an event or an error, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = reaper_user::parse::decode(data);
});
