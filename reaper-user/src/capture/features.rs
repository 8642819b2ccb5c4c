//! What the running kernel offers, probed at start-up rather than guessed from its version:
//! distribution kernels backport and configure features away, so a version number proves
//! nothing. What reaper-trace cannot work without is an error naming the missing piece; what it
//! can work around is picked or degraded by the caller (the setsid hook, for example).
use anyhow::{Result, bail};
use aya::{maps::MapType, sys::is_map_supported};

/// The oldest kernel the probes load on: the BPF v3 atomic fetch-add (5.12) and
/// `bpf_get_current_task_btf` (5.11) are what older ones lack.
pub const OLDEST_SUPPORTED: (u32, u32) = (5, 12);

/// `(major, minor)` of a kernel release like `5.10.0-46-amd64`.
pub fn version_of(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// The probed facts. The BTF tracepoints need the kernel's BTF (read at load, whose absence
/// has a message of its own) and their `btf_trace_*` types (checked at load); no trial load of
/// a tracing program is made: a generic one is an fentry program, which Debian's 6.1 arm64
/// kernel refuses while its BTF tracepoints work.
#[derive(Clone, Debug)]
pub struct KernelFeatures {
    /// `uname -r`.
    pub release: String,
    /// BPF ring buffer maps (Linux 5.8+); `None`: the probe itself failed (no privileges:
    /// loading will say so).
    pub ring_buffer: Option<bool>,
}

impl KernelFeatures {
    pub fn probe() -> KernelFeatures {
        KernelFeatures {
            release: crate::procfs::kernel_release(),
            ring_buffer: is_map_supported(MapType::RingBuf).ok(),
        }
    }

    /// Fails, saying what is missing, when the probes cannot run on this kernel at all.
    pub fn require(&self) -> Result<()> {
        if self.ring_buffer == Some(false) {
            bail!(
                "kernel {} lacks BPF ring buffer maps (Linux 5.8+): {NEEDS_NEWER}",
                self.release
            );
        }
        Ok(())
    }
}

/// What an unsupported kernel is told.
pub const NEEDS_NEWER: &str =
    "reaper-trace needs Linux 5.12 or newer (see the README's supported kernels)";

/// Whether this release is older than [`OLDEST_SUPPORTED`] (unknown: no).
pub fn too_old(release: &str) -> bool {
    version_of(release).is_some_and(|v| v < OLDEST_SUPPORTED)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_and_refusals() {
        assert_eq!(version_of("5.10.0-46-amd64"), Some((5, 10)));
        assert_eq!(version_of("6.18.44-fc-v669"), Some((6, 18)));
        assert_eq!(version_of("garbage"), None);
        assert!(too_old("5.11.22") && too_old("4.19.0-27-amd64"));
        assert!(!too_old("5.12.0") && !too_old("6.1.0-56-amd64") && !too_old("?"));
        let old = KernelFeatures {
            release: "5.4.0".into(),
            ring_buffer: Some(false),
        };
        let err = old.require().unwrap_err().to_string();
        assert!(
            err.contains("lacks BPF ring buffer maps (Linux 5.8+)"),
            "{err}"
        );
        assert!(err.contains("needs Linux 5.12 or newer"), "{err}");
        let unprobed = KernelFeatures {
            ring_buffer: None,
            ..old
        };
        assert!(
            unprobed.require().is_ok(),
            "unprivileged probes: loading says why"
        );
    }

    #[test]
    fn this_kernel_has_what_reaper_needs() {
        let f = KernelFeatures::probe();
        assert!(!f.release.is_empty());
        // Probing the BPF features needs privileges.
        // SAFETY: plain syscall.
        if unsafe { libc::geteuid() } == 0 {
            f.require().unwrap();
        }
    }
}
