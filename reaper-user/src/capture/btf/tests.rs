//! Unit tests of `btf.rs`.
use super::*;

/// Builds a BTF blob from type records and a string table, as the kernel lays it out.
struct Blob {
    types: Vec<u8>,
    strings: Vec<u8>,
}

impl Blob {
    fn new() -> Self {
        Blob {
            types: Vec::new(),
            strings: vec![0],
        }
    }
    fn name(&mut self, name: &str) -> u32 {
        if name.is_empty() {
            return 0;
        }
        let off = self.strings.len() as u32;
        self.strings.extend_from_slice(name.as_bytes());
        self.strings.push(0);
        off
    }
    fn words(&mut self, words: &[u32]) {
        for w in words {
            self.types.extend_from_slice(&w.to_le_bytes());
        }
    }
    fn ty(&mut self, name: &str, kind: u32, vlen: u32, size_or_type: u32) {
        let name = self.name(name);
        self.words(&[name, kind << 24 | vlen, size_or_type]);
    }
    fn member(&mut self, name: &str, type_id: u32, bit_offset: u32) {
        let name = self.name(name);
        self.words(&[name, type_id, bit_offset]);
    }
    fn bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&BTF_MAGIC.to_le_bytes());
        out.extend_from_slice(&[1, 0]);
        for w in [
            24,
            0,
            self.types.len() as u32,
            self.types.len() as u32,
            self.strings.len() as u32,
        ] {
            out.extend_from_slice(&w.to_le_bytes());
        }
        out.extend_from_slice(&self.types);
        out.extend_from_slice(&self.strings);
        out
    }
}

/// `struct upid { int nr; long ns; }`, `struct pid { int count; struct upid numbers[]; }`,
/// `struct s { int a; union { int b; struct { int c; int d[4]; }; }; }`, an enum and a
/// tracepoint typedef.
fn sample() -> KernelBtf {
    let mut b = Blob::new();
    b.ty("int", kind::INT, 0, 4); // 1
    b.words(&[32]);
    b.ty("long", kind::INT, 0, 8); // 2
    b.words(&[64]);
    b.ty("upid", kind::STRUCT, 2, 16); // 3
    b.member("nr", 1, 0);
    b.member("ns", 2, 64);
    b.ty("", kind::ARRAY, 0, 0); // 4: struct upid[]
    b.words(&[3, 1, 0]);
    b.ty("pid", kind::STRUCT, 2, 8); // 5
    b.member("count", 1, 0);
    b.member("numbers", 4, 64);
    b.ty("", kind::ARRAY, 0, 0); // 6: int[4]
    b.words(&[1, 1, 4]);
    b.ty("", kind::STRUCT, 2, 20); // 7: anonymous { c; d[4] }
    b.member("c", 1, 0);
    b.member("d", 6, 32);
    b.ty("", kind::UNION, 2, 20); // 8: anonymous { b; {c, d} }
    b.member("b", 1, 0);
    b.member("", 7, 0);
    b.ty("s", kind::STRUCT, 2, 24); // 9
    b.member("a", 1, 0);
    b.member("", 8, 32);
    b.ty("pid_type", kind::ENUM, 2, 4); // 10
    let (pid, sid) = (b.name("PIDTYPE_PID"), b.name("PIDTYPE_SID"));
    b.words(&[pid, 0, sid, 3]);
    b.ty("btf_trace_sched_process_fork", kind::TYPEDEF, 0, 1); // 11
    KernelBtf::from_bytes(b.bytes()).unwrap()
}

#[test]
fn offsets_follow_paths_arrays_and_anonymous_members() {
    let btf = sample();
    assert_eq!(btf.offset("upid", "ns").unwrap(), 8);
    assert_eq!(btf.offset("pid", "numbers[0].nr").unwrap(), 8);
    assert_eq!(btf.offset("pid", "numbers[2].ns").unwrap(), 8 + 2 * 16 + 8);
    assert_eq!(btf.offset("s", "b").unwrap(), 4);
    assert_eq!(btf.offset("s", "c").unwrap(), 4);
    assert_eq!(btf.offset("s", "d[3]").unwrap(), 4 + 4 + 12);
    assert_eq!(btf.enum_value("pid_type", "PIDTYPE_SID").unwrap(), 3);
    assert!(btf.has_btf_tracepoint("sched_process_fork").unwrap());
    assert!(!btf.has_btf_tracepoint("sched_process_exec").unwrap());
}

#[test]
fn bad_paths_are_errors() {
    let btf = sample();
    for (ty, path) in [
        ("s", "nope"),
        ("s", "d[4]"),
        ("s", "a[0]"),
        ("s", "d[x]"),
        ("nope", "a"),
    ] {
        assert!(btf.offset(ty, path).is_err(), "{ty}.{path}");
    }
    assert!(btf.enum_value("pid_type", "PIDTYPE_PGID").is_err());
}

#[test]
fn malformed_blobs_are_errors_not_panics() {
    let good = {
        let mut b = Blob::new();
        b.ty("s", kind::STRUCT, 1, 4);
        b.member("a", 1, 0);
        b.bytes()
    };
    assert!(KernelBtf::from_bytes(good.clone()).is_ok());
    // Every truncation, and every single-byte corruption, must fail cleanly or parse.
    for len in 0..good.len() {
        let _ = KernelBtf::from_bytes(good[..len].to_vec());
    }
    for at in 0..good.len() {
        let mut bad = good.clone();
        bad[at] ^= 0xff;
        if let Ok(btf) = KernelBtf::from_bytes(bad) {
            let _ = btf.offset("s", "a");
        }
    }
    assert!(KernelBtf::from_bytes(vec![0x9f, 0xeb]).is_err());
}

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
    assert!(btf.has_btf_tracepoint("sched_process_fork").unwrap());
    assert!(!btf.has_btf_tracepoint("no_such_tracepoint").unwrap());
    assert!(btf.offset("task_struct", "no_such_field").is_err());
}
