//! `reaper-trace report` on any audit file: it reads, counts what it cannot, and renders a
//! page in which nothing from the input is markup.
#![no_main]
use libfuzzer_sys::fuzz_target;
use reaper_user::parse::{Audit, render};

fuzz_target!(|data: &[u8]| {
    let audit = Audit::read(data).expect("reading from memory cannot fail");
    let page = render(&audit, "fuzz");
    assert!(!page.contains("<script>alert"));
});
