//! The layers of reaper-user, bottom up, held against the code's own imports: a top-level
//! module may use one on a floor below its own, never one on its floor or above (so no loop
//! runs among them). docs/design.md draws the same floors.
//!
//! Imports are read as text: every `crate::module` path in a module's files, test code left
//! out (files named `tests.rs` or `testing.rs`, and the item after each `#[cfg(test)]`),
//! comments too.
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The floors, bottom first.
const FLOORS: &[&[&str]] = &[
    // What knows nothing of processes: text, the untrusted reader, netlink, the HTTP server.
    &[
        "text",
        "untrusted",
        "sockdiag",
        "serve",
        "privileges",
        "exit_status",
    ],
    // /proc, then "is this still the same process".
    &["procfs"],
    &["identity", "resident"],
    // The wire types: every event, its evidence, the API's answer about a process.
    &["stream"],
    // The kernel's records, typed.
    &["capture"],
    // The lineage graph, built from them.
    &["lineage"],
    // What reads beyond the records: gateways chosen, then spawn sites named (a gateway's
    // interpreter) and leaks judged.
    &["gateways"],
    &["sites", "leaks"],
    // The checkpoint (lineage and sites), the command line, kills decided on the flags.
    &["state", "cli", "kill"],
    // The only writer, and what the run says at its end.
    &["output"],
    &["closing"],
    // Reading an audit back, and the local API (server and clients).
    &["replay"],
    &["api", "report"],
    // The run itself, and the binary's words.
    &["daemon"],
    &["commands"],
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The `.rs` files of top-level module `name` (its file and its folder), test files left out.
fn files_of(name: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let file = src().join(format!("{name}.rs"));
    if file.is_file() {
        out.push(file);
    }
    let mut dirs = vec![src().join(name)];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.map(Result::unwrap) {
            let path = entry.path();
            let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                if stem != "tests" {
                    dirs.push(path);
                }
            } else if path.extension().is_some_and(|e| e == "rs")
                && stem != "tests"
                && stem != "testing"
            {
                out.push(path);
            }
        }
    }
    out
}

/// The code of a file without its comments and without the items marked `#[cfg(test)]`.
fn product_code(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let code = line.trim_start();
        if code.starts_with("//") {
            continue;
        }
        if code.starts_with("#[cfg(test)]") {
            // The next item: one line to its `;`, or a block to its closing brace.
            let mut depth = 0i32;
            let mut opened = false;
            for item in lines.by_ref() {
                depth += item.matches('{').count() as i32 - item.matches('}').count() as i32;
                opened |= item.contains('{');
                if (opened && depth <= 0) || (!opened && item.trim_end().ends_with(';')) {
                    break;
                }
            }
            continue;
        }
        let code = line.split(" //").next().unwrap_or("");
        out.push_str(code);
        out.push('\n');
    }
    out
}

/// The top-level modules a piece of code names through `crate::`, groups included
/// (`crate::{a::b, c}`).
fn named_modules(code: &str) -> BTreeSet<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut found = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = code[at + "crate::".len()..].trim_start();
        if let Some(group) = rest.strip_prefix('{') {
            // The group's top-level members, up to its closing brace.
            let (mut depth, mut member) = (0, String::new());
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        found.insert(ident(member.trim()));
                        member.clear();
                        continue;
                    }
                    _ => {}
                }
                if depth == 0 {
                    member.push(c);
                }
            }
            found.insert(ident(member.trim()));
        } else {
            found.insert(ident(rest));
        }
    }
    found.retain(|m| !m.is_empty());
    found
}

#[test]
fn every_import_runs_down_a_floor() {
    let floor: BTreeMap<&str, usize> = FLOORS
        .iter()
        .enumerate()
        .flat_map(|(i, names)| names.iter().map(move |&n| (n, i)))
        .collect();
    let mut modules: Vec<String> = fs::read_dir(src())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir() || p.extension().is_some_and(|e| e == "rs"))
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .filter(|m| m != "lib" && m != "main")
        .collect();
    modules.sort();
    modules.dedup();
    for m in &modules {
        assert!(
            floor.contains_key(m.as_str()),
            "the module `{m}` is on no floor: give it one in FLOORS and in docs/design.md"
        );
    }
    let mut upward = Vec::new();
    for m in &modules {
        let mut names = BTreeSet::new();
        for file in files_of(m) {
            names.extend(named_modules(&product_code(
                &fs::read_to_string(&file).unwrap(),
            )));
        }
        for to in names
            .iter()
            .filter(|t| *t != m && floor.contains_key(t.as_str()))
        {
            if floor[to.as_str()] >= floor[m.as_str()] {
                upward.push(format!("{m} -> {to}"));
            }
        }
    }
    assert!(
        upward.is_empty(),
        "imports up or across a floor: {upward:?} (move the part imported down, or the \
         importer up)"
    );
}

#[test]
fn the_reader_of_imports_sees_groups_and_leaves_tests_and_comments_out() {
    let code = product_code(
        "use crate::a::b;\nuse crate::{c::d, e, f::{g, h}};\n// crate::comment\n\
         let x = crate::i::j(); // crate::trailing\n#[cfg(test)]\nmod tests {\n    use \
         crate::k;\n}\n#[cfg(test)]\nuse crate::l;\nuse crate::m;\n",
    );
    let names: Vec<String> = named_modules(&code).into_iter().collect();
    assert_eq!(names, ["a", "c", "e", "f", "i", "m"]);
}
