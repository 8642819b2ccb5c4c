//! A guest's root filesystem: the initramfs of one architecture's guests (the test
//! executables and the workspace's binaries at their paths here, the programs they run, the
//! Node and Python host tests' scripts, the demo's example, the image's binary) and its init,
//! which runs the test binaries the kernel command line names and prints the marks `vmtest`
//! reads back.
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::{EXIT_MARK, KERNEL_MARK, is_support_test};
use crate::{
    arch::Arch,
    debian,
    initramfs::{Initramfs, resolve_in},
};

/// The guest's programs under the names the tests and shapes use, and the program of this
/// machine (or of the guests' userland) each one is.
const GUEST_PROGRAMS: &[(&str, &str)] = &[
    ("/bin/sh", "sh"),
    ("/bin/true", "true"),
    ("/bin/sleep", "sleep"),
    ("/bin/cat", "cat"),
    ("/bin/seq", "seq"),
    ("/bin/rm", "rm"),
    ("/bin/dd", "dd"),
    ("/bin/mount", "mount"),
    ("/bin/umount", "umount"),
    ("/bin/node", "node"),
    // The session tests' `env -i`, and the demo's shell and setsid.
    ("/usr/bin/env", "env"),
    ("/bin/bash", "bash"),
    ("/usr/bin/setsid", "setsid"),
    // The Python tests' shell waits on its host's helper by pgrep; tests end what their
    // gateways leaked by pkill.
    ("/usr/bin/pgrep", "pgrep"),
    ("/usr/bin/pkill", "pkill"),
    // The bpffs mount test: a mount namespace of its own, the lock it holds, /proc/locks read.
    ("/usr/bin/unshare", "unshare"),
    ("/usr/bin/flock", "flock"),
    ("/bin/grep", "grep"),
    // The Python spawn-site tests' interpreter: Debian's (libpython linked in), by its path
    // (this machine's PATH may name another first).
    ("/usr/bin/python3.11", "/usr/bin/python3.11"),
    // What the Python tests run sid's CPythons in (see [`PYTHON_ROOT`]).
    ("/usr/bin/chroot", "chroot"),
];

/// Debian's CPython's standard library, which the Python tests' host imports (asyncio,
/// subprocess, threading), but what no test runs: its tests, bytecode caches, static
/// library (in `config-3.11-*`, left out by [`python_library`]), GUI, 2to3, pydoc's data and
/// pip's bootstrap.
const PYTHON_LIBRARY: &str = "/usr/lib/python3.11";
const PYTHON_LEFT_OUT: &[&str] = &[
    "test",
    "__pycache__",
    "idlelib",
    "tkinter",
    "lib2to3",
    "ensurepip",
    "pydoc_data",
];

/// Where another architecture's guests hold Debian sid's CPython 3.13 and 3.14 of theirs
/// ([`debian::python_root`]): a root the Python tests chroot into, as they chroot into this
/// machine's own on the host (`REAPER_PYTHON_ROOT`). This machine's architecture's guests
/// run Debian's python3.11 alone: the host runs its other CPythons.
const PYTHON_ROOT: &str = "/python-root";
/// The CPythons [`PYTHON_ROOT`] holds.
const SID_PYTHONS: [&str; 2] = ["3.13", "3.14"];
/// The programs the Python tests start in [`PYTHON_ROOT`] (their hosts' helpers, and the
/// shell that starts a host after a burst of forks), which it holds too.
const SID_PROGRAMS: [&str; 4] = ["true", "cat", "sleep", "dash"];

/// Where a guest holds the image's binary, and the variable that names it to the demo's test.
const IMAGE_BINARY: &str = "/image/usr/bin/reaper-trace";

