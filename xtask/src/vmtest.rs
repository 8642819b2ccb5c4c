//! `cargo xtask vmtest`: the kernel integration tests on other kernels, each booted under qemu.
//!
//! The guest's root filesystem is an initramfs holding the release test binaries, reaper-trace,
//! reaper-shapes, the host programs the tests run (sh, bash, env, setsid, true, sleep, cat, seq,
//! node and the Node host tests' scripts, the demo's example) and their shared libraries, at their host paths, plus a static busybox
//! for the guest's init. Debian kernels boot from it with one module, `unix_diag` (sock_diag
//! for UNIX sockets, which the Node host tests need; the serial console is built in). The
//! guest's init mounts /proc, /sys, /dev and /dev/pts (the initramfs itself is the writable
//! root, /tmp included: the workspace may live under /tmp), brings up loopback (for
//! `/metrics`), loads the module, runs the tests with `CI=true` (so nothing may skip), prints
//! their exit status and powers off. tracefs is left unmounted, as on a fresh host.
//!
//! Another architecture's guests (`aarch64:6.12`: Debian's arm64 kernel under
//! qemu-system-aarch64) get an initramfs of their own: the same tests and binaries built for
//! that architecture (static, see `Arch::cargo_env`), and the programs they run taken from
//! Debian's packages of that architecture ([`debian::guest_userland`]) with the libraries
//! their ELF headers name.
//!
//! The guests run under single-threaded TCG, one host core each, so two run at once (one per
//! core of the machines this project runs on), and each supported kernel's test binaries are
//! split into two guests of about equal test counts: the matrix takes about half of what one
//! guest after another took. A guest's time limit follows from its work: a boot allowance
//! plus an allowance per test it runs, and the cap one test may wait out (see
//! [`guest_limit`]).
use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use crate::{arch::Arch, debian, host_tests, tally::Tally};

mod guest_root;
mod script;
use guest_root::guest_root;
pub use guest_root::release_dir;
pub use script::script_on_each_arch;

/// The kernels of the matrix besides the running one: this machine's architecture's, and
/// arm64's of the two supported series. 5.10 is older than the oldest supported kernel
/// (5.12): there the tests check that it is refused, by name.
pub const DEFAULT_KERNELS: [&str; 5] = ["5.10", "6.1", "6.12", "aarch64:6.1", "aarch64:6.12"];

/// The line the guest prints when its tests are done.
const EXIT_MARK: &str = "reaper-vmtest: exit ";
const KERNEL_MARK: &str = "reaper-vmtest: kernel ";

/// What a guest may take to boot (the kernel under TCG, the initramfs unpacked) and to power
/// off, besides its tests.
const BOOT_ALLOWANCE: Duration = Duration::from_secs(240);
/// What one test may take in a guest, on average: the slowest kernel (6.1) ran its 83 tests
/// in 860 s (two guests side by side, 433 s and 427 s), 10.4 s a test (docs/testing.md); this
/// is about three times that.
const PER_TEST_ALLOWANCE: Duration = Duration::from_secs(30);
/// Guests booted at once: each is one TCG thread, one host core.
const LANES: usize = 2;
/// Guests a supported kernel's tests are split into.
const PARTS: usize = 2;

/// What a guest running `tests` tests is expected to take at most: a boot allowance and an
/// allowance per test. Past half of it, a warning.
fn guest_allowance(tests: usize) -> Duration {
    BOOT_ALLOWANCE + PER_TEST_ALLOWANCE * tests as u32
}

/// How long a guest of `arch` running `tests` tests may take before it is stopped: its
/// allowance, and room for one test to wait out its cap and print what it saw.
fn guest_limit(arch: Arch, tests: usize) -> Duration {
    guest_allowance(tests) + Duration::from_secs(guest_root::patience_secs(arch))
}

/// A kernel to test on.
#[derive(Clone, Debug)]
pub enum Kernel {
    /// The one this machine runs: the tests run natively.
    Host,
    /// A Debian series (`6.1`) of an architecture: its newest generic image
    /// (`aarch64:6.12` names arm64's; the bare series, this machine's architecture's).
    Debian { series: String, arch: Arch },
    /// A kernel image (bzImage) on disk, of this machine's architecture.
    Image(PathBuf),
}

