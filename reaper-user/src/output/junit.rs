//! `--junit FILE`: `--check`'s verdict as a JUnit XML report, the format CI systems (GitLab,
//! Jenkins, GitHub test reporters, Buildkite) show in their own test view: one failed test
//! case a process left behind, one passed case when none was.
//!
//! Written as the Jenkins/Ant schema (`junit-10.xsd`) that these readers share: `testsuites` >
//! `testsuite` (with `properties` first) > `testcase` > `failure`. Every text comes from the
//! terminal escaping (control bytes and invalid UTF-8 as `\xNN`), so nothing a process named
//! itself can break the XML; markup's five specials are escaped on top.
use std::{
    fs::File,
    io::Write,
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use anyhow::{Context, Result};

use crate::stream::events::LeakedProcess;
use crate::stream::readable::evidence_text;
use crate::stream::words::who;
use crate::text::escape_markup as esc;

/// The report file, created at start so that a bad path is an error before anything runs.
pub struct JunitFile {
    path: PathBuf,
    file: File,
}

impl JunitFile {
    pub fn create(path: &Path) -> Result<JunitFile> {
        let file = File::create(path).with_context(|| format!("--junit {}", path.display()))?;
        Ok(JunitFile {
            path: path.to_owned(),
            file,
        })
    }

    pub fn write(mut self, verdict: &Verdict) -> Result<()> {
        let xml = render(verdict, SystemTime::now());
        self.file
            .write_all(xml.as_bytes())
            .and_then(|()| self.file.sync_all())
            .with_context(|| format!("writing --junit {}", self.path.display()))
    }
}

/// What the report says.
pub struct Verdict<'a> {
    /// The command `--check` ran, as the terminal shows it.
    pub command: String,
    /// "clean", "leaked" or "gateway_failed".
    pub verdict: &'a str,
    pub gateway_exit_code: Option<i32>,
    pub leaked: &'a [LeakedProcess],
    /// From start to the verdict.
    pub took: Duration,
}

/// The XML for `v`, stamped `now`.
pub fn render(v: &Verdict, now: SystemTime) -> String {
    let secs = format!("{:.3}", v.took.as_secs_f64());
    let failures = v.leaked.len();
    let tests = failures.max(1);
    let suite = format!("reaper-trace --check {}", v.command);
    // The schema's timestamp has no zone: UTC, by convention.
    let stamp = humantime::format_rfc3339_seconds(now).to_string();
    let stamp = stamp.trim_end_matches('Z');
    let mut x = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    x += &format!(
        "<testsuites name=\"reaper-trace\" tests=\"{tests}\" failures=\"{failures}\" \
         errors=\"0\" time=\"{secs}\">\n"
    );
    x += &format!(
        "  <testsuite name=\"{}\" tests=\"{tests}\" failures=\"{failures}\" errors=\"0\" \
         skipped=\"0\" time=\"{secs}\" timestamp=\"{stamp}\">\n",
        esc(&suite)
    );
    x += "    <properties>\n";
    x += &format!(
        "      <property name=\"verdict\" value=\"{}\"/>\n",
        esc(v.verdict)
    );
    let code = v
        .gateway_exit_code
        .map_or("unknown".into(), |c| c.to_string());
    x += &format!("      <property name=\"command_exit_code\" value=\"{code}\"/>\n");
    x += "    </properties>\n";
    if v.leaked.is_empty() {
        x += "    <testcase classname=\"reaper-trace.leaks\" \
              name=\"no process left behind\" time=\"0\"/>\n";
    }
    for p in v.leaked {
        let d = &p.detail;
        let args = d.argv.for_terminal();
        let name = match args.is_empty() {
            true => d.comm.for_terminal(),
            false => args,
        };
        let lineage: Vec<String> = d.lineage.iter().map(u32::to_string).collect();
        let message = format!(
            "pid {} left behind: {}, lineage {}",
            who(p.pid, &d.comm, &d.argv),
            d.state,
            lineage.join(" > ")
        );
        let mut body = message.clone();
        evidence_text(&mut body, d);
        let spawners: Vec<String> = d
            .ancestors
            .iter()
            .map(|a| who(a.process.pid, &a.process.comm, &a.process.argv))
            .collect();
        if !spawners.is_empty() {
            body += &format!("\nspawned by {}", spawners.join(" > "));
        }
        x += &format!(
            "    <testcase classname=\"reaper-trace.leaks\" name=\"{}\" time=\"0\">\n",
            esc(&name)
        );
        x += &format!(
            "      <failure type=\"leaked\" message=\"{}\">{}</failure>\n",
            esc(&message),
            esc(&body)
        );
        x += "    </testcase>\n";
    }
    x += "  </testsuite>\n</testsuites>\n";
    x
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::events::{Argv, ProcText};
    use crate::stream::evidence::LeakDetail;
    use crate::text::{Args, Comm};

    fn leaked(pid: u32, argv: &[&[u8]]) -> LeakedProcess {
        LeakedProcess {
            pid,
            detail: LeakDetail {
                lineage: vec![10, pid],
                state: "S (sleeping)".into(),
                comm: ProcText::new("comm", Comm::from_c(b"x")),
                argv: Argv::new(Args::from_list(argv.iter().copied())),
                ..LeakDetail::default()
            },
        }
    }

    fn report(verdict: &str, leaked: &[LeakedProcess]) -> String {
        let v = Verdict {
            command: "python3 -m unittest".into(),
            verdict,
            gateway_exit_code: Some(0),
            leaked,
            took: Duration::from_millis(1500),
        };
        render(
            &v,
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_000_000),
        )
    }

    #[test]
    fn one_failed_case_a_leaked_process() {
        let xml = report(
            "leaked",
            &[leaked(11, &[b"sleep", b"600"]), leaked(12, &[b"node"])],
        );
        assert!(xml.contains(r#"tests="2" failures="2""#), "{xml}");
        assert!(xml.contains(r#"name="sleep 600""#), "{xml}");
        assert!(xml.contains("pid 11 (sleep 600) left behind: S (sleeping), lineage 10 &gt; 11"));
        assert!(xml.contains(r#"timestamp="2026-11-18T"#), "{xml}");
        assert_eq!(xml.matches("<failure ").count(), 2);
    }

    #[test]
    fn nothing_left_behind_is_one_passed_case() {
        let xml = report("clean", &[]);
        assert!(xml.contains(r#"tests="1" failures="0""#), "{xml}");
        assert!(xml.contains(r#"name="no process left behind""#), "{xml}");
        assert!(!xml.contains("<failure"));
    }

    #[test]
    fn hostile_names_cannot_break_the_xml() {
        let xml = report("leaked", &[leaked(11, &[b"<x>&\"'", b"\x1b]0;\xff"])]);
        assert!(
            xml.contains(r#"name="&lt;x&gt;&amp;&quot;&#39; \x1b]0;\xff""#),
            "{xml}"
        );
        assert!(!xml.chars().any(|c| c.is_control() && c != '\n'), "{xml}");
    }
}
