//! Debian packages the helpers need: tools installed on demand, kernels fetched into a cache.
use std::{
    cmp::Ordering,
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context, Result, bail};

use crate::arch::Arch;

/// Whether `bin` is on the PATH.
pub fn have(bin: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {bin}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Installs `packages` from Debian in one `apt-get install` (after `apt-get update` when the
/// machine has no package lists yet, or the first try fails). What is still missing after it
/// is for the caller to name ([`crate::prereqs::install`]).
pub fn install(packages: &[&str]) {
    if packages.is_empty() {
        return;
    }
    let install = || {
        Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(packages)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let update = || {
        let _ = Command::new("apt-get")
            .args(["update", "-qq"])
            .stdout(Stdio::null())
            .status();
    };
    if !has_package_lists() {
        update();
    }
    if !install() {
        // The lists may be old (a package moved to a newer version).
        update();
        install();
    }
}

/// Whether apt has package lists (a fresh machine has none until `apt-get update`; apt may
/// keep them compressed, `..._Packages.lz4`).
fn has_package_lists() -> bool {
    fs::read_dir("/var/lib/apt/lists").is_ok_and(|d| {
        d.flatten()
            .any(|e| e.file_name().to_string_lossy().contains("_Packages"))
    })
}

/// Where fetched kernels and Debian roots are kept: outside the repository, across runs.
fn cache(what: &str) -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/var/cache"));
    base.join("reaper").join(what)
}

fn kernel_cache() -> PathBuf {
    cache("kernels")
}

/// This machine's Debian release (`bookworm`).
fn machine_release() -> Result<String> {
    let os = fs::read_to_string("/etc/os-release").unwrap_or_default();
    os.lines()
        .find_map(|l| l.strip_prefix("VERSION_CODENAME="))
        .map(|c| c.trim_matches('"').to_owned())
        .context("/etc/os-release names no VERSION_CODENAME: is this Debian?")
}

/// Runs `mmdebstrap --mode=root --quiet ARGS SUITE INTO` from Debian's archive; `what` names
/// the root in its error.
fn mmdebstrap(args: &[&str], suite: &str, into: &Path, what: &str) -> Result<()> {
    mmdebstrap_by(Command::new("mmdebstrap"), args, suite, into, what)
}

/// [`mmdebstrap`] run by `cmd` (which names mmdebstrap as its last argument).
fn mmdebstrap_by(
    mut cmd: Command,
    args: &[&str],
    suite: &str,
    into: &Path,
    what: &str,
) -> Result<()> {
    let status = cmd
        .args(["--mode=root", "--quiet"])
        .args(args)
        .arg(suite)
        .arg(into)
        .arg("http://deb.debian.org/debian")
        .status()
        .context("running mmdebstrap")?;
    if !status.success() {
        bail!("mmdebstrap {what} failed ({status})");
    }
    Ok(())
}

/// The programs another architecture's guests run (the guest's userland: what this machine's
/// own programs are to its own guests), with their libraries: Debian's files of this
/// machine's release for `arch`, unpacked and never run here (`mmdebstrap --variant=extract`:
/// no maintainer script, so no emulation), made once and cached.
pub fn guest_userland(arch: Arch) -> Result<PathBuf> {
    let release = machine_release()?;
    let dir = cache("roots").join(format!("{release}-{}-guest", arch.deb()));
    // The marker names the packages: a list that changed unpacks the root again.
    let complete = dir.join(".reaper-complete");
    let packages = GUEST_PACKAGES.join(",");
    if fs::read_to_string(&complete).is_ok_and(|made| made == packages) {
        return Ok(dir);
    }
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir)?;
    eprintln!(
        "xtask: unpacking Debian {release}'s {} programs for the guests (cached once)",
        arch.deb()
    );
    let arch_arg = format!("--arch={}", arch.deb());
    let include = format!("--include={packages}");
    let args = ["--variant=extract", arch_arg.as_str(), include.as_str()];
    mmdebstrap(
        &args,
        &release,
        &dir,
        &format!("--arch={} {release}", arch.deb()),
    )?;
    fs::write(&complete, &packages)?;
    Ok(dir)
}

/// The Debian packages of the programs the guests run (see vmtest's `guest_root`).
const GUEST_PACKAGES: &[&str] = &[
    "coreutils",
    "dash",
    "bash",
    "util-linux",
    "mount",
    "nodejs",
    "busybox-static",
    "python3.11",
    "procps",
    "grep",
];

/// A fresh minimal Debian root of this machine's release for `arch` (`mmdebstrap
/// --variant=minbase` from Debian's archive) with systemd as its init, as Debian installs
/// it (the package's tests boot it, and systemd starts the package's unit), as a tarball:
/// made once, cached, and linked at `target/test-tools/debian-root[-ARCH].tar` for the
/// package's tests. Another architecture's root is made with its programs run under
/// qemu-user (`tests/emulated.sh`: nothing is registered on the machine), its maintainer
/// scripts included: a root as Debian installs it.
pub fn test_root(root: &Path, arch: Arch) -> Result<PathBuf> {
    let release = machine_release().unwrap_or_else(|_| "bookworm".into());
    let suffix = match arch == Arch::host() {
        true => String::new(),
        false => format!("-{}", arch.deb()),
    };
    let cached = cache("roots").join(format!("{release}-minbase-systemd{suffix}.tar"));
    if !cached.is_file() {
        fs::create_dir_all(cached.parent().context("cache dir")?)?;
        eprintln!(
            "xtask: making a Debian {release} {} root with mmdebstrap (cached once)",
            arch.deb()
        );
        let partial = cached.with_extension("partial.tar");
        let arch_arg = format!("--arch={}", arch.deb());
        // The emulating namespace cannot mount /sys (it has no network namespace of its
        // own), and no maintainer script of minbase needs /proc or /sys: every root is made
        // without them.
        let args = [
            "--variant=minbase",
            "--include=systemd-sysv",
            &arch_arg,
            "--skip=chroot/mount",
        ];
        let by = match arch == Arch::host() {
            true => Command::new("mmdebstrap"),
            false => {
                let mut cmd = Command::new("sh");
                cmd.arg(root.join("tests/emulated.sh"))
                    .args([arch.name(), "mmdebstrap"]);
                cmd
            }
        };
        let what = format!("{release} {}", arch.deb());
        mmdebstrap_by(by, &args, &release, &partial, &what)?;
        fs::rename(&partial, &cached)?;
    }
    let link = root.join(format!("target/test-tools/debian-root{suffix}.tar"));
    fs::create_dir_all(link.parent().context("target dir")?)?;
    let _ = fs::remove_file(&link);
    std::os::unix::fs::symlink(&cached, &link)?;
    Ok(link)
}

/// A Debian sid root of `arch` with CPython 3.13 and 3.14, made once and cached: the Python
/// spawn-site tests run each of those interpreters in it (chroot), beside Debian's python3.11.
/// This machine's is installed (`mmdebstrap --variant=minbase`) and its tests run it here;
/// another architecture's is unpacked, never run here (`--variant=extract`: no maintainer
/// script, no emulation), with the links of a merged /usr (`/bin`, `/lib`: where its
/// programs name their loader), for that architecture's guests to hold (vmtest's
/// `guest_root`). The archive's sid index may be past its Valid-Until date (a frozen
/// mirror), which apt is told to accept.
pub fn python_root(arch: Arch) -> Result<PathBuf> {
    let here = arch == Arch::host();
    let dir = cache("roots").join(match here {
        true => "sid-python".to_owned(),
        false => format!("sid-python-{}", arch.deb()),
    });
    // An unpacked root has only what is named and what that depends on: the programs the
    // Python tests start there (`true`, `cat`, `sleep`, `sh`) are named too. The marker names the
    // packages: a list that changed makes the root again.
    let packages = match here {
        true => "python3.13,python3.14",
        false => "python3.13,python3.14,coreutils,dash",
    };
    let complete = dir.join(".reaper-complete");
    if fs::read_to_string(&complete).is_ok_and(|made| made == packages) {
        return Ok(dir);
    }
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir)?;
    eprintln!(
        "xtask: making a Debian sid {} root with python3.13 and python3.14 (cached once)",
        arch.deb()
    );
    let arch_arg = format!("--arch={}", arch.deb());
    let include = format!("--include={packages}");
    let args = [
        match here {
            true => "--variant=minbase",
            false => "--variant=extract",
        },
        arch_arg.as_str(),
        "--aptopt=Acquire::Check-Valid-Until \"false\"",
        include.as_str(),
    ];
    mmdebstrap(&args, "sid", &dir, "sid (python3.13, python3.14)")?;
    if !here {
        for link in ["bin", "lib", "sbin"] {
            if dir.join(link).symlink_metadata().is_err() {
                std::os::unix::fs::symlink(format!("usr/{link}"), dir.join(link))?;
            }
        }
    }
    fs::write(&complete, packages)?;
    Ok(dir)
}