impl Kernel {
    pub fn parse(spec: &str) -> Result<Kernel> {
        let is_series =
            |s: &str| s.split('.').count() == 2 && s.split('.').all(|p| p.parse::<u32>().is_ok());
        let (arch, series) = match spec.split_once(':') {
            Some((name, series)) => match Arch::ALL.into_iter().find(|a| a.name() == name) {
                Some(arch) => (arch, series),
                None => bail!("unknown architecture `{name}` in `{spec}`: x86_64 or aarch64"),
            },
            None => (Arch::host(), spec),
        };
        Ok(match series {
            "host" if arch == Arch::host() => Kernel::Host,
            s if is_series(s) => Kernel::Debian {
                series: s.to_owned(),
                arch,
            },
            s if arch == Arch::host() && Path::new(s).is_file() => Kernel::Image(PathBuf::from(s)),
            _ => bail!(
                "unknown kernel `{spec}`: give a series like 6.1 (aarch64:6.1 for arm64's), \
                 `host`, or a bzImage path"
            ),
        })
    }

    /// The architecture it runs.
    fn arch(&self) -> Arch {
        match self {
            Kernel::Debian { arch, .. } => *arch,
            Kernel::Host | Kernel::Image(_) => Arch::host(),
        }
    }

    /// Whether it is older than the oldest supported kernel (5.12), where only the refusal is
    /// tested. A bzImage's release is known only once it boots: it runs every test.
    fn is_before_support(&self) -> bool {
        let Kernel::Debian { series, .. } = self else {
            return false;
        };
        let mut parts = series.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
        let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
        (major, minor) < (5, 12)
    }

    fn label(&self) -> String {
        match self {
            Kernel::Host => "host".into(),
            Kernel::Debian { series, arch } if *arch == Arch::host() => format!("Debian {series}"),
            Kernel::Debian { series, arch } => format!("Debian {series} {}", arch.deb()),
            Kernel::Image(p) => p.display().to_string(),
        }
    }
}

/// How one kernel fared.
pub struct Outcome {
    pub label: String,
    /// `uname -r` as the tests saw it.
    pub release: String,
    /// What its tests came to; each failure named `NAME on LABEL`.
    pub tests: Tally,
    /// Why the run did not finish, if it did not.
    pub problem: Option<String>,
    pub secs: f64,
    /// The time limit it ran under, and what it was expected to take at most (none on the
    /// host).
    pub limit: Option<(Duration, Duration)>,
}

impl Outcome {
    pub fn ok(&self) -> bool {
        self.problem.is_none() && self.tests.failed == 0 && self.tests.passed > 0
    }
}

/// The matrix `cargo xtask test` runs.
pub fn default_kernels() -> Result<Vec<Kernel>> {
    DEFAULT_KERNELS.iter().map(|k| Kernel::parse(k)).collect()
}

/// The Debian kernels among `kernels`, each fetched (once: they are cached) by its series and
/// architecture.
pub fn debian_kernels(kernels: &[Kernel]) -> Result<Vec<(String, Arch, debian::DebianKernel)>> {
    let mut fetched = Vec::new();
    for kernel in kernels {
        if let Kernel::Debian { series, arch } = kernel {
            let pkg = debian::newest_kernel_package(series, *arch)?;
            fetched.push((series.clone(), *arch, debian::kernel(&pkg, series, *arch)?));
        }
    }
    Ok(fetched)
}

/// One guest to boot: a kernel image and the test binaries it runs (indices into the
/// initramfs's list).
struct Guest {
    label: String,
    arch: Arch,
    image: PathBuf,
    /// The initramfs of its architecture.
    initrd: PathBuf,
    runs: Vec<usize>,
    tests: usize,
}

