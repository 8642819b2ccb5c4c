//! The command line as a user meets it first.
use std::process::Command;

use reaper_tests::reaper_trace;

/// `--version` names the release and the commit it was built from (the checkout's HEAD, where
/// the tests run in one), for `reaper-trace` and `reaper-trace report` alike.
#[test]
fn version_names_the_release_and_the_commit() {
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    for args in [&["--version"][..], &["report", "--version"]] {
        let out = Command::new(reaper_trace()).args(args).output().unwrap();
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(env!("CARGO_PKG_VERSION")), "{text}");
        match &head {
            // The binary under test was built from this checkout.
            Some(hash) => assert!(text.contains(&format!("(commit {hash})")), "{text}"),
            None => assert!(text.contains("(commit "), "{text}"),
        }
    }
}
