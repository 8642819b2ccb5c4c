//! Every program `cargo xtask` or a test runs, in one table: where it comes from, which
//! commands need it and why. `cargo xtask test` (and `dist`, `vmtest`, `bench`) installs what
//! its commands need from this table before its first step, so a fresh machine meets no
//! program before it is installed; a unit test below reads xtask's and the tests' sources for
//! the programs they start and fails when one is missing here.
//!
//! The fixtures the tests use (Debian roots, kernels, the Hermes venvs, the MCP SDK, the JUnit
//! schema) are not programs: each is made by its own module, after this table is installed.
use std::path::Path;

use anyhow::{Result, bail};

use crate::{debian, pypi};

/// Which `cargo xtask` command needs a program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// `test`: the unit and host integration tests and what prepares them.
    Test,
    /// `dist`, and `test`'s tests of what it makes.
    Dist,
    /// `vmtest`, and `test`'s kernel matrix.
    Vm,
    /// `bench`.
    Bench,
    /// `bench`'s peer tracers: each one compared when it installs, left out (and said so)
    /// when it does not, so none is installed before the first step.
    BenchPeer,
}

impl Need {
    /// As docs/testing.md's table names it.
    fn name(self) -> &'static str {
        match self {
            Test => "test",
            Dist => "dist",
            Vm => "vm",
            Bench => "bench",
            BenchPeer => "bench (if it installs)",
        }
    }
}

