//! Command-line values: durations, sizes, listen addresses, kill reasons, replay moments.
#![no_main]
use libfuzzer_sys::fuzz_target;
use reaper_user::parse as cli;
use reaper_user::parse::At;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let _ = cli::parse_duration(s);
    let _ = cli::parse_size(s);
    if let Ok(n) = cli::parse_ring_size(s) {
        assert!(n.is_power_of_two() && n >= 4096);
    }
    let _ = cli::parse_rotate_size(s);
    let _ = cli::parse_listen_addr(s);
    let _ = cli::parse_kill_reasons(s);
    let _ = s.parse::<At>();
});
