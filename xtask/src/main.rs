//! `cargo xtask`: set-up, build, demo, run and test helpers for reaper.
//!
//! Everything a fresh machine needs is installed before a command's first step: the programs
//! of [`prereqs::TOOLS`] that the command needs, then `setup`'s toolchain (the nightly
//! toolchain's `rust-src`, and `bpf-linker` built against the nightly toolchain's own LLVM).
//! Both are idempotent and take well under a second when all is there.
mod arch;
mod bench;
mod bench_before;
mod debian;
mod dist;
mod fixtures;
mod fuzz;
mod host_tests;
mod initramfs;
mod npm;
mod prereqs;
mod pypi;
mod report_bench;
mod setup;
mod soak;
mod tally;
mod vmtest;

use std::{
    path::{Path, PathBuf},
    process::{Command, ExitCode},
};

use anyhow::{Context, Result, bail};
use arch::Arch;

const USAGE: &str = "\
usage: cargo xtask <command>

commands:
  setup            install what the eBPF build needs (nightly rust-src, bpf-linker)
  prereqs          the table of every program the commands and tests run, and where each
                   comes from (each command installs its rows first)
  build [--release]  build reaper-trace (eBPF object embedded)
  dist             target/dist/: for x86_64 and aarch64, a static binary in a tarball (man
                   pages, completions, unit, schema, README, licences) and a Debian package;
                   an OCI image archive of one index of both platforms
  demo             trace the bundled leaky example gateway for a few seconds
  run [ARGS...]    build (release) and run reaper-trace with ARGS
  test [--no-vm] [--no-dist] [--reverse]
                   lock files, fmt and clippy checks, unit tests, the kernel integration tests on this
                   kernel, 15 s of each fuzz target; unless --no-dist, `dist` and the tests
                   of its package, binary and image; unless --no-vm, the integration tests
                   on Debian's 5.10 (the refusal), 6.1 and 6.12 under qemu; with --reverse,
                   the host's tests each on its own, one at a time, in reverse name order
  fuzz [--secs N] [TARGET...]
                   the cargo-fuzz targets (decode, proc_stat, proc_files, btf, cli_values,
                   audit), N seconds each (default 60); installs cargo-fuzz if missing
  vmtest [--image OCI-ARCHIVE] [KERNEL...] [-- TEST-ARGS]
                   the kernel integration tests on each KERNEL: a Debian series (5.10,
                   6.1, 6.12: its newest image for this machine's architecture, fetched
                   and cached; aarch64:6.12 for arm64's, booted by qemu-system-aarch64
                   with the tests built for aarch64), `host`, or a bzImage path;
                   default: 5.10 6.1 6.12 aarch64:6.1 aarch64:6.12 host. Prints a
                   table of results. With --image (what `dist` made), the guests' demo
                   runs the image's binary of their architecture (`test` passes its own).
  bench [--quick] [--procs N] [--reps N] [--idle-secs N] [--sleepers N] [--only LIST]
        [--before REV]
                   overhead, completeness, reader CPU per traced process, hook cost,
                   memory, idle CPU, latency, the lineage checkpoint (restarts), the
                   report on a million-line audit, side by side with no tracer and with
                   perf, forkstat and bpftrace, and aarch64 against x86_64 in guests
                   (sections for --only: overhead, reader, hooks, memory, idle, latency,
                   loaded, sessions, state, report, api, arches, before); with --before,
                   this build's reader CPU, cost of tracking and latency against git
                   revision REV's, built from a worktree
  soak [--mins N]  gateways that come and go for N minutes (default 60): one instance of a
                   --gateway-exe program a second, each leaving a helper; fails unless the
                   RSS at the end is within 10% of the RSS after the first ten minutes
  bench --only soak [--soak-mins N]
                   N minutes (default 30) of process churn: reaper-trace's RSS, fds and
                   graph size over time
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match dispatch(&args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn dispatch(args: &[String]) -> Result<ExitCode> {
    let root = workspace_root();
    match args.first().map(String::as_str) {
        Some("setup") => setup::ensure_all().map(|_| ExitCode::SUCCESS),
        Some("prereqs") => {
            print!("{}", prereqs::markdown());
            Ok(ExitCode::SUCCESS)
        }
        Some("build") => {
            setup::ensure_all()?;
            build(&root, args.iter().any(|a| a == "--release"))?;
            Ok(ExitCode::SUCCESS)
        }
        Some("dist") => {
            prereqs::install(&[prereqs::Need::Dist])?;
            dist::run(&root)?;
            Ok(ExitCode::SUCCESS)
        }
        Some("demo") => {
            setup::ensure_all()?;
            build(&root, true)?;
            // From the checkout, by the path the README shows.
            let status = Command::new(root.join("target/release/reaper-trace"))
                .args(["--duration", "6s", "--", "examples/leaky-gateway.sh"])
                .current_dir(&root)
                .status()
                .context("running reaper-trace")?;
            Ok(ExitCode::from(
                status.code().unwrap_or(1).clamp(0, 255) as u8
            ))
        }
        Some("run") => {
            setup::ensure_all()?;
            build(&root, true)?;
            run_reaper(&root, &args[1..])
        }
        Some("soak") => {
            let mins = match args.get(1).map(String::as_str) {
                Some("--mins") => args
                    .get(2)
                    .and_then(|n| n.parse().ok())
                    .context("soak: --mins N, a number of minutes")?,
                None => 60,
                Some(other) => bail!("soak: unknown option {other} (--mins N)"),
            };
            prereqs::install(&[prereqs::Need::Bench])?;
            setup::ensure_all()?;
            build(&root, true)?;
            soak::gateways(&root.join("target/release/reaper-trace"), mins)?;
            Ok(ExitCode::SUCCESS)
        }
        Some("bench") => {
            let opts = bench::BenchOptions::parse(&args[1..])?;
            // `arches` boots the kernel matrix's guests.
            let mut needs = vec![prereqs::Need::Bench];
            needs.extend(opts.wants("arches").then_some(prereqs::Need::Vm));
            prereqs::install(&needs)?;
            setup::ensure_all()?;
            build(&root, true)?;
            bench::run(&root, &opts)?;
            Ok(ExitCode::SUCCESS)
        }
        Some("test") => {
            let (mut vm, mut dist) = (true, true);
            let mut order = host_tests::Order::Cargo;
            for flag in &args[1..] {
                match flag.as_str() {
                    "--no-vm" => vm = false,
                    "--no-dist" => dist = false,
                    "--reverse" => order = host_tests::Order::Reverse,
                    other => bail!("unknown argument to test: {other}"),
                }
            }
            // Every program any step runs, before the first step runs.
            let mut needs = vec![prereqs::Need::Test];
            needs.extend(dist.then_some(prereqs::Need::Dist));
            needs.extend(vm.then_some(prereqs::Need::Vm));
            prereqs::install(&needs)?;
            setup::ensure_all()?;
            test(&root, vm, dist, order)?;
            Ok(ExitCode::SUCCESS)
        }
        Some("fuzz") => {
            let mut secs = 60;
            let mut targets = Vec::new();
            let mut it = args[1..].iter();
            while let Some(a) = it.next() {
                match a.as_str() {
                    "--secs" => {
                        secs = it
                            .next()
                            .and_then(|v| v.parse().ok())
                            .context("--secs takes a number of seconds")?;
                    }
                    t => targets.push(t.to_owned()),
                }
            }
            if targets.is_empty() {
                targets = fuzz::TARGETS.map(String::from).to_vec();
            }
            setup::ensure_all()?;
            let (_, crashed) = fuzz::run(&root, secs, &targets)?;
            Ok(match crashed.is_empty() {
                true => ExitCode::SUCCESS,
                false => ExitCode::FAILURE,
            })
        }
        Some("vmtest") => {
            let (image, first) = match args.get(1).map(String::as_str) {
                Some("--image") => {
                    let archive = args.get(2).context("--image names an OCI archive")?;
                    (Some(PathBuf::from(archive)), 3)
                }
                _ => (None, 1),
            };
            let (specs, test_args) = match args[first..].iter().position(|a| a == "--") {
                Some(i) => (&args[first..first + i], &args[first + i + 1..]),
                None => (&args[first..], &[][..]),
            };
            let kernels = match specs {
                [] => vmtest::DEFAULT_KERNELS
                    .iter()
                    .chain(&["host"])
                    .map(|k| vmtest::Kernel::parse(k))
                    .collect::<Result<Vec<_>>>()?,
                specs => specs
                    .iter()
                    .map(|k| vmtest::Kernel::parse(k))
                    .collect::<Result<Vec<_>>>()?,
            };
            prereqs::install(&[prereqs::Need::Vm])?;
            setup::ensure_all()?;
            let outcomes = vmtest::run(&root, &kernels, test_args, image.as_deref())?;
            Ok(match outcomes.iter().all(vmtest::Outcome::ok) {
                true => ExitCode::SUCCESS,
                false => ExitCode::FAILURE,
            })
        }
        Some("-h" | "--help" | "help") => {
            print!("{USAGE}");
            Ok(ExitCode::SUCCESS)
        }
        _ => {
            eprint!("{USAGE}");
            Ok(ExitCode::from(2))
        }
    }
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

/// Runs a command in the workspace, failing with its name when it fails.
pub fn cargo(root: &Path, args: &[&str]) -> Result<()> {
    cargo_env(root, args, &[])
}

/// [`cargo`] with more environment variables.
pub fn cargo_env(root: &Path, args: &[&str], env: &[(&str, &str)]) -> Result<()> {
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(args)
        .envs(env.iter().copied())
        .current_dir(root)
        .status()
        .with_context(|| format!("running cargo {}", args.join(" ")))?;
    if !status.success() {
        bail!("`cargo {}` failed ({status})", args.join(" "));
    }
    Ok(())
}

fn build(root: &Path, release: bool) -> Result<()> {
    let mut args = vec!["build", "--bins"];
    if release {
        args.push("--release");
    }
    cargo(root, &args)
}

fn run_reaper(root: &Path, args: &[String]) -> Result<ExitCode> {
    let status = Command::new(root.join("target/release/reaper-trace"))
        .args(args)
        .status()
        .context("running reaper-trace")?;
    Ok(ExitCode::from(
        status.code().unwrap_or(1).clamp(0, 255) as u8
    ))
}

/// Seconds each fuzz target runs in `cargo xtask test` (longer runs: `cargo xtask fuzz`).
const FUZZ_SECS_IN_TEST: u64 = 15;

/// What a whole `cargo xtask test` from a clean clone adds to the disk, measured: target/ and
/// fuzz/target/ (6.3 GiB), the kernels, test tools and installed packages (docs/testing.md).
const TEST_RUN_DISK_GIB: u64 = 11;

/// Says, before the first step, when the disk under target/ holds less than a run takes: a run
/// that fills it fails late and obscurely (a linker's bus error, a test's empty read).
fn warn_if_short_of_disk(root: &Path) {
    let Ok(path) = std::ffi::CString::new(root.as_os_str().as_encoded_bytes()) else {
        return;
    };
    // SAFETY: statvfs writes only into `fs`, a plain struct of integers, zeroed here.
    let mut fs: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(path.as_ptr(), &mut fs) } != 0 {
        return;
    }
    let free_gib = (fs.f_bavail as u64 * fs.f_frsize as u64) >> 30;
    if free_gib < TEST_RUN_DISK_GIB {
        eprintln!(
            "xtask: warning: {free_gib} GiB free under {}; a whole test run from a clean clone \
             takes about {TEST_RUN_DISK_GIB} GiB (docs/testing.md)",
            root.display()
        );
    }
}

/// The workspace's and the fuzz crate's lock files hold every dependency the manifests name:
/// a build would otherwise rewrite a stale one silently, and `.ci/run` fails a run that leaves
/// the checkout changed, an hour later. `--locked` makes it an error here, in seconds.
fn check_lock_files(root: &Path) -> Result<()> {
    for manifest in ["Cargo.toml", "fuzz/Cargo.toml"] {
        let args = [
            "metadata",
            "--locked",
            "--format-version",
            "1",
            "--manifest-path",
            manifest,
        ];
        let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .args(args)
            .current_dir(root)
            .stdout(std::process::Stdio::null())
            .status()
            .with_context(|| format!("running cargo {}", args.join(" ")))?;
        if !out.success() {
            bail!(
                "`cargo metadata --locked` failed for {manifest} (cargo's error above); a \
                 lock file out of date is brought up to date by `cargo update --workspace \
                 --manifest-path {manifest}` at the top of the checkout: commit it"
            );
        }
    }
    Ok(())
}

fn test(root: &Path, vm: bool, dist: bool, order: host_tests::Order) -> Result<()> {
    warn_if_short_of_disk(root);
    check_lock_files(root)?;
    let fetching = fixtures::fetch(root, dist, vm);
    cargo(root, &["fmt", "--all", "--", "--check"]).context("formatting: run `cargo fmt --all`")?;
    cargo(root, &["clippy", "--all-targets", "--", "-D", "warnings"])?;
    clippy_ebpf(root)?;
    clippy_other_archs(root)?;
    // The integration tests run the workspace's binaries: build them first.
    build(root, false)?;
    // The artifacts' tests get this run's artifacts by name, never whatever lies in
    // target/dist; without them (`--no-dist`) they are left out, not skipped.
    let made = match dist {
        true => Some(dist::run(root)?),
        false => None,
    };
    let mut env = fixtures::wait(fetching)?;
    // `CI=true`: every prerequisite was installed above, so a test that would skip fails
    // instead (as it does in the guests, whose init sets it too).
    env.push(("CI", "true".into()));
    // Every skip is written here (tests/src/lib.rs `skip`), to be counted apart from passes.
    let skips = root.join("target/test-skips.log");
    let _ = std::fs::remove_file(&skips);
    env.push(("REAPER_SKIP_LOG", skips.clone().into_os_string()));
    let mut filters = Vec::new();
    // The guests run the demo from the image's binaries.
    let image = made.as_ref().map(|made| made.image.clone());
    match made {
        // The artifacts are tested as installed: the package in a fresh Debian root, the
        // image under podman.
        // The other architecture's package and tarball go into a root of their own, emulated.
        Some(made) => env.extend([
            (
                "REAPER_DIST_TARBALL",
                made.of(Arch::host()).tarball.clone().into(),
            ),
            ("REAPER_DIST_DEB", made.of(Arch::host()).deb.clone().into()),
            (
                "REAPER_DIST_OTHER_DEB",
                made.of(Arch::other()).deb.clone().into(),
            ),
            (
                "REAPER_DIST_OTHER_TARBALL",
                made.of(Arch::other()).tarball.clone().into(),
            ),
            ("REAPER_OTHER_ARCH", Arch::other().name().into()),
            ("REAPER_DIST_IMAGE", made.image.into_os_string()),
        ]),
        None => filters.extend(["--skip", "installed_artifacts::"]),
    }
    let mut tests = host_tests::run(root, &env, &filters, order)?;
    // A test leaves nothing behind: a socket nobody serves is a run a test ended and left.
    let left = host_tests::dead_api_sockets();
    if !left.is_empty() {
        let names: Vec<String> = left.iter().map(|p| p.display().to_string()).collect();
        let said = format!("sockets nobody serves: {}", names.join(", "));
        tests.fail(
            "the host's tests left /run/reaper-trace clean".into(),
            &said,
        );
    }
    // A short fuzz run of every target: each clean target counts as a passed test.
    let targets = fuzz::TARGETS.map(String::from);
    let (clean, crashed) = fuzz::run(root, FUZZ_SECS_IN_TEST, &targets)?;
    tests.passed += clean.len() as u64;
    for crash in &crashed {
        tests.fail(format!("fuzz target {}", crash.target), &crash.said());
    }
    let mut broken = Vec::new();
    if vm {
        for o in vmtest::run(root, &vmtest::default_kernels()?, &[], image.as_deref())? {
            if let Some(p) = &o.problem {
                broken.push(format!("{}: {p}", o.label));
            } else if o.tests.passed == 0 {
                broken.push(format!("{}: no test ran", o.label));
            }
            tests.add(o.tests);
        }
    }
    // The closing lines for the whole run, whatever order cargo printed its binaries in: each
    // failure by name (a long log is often read from its end only), then the counts. A skip
    // under CI=true is a failure; the count says how many failures were skips.
    let skipped: Vec<String> = std::fs::read_to_string(&skips)
        .map(|t| t.lines().map(str::to_owned).collect())
        .unwrap_or_default();
    for line in &skipped {
        println!("skipped {line}");
    }
    for f in &tests.failures {
        println!("FAILED {}", f.name);
        for line in &f.said {
            println!("    {line}");
        }
    }
    println!(
        "{} passed, {} failed, {} skipped on this host",
        tests.passed,
        tests.failed,
        skipped.len()
    );
    if tests.failed > 0 {
        bail!("{} tests failed", tests.failed);
    }
    if !broken.is_empty() {
        bail!("the kernel matrix did not complete: {}", broken.join("; "));
    }
    Ok(())
}

/// Clippy on the workspace for each architecture other than this machine's: code under
/// `cfg(target_arch)` (the unwinder's registers, system call numbers, the shapes' raw fork)
/// is checked for every architecture on any machine.
fn clippy_other_archs(root: &Path) -> Result<()> {
    for arch in Arch::ALL.into_iter().filter(|&a| a != Arch::host()) {
        arch.ensure_std()?;
        let args = ["clippy", "--target", arch.triple(), "--all-targets"];
        cargo(root, &[&args[..], &["--", "-D", "warnings"]].concat())
            .with_context(|| format!("clippy for {}", arch.triple()))?;
    }
    Ok(())
}

/// Clippy on the kernel programs, which only build for the BPF target with nightly: once for
/// each architecture they are built for (each reads its own saved registers).
fn clippy_ebpf(root: &Path) -> Result<()> {
    for arch in Arch::ALL.map(Arch::name) {
        let flags = [
            format!("--cfg=bpf_target_arch=\"{arch}\""),
            "-Ctarget-cpu=v3".into(),
        ]
        .join("\x1f");
        let status = Command::new("rustup")
            .args([
                "run",
                setup::NIGHTLY,
                "cargo",
                "clippy",
                "--package",
                "reaper-ebpf",
                "--bins",
            ])
            .args([
                "--release",
                "--target",
                "bpfel-unknown-none",
                "-Z",
                "build-std=core",
            ])
            .arg("--target-dir")
            .arg(root.join("target/ebpf-clippy").join(arch))
            .args(["--", "-D", "warnings"])
            .env("CARGO_ENCODED_RUSTFLAGS", flags)
            .current_dir(root.join("reaper-ebpf"))
            .status()
            .context("running clippy on reaper-ebpf")?;
        if !status.success() {
            bail!("clippy on reaper-ebpf for {arch} failed ({status})");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lock_files_hold_what_the_manifests_name() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        check_lock_files(root).unwrap();
    }

    #[test]
    fn docs_testing_md_says_the_disk_a_run_takes_as_the_warning_does() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let doc = std::fs::read_to_string(root.join("docs/testing.md")).unwrap();
        let said = format!("adds about {TEST_RUN_DISK_GIB} GiB");
        assert!(
            doc.contains(&said),
            "docs/testing.md, \"The disk it takes\", should say `{said}` (TEST_RUN_DISK_GIB)"
        );
    }
}