/// Where a program comes from.
#[derive(Clone, Copy, Debug)]
pub enum Source {
    /// A Debian package, installed with `apt-get install`.
    Debian(&'static str),
    /// A PyPI package, installed with `pip install`.
    PyPi(&'static str),
    /// The Rust toolchain (rustup's): the one thing a user brings (README's set-up).
    Rustup,
    /// A crate from crates.io that `cargo xtask` builds itself (`setup` for bpf-linker, `fuzz`
    /// for cargo-fuzz): installed by that step, which runs before the program is used.
    Crate(&'static str),
}

/// One program.
#[derive(Debug)]
pub struct Tool {
    /// Its name on the PATH, or an absolute path where a test names one (or where a file
    /// stands for a library: a header of a C library).
    pub program: &'static str,
    pub source: Source,
    pub needed_by: &'static [Need],
    pub why: &'static str,
}

const fn tool(
    program: &'static str,
    source: Source,
    needed_by: &'static [Need],
    why: &'static str,
) -> Tool {
    Tool {
        program,
        source,
        needed_by,
        why,
    }
}

use Need::*;
use Source::*;

const ALL: &[Need] = &[Test, Dist, Vm, Bench];

/// The table. Base-system programs are listed too: a minimal image may lack any of them, and
/// the tests would otherwise fail on the first that is missing instead of installing it.
#[rustfmt::skip]
pub const TOOLS: &[Tool] = &[
    // The toolchain and the installers.
    tool("cargo", Rustup, ALL, "every build"),
    tool("rustup", Rustup, ALL, "the nightly toolchain of the eBPF build and the fuzzers"),
    tool("bpf-linker", Crate("bpf-linker"), ALL, "links the eBPF programs (`cargo xtask setup`)"),
    tool("cc", Debian("gcc"), ALL, "links the binaries; builds the spawn-site shapes' C spawner (tests/build.rs)"),
    tool("aarch64-linux-gnu-gcc", Debian("gcc-aarch64-linux-gnu"), &[Test, Dist, Vm], "builds the spawn-site shapes' C spawner for aarch64 (the workspace's clippy for aarch64); links the arm64 guests' binaries and the arm64 packages' binary"),
    // The compilers' C libraries: Debian has the compilers only recommend them, and the
    // installs below leave recommendations out. A header stands for each.
    tool("/usr/include/stdio.h", Debian("libc6-dev"), ALL, "the C library `cc` compiles and links against"),
    tool("/usr/aarch64-linux-gnu/include/stdio.h", Debian("libc6-dev-arm64-cross"), &[Test, Dist, Vm], "the arm64 C library `aarch64-linux-gnu-gcc` compiles and links against"),
    tool("apt-get", Debian("apt"), ALL, "installs this table's Debian packages and fetches kernels"),
    tool("apt-cache", Debian("apt"), &[Vm], "finds the newest kernel of each series"),
    tool("git", Debian("git"), &[Test, Dist, Bench], "the commit `--version` names; `bench --before` worktrees"),
    tool("python3", Debian("python3"), &[Test, Bench], "pip, the Hermes venvs, the JUnit schema's download; the memory bench's Python gateway"),
    // Programs the tests and shapes run on the host (and, for some, in the guests).
    tool("sh", Debian("dash"), ALL, "scripts of the tests, shapes and helpers"),
    tool("true", Debian("coreutils"), &[Test, Vm], "the input tests' command"),
    tool("/bin/true", Debian("coreutils"), &[Test, Vm], "the spawn-site tests' exec target"),
    tool("sleep", Debian("coreutils"), &[Test, Vm], "long-lived helpers in the leak and restart tests"),
    tool("cat", Debian("coreutils"), &[Test, Dist, Vm], "the spawn-site tests' Rust spawner starts it; the package test reads dpkg's conffiles"),
    tool("dd", Debian("coreutils"), &[Test, Vm], "the full-disk audit test fills a tmpfs"),
    tool("seq", Debian("coreutils"), &[Vm], "the guests' shapes"),
    tool("rm", Debian("coreutils"), &[Vm], "the guests' shapes"),
    tool("env", Debian("coreutils"), &[Vm], "the session tests' `env -i`; the demo's `#!`"),
    tool("bash", Debian("bash"), &[Vm], "the demo's example gateway"),
    tool("setsid", Debian("util-linux"), &[Vm], "the demo's escaping server"),
    tool("chroot", Debian("coreutils"), &[Test, Dist, Vm], "the package and tarball tests in a Debian root; the Python tests in sid's root"),
    tool("date", Debian("coreutils"), &[Dist], "the package's changelog date outside a checkout"),
    tool("du", Debian("coreutils"), &[Dist], "the package's installed size"),
    tool("mkfifo", Debian("coreutils"), &[Bench], "the latency bench's gateway"),
    tool("mount", Debian("mount"), &[Test, Dist, Vm], "tmpfs, bind mounts and bpffs in the tests"),
    tool("umount", Debian("mount"), &[Test, Dist, Vm], "undoes the tests' mounts"),
    tool("unshare", Debian("util-linux"), &[Test, Dist, Vm], "private mount namespaces; tests/emulated.sh's user namespace"),
    tool("flock", Debian("util-linux"), &[Test, Vm], "the bpffs mount test holds the lock a run mounting holds"),
    tool("grep", Debian("grep"), &[Test, Vm], "the bpffs mount test reads /proc/locks and mountinfo"),
    tool("readlink", Debian("coreutils"), &[Dist], "tests/emulated.sh: whether its child is in its user namespace yet"),
    tool("id", Debian("coreutils"), &[Dist], "tests/emulated.sh: whether the namespace's ids are mapped yet"),
    tool("pkill", Debian("procps"), &[Test, Dist, Vm], "ends helpers a failed test left"),
    tool("pgrep", Debian("procps"), &[Test, Vm], "the Python tests' shell waits on its host's helper"),
    tool("tar", Debian("tar"), &[Test, Dist], "the tarball, the Debian root, the JUnit schema"),
    tool("gzip", Debian("gzip"), &[Dist], "the man pages and the tarball"),
    tool("zcat", Debian("gzip"), &[Dist], "the package test reads the man page"),
    tool("ldd", Debian("libc-bin"), &[Vm], "the guests' shared libraries"),
    tool("xz", Debian("xz-utils"), &[Vm], "Debian's kernel modules"),
    tool("zstd", Debian("zstd"), &[Vm], "Debian's kernel modules"),
    tool("node", Debian("nodejs"), &[Test, Vm, Bench], "the Node host tests and the Node spawner bench"),
    tool("npm", Debian("nodejs"), &[Test], "the MCP TypeScript SDK of the Node MCP host test"),
    tool("/usr/bin/python3.11", Debian("python3.11"), &[Test, Vm], "Debian's CPython in the Python spawn-site tests, on the host and in the x86_64 guests"),
    tool("go", Debian("golang-go"), &[Test], "builds the Go spawner of the spawn-site tests (tests/go)"),
    tool("chromium", Debian("chromium"), &[Test], "the report's browser test"),
    tool("prometheus", Debian("prometheus"), &[Test], "a real Prometheus scraping a run"),
    tool("promtool", Debian("prometheus"), &[Test], "the alerting rules' unit tests, metrics checks"),
    tool("xmllint", Debian("libxml2-utils"), &[Test], "the JUnit report against the JUnit schema"),
    tool("systemd-analyze", Debian("systemd"), &[Test], "the service unit, read as systemd reads it"),
    tool("tmux", Debian("tmux"), &[Test, Bench], "a real terminal for `reaper-trace top`: its screen read back, its CPU measured"),
    tool("kubernetes-validate", PyPi("kubernetes-validate"), &[Test], "the DaemonSet against the Kubernetes schemas"),
    tool("mmdebstrap", Debian("mmdebstrap"), &[Test, Dist, Vm], "the sid roots (CPython 3.13, 3.14: the host's, the arm64 guests'), the package's Debian root, the arm64 guests' programs"),
    // What `dist` makes and its tests.
    tool("dpkg-deb", Debian("dpkg"), &[Dist, Vm], "builds the package; unpacks Debian's kernels"),
    tool("umoci", Debian("umoci"), &[Dist], "builds the OCI image"),
    tool("lintian", Debian("lintian"), &[Dist], "checks the package"),
    tool("strip", Debian("binutils"), &[Dist], "strips the packages' x86_64 binary"),
    tool("aarch64-linux-gnu-strip", Debian("binutils-aarch64-linux-gnu"), &[Dist], "strips the packages' arm64 binary"),
    tool("qemu-aarch64-static", Debian("qemu-user-static"), &[Dist, Vm], "runs arm64 programs here: the arm64 Debian root's (tests/emulated.sh), the arm64 test binaries' lists of tests"),
    tool("arch-test", Debian("arch-test"), &[Dist], "mmdebstrap's check that the arm64 root's programs run here"),
    tool("cpio", Debian("cpio"), &[Dist], "packs the package's booted roots"),
    tool("podman", Debian("podman"), &[Dist], "runs the image as the DaemonSet does"),
    tool("runc", Debian("runc"), &[Dist], "podman's runtime in the image tests"),
    // The kernel matrix.
    tool("qemu-system-x86_64", Debian("qemu-system-x86"), &[Dist, Vm], "boots each kernel of the matrix; boots the package's x86_64 root, where systemd starts its unit"),
    tool("busybox", Debian("busybox-static"), &[Vm], "the guests' init"),
    tool("qemu-system-aarch64", Debian("qemu-system-arm"), &[Dist, Vm], "boots each arm64 kernel of the matrix; boots the package's arm64 root, where systemd starts its unit"),
    tool("readelf", Debian("binutils"), &[Vm], "the libraries of the arm64 guests' programs (ldd cannot run them here)"),
    // The bench and its peers.
    tool("bpftool", Debian("bpftool"), &[Bench], "names the programs in the hook-cost table; map sizes"),
    tool("perf", Debian("linux-perf"), &[BenchPeer], "a peer tracer"),
    tool("forkstat", Debian("forkstat"), &[BenchPeer], "a peer tracer"),
    tool("bpftrace", Debian("bpftrace"), &[BenchPeer], "a peer tracer"),
    tool("curl", Debian("curl"), &[Bench], "the soak bench's scrapes"),
];

impl Source {
    /// Where it comes from, as docs/testing.md's table says it.
    fn describe(self) -> String {
        match self {
            Debian(pkg) => format!("Debian `{pkg}`"),
            PyPi(pkg) => format!("PyPI `{pkg}`"),
            Rustup => "rustup's toolchain (brought by the user)".to_owned(),
            Crate(name) => format!("crates.io `{name}` (built by xtask)"),
        }
    }
}

/// The table as markdown (`cargo xtask prereqs`): docs/testing.md holds it verbatim, which a
/// test checks.
pub fn markdown() -> String {
    let mut out = String::from("| program | from | needed by | why |\n|---|---|---|---|\n");
    for t in TOOLS {
        let needs: Vec<&str> = t.needed_by.iter().map(|n| n.name()).collect();
        out.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            t.program,
            t.source.describe(),
            needs.join(", "),
            t.why
        ));
    }
    out
}

/// The row of `program`. Every program is in the table (the unit test below checks the
/// sources), so a missing row is this crate's bug.
fn row(program: &str) -> &'static Tool {
    TOOLS
        .iter()
        .find(|t| t.program == program)
        .unwrap_or_else(|| panic!("{program} is not in xtask's prerequisites table"))
}

