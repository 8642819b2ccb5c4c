//! Kernel struct offsets and features from the running kernel's BTF (`/sys/kernel/btf/vmlinux`).
//!
//! Rust eBPF emits no CO-RE relocations, so the probes read `task_struct` and friends through
//! offsets resolved here at start-up and passed in as a load-time global. Struct layouts differ
//! between kernel builds: nothing here may be a constant.
//!
//! This reads the BTF wire format directly (it is small and stable: a header, a type section
//! of fixed-shape records, a string section) and indexes only where each type starts. A general
//! parser materialises every one of the kernel's ~100,000 types: 60 MiB of peak memory for the
//! twenty-odd facts needed here. Every read is bounds-checked: a malformed blob is an error,
//! never a panic.
use std::path::Path;

use anyhow::{Context, Result, anyhow, bail};
use reaper_common::KernelOffsets;

/// Where the kernel exposes its own BTF.
pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

const BTF_MAGIC: u16 = 0xeb9f;

/// BTF type kinds (include/uapi/linux/btf.h).
mod kind {
    pub const INT: u32 = 1;
    pub const PTR: u32 = 2;
    pub const ARRAY: u32 = 3;
    pub const STRUCT: u32 = 4;
    pub const UNION: u32 = 5;
    pub const ENUM: u32 = 6;
    pub const FWD: u32 = 7;
    pub const TYPEDEF: u32 = 8;
    pub const VOLATILE: u32 = 9;
    pub const CONST: u32 = 10;
    pub const RESTRICT: u32 = 11;
    pub const FUNC: u32 = 12;
    pub const FUNC_PROTO: u32 = 13;
    pub const VAR: u32 = 14;
    pub const DATASEC: u32 = 15;
    pub const FLOAT: u32 = 16;
    pub const DECL_TAG: u32 = 17;
    pub const TYPE_TAG: u32 = 18;
    pub const ENUM64: u32 = 19;
}

/// Type chains deeper than this are malformed (or hostile): real ones are a few links long.
const MAX_DEPTH: usize = 32;

/// One type record's fixed part.
#[derive(Clone, Copy, Debug)]
struct TypeHeader {
    name_off: u32,
    kind: u32,
    vlen: usize,
    kind_flag: bool,
    /// `size` for sized kinds, `type` for references.
    size_or_type: u32,
    /// Where the kind-specific data after the fixed part starts.
    extra: usize,
}

/// A struct or union member.
#[derive(Clone, Copy, Debug)]
struct Member {
    name_off: u32,
    type_id: u32,
    bit_offset: u32,
    bitfield_size: u32,
}

/// The running kernel's BTF, indexed by type id.
pub struct KernelBtf {
    bytes: Vec<u8>,
    strings: std::ops::Range<usize>,
    /// Byte position of each type record; index 0 is `void`, which has none.
    starts: Vec<usize>,
}

