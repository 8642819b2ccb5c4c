//! How a readable line names a process: by what it runs. Every process of a Python or Node host
//! is `python3` or `node`, and its full command line is long (`/usr/bin/python3 -u
//! /opt/app/servers/tiny_mcp_server.py alpha`); what tells two apart is the script or module.
//! So for an interpreter or a shell the label is its script's file name (or `-m module`, `-c
//! code`) and the arguments after it; any other program is labelled by its own file name and
//! arguments. The NDJSON stream keeps the exact argv.
use crate::text::{Args, escape_for_terminal};

/// Interpreters whose first non-option argument is the script they run.
const INTERPRETERS: &[&str] = &[
    "python", "python2", "python3", "pypy", "pypy3", "node", "nodejs", "deno", "bun", "perl",
    "ruby", "php", "lua", "sh", "bash", "dash", "zsh", "ksh", "fish",
];

/// Interpreter options that take the next argument as their value (`-X dev`, `-r ./hook.js`).
const OPTIONS_WITH_VALUE: &[&[u8]] = &[
    b"-X",
    b"-W",
    b"-Q",
    b"-r",
    b"--require",
    b"--import",
    b"--loader",
    b"-I",
    b"-o",
    b"-O",
];

/// Options after which the rest of the command line is the program itself.
const PROGRAM_OPTIONS: &[&[u8]] = &[b"-m", b"-c", b"-e", b"--eval", b"-p", b"--print"];

/// The file name of a path (`/usr/bin/python3.11` → `python3.11`).
fn base(path: &[u8]) -> &[u8] {
    path.rsplit(|&b| b == b'/').next().unwrap_or(path)
}

/// Whether `name` (a file name) is an interpreter, versions included (`python3.11`, `node20`).
fn is_interpreter(name: &[u8]) -> bool {
    let name = std::str::from_utf8(name).unwrap_or("");
    let stem = name.trim_end_matches(|c: char| c.is_ascii_digit() || c == '.');
    INTERPRETERS.contains(&stem) || INTERPRETERS.contains(&name)
}

/// The words that name what `argv` runs: the program's file name (or, for an interpreter, its
/// script's, or `-m module`) and the arguments after it. Empty for an empty argv.
pub fn command_words(argv: &Args) -> Vec<&[u8]> {
    let all: Vec<&[u8]> = argv.iter().collect();
    let Some(&program) = all.first() else {
        return Vec::new();
    };
    if !is_interpreter(base(program)) {
        let mut words = vec![base(program)];
        words.extend(&all[1..]);
        return words;
    }
    let mut i = 1;
    while i < all.len() {
        let arg = all[i];
        if PROGRAM_OPTIONS.contains(&arg) {
            return all[i..].to_vec();
        }
        if arg == b"--" {
            i += 1;
            break;
        }
        if !arg.starts_with(b"-") || arg == b"-" {
            break;
        }
        i += 1 + usize::from(OPTIONS_WITH_VALUE.contains(&arg));
    }
    match all.get(i) {
        Some(&script) => {
            let mut words = vec![base(script)];
            words.extend(&all[i + 1..]);
            words
        }
        // An interpreter with no script (a REPL, options only): its own name.
        None => vec![base(program)],
    }
}

/// [`command_words`] escaped for a terminal, space-separated.
pub fn command_label(argv: &Args) -> String {
    command_words(argv)
        .into_iter()
        .map(escape_for_terminal)
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn label(argv: &[&str]) -> String {
        command_label(&Args::from_list(argv))
    }

    #[test]
    fn an_interpreter_is_named_by_its_script_or_module() {
        assert_eq!(
            label(&[
                "/usr/bin/python3",
                "-u",
                "/opt/servers/tiny_mcp_server.py",
                "alpha"
            ]),
            "tiny_mcp_server.py alpha"
        );
        assert_eq!(
            label(&[
                "python3",
                "-X",
                "dev",
                "-m",
                "tui_gateway.slash_worker",
                "--session-key",
                "k"
            ]),
            "-m tui_gateway.slash_worker --session-key k"
        );
        assert_eq!(
            label(&[
                "node",
                "--require",
                "./hook.js",
                "/srv/bridge.cjs",
                "--agent=hermes"
            ]),
            "bridge.cjs --agent=hermes"
        );
        assert_eq!(label(&["sh", "-c", "sleep 20 | cat"]), "-c sleep 20 | cat");
        assert_eq!(label(&["/bin/bash", "/etc/init.d/x", "start"]), "x start");
        assert_eq!(
            label(&["python3.11"]),
            "python3.11",
            "a REPL keeps its own name"
        );
    }

    #[test]
    fn another_program_is_named_by_its_file_and_arguments() {
        assert_eq!(
            label(&["/usr/local/bin/stdio-mcp-binary", "serve"]),
            "stdio-mcp-binary serve"
        );
        assert_eq!(label(&["/usr/bin/sleep\u{1b}", "1"]), "sleep\\x1b 1");
        assert_eq!(label(&[]), "");
    }
}
