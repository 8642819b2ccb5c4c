//! tracefs: found, or mounted when missing, for the classic `syscalls/sys_exit_setsid`
//! tracepoint (the BTF tracepoints need none of this).
use std::{fs, path::PathBuf};

use anyhow::{Context, Result, anyhow};

const MOUNT_POINT: &str = "/sys/kernel/tracing";
const CANDIDATES: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

/// Where tracefs is, and whether reaper-trace mounted it.
#[derive(Debug, Clone)]
pub struct Tracefs {
    pub root: PathBuf,
    pub mounted_by_us: bool,
}

fn find() -> Option<PathBuf> {
    CANDIDATES
        .iter()
        .map(PathBuf::from)
        .find(|p| p.join("events").is_dir())
}

/// Finds tracefs, mounting it at /sys/kernel/tracing when it is not mounted anywhere.
pub fn find_or_mount() -> Result<Tracefs> {
    if let Some(root) = find() {
        return Ok(Tracefs {
            root,
            mounted_by_us: false,
        });
    }
    nix::mount::mount(
        Some("nodev"),
        MOUNT_POINT,
        Some("tracefs"),
        nix::mount::MsFlags::MS_NOSUID
            | nix::mount::MsFlags::MS_NODEV
            | nix::mount::MsFlags::MS_NOEXEC,
        None::<&str>,
    )
    .map_err(|e| anyhow!("tracefs is not mounted and mounting it at {MOUNT_POINT} failed: {e}"))?;
    find()
        .map(|root| Tracefs {
            root,
            mounted_by_us: true,
        })
        .ok_or_else(|| anyhow!("mounted tracefs at {MOUNT_POINT} but it has no events/"))
}

impl Tracefs {
    /// Offset of `field` in the records of tracepoint `category/event`, from its format file.
    pub fn field_offset(&self, category: &str, event: &str, field: &str) -> Result<u64> {
        let path = self
            .root
            .join("events")
            .join(category)
            .join(event)
            .join("format");
        let text = fs::read_to_string(&path).with_context(|| {
            format!(
                "reading {} (is CONFIG_FTRACE_SYSCALLS set?)",
                path.display()
            )
        })?;
        parse_field_offset(&text, field)
            .ok_or_else(|| anyhow!("{} has no field `{field}`", path.display()))
    }
}

/// Finds `offset:N` on the line declaring `field` in a tracepoint format file, e.g.
/// `field:long ret; offset:16; size:8; signed:1;` (tab-separated).
pub fn parse_field_offset(format: &str, field: &str) -> Option<u64> {
    format.lines().find_map(|line| {
        let decl = line.trim().strip_prefix("field:")?.split(';').next()?;
        let name = decl.rsplit([' ', '*']).next()?;
        let name = name.split('[').next()?;
        if name != field {
            return None;
        }
        line.split(';')
            .find_map(|part| part.trim().strip_prefix("offset:")?.parse().ok())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_from_a_format_file() {
        let format = "name: sys_exit_setsid\nID: 123\nformat:\n\
            \tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
            \tfield:int __syscall_nr;\toffset:8;\tsize:4;\tsigned:1;\n\
            \tfield:long ret;\toffset:16;\tsize:8;\tsigned:1;\n\
            \tfield:char comm[16];\toffset:24;\tsize:16;\tsigned:0;\n";
        assert_eq!(parse_field_offset(format, "ret"), Some(16));
        assert_eq!(parse_field_offset(format, "__syscall_nr"), Some(8));
        assert_eq!(parse_field_offset(format, "comm"), Some(24));
        assert_eq!(parse_field_offset(format, "missing"), None);
    }
}