impl KernelBtf {
    /// Reads the running kernel's BTF.
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
        Self::from_bytes(bytes).with_context(|| format!("parsing {}", path.display()))
    }

    /// Indexes a BTF blob (little-endian, as every kernel this runs on writes it).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self> {
        let u32_at = |at: usize| read_u32(&bytes, at);
        let magic = bytes
            .get(..2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .ok_or_else(|| anyhow!("truncated BTF header"))?;
        if magic != BTF_MAGIC {
            bail!("not little-endian BTF (magic {magic:#06x})");
        }
        let hdr_len = u32_at(4)? as usize;
        let section = |off_at: usize, len_at: usize| -> Result<std::ops::Range<usize>> {
            let start = hdr_len
                .checked_add(u32_at(off_at)? as usize)
                .ok_or_else(|| anyhow!("BTF section offset overflows"))?;
            let end = start
                .checked_add(u32_at(len_at)? as usize)
                .filter(|&end| end <= bytes.len())
                .ok_or_else(|| anyhow!("BTF section runs past the end of the data"))?;
            Ok(start..end)
        };
        let types = section(8, 12)?;
        let strings = section(16, 20)?;

        let mut starts = vec![0];
        let mut at = types.start;
        while at < types.end {
            starts.push(at);
            let header = read_header(&bytes, at)?;
            at = header
                .extra
                .checked_add(extra_len(&header)?)
                .filter(|&end| end <= types.end)
                .ok_or_else(|| anyhow!("BTF type {} runs past its section", starts.len() - 1))?;
        }
        Ok(KernelBtf {
            bytes,
            strings,
            starts,
        })
    }

    fn header(&self, id: u32) -> Result<TypeHeader> {
        match self.starts.get(id as usize) {
            Some(&at) if id != 0 => read_header(&self.bytes, at),
            _ => bail!("BTF type id {id} does not exist"),
        }
    }

    fn name(&self, name_off: u32) -> Result<&str> {
        let start = self
            .strings
            .start
            .checked_add(name_off as usize)
            .filter(|&s| s < self.strings.end)
            .ok_or_else(|| anyhow!("BTF name offset {name_off} is outside the string section"))?;
        let tail = &self.bytes[start..self.strings.end];
        let len = tail
            .iter()
            .position(|&b| b == 0)
            .ok_or_else(|| anyhow!("unterminated BTF name"))?;
        std::str::from_utf8(&tail[..len]).map_err(|_| anyhow!("BTF name is not UTF-8"))
    }

    /// The first type named `name` whose kind is one of `kinds`.
    fn find(&self, name: &str, kinds: &[u32]) -> Result<Option<(u32, TypeHeader)>> {
        for id in 1..self.starts.len() as u32 {
            let header = self.header(id)?;
            if kinds.contains(&header.kind) && self.name(header.name_off)? == name {
                return Ok(Some((id, header)));
            }
        }
        Ok(None)
    }

    /// Follows typedefs and qualifiers to the type they name.
    fn resolve(&self, mut id: u32) -> Result<(u32, TypeHeader)> {
        for _ in 0..MAX_DEPTH {
            let header = self.header(id)?;
            match header.kind {
                kind::TYPEDEF | kind::VOLATILE | kind::CONST | kind::RESTRICT | kind::TYPE_TAG => {
                    id = header.size_or_type
                }
                _ => return Ok((id, header)),
            }
        }
        bail!("BTF type chain from id {id} is too deep")
    }

    /// Size in bytes of a type.
    fn size_of(&self, id: u32, depth: usize) -> Result<u64> {
        if depth > MAX_DEPTH {
            bail!("BTF array nesting is too deep");
        }
        let (_, header) = self.resolve(id)?;
        Ok(match header.kind {
            kind::INT | kind::STRUCT | kind::UNION | kind::ENUM | kind::ENUM64 | kind::FLOAT => {
                u64::from(header.size_or_type)
            }
            kind::PTR => 8,
            kind::ARRAY => {
                let (elem, nelems) = self.array(&header)?;
                self.size_of(elem, depth + 1)? * u64::from(nelems)
            }
            other => bail!("BTF kind {other} has no size"),
        })
    }

    /// An array's element type and length.
    fn array(&self, header: &TypeHeader) -> Result<(u32, u32)> {
        Ok((
            read_u32(&self.bytes, header.extra)?,
            read_u32(&self.bytes, header.extra + 8)?,
        ))
    }

    fn members(&self, header: &TypeHeader) -> impl Iterator<Item = Result<Member>> + '_ {
        let (base, kind_flag) = (header.extra, header.kind_flag);
        (0..header.vlen).map(move |i| {
            let at = base + i * 12;
            let raw_offset = read_u32(&self.bytes, at + 8)?;
            let (bit_offset, bitfield_size) = match kind_flag {
                true => (raw_offset & 0x00ff_ffff, raw_offset >> 24),
                false => (raw_offset, 0),
            };
            Ok(Member {
                name_off: read_u32(&self.bytes, at)?,
                type_id: read_u32(&self.bytes, at + 4)?,
                bit_offset,
                bitfield_size,
            })
        })
    }

    /// The member `name` of a struct or union, looking through anonymous members as C does;
    /// the offset is in bits from the start of `header`'s type.
    fn member(&self, header: &TypeHeader, name: &str, depth: usize) -> Result<Option<Member>> {
        if depth > MAX_DEPTH {
            bail!("BTF anonymous member nesting is too deep");
        }
        for member in self.members(header) {
            let member = member?;
            let member_name = self.name(member.name_off)?;
            if member_name == name {
                return Ok(Some(member));
            }
            if member_name.is_empty() {
                let (_, inner) = self.resolve(member.type_id)?;
                if matches!(inner.kind, kind::STRUCT | kind::UNION)
                    && let Some(found) = self.member(&inner, name, depth + 1)?
                {
                    return Ok(Some(Member {
                        bit_offset: member.bit_offset + found.bit_offset,
                        ..found
                    }));
                }
            }
        }
        Ok(None)
    }

    /// Byte offset of `path` in `struct ty`: member names joined by `.`, each optionally
    /// indexed (`pids[3]`, `numbers[0].nr`); anonymous structs and unions are looked through.
    pub fn offset(&self, ty: &str, path: &str) -> Result<u64> {
        let (_, mut header) = self
            .find(ty, &[kind::STRUCT, kind::UNION])?
            .ok_or_else(|| anyhow!("kernel BTF has no struct `{ty}`"))?;
        let mut bits = 0u64;
        for step in path.split('.') {
            let (name, index) =
                split_index(step).with_context(|| format!("bad field path `{ty}.{path}`"))?;
            let member = self
                .member(&header, name, 0)?
                .ok_or_else(|| anyhow!("kernel BTF: no field `{ty}.{path}`"))?;
            if member.bitfield_size != 0 {
                bail!("`{ty}.{path}` is a bit field");
            }
            bits += u64::from(member.bit_offset);
            let (_, mut member_type) = self.resolve(member.type_id)?;
            if let Some(index) = index {
                if member_type.kind != kind::ARRAY {
                    bail!("`{ty}.{path}`: `{name}` is not an array");
                }
                let (elem, nelems) = self.array(&member_type)?;
                // A zero length is a flexible array: any index is the caller's business.
                if nelems != 0 && index >= u64::from(nelems) {
                    bail!("`{ty}.{path}`: index {index} is past `{name}[{nelems}]`");
                }
                bits += index * self.size_of(elem, 0)? * 8;
                member_type = self.resolve(elem)?.1;
            }
            header = member_type;
        }
        if !bits.is_multiple_of(8) {
            bail!("`{ty}.{path}` is not byte-aligned");
        }
        Ok(bits / 8)
    }

    /// Value of enumerator `name` in `enum ty`.
    pub fn enum_value(&self, ty: &str, name: &str) -> Result<u64> {
        let (_, header) = self
            .find(ty, &[kind::ENUM, kind::ENUM64])?
            .ok_or_else(|| anyhow!("kernel BTF has no enum `{ty}`"))?;
        let width = if header.kind == kind::ENUM { 8 } else { 12 };
        for i in 0..header.vlen {
            let at = header.extra + i * width;
            if self.name(read_u32(&self.bytes, at)?)? == name {
                let low = read_u32(&self.bytes, at + 4)?;
                return Ok(match header.kind {
                    kind::ENUM => u64::from(low),
                    _ => u64::from(low) | u64::from(read_u32(&self.bytes, at + 8)?) << 32,
                });
            }
        }
        bail!("kernel BTF: enum {ty} has no {name}")
    }

    /// Whether the kernel has a BTF tracepoint named `name` (its `btf_trace_<name>` typedef).
    pub fn has_btf_tracepoint(&self, name: &str) -> Result<bool> {
        Ok(self
            .find(&format!("btf_trace_{name}"), &[kind::TYPEDEF])?
            .is_some())
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
            pid_numbers_nr: self.offset("pid", "numbers[0].nr")?,
            task_thread_pid: task("thread_pid")?,
            pid_level: self.offset("pid", "level")?,
            mm_arg_start: self.offset("mm_struct", "arg_start")?,
            mm_arg_end: self.offset("mm_struct", "arg_end")?,
            bprm_filename: self.offset("linux_binprm", "filename")?,
            bprm_file: self.offset("linux_binprm", "file")?,
            file_inode: self.offset("file", "f_inode")?,
            inode_ino: self.offset("inode", "i_ino")?,
            inode_sb: self.offset("inode", "i_sb")?,
            super_block_dev: self.offset("super_block", "s_dev")?,
            file_dentry: self.offset("file", "f_path.dentry")?,
            dentry_name: self.offset("dentry", "d_name.name")?,
            mm_start_code: self.offset("mm_struct", "start_code")?,
            mm_end_code: self.offset("mm_struct", "end_code")?,
            mm_exe_file: self.offset("mm_struct", "exe_file")?,
            // `__parent` since 6.15, when it became RCU-protected.
            kernfs_node_parent: self
                .offset("kernfs_node", "parent")
                .or_else(|_| self.offset("kernfs_node", "__parent"))?,
            cgroup_root: self.offset("cgroup", "root")?,
            cgroup_root_hierarchy_id: self.offset("cgroup_root", "hierarchy_id")?,
            pt_regs_syscall_nr: self.offset("pt_regs", PT_REGS_SYSCALL_NR)?,
        })
    }
}