/// Builds what the guests need, runs the tests on every kernel (the guests [`LANES`] at a
/// time, then the host), prints the table. Each architecture's guests share one initramfs
/// of that architecture's binaries; with `image` (the OCI archive `dist` made), each also
/// holds the binary of the image's variant for its architecture, which the demo runs.
pub fn run(
    root: &Path,
    kernels: &[Kernel],
    test_args: &[String],
    image: Option<&Path>,
) -> Result<Vec<Outcome>> {
    let host_exes = build(root, Arch::host())?;
    // Every Debian kernel first: each architecture's initramfs carries its kernels' unix_diag.
    let debian_kernels = debian_kernels(kernels)?;
    let mut guests = Vec::new();
    for arch in Arch::ALL {
        let theirs: Vec<&Kernel> = kernels
            .iter()
            .filter(|k| !matches!(k, Kernel::Host) && k.arch() == arch)
            .collect();
        if theirs.is_empty() {
            continue;
        }
        let test_exes = match arch == Arch::host() {
            true => host_exes.clone(),
            false => build(root, arch)?,
        };
        let initrd = root.join(format!("target/vmtest/initramfs-{}.cpio", arch.name()));
        std::fs::create_dir_all(initrd.parent().unwrap())?;
        let image_binary = image
            .map(|archive| crate::dist::image_binary(archive, arch, &root.join("target/vmtest")))
            .transpose()?;
        let mut guest = guest_root(root, arch, &test_exes, test_args, image_binary.as_deref())?;
        for (_, _, k) in debian_kernels.iter().filter(|(_, a, _)| *a == arch) {
            let at = format!("/lib/modules/{}/unix_diag.ko", k.release);
            guest.host_file_at(Path::new(&at), &k.unix_diag)?;
        }
        guest.write(&initrd)?;
        let counts = test_counts(arch, &test_exes, test_args)?;
        for kernel in theirs {
            let image = match kernel {
                Kernel::Host => continue,
                Kernel::Debian { series, .. } => debian_kernels
                    .iter()
                    .find(|(s, a, _)| s == series && *a == arch)
                    .map(|(_, _, k)| k.image.clone())
                    .context("a Debian kernel not fetched")?,
                Kernel::Image(image) => image.clone(),
            };
            guests.extend(split(kernel, &image, &initrd, &test_exes, &counts));
        }
    }
    // Longest first, so that the lanes end together.
    guests.sort_by_key(|g| std::cmp::Reverse(g.tests));
    let mut outcomes = boot_all(&guests)?;
    if kernels.iter().any(|k| matches!(k, Kernel::Host)) {
        let started = Instant::now();
        let (log, problem) = run_host(root, &host_exes, test_args)?;
        outcomes.push(outcome(
            Kernel::Host.label(),
            &log,
            problem,
            started.elapsed(),
        ));
    }
    print_table(&outcomes);
    Ok(outcomes)
}

/// How many tests each binary runs with `test_args` (its `--list`, on this machine: another
/// architecture's static binaries under qemu-user).
fn test_counts(arch: Arch, exes: &[PathBuf], test_args: &[String]) -> Result<Vec<usize>> {
    exes.iter()
        .map(|exe| {
            let mut list = match arch.runner() {
                Some(runner) => {
                    let mut c = Command::new(runner);
                    c.arg(exe);
                    c
                }
                None => Command::new(exe),
            };
            let out = list
                .args(["--list", "--format", "terse"])
                .args(test_args)
                .output()
                .with_context(|| format!("listing the tests of {}", exe.display()))?;
            Ok(String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter(|l| l.ends_with(": test"))
                .count())
        })
        .collect()
}

/// `kernel`'s guests: on a kernel older than the oldest supported one, one guest running only
/// the test that it is refused by name (the others would only show that it is); otherwise
/// [`PARTS`] guests sharing the binaries, the largest binary first to the guest with the
/// fewest tests so far.
fn split(
    kernel: &Kernel,
    image: &Path,
    initrd: &Path,
    exes: &[PathBuf],
    counts: &[usize],
) -> Vec<Guest> {
    let label = kernel.label();
    let arch = kernel.arch();
    if kernel.is_before_support() {
        let runs: Vec<usize> = (0..exes.len())
            .filter(|&i| is_support_test(&exes[i]))
            .collect();
        let tests = runs.iter().map(|&i| counts[i]).sum();
        return vec![Guest {
            label,
            arch,
            image: image.to_owned(),
            initrd: initrd.to_owned(),
            runs,
            tests,
        }];
    }
    let mut order: Vec<usize> = (0..exes.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(counts[i]));
    let mut guests: Vec<Guest> = (0..PARTS)
        .map(|p| Guest {
            label: format!("{label} ({}/{PARTS})", p + 1),
            arch,
            image: image.to_owned(),
            initrd: initrd.to_owned(),
            runs: Vec::new(),
            tests: 0,
        })
        .collect();
    for i in order {
        let lightest = guests
            .iter_mut()
            .min_by_key(|g| g.tests)
            .expect("PARTS > 0");
        lightest.runs.push(i);
        lightest.tests += counts[i];
    }
    // A filter (`-- TEST-ARGS`) may leave a part with nothing to run: no guest for it.
    guests.retain(|g| g.tests > 0);
    guests
}

