//! What a run of test binaries came to, read from the lines libtest prints: the counts of its
//! `test result:` lines, and every test that failed with the end of what it said, so the run's
//! closing lines can say which ones and why (a long run's log is often read from its end only).

#[derive(Default, Debug, PartialEq, Eq)]
pub struct Tally {
    pub passed: u64,
    pub failed: u64,
    /// In the order they failed.
    pub failures: Vec<Failure>,
    /// The failure whose `---- NAME stdout ----` block is being read.
    reading: Option<usize>,
    /// Within it, a panic's backtrace (`RUST_BACKTRACE=1`), left out: the lines kept are for
    /// the message above it.
    in_backtrace: bool,
}

#[derive(Debug, PartialEq, Eq)]
pub struct Failure {
    /// `test NAME ... FAILED`'s NAME.
    pub name: String,
    /// The last lines of what it printed (its panic's message last).
    pub said: Vec<String>,
}

/// How many of a failed test's last lines are kept: its panic and what led to it.
const SAID_LINES: usize = 40;

impl Tally {
    /// Takes one line of a test binary's output; a line may carry a prefix (a guest's
    /// console). Inside a failed test's block, every line is what it said, a `test result:`
    /// it printed included.
    pub fn read(&mut self, line: &str) {
        if let Some(name) = said_by(line) {
            self.reading = self.failures.iter().rposition(|f| f.name == name);
            self.in_backtrace = false;
        } else if let Some(i) = self.reading {
            let text = line.trim();
            // libtest's list of the failed names ends the blocks.
            if text.ends_with("failures:") {
                self.reading = None;
                return;
            }
            if text == "stack backtrace:" {
                self.in_backtrace = true;
            }
            if self.in_backtrace {
                // Its last line: `note: Some details are omitted, run with ...`.
                self.in_backtrace = !text.starts_with("note: ");
                return;
            }
            let said = &mut self.failures[i].said;
            if said.len() == SAID_LINES {
                said.remove(0);
            }
            said.push(line.to_owned());
        } else if let Some((_, rest)) = line.split_once("test result: ") {
            self.passed += count_before(rest, " passed");
            self.failed += count_before(rest, " failed");
        } else if let Some(name) = failed_test(line) {
            self.failures.push(Failure {
                name: name.to_owned(),
                said: Vec::new(),
            });
        }
    }

    /// One failure not read from libtest (a fuzz target's crash): counted and named.
    pub fn fail(&mut self, name: String, said: &str) {
        self.failed += 1;
        self.failures.push(Failure {
            name,
            said: vec![said.to_owned()],
        });
    }

    pub fn add(&mut self, other: Tally) {
        self.passed += other.passed;
        self.failed += other.failed;
        self.failures.extend(other.failures);
    }
}

/// The NAME of `test NAME ... FAILED`, libtest's line for one failed test.
fn failed_test(line: &str) -> Option<&str> {
    let (_, rest) = line.split_once("test ")?;
    rest.strip_suffix(" ... FAILED")
}

/// The NAME of `---- NAME stdout ----`, which opens what a failed test printed.
fn said_by(line: &str) -> Option<&str> {
    let (_, rest) = line.split_once("---- ")?;
    rest.strip_suffix(" stdout ----")
}

/// In `ok. 10 passed; 0 failed; ...`, the number before `word`.
fn count_before(text: &str, word: &str) -> u64 {
    text.split(';')
        .find_map(|part| {
            part.trim()
                .trim_start_matches("ok. ")
                .trim_start_matches("FAILED. ")
                .strip_suffix(word.trim_start())
        })
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::Tally;

    fn tally(lines: &[&str]) -> Tally {
        let mut t = Tally::default();
        lines.iter().for_each(|l| t.read(l));
        t
    }

    #[test]
    fn counts_result_lines_and_names_each_failed_test_with_the_end_of_what_it_said() {
        let t = tally(&[
            "test a_helper_is_flagged ... ok",
            "test top_shows_the_gateway ... FAILED",
            "",
            "failures:",
            "",
            "---- top_shows_the_gateway stdout ----",
            "the screen: stdio-serve…",
            "test result: ok. 99 passed; 0 failed (a line it printed)",
            "thread 'top_shows_the_gateway' panicked at tests/top.rs:9:5:",
            "the last look saw: stdio-serve…",
            "stack backtrace:",
            "   0: __rustc::rust_begin_unwind",
            "             at /rustc/59807616e/library/std/src/panicking.rs:689:5",
            "note: Some details are omitted, run with `RUST_BACKTRACE=full` for a verbose backtrace.",
            "",
            "failures:",
            "    top_shows_the_gateway",
            "",
            "test result: FAILED. 9 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out",
            "[Debian 6.1 (1/2)] test lineage::a_double_fork ... FAILED",
            "[Debian 6.1 (1/2)] test result: FAILED. 3 passed; 1 failed; 1 ignored",
            "test result: ok. 10 passed; 0 failed; 1 ignored; 0 measured; finished in 2.1s",
            "garbage",
        ]);
        assert_eq!((t.passed, t.failed), (22, 2));
        let named: Vec<(&str, Vec<&str>)> = t
            .failures
            .iter()
            .map(|f| (&*f.name, f.said.iter().map(|l| &**l).collect()))
            .collect();
        assert_eq!(
            named,
            [
                (
                    "top_shows_the_gateway",
                    vec![
                        "the screen: stdio-serve…",
                        "test result: ok. 99 passed; 0 failed (a line it printed)",
                        "thread 'top_shows_the_gateway' panicked at tests/top.rs:9:5:",
                        "the last look saw: stdio-serve…",
                        ""
                    ]
                ),
                ("lineage::a_double_fork", vec![])
            ]
        );
    }

    #[test]
    fn only_the_last_lines_of_a_long_failure_are_kept() {
        let mut t = tally(&["test chatty ... FAILED", "---- chatty stdout ----"]);
        (0..100).for_each(|i| t.read(&format!("line {i}")));
        let said = &t.failures[0].said;
        assert_eq!((said.len(), &*said[0]), (super::SAID_LINES, "line 60"));
        assert_eq!(said.last().unwrap(), "line 99");
    }

    #[test]
    fn a_test_that_prints_the_word_test_is_not_a_failure() {
        let t = tally(&["test output: the test ... ok", "running 3 tests"]);
        assert_eq!((t.passed, t.failed, t.failures.len()), (0, 0, 0));
    }
}