/// The field of `struct pt_regs` in which this architecture's kernel keeps the number of the
/// system call under way.
#[cfg(target_arch = "x86_64")]
const PT_REGS_SYSCALL_NR: &str = "orig_ax";
#[cfg(target_arch = "aarch64")]
const PT_REGS_SYSCALL_NR: &str = "syscallno";

fn read_u32(bytes: &[u8], at: usize) -> Result<u32> {
    at.checked_add(4)
        .and_then(|end| bytes.get(at..end))
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .ok_or_else(|| anyhow!("BTF data truncated at byte {at}"))
}

fn read_header(bytes: &[u8], at: usize) -> Result<TypeHeader> {
    let info = read_u32(bytes, at + 4)?;
    Ok(TypeHeader {
        name_off: read_u32(bytes, at)?,
        kind: (info >> 24) & 0x1f,
        vlen: (info & 0xffff) as usize,
        kind_flag: info >> 31 == 1,
        size_or_type: read_u32(bytes, at + 8)?,
        extra: at + 12,
    })
}

/// Bytes of kind-specific data after a type record's fixed 12 bytes.
fn extra_len(header: &TypeHeader) -> Result<usize> {
    let vlen = header.vlen;
    Ok(match header.kind {
        kind::PTR
        | kind::FWD
        | kind::TYPEDEF
        | kind::VOLATILE
        | kind::CONST
        | kind::RESTRICT
        | kind::FUNC
        | kind::FLOAT
        | kind::TYPE_TAG => 0,
        kind::INT | kind::VAR | kind::DECL_TAG => 4,
        kind::ARRAY => 12,
        kind::STRUCT | kind::UNION | kind::DATASEC | kind::ENUM64 => 12 * vlen,
        kind::ENUM | kind::FUNC_PROTO => 8 * vlen,
        other => bail!("unknown BTF kind {other} (a kernel newer than this reaper-trace?)"),
    })
}

/// `name[3]` → (`name`, Some(3)); `name` → (`name`, None).
fn split_index(step: &str) -> Result<(&str, Option<u64>)> {
    match step.split_once('[') {
        None => Ok((step, None)),
        Some((name, rest)) => {
            let index = rest
                .strip_suffix(']')
                .and_then(|n| n.parse().ok())
                .ok_or_else(|| anyhow!("`{step}` is not `name[N]`"))?;
            Ok((name, Some(index)))
        }
    }
}

#[cfg(test)]
mod tests;