/// The Debian release whose archive carries a kernel series this machine's release does not:
/// 5.10, the series before the oldest supported one (5.12), is bullseye's.
fn release_of(series: &str) -> Option<&'static str> {
    match series {
        "5.10" => Some("bullseye"),
        _ => None,
    }
}

/// apt options that read `release`'s package lists for architecture `arch` instead of the
/// machine's, from a private configuration in the cache: the machine's own Debian sources with
/// its codename swapped for `release` (same mirrors, same keyring). The machine's apt state
/// (its releases, its architectures) is left alone.
fn private_apt(release: &str, arch: Arch) -> Result<Vec<String>> {
    let dir = kernel_cache().join(match arch == Arch::host() {
        true => format!("apt-{release}"),
        false => format!("apt-{release}-{}", arch.deb()),
    });
    let lists = dir.join("lists");
    let parts = dir.join("sources.list.d");
    fs::create_dir_all(lists.join("partial"))?;
    fs::create_dir_all(&parts)?;
    let codename = machine_release()?;
    let ours = fs::read_to_string("/etc/apt/sources.list.d/debian.sources")
        .context("reading /etc/apt/sources.list.d/debian.sources (the Debian mirrors to use)")?;
    fs::write(
        parts.join("debian.sources"),
        ours.replace(&codename, release),
    )?;
    let opt = |k: &str, v: &Path| ["-o".to_owned(), format!("{k}={}", v.display())];
    let mut opts = Vec::new();
    opts.extend(opt("Dir::Etc::SourceList", &dir.join("none.list")));
    opts.extend(opt("Dir::Etc::SourceParts", &parts));
    opts.extend(opt("Dir::State::Lists", &lists));
    opts.extend(["-o".into(), "Dir::Cache::pkgcache=".into()]);
    opts.extend(["-o".into(), "Dir::Cache::srcpkgcache=".into()]);
    opts.extend(["-o".into(), format!("APT::Architecture={}", arch.deb())]);
    opts.extend(["-o".into(), format!("APT::Architectures={}", arch.deb())]);
    // Compressed or not (`..._Packages.lz4`).
    let has_lists = fs::read_dir(&lists)?
        .any(|e| e.is_ok_and(|e| e.file_name().to_string_lossy().contains("_Packages")));
    if !has_lists {
        eprintln!(
            "xtask: fetching Debian {release}'s package lists for {} (for its kernel)",
            arch.deb()
        );
        let ok = Command::new("apt-get")
            .args(&opts)
            .args(["update", "-qq"])
            .stdout(Stdio::null())
            .status()
            .context("running apt-get update")?
            .success();
        if !ok {
            bail!("`apt-get update` of Debian {release}'s lists failed");
        }
    }
    Ok(opts)
}

