//! What `cargo xtask dist` makes, met the way its users meet it: the Debian package installed
//! with `dpkg -i` into a fresh Debian root (made by `mmdebstrap` from Debian's archive), the
//! tarball's static binary tracing a real leak from inside that root (no Rust toolchain, no
//! shared library of the host), and the OCI image under podman with the host's pid namespace
//! and exactly the DaemonSet's capabilities (`dist/pods.rs`), flagging a leak of a gateway on
//! the host. `cargo xtask test` builds the artifacts and the root first; host only (the
//! guests have no podman, and these are not about the kernel).
use std::{
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

use reaper_tests::{
    Instance, OrphanLater, checkpointed, end_once_checkpointed, kept_run, patience, pid, pin_dir,
    require_root, scratch, shapes, skip,
};
use serde_json::Value;

/// The file this run of `cargo xtask test` made, named by `variable` (never whatever lies in
/// target/dist from an earlier build), or `None` to [`skip`].
fn made_by_this_run(test: &str, variable: &str) -> Option<PathBuf> {
    let path = std::env::var_os(variable).map(PathBuf::from);
    match path {
        Some(p) if p.is_file() => Some(p),
        Some(p) => {
            skip(
                test,
                &format!("{variable} names {}, which is not a file", p.display()),
            );
            None
        }
        None => {
            skip(
                test,
                &format!("no {variable}: `cargo xtask test` builds it and says where"),
            );
            None
        }
    }
}

/// A fresh Debian root (minbase, Debian's own archive), the tarball `variable` names,
/// unpacked for this test.
fn debian_root(test: &str, dir: &Path, variable: &str) -> Option<PathBuf> {
    let tar = made_by_this_run(test, variable)?;
    let root = dir.join("root");
    std::fs::create_dir_all(&root).unwrap();
    ok(Command::new("tar")
        .arg("-xf")
        .arg(&tar)
        .arg("-C")
        .arg(&root));
    Some(root)
}

/// Runs `cmd`, asserting it succeeds; returns its stdout.
fn ok(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?}: {}", said(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn said(out: &Output) -> String {
    format!(
        "{}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs `args` chrooted into `root` with a clean environment.
fn chroot(root: &Path, args: &[&str]) -> Output {
    in_root(Command::new("chroot"), root, args)
}

/// [`chroot`] into a root of architecture `arch`, its programs run under qemu-user
/// (`tests/emulated.sh`: a namespace of its own, nothing registered on this machine).
fn emulated_chroot(arch: &str, root: &Path, args: &[&str]) -> Output {
    let mut emulated = Command::new("sh");
    emulated
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("emulated.sh"))
        .args([arch, "chroot"]);
    in_root(emulated, root, args)
}

/// `chroot` (as `cmd` runs it) `root` `args`, with nothing of this environment but a PATH.
fn in_root(mut cmd: Command, root: &Path, args: &[&str]) -> Output {
    cmd.arg(root)
        .args(args)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .output()
        .unwrap()
}

/// What the package installs, each listed by `dpkg -L`.
const PACKAGED: &[&str] = &[
    "/usr/bin/reaper-trace",
    "/usr/share/man/man1/reaper-trace.1.gz",
    "/usr/share/man/man1/reaper-trace-report.1.gz",
    "/usr/share/bash-completion/completions/reaper-trace",
    "/usr/share/zsh/vendor-completions/_reaper-trace",
    "/usr/share/fish/vendor_completions.d/reaper-trace.fish",
    "/lib/systemd/system/reaper-trace.service",
    "/etc/default/reaper-trace",
    "/usr/share/doc/reaper-trace/copyright",
];

/// Asserts that `dpkg -L` lists each of [`PACKAGED`] and that each is in `root`.
fn assert_packaged(root: &Path, listed: &str) {
    for file in PACKAGED {
        assert!(listed.lines().any(|l| l == *file), "{file} in {listed}");
        let inside = root.join(file.trim_start_matches('/'));
        assert!(inside.is_file(), "{} installed", inside.display());
    }
}

/// Asserts that `--version` said this build's version.
fn assert_version(out: &Output) {
    let version = String::from_utf8_lossy(&out.stdout);
    let this = format!("reaper-trace {} (commit ", env!("CARGO_PKG_VERSION"));
    assert!(version.starts_with(&this), "{}", said(out));
}

/// `lintian` finds no error in `deb`.
fn assert_lintian_clean(deb: &Path) {
    let lintian = Command::new("lintian")
        .args(["--fail-on", "error", "--tag-display-limit", "0"])
        .arg(deb)
        .output()
        .unwrap();
    assert!(lintian.status.success(), "lintian: {}", said(&lintian));
}

#[path = "dist/pods.rs"]
mod pods;

#[path = "dist/booted.rs"]
mod booted;

/// In a module of their own, so that `cargo xtask test --no-dist` leaves them out by name
/// (`--skip installed_artifacts::`) rather than letting them skip.
mod installed_artifacts {
    use super::*;

    #[test]
    fn the_package_installs_into_a_fresh_debian_root_and_lintian_finds_no_error() {
        let test = "the_package_installs_into_a_fresh_debian_root_and_lintian_finds_no_error";
        if !require_root(test) {
            return;
        }
        let Some(deb) = made_by_this_run(test, "REAPER_DIST_DEB") else {
            return;
        };
        assert_lintian_clean(&deb);
        let dir = scratch(test);
        let Some(root) = debian_root(test, &dir, "REAPER_DEBIAN_ROOT") else {
            return;
        };
        std::fs::copy(&deb, root.join("tmp/reaper-trace.deb")).unwrap();
        let install = chroot(&root, &["dpkg", "-i", "/tmp/reaper-trace.deb"]);
        assert!(install.status.success(), "dpkg -i: {}", said(&install));
        assert_version(&chroot(&root, &["reaper-trace", "--version"]));
        let listed = chroot(&root, &["dpkg", "-L", "reaper-trace"]);
        assert_packaged(&root, &String::from_utf8_lossy(&listed.stdout));
        assert_static_pie_of(&root.join("usr/bin/reaper-trace"), std::env::consts::ARCH);
        // The page is the CLI's own, and the unit runs the packaged binary with its defaults.
        let page = ok(Command::new("zcat").arg(root.join("usr/share/man/man1/reaper-trace.1.gz")));
        assert!(
            page.contains("\\-\\-gateway\\-exe") && page.contains("\\-\\-junit"),
            "{page}"
        );
        let unit =
            std::fs::read_to_string(root.join("lib/systemd/system/reaper-trace.service")).unwrap();
        assert!(
            unit.contains("ExecStart=/usr/bin/reaper-trace $GATEWAY_SELECTORS"),
            "{unit}"
        );
        let conffiles =
            ok(Command::new("cat").arg(root.join("var/lib/dpkg/info/reaper-trace.conffiles")));
        assert_eq!(conffiles.trim(), "/etc/default/reaper-trace");
        // The bash completion knows the options.
        let completion = std::fs::read_to_string(
            root.join("usr/share/bash-completion/completions/reaper-trace"),
        )
        .unwrap();
        assert!(completion.contains("--gateway-pidfile"), "{completion}");
        booted::assert_unit_starts_under_systemd(
            test,
            &root,
            std::env::consts::ARCH,
            |args| chroot(&root, args),
            "REAPER_DEBIAN_KERNEL",
        );
        removal_releases_the_state(&root, &dir);
    }

    /// The other architecture's package (arm64 on an x86_64 machine) as its users meet it:
    /// `dpkg -i` in a fresh Debian root of that architecture, where dpkg, the package's
    /// maintainer script and reaper-trace itself run as that architecture's programs (under
    /// qemu-user here; the kernel matrix runs its binary on that architecture's kernels).
    #[test]
    fn the_other_architectures_package_installs_into_a_debian_root_of_that_architecture() {
        let test =
            "the_other_architectures_package_installs_into_a_debian_root_of_that_architecture";
        if !require_root(test) {
            return;
        }
        let Some(deb) = made_by_this_run(test, "REAPER_DIST_OTHER_DEB") else {
            return;
        };
        let arch = std::env::var("REAPER_OTHER_ARCH").expect("REAPER_OTHER_ARCH beside the deb");
        assert_ne!(arch, std::env::consts::ARCH, "the other architecture");
        assert_lintian_clean(&deb);
        let dir = scratch(test);
        let Some(root) = debian_root(test, &dir, "REAPER_OTHER_DEBIAN_ROOT") else {
            return;
        };
        let in_root = |args: &[&str]| emulated_chroot(&arch, &root, args);
        // The root is of the package's architecture (which is not this machine's).
        let package_arch = ok(Command::new("dpkg-deb")
            .arg("-f")
            .arg(&deb)
            .arg("Architecture"));
        let root_arch = in_root(&["dpkg", "--print-architecture"]);
        assert!(root_arch.status.success(), "{}", said(&root_arch));
        assert_eq!(
            String::from_utf8_lossy(&root_arch.stdout).trim(),
            package_arch.trim(),
            "the root's architecture is the package's"
        );
        std::fs::copy(&deb, root.join("tmp/reaper-trace.deb")).unwrap();
        let install = in_root(&["dpkg", "-i", "/tmp/reaper-trace.deb"]);
        assert!(install.status.success(), "dpkg -i: {}", said(&install));
        assert_version(&in_root(&["reaper-trace", "--version"]));
        let listed = in_root(&["dpkg", "-L", "reaper-trace"]);
        assert_packaged(&root, &String::from_utf8_lossy(&listed.stdout));
        assert_static_pie_of(&root.join("usr/bin/reaper-trace"), &arch);
        booted::assert_unit_starts_under_systemd(
            test,
            &root,
            &arch,
            in_root,
            "REAPER_OTHER_DEBIAN_KERNEL",
        );
        let removed = in_root(&["dpkg", "-r", "reaper-trace"]);
        assert!(removed.status.success(), "dpkg -r: {}", said(&removed));
        assert!(!root.join("usr/bin/reaper-trace").exists(), "removed");
    }

    /// The other architecture's tarball (arm64's on an x86_64 machine): the same files as
    /// this architecture's, and its binary, that architecture's code, runs in a fresh Debian
    /// root of that architecture (under qemu-user here: the kernel matrix's guests of that
    /// architecture trace with the same build, the image's).
    #[test]
    fn the_other_architectures_tarball_holds_the_same_files_and_runs_in_its_root() {
        let test = "the_other_architectures_tarball_holds_the_same_files_and_runs_in_its_root";
        if !require_root(test) {
            return;
        }
        let (Some(ours), Some(theirs)) = (
            made_by_this_run(test, "REAPER_DIST_TARBALL"),
            made_by_this_run(test, "REAPER_DIST_OTHER_TARBALL"),
        ) else {
            return;
        };
        let arch = std::env::var("REAPER_OTHER_ARCH").expect("REAPER_OTHER_ARCH beside it");
        // Each tarball's files under its own top directory (which names its architecture).
        let files = |tarball: &Path| -> Vec<String> {
            let listed = ok(Command::new("tar").arg("-tzf").arg(tarball));
            let mut files: Vec<String> = listed
                .lines()
                .filter_map(|l| Some(l.split_once('/')?.1.to_owned()))
                .filter(|f| !f.is_empty())
                .collect();
            files.sort();
            files
        };
        assert_eq!(files(&theirs), files(&ours), "the same files in both");
        let dir = scratch(test);
        let Some(root) = debian_root(test, &dir, "REAPER_OTHER_DEBIAN_ROOT") else {
            return;
        };
        ok(Command::new("tar")
            .args(["-xzf"])
            .arg(&theirs)
            .args(["--strip-components=1", "-C"])
            .arg(root.join("opt")));
        assert_static_pie_of(&root.join("opt/reaper-trace"), &arch);
        assert_version(&emulated_chroot(
            &arch,
            &root,
            &["/opt/reaper-trace", "--version"],
        ));
    }

    /// Fails unless ELF file `binary` is `arch`'s code (its `e_machine`) and static-pie: no
    /// program interpreter (`PT_INTERP`), position-independent (`ET_DYN`), so that the
    /// kernel loads its code at a random address on every architecture.
    fn assert_static_pie_of(binary: &Path, arch: &str) {
        let elf = std::fs::read(binary).unwrap();
        let u16_at = |at: usize| u16::from_le_bytes([elf[at], elf[at + 1]]);
        let expected = match arch {
            "aarch64" => 183,
            _ => 62,
        };
        assert_eq!(u16_at(0x12), expected, "e_machine of {arch}");
        const ET_DYN: u16 = 3;
        assert_eq!(
            u16_at(0x10),
            ET_DYN,
            "{arch}'s binary is not position-independent"
        );
        const PT_INTERP: u32 = 3;
        let table = u64::from_le_bytes(elf[0x20..0x28].try_into().unwrap()) as usize;
        let (size, count) = (usize::from(u16_at(0x36)), usize::from(u16_at(0x38)));
        let interpreted = (0..count).any(|i| {
            let at = table + i * size;
            u32::from_le_bytes(elf[at..at + 4].try_into().unwrap()) == PT_INTERP
        });
        assert!(!interpreted, "{arch}'s binary names a loader: not static");
    }

    /// A bind mount undone however the test ends.
    struct Bound(PathBuf);
    impl Drop for Bound {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }

    /// The package's removal releases the service's state: a real one, made by the host's
    /// reaper-trace in the root's /var/lib/reaper-trace, with the host's bpffs seen inside.
    fn removal_releases_the_state(root: &Path, dir: &Path) {
        let state = root.join("var/lib/reaper-trace");
        let mut sleeper = Command::new("sleep").arg("600").spawn().expect("sleep");
        let gw = u64::from(sleeper.id());
        let run = kept_run(&state, &dir.join("kept.ndjson"), gw, &[]);
        end_once_checkpointed(run, &state, gw, libc::SIGTERM);
        let pins = pin_dir(&state);
        assert!(pins.is_dir(), "{} pinned", pins.display());
        let inside = root.join("sys/fs/bpf");
        std::fs::create_dir_all(&inside).unwrap();
        ok(Command::new("mount")
            .args(["--bind", "/sys/fs/bpf"])
            .arg(&inside));
        let _bound = Bound(inside);
        let removed = chroot(root, &["dpkg", "-r", "reaper-trace"]);
        assert!(removed.status.success(), "dpkg -r: {}", said(&removed));
        assert!(!pins.exists(), "unpinned: {}", said(&removed));
        assert!(!state.exists(), "the state dir is gone: {}", said(&removed));
        let _ = sleeper.kill();
        let _ = sleeper.wait();
    }

    #[test]
    fn the_static_binary_traces_a_leak_from_a_root_with_no_toolchain() {
        let test = "the_static_binary_traces_a_leak_from_a_root_with_no_toolchain";
        if !require_root(test) {
            return;
        }
        let Some(tarball) = made_by_this_run(test, "REAPER_DIST_TARBALL") else {
            return;
        };
        let dir = scratch(test);
        let Some(root) = debian_root(test, &dir, "REAPER_DEBIAN_ROOT") else {
            return;
        };
        let opt = root.join("opt");
        ok(Command::new("tar")
            .args(["-xzf"])
            .arg(&tarball)
            .args(["--strip-components=1", "-C"])
            .arg(&opt));
        assert!(!root.join("usr/bin/cargo").exists() && !root.join("usr/bin/rustc").exists());
        // The host's /proc, /sys and /dev seen from the root, in a mount namespace of its own so
        // that nothing outlives the test.
        let leak = "setsid sleep 3600.7 </dev/null >/dev/null 2>&1 &";
        let script = format!(
            "mount --rbind /proc {r}/proc && mount --rbind /sys {r}/sys && \
             mount --rbind /dev {r}/dev && \
             exec chroot {r} /usr/bin/env -i PATH=/usr/bin:/bin \
             /opt/reaper-trace --check --json --settle 200ms -- sh -c '{leak}'",
            r = root.display()
        );
        let out = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", &script])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let _ = Command::new("pkill")
            .args(["-f", "^sleep 3600.7$"])
            .status();
        assert_eq!(
            out.status.code(),
            Some(3),
            "exit 3 (leaked): {}",
            said(&out)
        );
        let events: Vec<Value> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        let check = events
            .iter()
            .find(|e| e["event"] == "check")
            .unwrap_or_else(|| panic!("no check event: {}", said(&out)));
        let leaked = check["leaked"].as_array().unwrap();
        assert_eq!(leaked.len(), 1, "{check}");
        assert_eq!(leaked[0]["argv"][0], "sleep", "{check}");
    }
}
