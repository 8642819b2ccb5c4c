//! What the running kernel offers, probed at start-up rather than guessed from its version:
//! distribution kernels backport and configure features away, so a version number proves
//! nothing. What reaper-trace cannot work without is an error naming the missing piece; what it
//! can work around is picked or degraded by the caller (the setsid hook, for example).
use anyhow::{Result, bail};
use aya::{
    maps::MapType,
    programs::ProgramType,
    sys::{is_map_supported, is_program_supported},
};

/// The probed facts.
#[derive(Clone, Debug)]
pub struct KernelFeatures {
    /// `uname -r`.
    pub release: String,
    /// BPF ring buffer maps (Linux 5.8+); `None`: the probe itself failed (no privileges:
    /// loading will say so).
    pub ring_buffer: Option<bool>,
    /// BTF-typed tracing programs, for `tp_btf` (Linux 5.5+); `None` as above.
    pub btf_tracing: Option<bool>,
    /// `pidfd_open` (Linux 5.3+): signals that cannot reach a recycled pid.
    pub pidfd: bool,
}

impl KernelFeatures {
    pub fn probe() -> KernelFeatures {
        KernelFeatures {
            release: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map(|s| s.trim().to_owned())
                .unwrap_or_else(|_| "unknown".into()),
            ring_buffer: is_map_supported(MapType::RingBuf).ok(),
            btf_tracing: is_program_supported(ProgramType::Tracing).ok(),
            pidfd: pidfd_open_works(),
        }
    }

    /// Fails, saying what is missing, when the probes cannot run on this kernel at all.
    pub fn require(&self) -> Result<()> {
        let mut missing = Vec::new();
        if self.ring_buffer == Some(false) {
            missing.push("BPF ring buffer maps (Linux 5.8+)");
        }
        if self.btf_tracing == Some(false) {
            missing.push("BTF tracing programs (Linux 5.5+, CONFIG_DEBUG_INFO_BTF=y)");
        }
        if !missing.is_empty() {
            bail!(
                "kernel {} lacks {}: reaper-trace needs Linux 5.12 or newer (see the README's \
                 supported kernels)",
                self.release,
                missing.join(" and ")
            );
        }
        Ok(())
    }
}

fn pidfd_open_works() -> bool {
    // SAFETY: plain syscalls; the fd is ours and closed at once.
    unsafe {
        let fd = libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0);
        if fd < 0 {
            return false;
        }
        libc::close(fd as i32);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_kernel_has_what_reaper_needs() {
        let f = KernelFeatures::probe();
        assert!(!f.release.is_empty());
        // Probing the BPF features needs privileges; pidfd does not.
        assert!(f.pidfd, "pidfd_open is in every kernel since 5.3");
        // SAFETY: plain syscall.
        if unsafe { libc::geteuid() } == 0 {
            f.require().unwrap();
        }
    }
}
