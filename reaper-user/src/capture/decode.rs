//! Ring-buffer records → typed kernel events. Never panics on malformed input: a record that
//! does not decode is an error the caller reports.
use std::{
    mem::{offset_of, size_of},
    sync::Arc,
};

use anyhow::{Result, bail};
use reaper_common::copy::{
    COPY_MAX, ExeCode, FORK_COPY_FIXED_LEN, FORK_STACK_COPIED, ForkCopyEvent, StackCopy, UserRegs,
};
use reaper_common::{
    ARGV_MAX, COMM_LEN, EXEC_ARGV_TRUNCATED, EXEC_FILENAME_TRUNCATED, EXEC_FIXED_LEN, EventHeader,
    EventKind, ExeKey, ExecEvent, ExitEvent, FILENAME_MAX, FORK_UNTRACKED, ForkEvent, GatewayEvent,
    LAYOUT, MatchedAt, SetsidEvent, interpreter::Interpreter,
};

use crate::text::{Args, Comm};

/// Most arguments kept from one exec (the rest is cut and flagged `truncated`).
pub const MAX_ARGS: usize = 256;

/// A fork/exec/exit/free/setsid as the kernel reported it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelEvent {
    /// Kernel sequence number (global across CPUs).
    pub seq: u64,
    /// The generation of the programs that wrote it (see `ReaderMark::generation`).
    pub generation: u16,
    /// Boot-time ns when it happened.
    pub ts: u64,
    /// The process (tgid) it is about, and its start_boottime: together its identity.
    pub pid: u32,
    pub start: u64,
    pub what: What,
}

/// The spawning thread's stacks at a fork (`--spawn-stacks`), as the kernel keeps them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpawnStack {
    /// Its user stack: `STACKS`' key.
    pub native: Option<u64>,
    /// Its Python frames: `PY_STACKS`' key.
    pub python: Option<u64>,
}

/// A JIT host's stack at a fork, copied for user space to unwind (see
/// `reaper_common::copy`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CopiedStack {
    /// The forking thread's registers at the fork syscall.
    pub regs: UserRegs,
    /// Where the spawner's executable was.
    pub exe: ExeCode,
    /// Its stack from `base` (the start of `sp`'s page) up.
    pub base: u64,
    pub bytes: Vec<u8>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum What {
    Fork {
        spawner: u32,
        ppid: u32,
        sid: u32,
        pgid: u32,
        uid: u32,
        cgroup_id: u64,
        comm: Comm,
        /// The thread of the spawner that forked it.
        spawner_tid: u32,
        /// That thread's stacks at the fork, as taken.
        stack: SpawnStack,
        /// A JIT host's: that thread's stack, copied.
        copy: Option<Box<CopiedStack>>,
        /// The tracked map was full: this child's own children will not be followed.
        untracked: bool,
    },
    Exec {
        old_tid: u32,
        comm: Comm,
        /// Shared with the lineage graph, which keeps them.
        filename: Arc<[u8]>,
        argv: Args,
        truncated: bool,
        /// The interpreter the program file is, told by its name (see
        /// `reaper_common::interpreter`).
        interpreter: Option<Interpreter>,
    },
    Exit {
        /// A wait(2) status.
        status: u32,
    },
    Free,
    Setsid {
        sid: u32,
    },
    /// The process matched a gateway selector in the kernel and is tracked from now on.
    Gateway {
        /// The selector's index (see `crate::gateways::Selectors`).
        selector: u32,
        matched_at: MatchedAt,
        ppid: u32,
        sid: u32,
        pgid: u32,
        cgroup_id: u64,
        comm: Comm,
    },
}

