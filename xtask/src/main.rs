//! `cargo xtask`: set-up, build, demo, run and test helpers for reaper.
//!
//! Everything a fresh machine needs is installed before a command's first step: the programs
//! of [`prereqs::TOOLS`] that the command needs, then `setup`'s toolchain (the nightly
//! toolchain's `rust-src`, and `bpf-linker` built against the nightly toolchain's own LLVM).
//! Both are idempotent and take well under a second when all is there.
mod bench;
mod bench_before;
mod debian;
mod dist;
mod fuzz;
mod initramfs;
mod npm;
mod prereqs;
mod pypi;
mod report_bench;
mod setup;
mod soak;
mod vmtest;

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Command, ExitCode, Stdio},
};

use anyhow::{Context, Result, bail};

const USAGE: &str = "\
usage: cargo xtask <command>

commands:
  setup            install what the eBPF build needs (nightly rust-src, bpf-linker)
  prereqs          the table of every program the commands and tests run, and where each
                   comes from (each command installs its rows first)
  build [--release]  build reaper-trace (eBPF object embedded)
  dist             target/dist/: a static binary in a tarball (man pages, completions, unit,
                   schema, README, licences), a Debian package and an OCI image archive
  demo             trace the bundled leaky example gateway for a few seconds
  run [ARGS...]    build (release) and run reaper-trace with ARGS
  test [--no-vm] [--no-dist]
                   fmt and clippy checks, unit tests, the kernel integration tests on this
                   kernel, 15 s of each fuzz target; unless --no-dist, `dist` and the tests
                   of its package, binary and image; unless --no-vm, the integration tests
                   on Debian's 5.10 (the refusal), 6.1 and 6.12 under qemu
  fuzz [--secs N] [TARGET...]
                   the cargo-fuzz targets (decode, proc_stat, proc_files, btf, cli_values,
                   audit), N seconds each (default 60); installs cargo-fuzz if missing
  vmtest [KERNEL...] [-- TEST-ARGS]
                   the kernel integration tests on each KERNEL: a Debian series (5.10,
                   6.1, 6.12: its newest amd64 image, fetched and cached), `host`, or a
                   bzImage path; default: 5.10 6.1 6.12 host. Prints a table of results.
  bench [--quick] [--procs N] [--reps N] [--idle-secs N] [--sleepers N] [--only LIST]
        [--before REV]
                   overhead, completeness, reader CPU per traced process, hook cost,
                   memory, idle CPU, latency, the lineage checkpoint (restarts) and the
                   report on a million-line audit, side by side with no tracer and with
                   perf, forkstat and bpftrace (sections for --only: overhead, reader,
                   hooks, memory, idle, latency, state, report, before); with --before, this build's reader CPU, cost of tracking and
                   latency against git revision REV's, built from a worktree
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
            let gateway = root.join("examples/leaky-gateway.sh");
            let args = ["--duration", "6s", "--", gateway.to_str().context("path")?];
            run_reaper(&root, &args.map(String::from))
        }
        Some("run") => {
            setup::ensure_all()?;
            build(&root, true)?;
            run_reaper(&root, &args[1..])
        }
        Some("bench") => {
            let opts = bench::BenchOptions::parse(&args[1..])?;
            prereqs::install(&[prereqs::Need::Bench])?;
            setup::ensure_all()?;
            build(&root, true)?;
            bench::run(&root, &opts)?;
            Ok(ExitCode::SUCCESS)
        }
        Some("test") => {
            let (mut vm, mut dist) = (true, true);
            for flag in &args[1..] {
                match flag.as_str() {
                    "--no-vm" => vm = false,
                    "--no-dist" => dist = false,
                    other => bail!("unknown argument to test: {other}"),
                }
            }
            // Every program any step runs, before the first step runs.
            let mut needs = vec![prereqs::Need::Test];
            needs.extend(dist.then_some(prereqs::Need::Dist));
            needs.extend(vm.then_some(prereqs::Need::Vm));
            prereqs::install(&needs)?;
            setup::ensure_all()?;
            test(&root, vm, dist)?;
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
            let (specs, test_args) = match args[1..].iter().position(|a| a == "--") {
                Some(i) => (&args[1..i + 1], &args[i + 2..]),
                None => (&args[1..], &[][..]),
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
            let outcomes = vmtest::run(&root, &kernels, test_args)?;
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

fn test(root: &Path, vm: bool, dist: bool) -> Result<()> {
    cargo(root, &["fmt", "--all", "--", "--check"]).context("formatting: run `cargo fmt --all`")?;
    cargo(root, &["clippy", "--all-targets", "--", "-D", "warnings"])?;
    clippy_ebpf(root)?;
    // The integration tests run the workspace's binaries: build them first.
    build(root, false)?;
    pypi::junit_schema(root)?;
    // The real Hermes gateway, with stdio MCP servers written with the mcp SDK.
    let hermes = pypi::hermes_venv(root, pypi::HERMES, "hermes-venv")?;
    let leaking = pypi::hermes_venv(root, pypi::HERMES_LEAKING, "hermes-0.14-venv")?;
    // CPython 3.13 and 3.14 for the Python spawn-site tests.
    let python_root = debian::python_root()?;
    // The MCP TypeScript SDK for the Node MCP host's spawn-site test.
    let mcp_sdk = npm::mcp_sdk(root)?;
    // The artifacts' tests get this run's artifacts by name, never whatever lies in
    // target/dist; without them (`--no-dist`) they are left out, not skipped.
    let mut env: Vec<(&str, std::ffi::OsString)> = vec![
        ("REAPER_HERMES_VENV", hermes.into_os_string()),
        ("REAPER_HERMES_LEAKING_VENV", leaking.into_os_string()),
        ("REAPER_PYTHON_ROOT", python_root.into_os_string()),
        ("REAPER_MCP_SDK", mcp_sdk.into_os_string()),
        // `CI=true`: every prerequisite was installed above, so a test that would skip fails
        // instead (as it does in the guests, whose init sets it too).
        ("CI", "true".into()),
    ];
    // Every skip is written here (tests/src/lib.rs `skip`), to be counted apart from passes.
    let skips = root.join("target/test-skips.log");
    let _ = std::fs::remove_file(&skips);
    env.push(("REAPER_SKIP_LOG", skips.clone().into_os_string()));
    let mut filters = Vec::new();
    if dist {
        // The artifacts are tested as installed: the package in a fresh Debian root, the
        // image under podman.
        let made = dist::run(root)?;
        env.extend([
            ("REAPER_DIST_TARBALL", made.tarball.into_os_string()),
            ("REAPER_DIST_DEB", made.deb.into_os_string()),
            ("REAPER_DIST_IMAGE", made.image.into_os_string()),
            (
                "REAPER_DEBIAN_ROOT",
                debian::test_root(root)?.into_os_string(),
            ),
        ]);
    } else {
        filters.extend(["--skip", "installed_artifacts::"]);
    }
    let (mut passed, mut failed) = cargo_test(root, &env, &filters)?;
    // A short fuzz run of every target: each clean target counts as a passed test.
    let targets = fuzz::TARGETS.map(String::from);
    let (clean, crashed) = fuzz::run(root, FUZZ_SECS_IN_TEST, &targets)?;
    passed += clean.len() as u64;
    failed += crashed.len() as u64;
    let mut broken = Vec::new();
    if vm {
        let kernels = vmtest::DEFAULT_KERNELS
            .iter()
            .map(|k| vmtest::Kernel::parse(k))
            .collect::<Result<Vec<_>>>()?;
        for o in vmtest::run(root, &kernels, &[])? {
            passed += o.passed;
            failed += o.failed;
            if let Some(p) = &o.problem {
                broken.push(format!("{}: {p}", o.label));
            } else if o.passed == 0 {
                broken.push(format!("{}: no test ran", o.label));
            }
        }
    }
    // One closing line for the whole run, whatever order cargo printed its binaries in. A
    // skip under CI=true is a failure; the count says how many failures were skips.
    let skipped: Vec<String> = std::fs::read_to_string(&skips)
        .map(|t| t.lines().map(str::to_owned).collect())
        .unwrap_or_default();
    for line in &skipped {
        println!("skipped {line}");
    }
    println!(
        "{passed} passed, {failed} failed, {} skipped on this host",
        skipped.len()
    );
    if failed > 0 {
        bail!("{failed} tests failed");
    }
    if !broken.is_empty() {
        bail!("the kernel matrix did not complete: {}", broken.join("; "));
    }
    Ok(())
}

/// Clippy on the kernel programs, which only build for the BPF target with nightly.
fn clippy_ebpf(root: &Path) -> Result<()> {
    let flags = ["--cfg=bpf_target_arch=\"x86_64\"", "-Ctarget-cpu=v3"].join("\x1f");
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
        .arg(root.join("target/ebpf-clippy"))
        .args(["--", "-D", "warnings"])
        .env("CARGO_ENCODED_RUSTFLAGS", flags)
        .current_dir(root.join("reaper-ebpf"))
        .status()
        .context("running clippy on reaper-ebpf")?;
    if !status.success() {
        bail!("clippy on reaper-ebpf failed ({status})");
    }
    Ok(())
}

/// Runs `cargo test`, passing its output through, and adds up its `test result:` lines.
fn cargo_test(
    root: &Path,
    env: &[(&str, std::ffi::OsString)],
    filters: &[&str],
) -> Result<(u64, u64)> {
    // Every test binary runs, whatever an earlier one found.
    let mut child = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["test", "--no-fail-fast", "--", "--test-threads=2"])
        .args(filters)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .current_dir(root)
        .stdout(Stdio::piped())
        .spawn()
        .context("running cargo test")?;
    let (mut passed, mut failed) = (0, 0);
    for line in BufReader::new(child.stdout.take().context("cargo test stdout")?).lines() {
        let line = line?;
        println!("{line}");
        if let Some(rest) = line.strip_prefix("test result: ") {
            passed += count_before(rest, " passed");
            failed += count_before(rest, " failed");
        }
    }
    let status = child.wait()?;
    if !status.success() && failed == 0 {
        bail!("`cargo test` failed ({status})");
    }
    Ok((passed, failed))
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
    use super::count_before;

    #[test]
    fn counts_cargo_test_result_lines() {
        let ok = "ok. 10 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 2.1s";
        assert_eq!(
            (count_before(ok, " passed"), count_before(ok, " failed")),
            (10, 0)
        );
        let bad = "FAILED. 9 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out";
        assert_eq!(
            (count_before(bad, " passed"), count_before(bad, " failed")),
            (9, 2)
        );
        assert_eq!(count_before("garbage", " passed"), 0);
    }
}
