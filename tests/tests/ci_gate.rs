//! `--check` as a CI job meets it: a real Python test suite, one of whose tests starts a helper
//! and never stops it. The CI log shows the verdict, not the interpreter's every fork and exec;
//! `--junit` writes a report that validates against the JUnit schema CI systems read (the
//! Jenkins/Ant `junit-10.xsd`, fetched from pytest's source release on PyPI by `cargo xtask
//! test`, checked with Debian's `xmllint`) and names the leaked helper as a failed test case.
//! Host only: the guests have no Python.
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use reaper_tests::{host_tool, reaper_trace, require_root, scratch, skip};

/// Checks a JUnit report against the schema: `xmllint` and the schema, or a skip.
struct Validator {
    xmllint: PathBuf,
    xsd: PathBuf,
}

impl Validator {
    fn new(test: &str) -> Option<Validator> {
        Some(Validator {
            xmllint: host_tool("xmllint", "libxml2-utils", test)?,
            xsd: junit_schema(test)?,
        })
    }

    /// Asserts that `report` validates; returns its text.
    fn validate(&self, report: &Path) -> String {
        let xml = std::fs::read_to_string(report).unwrap_or_default();
        let out = Command::new(&self.xmllint)
            .args(["--noout", "--schema"])
            .arg(&self.xsd)
            .arg(report)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}\n{xml}",
            String::from_utf8_lossy(&out.stderr)
        );
        xml
    }
}

/// Where `cargo xtask test` puts the JUnit schema.
fn junit_schema(test: &str) -> Option<PathBuf> {
    let xsd = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/test-tools/junit-10.xsd");
    if !xsd.is_file() {
        let why = format!("no {} (`cargo xtask test` fetches it)", xsd.display());
        skip(test, &why);
        return None;
    }
    Some(xsd)
}

const SUITE: &str = r#"
import subprocess, unittest

class Gateway(unittest.TestCase):
    def test_answers(self):
        self.assertEqual(1 + 1, 2)

    def test_starts_a_helper(self):
        # The bug under test: a helper started in its own session and never stopped. (It
        # lets go of the job's output, or the job itself would never end.)
        subprocess.Popen(["sleep", "3600.5"], start_new_session=True,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
"#;

#[test]
fn a_real_suites_leak_is_a_failed_junit_case_and_a_short_log() {
    let test = "a_real_suites_leak_is_a_failed_junit_case_and_a_short_log";
    if !require_root(test) {
        return;
    }
    let Some(validator) = Validator::new(test) else {
        return;
    };
    let dir = scratch(test);
    std::fs::write(dir.join("test_gateway.py"), SUITE).unwrap();
    let report = dir.join("leaks.xml");
    let out = Command::new(reaper_trace())
        .arg("--check")
        .arg("--junit")
        .arg(&report)
        .args(["--", "python3", "-m", "unittest", "-q"])
        .current_dir(&dir)
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stdout).into_owned();
    println!("{log}");
    // What reaper-trace told the operator (why an interpreter's frames are not read).
    println!("stderr:\n{}", String::from_utf8_lossy(&out.stderr));
    // The helper is ours to stop, whatever the assertions find.
    let _ = Command::new("pkill")
        .args(["-f", "^sleep 3600.5$"])
        .status();
    assert_eq!(out.status.code(), Some(3), "exit 3: leaked\n{log}\n{out:?}");
    assert!(log.contains("CHECK leaked"), "{log}");
    assert!(
        log.lines().count() <= 20,
        "the verdict, not every event ({} lines):\n{log}",
        log.lines().count()
    );
    let xml = validator.validate(&report);
    assert_eq!(
        xml.matches("<failure ").count(),
        1,
        "one leaked process:\n{xml}"
    );
    assert!(
        xml.contains(r#"<testcase classname="reaper-trace.leaks" name="sleep 3600.5""#),
        "{xml}"
    );
    assert!(
        xml.contains(r#"<property name="verdict" value="leaked"/>"#),
        "{xml}"
    );
    // The spawner's own code, named as a flag names it: the test method and its line (the
    // suite's interpreter was gone by the verdict).
    let line = SUITE
        .lines()
        .position(|l| l.contains("subprocess.Popen("))
        .unwrap()
        + 1;
    let site = format!("spawned at Gateway.test_starts_a_helper (test_gateway.py:{line})");
    assert!(xml.contains(&site), "{site}:\n{xml}");
    assert!(log.contains(&site), "{site}:\n{log}");
}

#[test]
fn a_clean_suite_is_one_passed_junit_case() {
    let test = "a_clean_suite_is_one_passed_junit_case";
    if !require_root(test) {
        return;
    }
    let Some(validator) = Validator::new(test) else {
        return;
    };
    let dir = scratch(test);
    let report = dir.join("leaks.xml");
    let out = Command::new(reaper_trace())
        .arg("--check")
        .arg("--junit")
        .arg(&report)
        .args(["--settle", "100ms", "--", "sh", "-c", "sh -c true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let xml = validator.validate(&report);
    assert!(xml.contains(r#"tests="1" failures="0""#), "{xml}");
    assert!(!xml.contains("<failure"), "{xml}");
}

#[test]
fn junit_needs_check_and_a_writable_place() {
    let run = |args: &[&str]| Command::new(reaper_trace()).args(args).output().unwrap();
    let out = run(&["--junit", "/tmp/x.xml", "--gateway-pid", "1"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--junit only applies with --check"));
    if !require_root("junit_needs_check_and_a_writable_place") {
        return;
    }
    let out = run(&["--check", "--junit", "/nonexistent/dir/x.xml", "--", "true"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{out:?}");
    assert!(err.contains("--junit /nonexistent/dir/x.xml"), "{err}");
}