/// The guest's files, and its init: `arch`'s test executables and the workspace's binaries
/// beside them, at their paths here, and the programs they run (see [`with_programs`]); the
/// binary of the image's variant for `arch`, when there is one, at [`IMAGE_BINARY`].
pub(super) fn guest_root(
    root: &Path,
    arch: Arch,
    test_exes: &[PathBuf],
    test_args: &[String],
    image_binary: Option<&Path>,
) -> Result<Initramfs> {
    let mut fs = with_programs(root, arch, test_exes)?;
    let image_env = match image_binary {
        Some(binary) => {
            fs.host_file_at(Path::new(IMAGE_BINARY), binary)?;
            format!("export REAPER_IMAGE_TRACE={IMAGE_BINARY}")
        }
        None => String::new(),
    };
    let python_env = match arch == Arch::host() {
        true => String::new(),
        false => {
            fs.nest(Path::new(PYTHON_ROOT), sid_pythons(arch)?);
            format!(
                "busybox mount --bind /dev {PYTHON_ROOT}/dev
busybox mount -t proc proc {PYTHON_ROOT}/proc
export REAPER_PYTHON_ROOT={PYTHON_ROOT}"
            )
        }
    };
    fs.dir(&root.join("tests").to_string_lossy());
    // The demo's example, and the README its test holds it to.
    for file in ["README.md", "examples/leaky-gateway.sh"] {
        let file = root.join(file);
        fs.host_file_at(&file, &file)?;
    }
    // The Node and Python host tests' scripts, at their host paths (the tests name them so).
    for dir in ["tests/node", "tests/python"] {
        for script in std::fs::read_dir(root.join(dir)).context(dir)? {
            let script = script?.path();
            fs.host_file_at(&script, &script)?;
        }
    }
    let args: Vec<String> = test_args.iter().map(|a| shell_quote(a)).collect();
    // Every test binary the kernel command line names (`reaper.run=0,3,...`, indices into this
    // list) runs; the status is the first failure's, or 0.
    let runs: Vec<String> = test_exes
        .iter()
        .enumerate()
        .map(|(i, exe)| {
            // A bzImage older than the oldest supported kernel runs only the refusal's test.
            let gate = match is_support_test(exe) {
                true => "",
                false => "[ \"$old\" = 1 ] || ",
            };
            format!(
                "case \",$runs,\" in *,{i},*) {gate}{} --test-threads=2 {} || status=$? ;; esac",
                shell_quote(&exe.to_string_lossy()),
                args.join(" ")
            )
        })
        .collect();
    let init = format!(
        "{prelude}{image_env}
{python_env}
# sock_diag for UNIX sockets (Debian builds it as a module; a host loads it on demand).
busybox insmod /lib/modules/$(busybox uname -r)/unix_diag.ko 2>/dev/null
case \"$(busybox uname -r)\" in 4.*|5.[0-9].*|5.1[01].*) old=1 ;; *) old=0 ;; esac
runs=
for word in $(busybox cat /proc/cmdline); do
    case \"$word\" in reaper.run=*) runs=${{word#reaper.run=}} ;; esac
done
cd {tests}
status=0
{runs}
echo \"{EXIT_MARK}$status\"
busybox poweroff -f
",
        prelude = init_prelude(arch),
        tests = shell_quote(&root.join("tests").to_string_lossy()),
        runs = runs.join("\n"),
    );
    fs.data("/init", init.into_bytes(), 0o755);
    Ok(fs)
}

/// How long a test in a guest of `arch` waits for the event that proves its point
/// (`REAPER_TEST_PATIENCE_SECS`), in seconds: the host's default (300 s) in this machine's
/// architecture's guests, 900 s in another's. There qemu translates every instruction of
/// another instruction set, and a wait can rest on chance: an arm64 guest's Node host tests
/// wait for their abandoned servers to move no data for 10 s, while V8's tasks wake each
/// server's loop (an 8-byte read and write) every 7.5 s or so: 200 to 305 s in runs of the
/// matrix, where the same test takes 13 s on the host and under a minute in this
/// architecture's guests.
pub(super) fn patience_secs(arch: Arch) -> u64 {
    match arch == Arch::host() {
        true => 300,
        false => 900,
    }
}

/// The start of every init of a guest of `arch`: the environment the tests expect, the
/// kernel's filesystems, loopback up, and the kernel's release (see `KERNEL_MARK`).
pub(super) fn init_prelude(arch: Arch) -> String {
    let patience = patience_secs(arch);
    format!(
        "#!/bin/busybox sh
export PATH=/bin:/usr/bin CI=true HOME=/tmp TMPDIR=/tmp RUST_BACKTRACE=1
export REAPER_TEST_PATIENCE_SECS={patience}
busybox mount -t proc proc /proc
busybox mount -t sysfs sysfs /sys
busybox mount -t devtmpfs devtmpfs /dev
busybox mkdir -p /dev/pts && busybox mount -t devpts devpts /dev/pts
busybox mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null
busybox ip link set lo up
echo \"{KERNEL_MARK}$(busybox uname -r)\"
"
    )
}