/// Boots every guest, [`LANES`] at a time; their outcomes in the order given.
fn boot_all(guests: &[Guest]) -> Result<Vec<Outcome>> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..LANES.min(guests.len()) {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(guest) = guests.get(i) else { break };
                    let limit = guest_limit(guest.arch, guest.tests);
                    let started = Instant::now();
                    let result = boot(guest, limit).map(|(log, problem)| {
                        let mut o = outcome(guest.label.clone(), &log, problem, started.elapsed());
                        o.limit = Some((limit, guest_allowance(guest.tests)));
                        o
                    });
                    results.lock().unwrap().push((i, result));
                }
            });
        }
    });
    let mut results = results.into_inner().unwrap();
    results.sort_by_key(|(i, _)| *i);
    results.into_iter().map(|(_, r)| r).collect()
}

/// Whether `exe` is the `kernel_support` test (cargo names it `kernel_support-HASH`).
fn is_support_test(exe: &Path) -> bool {
    exe.file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with("kernel_support-"))
}

/// Test files that need the host rather than a kernel: the report's renders a page in
/// Chromium, the Prometheus one runs a Prometheus server, the Kubernetes one a schema
/// validator, the Hermes one a Python venv with the real gateway, none of which the guests
/// carry (their audits come from the host kernel's run).
const HOST_ONLY_TESTS: &[&str] = &[
    "report",
    "prometheus",
    "kubernetes",
    "ci_gate",
    "dist",
    "hermes",
    "service_unit",
    "go_sites",
    "mcp_sdk",
    "top",
];

/// Release builds of the binaries and of the kernel integration tests for `arch`; returns the
/// test executables.
fn build(root: &Path, arch: Arch) -> Result<Vec<PathBuf>> {
    build_binaries(root, arch)?;
    let mut test_args = vec!["--release", "--package", "reaper-tests", "--tests"];
    if arch != Arch::host() {
        test_args.extend(["--target", arch.triple()]);
    }
    let built = host_tests::test_binaries(root, &test_args, &arch.cargo_env())?;
    let exes: Vec<PathBuf> = built
        .into_iter()
        .filter(|b| b.kind == "test" && !HOST_ONLY_TESTS.contains(&b.target.as_str()))
        .map(|b| b.exe)
        .collect();
    if exes.is_empty() {
        bail!("cargo reported no integration test executables");
    }
    Ok(exes)
}

/// Release builds of the workspace's binaries for `arch` (see `guest_root::release_dir`).
fn build_binaries(root: &Path, arch: Arch) -> Result<()> {
    let owned = arch.cargo_env();
    let env: Vec<(&str, &str)> = owned
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let mut args = vec!["build", "--release", "--bins"];
    if arch != Arch::host() {
        arch.ensure_std()?;
        args.extend(["--target", arch.triple()]);
    }
    crate::cargo_env(root, &args, &env)
}

/// Boots `guest` with its architecture's initramfs, streaming its console with its label,
/// stopping it after `limit`. Returns the console lines, and a problem when the guest did not
/// finish its tests.
fn boot(guest: &Guest, limit: Duration) -> Result<(Vec<String>, Option<String>)> {
    let prefix = format!("[{}] ", guest.label);
    let runs: Vec<String> = guest.runs.iter().map(usize::to_string).collect();
    let append = format!(
        "console={} rdinit=/init panic=-1 quiet loglevel=3 reaper.run={}",
        guest.arch.console(),
        runs.join(",")
    );
    // TCG by default: nested KVM (this project's CI machines are VMs themselves) hangs the
    // guest kernel right after decompression, while TCG runs a kernel's tests in well under a
    // minute. REAPER_VMTEST_ACCEL=kvm asks for KVM where it works (this machine's own
    // architecture only).
    let kvm = guest.arch == Arch::host()
        && std::env::var("REAPER_VMTEST_ACCEL").is_ok_and(|a| a == "kvm");
    let (program, machine) = guest.arch.qemu();
    let mut qemu = Command::new(program);
    qemu.args(["-m", "2048", "-smp", "2", "-nographic", "-no-reboot"])
        .args(match kvm {
            true => &["-enable-kvm", "-cpu", "host"][..],
            false => &["-accel", "tcg,thread=single"][..],
        })
        .args(if kvm { &[][..] } else { machine })
        .arg("-kernel")
        .arg(&guest.image)
        .arg("-initrd")
        .arg(&guest.initrd)
        .arg("-append")
        .arg(&append)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut child = qemu
        .spawn()
        .with_context(|| format!("starting {program}"))?;
    let stdout = child.stdout.take().context("qemu stdout")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).split(b'\n') {
            let Ok(line) = line else { break };
            let text = String::from_utf8_lossy(&line)
                .trim_end_matches('\r')
                .to_owned();
            if tx.send(text).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + limit;
    let mut log = Vec::new();
    let mut problem = None;
    loop {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) => {
                println!("{prefix}{line}");
                log.push(line);
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                problem = Some(format!("timed out after {} s", limit.as_secs()));
                let _ = child.kill();
                break;
            }
        }
    }
    child.wait()?;
    if problem.is_none() && !log.iter().any(|l| l.contains(EXIT_MARK)) {
        let panic = log.iter().find(|l| l.contains("Kernel panic"));
        problem = Some(match panic {
            Some(p) => format!("the guest stopped before its tests ended: {}", p.trim()),
            None => "the guest stopped before its tests ended".into(),
        });
    }
    Ok((log, problem))
}