/// apt options for `series` on `arch`: none for the machine's own release and architecture.
fn apt_opts(series: &str, arch: Arch) -> Result<Vec<String>> {
    match (release_of(series), arch == Arch::host()) {
        (Some(release), _) => private_apt(release, arch),
        (None, false) => private_apt(&machine_release()?, arch),
        (None, true) => Ok(Vec::new()),
    }
}

/// Debian's newest generic kernel image package of the `series` line (`5.10`, `6.1`, `6.12`)
/// for `arch`.
pub fn newest_kernel_package(series: &str, arch: Arch) -> Result<String> {
    let opts = apt_opts(series, arch)?;
    let search = || -> Result<Vec<String>> {
        let out = Command::new("apt-cache")
            .args(&opts)
            .args(["search", "--names-only", &format!("^linux-image-{series}")])
            .output()
            .context("running apt-cache search")?;
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .filter(|name| is_generic_image(name, series, arch.deb()))
            .map(str::to_owned)
            .collect())
    };
    let mut names = search()?;
    if names.is_empty() {
        let _ = Command::new("apt-get")
            .args(["update", "-qq"])
            .stdout(Stdio::null())
            .status();
        names = search()?;
    }
    names
        .into_iter()
        .max_by(|a, b| natural_cmp(a, b))
        .with_context(|| {
            format!(
                "Debian offers no linux-image-{series}.*-{}-unsigned package",
                arch.deb()
            )
        })
}

