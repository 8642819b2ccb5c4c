//! A doc sentence is a claim: the README's and docs/leaks.md's rules tables and the schema's
//! `reason` enum name exactly the reasons of the rules' table (`leaks::RULES`), and
//! docs/cli.md's options tables name exactly the options the parsers take, with the same defaults. A rule or an option added, renamed or re-defaulted
//! without its doc fails here.
use std::collections::BTreeSet;

use clap::CommandFactory;
use reaper_user::docs::{
    Cli, EventsCli, KillCli, RULES, ReportCli, SessionsCli, TopCli, TreeCli, WhyCli,
};

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
    let code: BTreeSet<String> = RULES.iter().map(|a| a.reason.name().to_owned()).collect();
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
        assert_eq!(documented, code, "{name}'s rules table against RULES");
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
fn each_subcommands_options_table_names_every_option_with_its_default() {
    for (word, command) in [
        ("report", ReportCli::command()),
        ("why", WhyCli::command()),
        ("tree", TreeCli::command()),
        ("sessions", SessionsCli::command()),
        ("kill", KillCli::command()),
        ("events", EventsCli::command()),
        ("top", TopCli::command()),
    ] {
        let title = format!("## `reaper-trace {word}`");
        let section = CLI_DOC
            .split(&title)
            .nth(1)
            .unwrap_or_else(|| panic!("docs/cli.md has no {title} section"));
        let mut doc = Vec::new();
        for row in table_rows(section, "| option | default | meaning |") {
            for word in quoted(&row[0]) {
                let flag = word.split_whitespace().next().unwrap_or("");
                doc.push((flag.to_owned(), row[1].clone()));
            }
        }
        assert_same_options(
            doc,
            parser_options(command),
            &format!("reaper-trace {word}"),
        );
    }
}

#[test]
fn every_option_the_readme_names_exists() {
    let options: BTreeSet<String> = [
        Cli::command(),
        ReportCli::command(),
        WhyCli::command(),
        TreeCli::command(),
        SessionsCli::command(),
        KillCli::command(),
        EventsCli::command(),
        TopCli::command(),
    ]
    .into_iter()
    .flat_map(parser_options)
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

/// `--option` (value) in `text`: each option a rules row names with the default it gives.
fn options_with_values(text: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for (at, _) in text.match_indices("`--") {
        let rest = &text[at + 1..];
        let Some(end) = rest.find('`') else { continue };
        let Some(value) = rest[end + 1..].strip_prefix(" (") else {
            continue;
        };
        let Some(close) = value.find(')') else {
            continue;
        };
        found.push((rest[..end].to_owned(), value[..close].to_owned()));
    }
    found
}

/// A duration or count as both the docs (`10 min`, `2 s`) and the parser (`10m`, `2s`) write it.
fn normalized(value: &str) -> String {
    value.replace(' ', "").replace("min", "m").to_lowercase()
}

#[test]
fn the_rules_tables_give_each_options_default_as_the_parser_has_it() {
    let defaults = parser_options(Cli::command());
    for (doc, name, header) in [
        (README, "README.md", "| reason | flagged when |"),
        (
            LEAKS_DOC,
            "docs/leaks.md",
            "| reason | flagged when | cleared when |",
        ),
    ] {
        let mut checked = 0;
        for row in table_rows(doc, header) {
            for (option, value) in options_with_values(&row.join(" | ")) {
                let (_, default) = defaults
                    .iter()
                    .find(|(o, _)| *o == option)
                    .unwrap_or_else(|| panic!("{name} names {option}, which the parser lacks"));
                assert_eq!(
                    normalized(&value),
                    normalized(default),
                    "{name}'s rules table gives {option} as ({value})"
                );
                checked += 1;
            }
        }
        // --orphan-grace, --max-instances, --idle-after, --zombie-after at least.
        assert!(checked >= 4, "{name}: only {checked} defaults found");
    }
}

/// A reader that validates against the schema accepts every flag this build writes, and no
/// other reason.
#[test]
fn the_schemas_reason_enum_is_the_rules_table() {
    let schema: serde_json::Value =
        serde_json::from_str(include_str!("../../schema/events.schema.json")).unwrap();
    let listed: Vec<&str> = schema["$defs"]["reason"]["enum"]
        .as_array()
        .expect("$defs.reason.enum")
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let table: Vec<&str> = RULES.iter().map(|a| a.reason.name()).collect();
    assert_eq!(listed, table, "schema/events.schema.json's reason enum");
}

/// The `.rs` files of a folder of the workspace.
fn rust_files(dir: &str) -> BTreeSet<String> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    std::fs::read_dir(root.join(dir))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".rs"))
        .collect()
}