/// The same tests on the running kernel, natively.
fn run_host(
    root: &Path,
    test_exes: &[PathBuf],
    test_args: &[String],
) -> Result<(Vec<String>, Option<String>)> {
    let mut log = Vec::new();
    let mut status = 0;
    for exe in test_exes {
        let out = Command::new(exe)
            .arg("--test-threads=2")
            .args(test_args)
            .env("CI", "true")
            .current_dir(root.join("tests"))
            .stderr(Stdio::inherit())
            .output()
            .context("running the integration tests")?;
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            println!("[host] {line}");
            log.push(line.to_owned());
        }
        if !out.status.success() && status == 0 {
            status = out.status.code().unwrap_or(-1);
        }
    }
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    log.push(format!("{KERNEL_MARK}{}", release.trim()));
    log.push(format!("{EXIT_MARK}{status}"));
    Ok((log, None))
}

fn outcome(label: String, log: &[String], problem: Option<String>, took: Duration) -> Outcome {
    let mut tests = Tally::default();
    let mut release = String::from("?");
    for line in log {
        tests.read(line);
        if let Some(r) = line.split_once(KERNEL_MARK).map(|(_, r)| r) {
            release = r.trim().to_owned();
        }
    }
    let status_problem = log
        .iter()
        .find_map(|l| l.split_once(EXIT_MARK).map(|(_, c)| c.trim().to_owned()))
        .filter(|code| code != "0" && tests.failed == 0)
        .map(|code| format!("the test binary exited with {code}"));
    // Named with the kernel they failed on, for the run's closing lines.
    for f in &mut tests.failures {
        f.name = format!("{} on {label}", f.name);
    }
    Outcome {
        label,
        release,
        tests,
        problem: problem.or(status_problem),
        secs: took.as_secs_f64(),
        limit: None,
    }
}

fn print_table(outcomes: &[Outcome]) {
    println!();
    println!("| kernel | uname -r | passed | failed | result | time | limit |");
    println!("|---|---|---|---|---|---|---|");
    for o in outcomes {
        let result = match (&o.problem, o.ok()) {
            (Some(p), _) => format!("FAIL: {p}"),
            (None, true) => "pass".into(),
            (None, false) if o.tests.passed == 0 => "FAIL: no test ran".into(),
            (None, false) => "FAIL".into(),
        };
        let limit = match o.limit {
            Some((l, _)) => format!("{} s", l.as_secs()),
            None => "none".into(),
        };
        println!(
            "| {} | {} | {} | {} | {} | {:.0} s | {limit} |",
            o.label, o.release, o.tests.passed, o.tests.failed, result, o.secs
        );
    }
    // A guest past half of what it was expected to take is one slow machine away from being
    // cut (the limit's room for a test waiting out its cap is not for a slow pace): say so.
    for o in outcomes {
        if let Some((_, allowed)) = o.limit.filter(|(_, a)| o.secs > a.as_secs_f64() / 2.0) {
            println!(
                "warning: {} took {:.0} s, more than half the {} s its tests are allowed",
                o.label,
                o.secs,
                allowed.as_secs()
            );
        }
    }
}