/// `linux-image-6.1.0-56-amd64-unsigned`, `linux-image-6.12.117+deb12-arm64-unsigned`: the
/// plain flavour for Debian architecture `deb` of exactly this series (not cloud, rt or
/// debug, not 6.10 for 6.1).
fn is_generic_image(name: &str, series: &str, deb: &str) -> bool {
    let Some(rest) = name
        .strip_prefix("linux-image-")
        .and_then(|r| r.strip_prefix(series))
    else {
        return false;
    };
    let Some(middle) = rest
        .strip_suffix("-unsigned")
        .and_then(|r| r.strip_suffix(deb))
        .and_then(|r| r.strip_suffix('-'))
    else {
        return false;
    };
    // After the series: `.0-56` or `.117+deb12`; a digit right after would be another series.
    middle.starts_with('.')
        && middle[1..].starts_with(|c: char| c.is_ascii_digit())
        && !middle.contains("cloud")
        && !middle.contains("rt")
}

/// Compares names with their digit runs as numbers (`6.1.0-9` < `6.1.0-56`).
fn natural_cmp(a: &str, b: &str) -> Ordering {
    fn chunks(s: &str) -> Vec<(bool, &str)> {
        let mut out = Vec::new();
        let mut start = 0;
        let bytes = s.as_bytes();
        for i in 1..=bytes.len() {
            if i == bytes.len() || bytes[i].is_ascii_digit() != bytes[start].is_ascii_digit() {
                out.push((bytes[start].is_ascii_digit(), &s[start..i]));
                start = i;
            }
        }
        out
    }
    for (x, y) in chunks(a).into_iter().zip(chunks(b)) {
        let ord = match (x, y) {
            ((true, x), (true, y)) => x.len().cmp(&y.len()).then_with(|| x.cmp(y)),
            ((_, x), (_, y)) => x.cmp(y),
        };
        if ord != Ordering::Equal {
            return ord;
        }
    }
    a.len().cmp(&b.len())
}

/// A Debian kernel for the guests: its image, its release (`uname -r`), and its `unix_diag`
/// module. The guests boot with no modules, but Debian builds sock_diag for UNIX sockets as
/// one, and the Node host tests need it to name socket peers (a host loads it on demand).
pub struct DebianKernel {
    pub image: PathBuf,
    pub release: String,
    pub unix_diag: PathBuf,
}

/// The kernel of Debian package `pkg` (of `series`, for `arch`), downloaded and cached on
/// first use.
pub fn kernel(pkg: &str, series: &str, arch: Arch) -> Result<DebianKernel> {
    let dir = kernel_cache().join(pkg);
    let cached = || -> Option<DebianKernel> {
        let kernel = DebianKernel {
            image: dir.join("vmlinuz"),
            release: fs::read_to_string(dir.join("release")).ok()?,
            unix_diag: dir.join("unix_diag.ko"),
        };
        (kernel.image.exists() && kernel.unix_diag.exists()).then_some(kernel)
    };
    if let Some(kernel) = cached() {
        return Ok(kernel);
    }
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let work = dir.join("download");
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work)?;
    eprintln!(
        "xtask: downloading {pkg} from Debian into {}",
        dir.display()
    );
    let status = Command::new("apt-get")
        .args(apt_opts(series, arch)?)
        .args(["download", "-qq", pkg])
        .current_dir(&work)
        .status()
        .context("running apt-get download")?;
    if !status.success() {
        bail!("`apt-get download {pkg}` failed ({status})");
    }
    let deb = fs::read_dir(&work)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .context("apt-get download left no .deb")?;
    extract(&deb, &work)?;
    let vmlinuz = fs::read_dir(work.join("boot"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("vmlinuz-"))
        })
        .with_context(|| format!("{pkg} has no /boot/vmlinuz-*"))?;
    let module = find_file(&work, "unix_diag.ko")
        .with_context(|| format!("{pkg} has no unix_diag module"))?;
    // .../modules/RELEASE/kernel/net/unix/unix_diag.ko[.xz]
    let release = module
        .ancestors()
        .find(|a| a.parent().is_some_and(|p| p.ends_with("modules")))
        .and_then(|a| a.file_name())
        .with_context(|| format!("no modules/RELEASE/ in {}", module.display()))?
        .to_string_lossy()
        .into_owned();
    unpack_module(&module, &dir.join("unix_diag.ko"))?;
    fs::write(dir.join("release"), &release)?;
    fs::rename(&vmlinuz, dir.join("vmlinuz"))?;
    fs::remove_dir_all(&work)?;
    cached().context("the kernel cache is incomplete after extracting")
}