/// A guest root of `arch` with its mount points, `exes` and the workspace's binaries at their
/// paths here (`release_dir` names where they are), and the programs the tests and shapes run
/// under their usual names: this machine's own (with their libraries) for its own
/// architecture, Debian's unpacked for another ([`debian::guest_userland`]).
pub(super) fn with_programs(root: &Path, arch: Arch, exes: &[PathBuf]) -> Result<Initramfs> {
    let mut fs = Initramfs::default();
    for dir in ["/proc", "/sys", "/dev", "/tmp", "/run"] {
        fs.dir(dir);
    }
    let ours = ["reaper-trace", "reaper-shapes"].map(|bin| release_dir(root, arch).join(bin));
    match arch == Arch::host() {
        true => {
            for program in exes.iter().chain(&ours) {
                fs.program(program)?;
            }
            for (name, bin) in GUEST_PROGRAMS {
                let host = which(bin)?;
                fs.program(&host)?;
                fs.host_file_at(Path::new(name), &host)?;
            }
            fs.host_file_at(Path::new("/bin/busybox"), &which("busybox")?)?;
            python_library(&mut fs, Path::new("/"), arch)?;
        }
        false => {
            // Static (see `Arch::cargo_env`): no loader, no library.
            for program in exes.iter().chain(&ours) {
                fs.host_file_at(program, program)?;
            }
            let userland = debian::guest_userland(arch)?;
            for (name, bin) in GUEST_PROGRAMS.iter().chain(&[("/bin/busybox", "busybox")]) {
                let (theirs, file) = ["/bin", "/usr/bin", "/sbin", "/usr/sbin"]
                    .iter()
                    .map(|dir| Path::new(dir).join(bin))
                    .find_map(|p| Some((p.clone(), resolve_in(&userland, &p).ok()?)))
                    .with_context(|| format!("`{bin}` is not in {}", userland.display()))?;
                fs.foreign_program(&userland, &theirs)?;
                fs.host_file_at(Path::new(name), &file)?;
            }
            // Debian's node loads some of its own modules from files of their packages.
            fs.foreign_dir(&userland, Path::new("/usr/share/nodejs"), &[])?;
            python_library(&mut fs, &userland, arch)?;
        }
    }
    Ok(fs)
}

/// Where `arch`'s release build of the workspace's binaries is.
pub fn release_dir(root: &Path, arch: Arch) -> PathBuf {
    match arch == Arch::host() {
        true => root.join("target/release"),
        false => root.join("target").join(arch.triple()).join("release"),
    }
}

/// [`PYTHON_LIBRARY`] of the root `from` (`/` for this machine's own programs) but what
/// [`PYTHON_LEFT_OUT`] names and the static library of `arch`.
fn python_library(fs: &mut Initramfs, from: &Path, arch: Arch) -> Result<()> {
    let config = format!("config-3.11-{}-linux-gnu", arch.name());
    let left_out: Vec<&str> = PYTHON_LEFT_OUT.iter().copied().chain([&*config]).collect();
    fs.foreign_dir(from, Path::new(PYTHON_LIBRARY), &left_out)
}

/// The root [`PYTHON_ROOT`] holds: [`SID_PYTHONS`] of `arch`'s sid root, each with its
/// standard library (but what [`PYTHON_LEFT_OUT`] names and its static library) and the
/// libraries it and its extension modules load, and [`SID_PROGRAMS`].
fn sid_pythons(arch: Arch) -> Result<Initramfs> {
    let root = debian::python_root(arch)?;
    let mut fs = Initramfs::default();
    for dir in ["/dev", "/proc", "/tmp"] {
        fs.dir(dir);
    }
    for program in SID_PROGRAMS {
        fs.foreign_program(&root, &Path::new("/usr/bin").join(program))?;
    }
    // As a sid system has them: its shell, and /bin the merged /usr's.
    fs.host_file_at(
        Path::new("/usr/bin/sh"),
        &resolve_in(&root, Path::new("/usr/bin/dash"))?,
    )?;
    fs.symlink("/bin", "usr/bin");
    for version in SID_PYTHONS {
        fs.foreign_program(&root, Path::new(&format!("/usr/bin/python{version}")))?;
        let library = PathBuf::from(format!("/usr/lib/python{version}"));
        let config = format!("config-{version}-{}-linux-gnu", arch.name());
        let left_out: Vec<&str> = PYTHON_LEFT_OUT.iter().copied().chain([&*config]).collect();
        fs.foreign_dir(&root, &library, &left_out)?;
        let modules = library.join("lib-dynload");
        let found = resolve_in(&root, &modules)?;
        for module in std::fs::read_dir(&found).with_context(|| found.display().to_string())? {
            fs.foreign_program(&root, &modules.join(module?.file_name()))?;
        }
    }
    Ok(fs)
}

/// The program file `bin` on the PATH (not a shell builtin of that name).
fn which(bin: &str) -> Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(bin))
        .find(|p| p.is_file())
        .with_context(|| format!("`{bin}` is not on this machine's PATH"))
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}
