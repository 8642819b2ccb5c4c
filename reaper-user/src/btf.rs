//! Kernel struct offsets from the running kernel's BTF (`/sys/kernel/btf/vmlinux`).
//!
//! Rust eBPF emits no CO-RE relocations, so the probes read `task_struct` and friends through
//! offsets resolved here at start-up and passed in as a load-time global. Struct layouts differ
//! between kernel builds: nothing here may be a constant.
use std::path::Path;

use anyhow::{Context, Result, anyhow, bail};
use btfparse::{Offset, Readable, TypeInformation, TypeVariant};
use reaper_common::KernelOffsets;

/// Where the kernel exposes its own BTF.
pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// BTF bytes in memory: the parser makes millions of tiny reads, one syscall each on a file.
struct BtfBytes(Vec<u8>);

impl Readable for BtfBytes {
    fn read(&self, offset: u64, buffer: &mut [u8]) -> btfparse::Result<()> {
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        match start
            .checked_add(buffer.len())
            .and_then(|end| self.0.get(start..end))
        {
            Some(bytes) => {
                buffer.copy_from_slice(bytes);
                Ok(())
            }
            None => Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into()),
        }
    }
}

/// Parsed kernel BTF, for offset and feature look-ups.
pub struct KernelBtf {
    types: TypeInformation,
}

impl KernelBtf {
    /// Parses the running kernel's BTF.
    pub fn from_sys_fs() -> Result<Self> {
        Self::from_path(Path::new(VMLINUX_BTF))
    }

    pub fn from_path(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).with_context(|| {
            format!(
                "cannot open {}: this kernel exposes no BTF (it needs CONFIG_DEBUG_INFO_BTF=y)",
                path.display()
            )
        })?;
        let types = TypeInformation::new(&BtfBytes(bytes))
            .map_err(|e| anyhow!("parsing {}: {e:?}", path.display()))?;
        Ok(KernelBtf { types })
    }

    fn type_id(&self, name: &str) -> Result<u32> {
        self.types
            .id_of(name)
            .ok_or_else(|| anyhow!("kernel BTF has no type `{name}`"))
    }

    /// Byte offset of `path` (e.g. `pids[3]`, `numbers[0].nr`) in `struct ty`.
    pub fn offset(&self, ty: &str, path: &str) -> Result<u64> {
        let id = self.type_id(ty)?;
        match self.types.offset_of(id, path) {
            Ok((_, Offset::ByteOffset(off))) => Ok(u64::from(off)),
            Ok((_, Offset::BitOffsetAndSize(..))) => bail!("`{ty}.{path}` is a bit field"),
            Err(e) => Err(anyhow!("kernel BTF: no field `{ty}.{path}` ({e:?})")),
        }
    }

    /// Value of enumerator `name` in `enum ty`.
    pub fn enum_value(&self, ty: &str, name: &str) -> Result<u64> {
        let id = self.type_id(ty)?;
        match self.types.from_id(id) {
            Some(TypeVariant::Enum(e)) => e
                .named_value_list()
                .iter()
                .find(|v| v.name == name)
                .map(|v| match v.value {
                    btfparse::Integer32Value::Signed(n) => n as u64,
                    btfparse::Integer32Value::Unsigned(n) => u64::from(n),
                })
                .ok_or_else(|| anyhow!("kernel BTF: enum {ty} has no {name}")),
            _ => bail!("kernel BTF: `{ty}` is not an enum"),
        }
    }

    /// Whether the kernel has a BTF tracepoint named `name` (its `btf_trace_<name>` typedef).
    pub fn has_btf_tracepoint(&self, name: &str) -> bool {
        self.types.id_of(&format!("btf_trace_{name}")).is_some()
    }

    /// Resolves every offset the probes read.
    pub fn kernel_offsets(&self) -> Result<KernelOffsets> {
        let sid = self.enum_value("pid_type", "PIDTYPE_SID")?;
        let pgid = self.enum_value("pid_type", "PIDTYPE_PGID")?;
        let task = |f: &str| self.offset("task_struct", f);
        Ok(KernelOffsets {
            task_pid: task("pid")?,
            task_tgid: task("tgid")?,
            task_real_parent: task("real_parent")?,
            task_group_leader: task("group_leader")?,
            task_start_boottime: task("start_boottime")?,
            task_comm: task("comm")?,
            task_signal: task("signal")?,
            task_mm: task("mm")?,
            task_exit_code: task("exit_code")?,
            task_cgroups: task("cgroups")?,
            css_set_dfl_cgrp: self.offset("css_set", "dfl_cgrp")?,
            cgroup_kn: self.offset("cgroup", "kn")?,
            kernfs_node_id: self.offset("kernfs_node", "id")?,
            signal_live: self.offset("signal_struct", "live")?,
            signal_pids_sid: self.offset("signal_struct", &format!("pids[{sid}]"))?,
            signal_pids_pgid: self.offset("signal_struct", &format!("pids[{pgid}]"))?,
            // `numbers` is a flexible array: its first element starts where it does.
            pid_numbers_nr: self.offset("pid", "numbers")? + self.offset("upid", "nr")?,
            mm_arg_start: self.offset("mm_struct", "arg_start")?,
            mm_arg_end: self.offset("mm_struct", "arg_end")?,
            bprm_filename: self.offset("linux_binprm", "filename")?,
            pt_regs_syscall_nr: self.offset("pt_regs", "orig_ax")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs against the machine's own kernel; every kernel with BTF has these fields.
    #[test]
    fn resolves_task_struct_offsets_from_this_kernel() {
        if !Path::new(VMLINUX_BTF).exists() {
            eprintln!("skipped: {VMLINUX_BTF} is absent on this machine");
            return;
        }
        let btf = KernelBtf::from_sys_fs().unwrap();
        let off = btf.kernel_offsets().unwrap();
        assert!(
            off.task_tgid > off.task_pid,
            "tgid follows pid in task_struct"
        );
        assert!(off.mm_arg_end > off.mm_arg_start);
        assert_ne!(off.signal_pids_sid, off.signal_pids_pgid);
        assert!(btf.has_btf_tracepoint("sched_process_fork"));
        assert!(!btf.has_btf_tracepoint("no_such_tracepoint"));
        assert!(btf.offset("task_struct", "no_such_field").is_err());
    }
}