fn read<T: Copy>(bytes: &[u8]) -> Result<T> {
    if bytes.len() < size_of::<T>() {
        bail!(
            "record of {} bytes is shorter than {} ({} bytes)",
            bytes.len(),
            std::any::type_name::<T>(),
            size_of::<T>()
        );
    }
    // SAFETY: length checked; T is a plain #[repr(C)] record of integers and byte arrays,
    // valid for any bit pattern; read_unaligned copes with the ring's 8-byte alignment.
    Ok(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

/// Bytes up to the first NUL.
fn c_bytes(raw: &[u8]) -> &[u8] {
    let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
    &raw[..end]
}

/// The stack copy after a fork record's fixed part.
fn decode_copy(bytes: &[u8]) -> Result<CopiedStack> {
    let fixed = FORK_COPY_FIXED_LEN;
    if bytes.len() < fixed {
        bail!(
            "fork record with a stack copy of {} bytes, shorter than its fixed part ({fixed})",
            bytes.len()
        );
    }
    let word = |field: usize| {
        let at = offset_of!(ForkCopyEvent, copy) + field;
        u64::from_ne_bytes(bytes[at..at + 8].try_into().unwrap())
    };
    let len = word(offset_of!(StackCopy, len));
    let copied = &bytes[fixed..];
    if len > COPY_MAX as u64 || (copied.len() as u64) < len {
        bail!(
            "fork record's stack copy says {len} bytes, has {}",
            copied.len()
        );
    }
    Ok(CopiedStack {
        regs: UserRegs {
            pc: word(offset_of!(StackCopy, regs) + offset_of!(UserRegs, pc)),
            sp: word(offset_of!(StackCopy, regs) + offset_of!(UserRegs, sp)),
            fp: word(offset_of!(StackCopy, regs) + offset_of!(UserRegs, fp)),
            lr: word(offset_of!(StackCopy, regs) + offset_of!(UserRegs, lr)),
        },
        exe: ExeCode {
            file: ExeKey {
                dev: word(
                    offset_of!(StackCopy, exe)
                        + offset_of!(ExeCode, file)
                        + offset_of!(ExeKey, dev),
                ),
                ino: word(
                    offset_of!(StackCopy, exe)
                        + offset_of!(ExeCode, file)
                        + offset_of!(ExeKey, ino),
                ),
            },
            start: word(offset_of!(StackCopy, exe) + offset_of!(ExeCode, start)),
            end: word(offset_of!(StackCopy, exe) + offset_of!(ExeCode, end)),
        },
        base: word(offset_of!(StackCopy, base)),
        bytes: copied[..len as usize].to_vec(),
    })
}

/// Decodes one ring-buffer record.
pub fn decode(bytes: &[u8]) -> Result<KernelEvent> {
    let header: EventHeader = read(bytes)?;
    if header.layout != LAYOUT {
        bail!("record of layout {}, not {LAYOUT}", header.layout);
    }
    let Some(kind) = EventKind::from_u32(u32::from(header.kind)) else {
        bail!("unknown record kind {}", header.kind);
    };
    if bytes.len() < kind.min_len() {
        bail!(
            "{} record of {} bytes is shorter than its fixed part ({} bytes)",
            kind.name(),
            bytes.len(),
            kind.min_len()
        );
    }
    let what = match kind {
        EventKind::Fork => {
            let ev: ForkEvent = read(bytes)?;
            What::Fork {
                spawner: ev.spawner,
                ppid: ev.ppid,
                sid: ev.sid,
                pgid: ev.pgid,
                uid: ev.uid,
                cgroup_id: ev.cgroup_id,
                comm: Comm::from_c(&ev.comm),
                spawner_tid: ev.spawner_tid,
                stack: SpawnStack {
                    native: (ev.stack != 0).then_some(ev.stack),
                    python: (ev.py_stack != 0).then_some(ev.py_stack),
                },
                copy: match ev.flags & FORK_STACK_COPIED {
                    0 => None,
                    _ => Some(Box::new(decode_copy(bytes)?)),
                },
                untracked: ev.flags & FORK_UNTRACKED != 0,
            }
        }
        EventKind::Exec => decode_exec(bytes)?,
        EventKind::Exit => What::Exit {
            status: read::<ExitEvent>(bytes)?.status,
        },
        EventKind::Free => What::Free,
        EventKind::Setsid => What::Setsid {
            sid: read::<SetsidEvent>(bytes)?.sid,
        },
        EventKind::Gateway => {
            let ev: GatewayEvent = read(bytes)?;
            let Some(matched_at) = MatchedAt::from_u32(ev.matched_at) else {
                bail!("gateway record with unknown match kind {}", ev.matched_at);
            };
            What::Gateway {
                selector: ev.selector,
                matched_at,
                ppid: ev.ppid,
                sid: ev.sid,
                pgid: ev.pgid,
                cgroup_id: ev.cgroup_id,
                comm: Comm::from_c(&ev.comm),
            }
        }
    };
    Ok(KernelEvent {
        seq: header.seq,
        generation: header.generation,
        ts: header.ts,
        pid: header.pid,
        start: header.start,
        what,
    })
}

/// A `u32` field of a record at `offset` (the caller checked the record is that long).
fn u32_at(bytes: &[u8], offset: usize) -> u32 {
    u32::from_ne_bytes(bytes[offset..offset + 4].try_into().expect("four bytes"))
}

/// Exec records have a fixed part and then only `argv_len` bytes of argv. Read in place: the
/// record is a few hundred bytes and the full struct more than 4 KiB.
fn decode_exec(bytes: &[u8]) -> Result<What> {
    if bytes.len() < EXEC_FIXED_LEN {
        bail!(
            "exec record of {} bytes is shorter than its fixed part",
            bytes.len()
        );
    }
    let argv_len = u32_at(bytes, offset_of!(ExecEvent, argv_len)) as usize;
    if argv_len > ARGV_MAX || bytes.len() < EXEC_FIXED_LEN + argv_len {
        bail!(
            "exec record claims {argv_len} bytes of argv in {} bytes",
            bytes.len()
        );
    }
    let flags = u32_at(bytes, offset_of!(ExecEvent, flags));
    let filename_len =
        (u32_at(bytes, offset_of!(ExecEvent, filename_len)) as usize).min(FILENAME_MAX);
    let filename_at = offset_of!(ExecEvent, filename);
    let comm_at = offset_of!(ExecEvent, comm);
    let program_at = offset_of!(ExecEvent, program);
    let (argv, cut) = Args::from_block(&bytes[EXEC_FIXED_LEN..][..argv_len], MAX_ARGS);
    Ok(What::Exec {
        old_tid: u32_at(bytes, offset_of!(ExecEvent, old_tid)),
        comm: Comm::from_c(&bytes[comm_at..comm_at + COMM_LEN]),
        filename: Arc::from(c_bytes(&bytes[filename_at..][..filename_len])),
        argv,
        truncated: cut || flags & (EXEC_ARGV_TRUNCATED | EXEC_FILENAME_TRUNCATED) != 0,
        interpreter: Interpreter::of_program(&bytes[program_at..program_at + COMM_LEN]),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use reaper_common::copy::COPY_CHUNK;

    fn as_bytes<T>(v: &T) -> Vec<u8> {
        // SAFETY: reading the bytes of a plain record.
        unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()) }.to_vec()
    }

    fn header(kind: EventKind) -> EventHeader {
        EventHeader {
            kind: kind as u8,
            layout: LAYOUT,
            generation: 1,
            pid: 42,
            seq: 7,
            ts: 1000,
            start: 99,
        }
    }

    #[test]
    fn fork_round_trip() {
        let mut comm = [0u8; 16];
        comm[..4].copy_from_slice(b"bash");
        let ev = ForkEvent {
            header: header(EventKind::Fork),
            spawner: 40,
            ppid: 1,
            sid: 40,
            pgid: 40,
            uid: 0,
            flags: FORK_UNTRACKED,
            spawner_tid: 41,
            _pad: 0,
            stack: 3,
            py_stack: 0xabc1,
            cgroup_id: 5,
            comm,
        };
        let got = decode(&as_bytes(&ev)).unwrap();
        assert_eq!((got.pid, got.seq, got.start), (42, 7, 99));
        match got.what {
            What::Fork {
                spawner,
                ppid,
                comm,
                spawner_tid,
                untracked,
                stack,
                ..
            } => {
                assert_eq!(
                    (spawner, ppid, comm.as_bytes(), spawner_tid, untracked),
                    (40, 1, &b"bash"[..], 41, true)
                );
                assert_eq!(stack.native, Some(3), "the record carries the stack's key");
                assert_eq!(stack.python, Some(0xabc1));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn fork_with_a_stack_copy() {
        let mut ev: ForkCopyEvent = unsafe { std::mem::zeroed() };
        ev.fork.header = header(EventKind::Fork);
        ev.fork.flags = FORK_STACK_COPIED;
        let regs = UserRegs {
            pc: 0x1000,
            sp: 0x7ff0_0000,
            fp: 0x7ff0_0100,
            lr: 0x1234,
        };
        ev.copy.regs = regs;
        ev.copy.base = 0x7fef_f000;
        ev.copy.len = COPY_CHUNK as u64;
        ev.copy.bytes[..4].copy_from_slice(b"\x01\x02\x03\x04");
        let bytes = as_bytes(&ev)[..FORK_COPY_FIXED_LEN + COPY_CHUNK].to_vec();
        match decode(&bytes).unwrap().what {
            What::Fork {
                copy: Some(copy), ..
            } => {
                assert_eq!(copy.regs, regs);
                assert_eq!(copy.bytes.len(), COPY_CHUNK);
                assert_eq!(&copy.bytes[..4], b"\x01\x02\x03\x04");
            }
            other => panic!("{other:?}"),
        }
        // A copy shorter than it claims, or longer than a copy can be: errors, not panics.
        assert!(decode(&bytes[..bytes.len() - 1]).is_err());
        assert!(decode(&bytes[..FORK_COPY_FIXED_LEN - 1]).is_err());
        ev.copy.len = COPY_MAX as u64 + 1;
        assert!(decode(&as_bytes(&ev)).is_err());
    }

    #[test]
    fn exec_variable_length() {
        let mut ev: ExecEvent = unsafe { std::mem::zeroed() };
        ev.header = header(EventKind::Exec);
        ev.filename[..9].copy_from_slice(b"/bin/true");
        ev.filename_len = 9;
        let argv = b"true\0--x\0";
        ev.argv[..argv.len()].copy_from_slice(argv);
        ev.argv_len = argv.len() as u32;
        let bytes = as_bytes(&ev)[..EXEC_FIXED_LEN + argv.len()].to_vec();
        match decode(&bytes).unwrap().what {
            What::Exec {
                filename,
                argv,
                truncated,
                ..
            } => {
                assert_eq!(&*filename, b"/bin/true");
                assert_eq!(argv, Args::from_list(["true", "--x"]));
                assert!(!truncated);
            }
            other => panic!("{other:?}"),
        }
        // A record shorter than it claims is an error, not a panic.
        assert!(decode(&bytes[..bytes.len() - 1]).is_err());
    }

    #[test]
    fn gateway_round_trip() {
        let mut comm = [0u8; 16];
        comm[..6].copy_from_slice(b"hermes");
        let mut ev = GatewayEvent {
            header: header(EventKind::Gateway),
            selector: 3,
            matched_at: MatchedAt::Attach as u32,
            ppid: 1,
            sid: 42,
            pgid: 42,
            _pad: 0,
            cgroup_id: 77,
            comm,
        };
        match decode(&as_bytes(&ev)).unwrap().what {
            What::Gateway {
                selector,
                matched_at,
                cgroup_id,
                comm,
                ..
            } => assert_eq!(
                (selector, matched_at, cgroup_id, comm.as_bytes()),
                (3, MatchedAt::Attach, 77, &b"hermes"[..])
            ),
            other => panic!("{other:?}"),
        }
        ev.matched_at = 9;
        assert!(decode(&as_bytes(&ev)).is_err(), "an unknown match kind");
    }

    #[test]
    fn malformed_records_are_errors() {
        assert!(decode(&[]).is_err());
        assert!(decode(&[9, 0, 0, 0]).is_err());
        let mut h = as_bytes(&header(EventKind::Exit));
        assert!(decode(&h).is_err(), "exit record without its status");
        h[0] = 77;
        assert!(decode(&h).is_err());
    }
}