/// Whether `program` is there: a file at its path, or on the PATH.
fn present(program: &str) -> bool {
    match program.starts_with('/') {
        true => Path::new(program).is_file(),
        false => debian::have(program),
    }
}

/// Installs every program `needs` call for that is missing, one line each saying what and
/// why; fails naming what is still missing after that.
pub fn install(needs: &[Need]) -> Result<()> {
    install_tools(
        TOOLS
            .iter()
            .filter(|t| t.needed_by.iter().any(|n| needs.contains(n))),
    )
}

/// Installs `program` (by its row) unless it is there; returns whether it is there now.
pub fn ensure(program: &str) -> bool {
    install_tools([row(program)]).is_ok()
}

fn install_tools<'a>(tools: impl IntoIterator<Item = &'a Tool>) -> Result<()> {
    let missing: Vec<&Tool> = tools.into_iter().filter(|t| !present(t.program)).collect();
    let mut packages: Vec<&str> = Vec::new();
    for t in &missing {
        match t.source {
            Debian(pkg) => {
                eprintln!(
                    "xtask: installing {pkg} from Debian for {} ({})",
                    t.program, t.why
                );
                if !packages.contains(&pkg) {
                    packages.push(pkg);
                }
            }
            PyPi(pkg) => {
                eprintln!(
                    "xtask: installing {pkg} from PyPI for {} ({})",
                    t.program, t.why
                );
                pypi::install(pkg);
            }
            Rustup => bail!(
                "{} is missing: install Rust with rustup (README, Set-up), then run this again",
                t.program
            ),
            // Built by the step that uses it (`setup`, `fuzz`), which runs first.
            Crate(_) => {}
        }
    }
    debian::install(&packages);
    let still: Vec<String> = missing
        .iter()
        .filter(|t| !matches!(t.source, Crate(_)) && !present(t.program))
        .map(|t| match t.source {
            Debian(pkg) => format!("{} (apt-get install {pkg})", t.program),
            PyPi(pkg) => format!("{} (pip install {pkg})", t.program),
            _ => t.program.to_owned(),
        })
        .collect();
    if !still.is_empty() {
        bail!("still missing after installing: {}", still.join(", "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::*;

    /// Every `.rs` file under `dir`.
    fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                sources(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    /// The programs `text` starts by a literal name: through `Command::new`, `host_tool` (a
    /// test's host program), `which` (the guests' programs) or `ensure`.
    fn started(text: &str) -> Vec<String> {
        let mut found = Vec::new();
        for call in ["Command::new(\"", "host_tool(\"", "which(\"", "ensure(\""] {
            for (at, _) in text.match_indices(call) {
                let rest = &text[at + call.len()..];
                if let Some(end) = rest.find('"') {
                    found.push(rest[..end].to_owned());
                }
            }
        }
        found
    }

    #[test]
    fn every_program_xtask_or_a_test_starts_is_in_the_table() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let mut files = Vec::new();
        sources(&root.join("xtask/src"), &mut files);
        sources(&root.join("tests"), &mut files);
        assert!(files.len() > 20, "{files:?}");
        let mut missing = Vec::new();
        let mut seen = 0;
        for file in &files {
            let text = std::fs::read_to_string(file).unwrap();
            for program in started(&text) {
                seen += 1;
                if !TOOLS.iter().any(|t| t.program == program) {
                    missing.push(format!("{program} ({})", file.display()));
                }
            }
        }
        assert!(seen > 50, "the scan found only {seen} programs");
        assert!(
            missing.is_empty(),
            "started but not in prereqs::TOOLS: {missing:?}"
        );
    }

    #[test]
    fn the_scan_finds_a_program_that_is_not_in_the_table() {
        // Written so that this file's own scan does not find it.
        let text = format!(
            "let out = Command::new({q}frobnicate{q}).arg({q}x{q});",
            q = '"'
        );
        assert_eq!(started(&text), ["frobnicate"]);
        assert!(!TOOLS.iter().any(|t| t.program == "frobnicate"));
    }

    #[test]
    fn docs_testing_md_holds_the_table_as_it_is() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let doc = std::fs::read_to_string(root.join("docs/testing.md")).unwrap();
        assert!(
            doc.contains(&markdown()),
            "docs/testing.md's prerequisites table differs from xtask's: paste the output of \
             `cargo xtask prereqs` there"
        );
    }

    #[test]
    fn each_program_has_one_row() {
        for (i, t) in TOOLS.iter().enumerate() {
            assert!(
                !TOOLS[..i].iter().any(|u| u.program == t.program),
                "{} twice",
                t.program
            );
            assert!(!t.needed_by.is_empty() && !t.why.is_empty(), "{t:?}");
        }
    }
}
