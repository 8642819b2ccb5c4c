//! A script of one's own as the init of a guest of each architecture, for what is measured
//! across architectures rather than tested (`cargo xtask bench --only arches`).
use std::{path::Path, time::Duration};

use anyhow::{Context, Result, bail};

use super::{EXIT_MARK, Guest, Kernel, boot, build_binaries, debian_kernels, guest_root};
use crate::arch::Arch;

/// Runs `script` of each architecture (shell, after the guests' usual start: see
/// `guest_root::init_prelude`) as the init of a guest of that architecture on Debian's
/// kernel of `series`, the two guests at once (one a core), each root holding the
/// workspace's binaries built for it and the programs the tests run; returns each one's
/// console, or why it did not finish within `limit`. For measurements compared across
/// architectures (`cargo xtask bench`).
pub fn script_on_each_arch(
    root: &Path,
    series: &str,
    script: impl Fn(Arch) -> String,
    limit: Duration,
) -> Result<Vec<(Arch, Vec<String>)>> {
    let kernels: Vec<Kernel> = Arch::ALL
        .map(|arch| Kernel::Debian {
            series: series.to_owned(),
            arch,
        })
        .into();
    let fetched = debian_kernels(&kernels)?;
    let mut guests = Vec::new();
    for (_, arch, kernel) in &fetched {
        build_binaries(root, *arch)?;
        let mut fs = guest_root::with_programs(root, *arch, &[])?;
        let init = format!(
            // In a subshell: a script that exits still ends with the mark and the power-off.
            "{}(\n{}\n)\necho \"{EXIT_MARK}$?\"\nbusybox poweroff -f\n",
            guest_root::init_prelude(*arch),
            script(*arch)
        );
        fs.data("/init", init.into_bytes(), 0o755);
        let initrd = root.join(format!("target/vmtest/script-{}.cpio", arch.name()));
        std::fs::create_dir_all(initrd.parent().context("target dir")?)?;
        fs.write(&initrd)?;
        guests.push(Guest {
            label: format!("{series} {}", arch.deb()),
            arch: *arch,
            image: kernel.image.clone(),
            initrd,
            runs: Vec::new(),
            tests: 0,
        });
    }
    std::thread::scope(|scope| {
        let booted: Vec<_> = guests
            .iter()
            .map(|guest| scope.spawn(move || (guest.arch, boot(guest, limit))))
            .collect();
        booted
            .into_iter()
            .map(|b| {
                let (arch, booted) = b.join().expect("a guest's thread");
                let (log, problem) = booted?;
                match problem {
                    Some(p) => bail!("the {} guest: {p}", arch.name()),
                    None => Ok((arch, log)),
                }
            })
            .collect()
    })
}
