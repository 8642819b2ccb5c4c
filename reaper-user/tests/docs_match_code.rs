//! A doc sentence is a claim: the README's and docs/leaks.md's rules tables name exactly the
//! reasons a flag can carry, and docs/cli.md's options tables name exactly the options the
//! parsers take, with the same defaults. A rule or an option added, renamed or re-defaulted
//! without its doc fails here.
use std::collections::BTreeSet;

use clap::CommandFactory;
use reaper_user::{cli::Cli, leaks::Reason, report::ReportCli};

const README: &str = include_str!("../../README.md");
const CLI_DOC: &str = include_str!("../../docs/cli.md");
const LEAKS_DOC: &str = include_str!("../../docs/leaks.md");

/// The rows of the markdown table whose header line starts with `header`, as cells.
fn table_rows(doc: &str, header: &str) -> Vec<Vec<String>> {
    let mut lines = doc.lines().skip_while(|l| !l.starts_with(header));
    assert!(lines.next().is_some(), "no table headed `{header}`");
    lines
        .skip(1) // the | --- | line
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            l.trim_matches('|')
                .split(" | ")
                .map(|c| c.trim().to_owned())
                .collect()
        })
        .collect()
}

/// The words in backticks in `cell`.
fn quoted(cell: &str) -> Vec<&str> {
    cell.split('`').skip(1).step_by(2).collect()
}

fn reasons_of(doc: &str, header: &str) -> Vec<String> {
    table_rows(doc, header)
        .iter()
        .flat_map(|row| quoted(&row[0]).into_iter().map(str::to_owned))
        .collect()
}

#[test]
fn the_rules_tables_name_every_reason_a_flag_can_carry_and_no_other() {
    let code: BTreeSet<String> = Reason::ALL.iter().map(|r| r.name().to_owned()).collect();
    for (doc, name, header) in [
        (README, "README.md", "| reason | flagged when |"),
        (
            LEAKS_DOC,
            "docs/leaks.md",
            "| reason | flagged when | cleared when |",
        ),
    ] {
        let listed = reasons_of(doc, header);
        let documented: BTreeSet<String> = listed.iter().cloned().collect();
        assert_eq!(
            documented.len(),
            listed.len(),
            "{name} lists a reason twice: {listed:?}"
        );
        assert_eq!(documented, code, "{name}'s rules table against Reason::ALL");
    }
}

/// Each documented option (`--name` or `-o`), with the default its row gives.
fn documented_options(header_line: &str) -> Vec<(String, String)> {
    let mut options = Vec::new();
    for row in table_rows(CLI_DOC, header_line) {
        for word in quoted(&row[0]) {
            let flag = word.split_whitespace().next().unwrap_or("");
            if flag.starts_with('-') {
                options.push((flag.to_owned(), row[1].clone()));
            }
        }
    }
    options
}

/// Each option of `command` (`--long` and `-s`), with its default as the docs write it:
/// `none` when it has none, `off` for a switch; an option whose default depends on another
/// (`--settle`, only with `--check`) states it in its help as `(default X)`.
fn parser_options(mut command: clap::Command) -> Vec<(String, String)> {
    // Built, a switch shows its implicit default (`false`).
    command.build();
    let mut options = Vec::new();
    for arg in command.get_arguments() {
        if arg.is_positional() || ["help", "version"].contains(&arg.get_id().as_str()) {
            continue;
        }
        let defaults: Vec<String> = arg
            .get_default_values()
            .iter()
            .map(|v| v.to_string_lossy().into_owned())
            .collect();
        let stated = arg
            .get_help()
            .map(|h| h.to_string())
            .and_then(|h| Some(h.split_once("(default ")?.1.split_once(')')?.0.to_owned()));
        let default = match defaults.join(",").as_str() {
            "" => stated.unwrap_or_else(|| "none".to_owned()),
            "false" => "off".to_owned(),
            d => d.to_owned(),
        };
        if let Some(long) = arg.get_long() {
            options.push((format!("--{long}"), default.clone()));
        }
        if let Some(short) = arg.get_short() {
            options.push((format!("-{short}"), default));
        }
    }
    options
}

fn assert_same_options(doc: Vec<(String, String)>, code: Vec<(String, String)>, what: &str) {
    let doc_set: BTreeSet<_> = doc.iter().map(|(o, _)| o.clone()).collect();
    let code_set: BTreeSet<_> = code.iter().map(|(o, _)| o.clone()).collect();
    assert_eq!(
        doc_set, code_set,
        "{what}: docs/cli.md's options against the parser's"
    );
    for (option, default) in &code {
        let (_, documented) = doc.iter().find(|(o, _)| o == option).unwrap();
        assert_eq!(documented, default, "{what}: the default of {option}");
    }
}

#[test]
fn the_options_table_names_every_option_with_its_default() {
    assert_same_options(
        documented_options("| option | default | meaning |"),
        parser_options(Cli::command()),
        "reaper-trace",
    );
}

#[test]
fn the_report_options_table_names_every_option_with_its_default() {
    let section = CLI_DOC
        .split("## `reaper-trace report`")
        .nth(1)
        .expect("docs/cli.md has a `reaper-trace report` section");
    let mut doc = Vec::new();
    for row in table_rows(section, "| option | default | meaning |") {
        for word in quoted(&row[0]) {
            let flag = word.split_whitespace().next().unwrap_or("");
            doc.push((flag.to_owned(), row[1].clone()));
        }
    }
    assert_same_options(
        doc,
        parser_options(ReportCli::command()),
        "reaper-trace report",
    );
}

#[test]
fn every_option_the_readme_names_exists() {
    let options: BTreeSet<String> = parser_options(Cli::command())
        .into_iter()
        .chain(parser_options(ReportCli::command()))
        .map(|(o, _)| o)
        .collect();
    // `ps --ppid`, `systemctl enable --now` and node's perf map options are theirs; the rest
    // must be reaper-trace's (but for the traced programs' own arguments in sample output
    // lines, `[   1.0s] ...`).
    let foreign = [
        "--ppid",
        "--now",
        "--perf-basic-prof",
        "--interpreted-frames-native-stack",
    ];
    let named: Vec<&str> = README
        .lines()
        .filter(|l| !l.starts_with('['))
        .flat_map(|l| l.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-')))
        .filter(|w| w.starts_with("--") && w[2..].starts_with(|c: char| c.is_ascii_alphabetic()))
        .filter(|w| !foreign.contains(w))
        .collect();
    assert!(!named.is_empty());
    for word in named {
        assert!(
            options.contains(word),
            "the README names {word}, which no parser takes"
        );
    }
}