#[test]
fn docs_testing_md_names_every_test_file_and_no_other() {
    let doc = include_str!("../../docs/testing.md");
    let section = doc
        .split("## What each test file proves")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("docs/testing.md has a `What each test file proves` section");
    let named: BTreeSet<String> = quoted(section)
        .into_iter()
        .filter(|w| w.ends_with(".rs") && !w.contains('/'))
        .map(str::to_owned)
        .collect();
    let files: BTreeSet<String> = rust_files("tests/tests")
        .into_iter()
        .chain(rust_files("reaper-user/tests"))
        .collect();
    assert_eq!(named, files, "the test files docs/testing.md names");
}

/// Every file and folder under the workspace's source trees, as paths from the root.
fn source_tree() -> Vec<String> {
    fn walk(dir: &std::path::Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            out.push(path.to_string_lossy().into_owned());
            if path.is_dir() {
                walk(&path, out);
            }
        }
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut out = Vec::new();
    for dir in [
        "reaper-user",
        "reaper-ebpf",
        "reaper-common",
        "tests",
        "xtask",
        "contrib",
        "fuzz",
        "examples",
        "schema",
        "docs",
    ] {
        out.push(root.join(dir).to_string_lossy().into_owned());
        walk(&root.join(dir), &mut out);
    }
    out
}

#[test]
fn every_source_path_docs_design_md_names_exists() {
    let doc = include_str!("../../docs/design.md");
    let tree = source_tree();
    let mut checked = 0;
    for word in quoted(doc) {
        let looks_like_source = word.contains('/')
            && !word.contains(['{', ' ', '<', '*', ':'])
            && (word.ends_with(".rs") || word.ends_with('/'));
        if !looks_like_source {
            continue;
        }
        // A path is whole, or relative to the folder its sentence is about (`graph/events`
        // in `lineage/`): it names the end of some real path.
        let tail = format!("/{}", word.trim_end_matches('/'));
        assert!(
            tree.iter().any(|p| p.ends_with(&tail)),
            "docs/design.md names `{word}`, which does not exist"
        );
        checked += 1;
    }
    assert!(checked > 20, "only {checked} paths checked");
}

/// Sentences once in the docs that the code contradicts, each with the fact that refutes it:
/// put back, they fail here.
const REFUTED: &[(&str, &str)] = &[
    (
        "within the host's network namespace",
        "a TCP channel's other end is in the process's own network namespace \
         (procfs/sockets.rs reads /proc/PID/net/tcp)",
    ),
    (
        "escaped its session",
        "`escaped` is another session, group or cgroup than the gateway's (ESCAPED_MEANING)",
    ),
    (
        "is true when the process itself called setsid()",
        "that is `called_setsid` since schema 2; `escaped` is ESCAPED_MEANING",
    ),
    (
        "The data path is a straight line",
        "a fork record goes to the graph, the spawn sites, upkeep and the announcer in turn",
    ),
    (
        "is its rule in `leaks/` and its row in the rules tables",
        "a reason touches the files docs/design.md lists",
    ),
];

#[test]
fn no_doc_says_what_the_code_refutes() {
    let docs = [
        ("README.md", README),
        ("docs/cli.md", CLI_DOC),
        ("docs/leaks.md", LEAKS_DOC),
        ("docs/events.md", include_str!("../../docs/events.md")),
        ("docs/design.md", include_str!("../../docs/design.md")),
        (
            "docs/operations.md",
            include_str!("../../docs/operations.md"),
        ),
        ("report/html.rs", include_str!("../src/report/html.rs")),
    ];
    for (name, text) in docs {
        // Sentences wrap: compare with the line breaks and indents folded into spaces.
        let folded = text.split_whitespace().collect::<Vec<_>>().join(" ");
        for (claim, fact) in REFUTED {
            assert!(!folded.contains(claim), "{name} says `{claim}`, but {fact}");
        }
    }
}

#[test]
fn the_readable_outputs_say_escaped_in_the_words_the_docs_use() {
    use reaper_user::docs::ESCAPED_MEANING;
    assert!(README.contains(&format!("escaped ({ESCAPED_MEANING})")));
    assert!(LEAKS_DOC.contains(&format!("escaped ({ESCAPED_MEANING})")));
}
