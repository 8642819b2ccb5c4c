//! The service unit as systemd reads it: `systemd-analyze verify` (Debian's `systemd`, which
//! `cargo xtask test` installs) finds nothing to say about `contrib/reaper-trace.service`, with
//! the binary where the unit expects it installed (here: this build's, in a copy of the unit).
//! Host only: the guests have no systemd.
use std::process::Command;

use reaper_tests::{host_tool, reaper_trace};

#[test]
fn the_service_unit_verifies() {
    let test = "the_service_unit_verifies";
    let Some(analyze) = host_tool("systemd-analyze", "systemd", test) else {
        return;
    };
    let unit = include_str!("../../contrib/reaper-trace.service");
    let installed = "/usr/local/bin/reaper-trace";
    assert!(unit.contains(installed), "the unit runs {installed}");
    let dir = reaper_tests::scratch("unit");
    let copy = dir.join("reaper-trace.service");
    let binary = reaper_trace();
    std::fs::write(&copy, unit.replace(installed, binary.to_str().unwrap())).unwrap();
    // `--man=no`: the page its Documentation= names comes with the package, not the checkout.
    let out = Command::new(analyze)
        .args(["verify", "--man=no"])
        .arg(&copy)
        .output()
        .unwrap();
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "systemd-analyze verify: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