/// Extracts `./boot` and the `unix_diag` module of a .deb (the guests need no other module).
fn extract(deb: &Path, into: &Path) -> Result<()> {
    let script = "dpkg-deb --fsys-tarfile \"$1\" | tar -x -C \"$2\" --wildcards \
                  './boot/vmlinuz-*' '*/unix_diag.ko*'";
    let status = Command::new("sh")
        .args(["-c", script, "sh"])
        .arg(deb)
        .arg(into)
        .status()
        .context("extracting the kernel")?;
    if !status.success() {
        bail!(
            "extracting the kernel from {} failed ({status})",
            deb.display()
        );
    }
    Ok(())
}

/// The first file under `dir` whose name starts with `prefix`.
fn find_file(dir: &Path, prefix: &str) -> Option<PathBuf> {
    for entry in fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if let Some(found) = find_file(&path, prefix) {
                return Some(found);
            }
        } else if entry.file_name().to_string_lossy().starts_with(prefix) {
            return Some(path);
        }
    }
    None
}

/// Copies a module to `to`, decompressed (Debian compresses them with xz or zstd).
fn unpack_module(module: &Path, to: &Path) -> Result<()> {
    let tool = match module.extension().and_then(|e| e.to_str()) {
        Some("xz") => "xz",
        Some("zst") => "zstd",
        _ => {
            fs::copy(module, to)?;
            return Ok(());
        }
    };
    let out = Command::new(tool)
        .args(["-dc"])
        .arg(module)
        .output()
        .with_context(|| format!("running {tool} -dc"))?;
    if !out.status.success() {
        bail!("{tool} -dc {} failed ({})", module.display(), out.status);
    }
    fs::write(to, out.stdout)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_generic_image_of_one_series() {
        let generic = |name: &str, series: &str| is_generic_image(name, series, "amd64");
        assert!(generic("linux-image-6.1.0-56-amd64-unsigned", "6.1"));
        assert!(generic("linux-image-6.12.117+deb12-amd64-unsigned", "6.12"));
        assert!(!generic("linux-image-6.12.117+deb12-amd64-unsigned", "6.1"));
        assert!(!generic("linux-image-6.1.0-56-cloud-amd64-unsigned", "6.1"));
        assert!(!generic("linux-image-6.1.0-56-rt-amd64-unsigned", "6.1"));
        assert!(!generic("linux-image-6.1.0-56-amd64", "6.1"));
        assert!(!generic("linux-image-6.1.0-56-amd64-dbg", "6.1"));
        // Another architecture's: only when asked for.
        assert!(!generic(
            "linux-image-6.12.118+deb12-arm64-unsigned",
            "6.12"
        ));
        let arm64 = |name: &str| is_generic_image(name, "6.12", "arm64");
        assert!(arm64("linux-image-6.12.118+deb12-arm64-unsigned"));
        assert!(!arm64("linux-image-6.12.118+deb12-cloud-arm64-unsigned"));
        assert!(!arm64("linux-image-6.12.118+deb12-rt-arm64-unsigned"));
        assert!(!arm64("linux-image-6.12.118+deb12-amd64-unsigned"));
    }

    #[test]
    fn natural_order_reads_numbers_as_numbers() {
        let mut v = [
            "linux-image-6.1.0-9-amd64-unsigned",
            "linux-image-6.1.0-56-amd64-unsigned",
            "linux-image-6.1.0-47-amd64-unsigned",
        ];
        v.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(v[2], "linux-image-6.1.0-56-amd64-unsigned");
        assert_eq!(natural_cmp("a-117", "a-99"), Ordering::Greater);
    }
}
