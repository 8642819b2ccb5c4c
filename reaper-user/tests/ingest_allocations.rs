//! The ingest path allocates nothing per process in steady state: ring-buffer record → decode
//! → lineage graph → NDJSON line, for fork, exit and free, counted by a counting global
//! allocator over 10,000 processes (after twice as many to let the graph's tables reach their
//! size: pruning has run for a retention's worth, and the pages of the pids in use moved on).
//! An exec stores the program's argv and filename for the lineage, so it may allocate for
//! those, and nothing else. Fed with the kernel's own record layouts (reaper-common), no kernel
//! needed.
use std::{
    alloc::{GlobalAlloc, Layout, System},
    cell::Cell,
    mem::size_of,
};

use reaper_common::{
    EXEC_FIXED_LEN, EventHeader, EventKind, ExecEvent, ExitEvent, ForkEvent, FreeEvent,
};
use reaper_user::testing::{Args, Comm, Ingest, Seed};

/// Counts the allocations of this thread while `COUNTING` is set (tests run on threads of
/// their own: the harness's allocations are not counted).
struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = COUNTING.try_with(|on| {
            if on.get() {
                ALLOCATIONS.with(|n| n.set(n.get() + 1));
            }
        });
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = COUNTING.try_with(|on| {
            if on.get() {
                ALLOCATIONS.with(|n| n.set(n.get() + 1));
            }
        });
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Allocations made by `f` on this thread.
fn allocations(f: impl FnOnce()) -> u64 {
    ALLOCATIONS.with(|n| n.set(0));
    COUNTING.with(|on| on.set(true));
    f();
    COUNTING.with(|on| on.set(false));
    ALLOCATIONS.with(Cell::get)
}

fn as_bytes<T>(v: &T) -> &[u8] {
    // SAFETY: the bytes of a plain `#[repr(C)]` record.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()) }
}

const GATEWAY: u32 = 100;
const GATEWAY_START_TICKS: u64 = 5;

/// Makes one traced process's records, as the kernel writes them.
struct Records {
    seq: u64,
}

impl Records {
    fn header(&mut self, kind: EventKind, pid: u32, start: u64) -> EventHeader {
        self.seq += 1;
        EventHeader {
            kind: kind as u8,
            layout: reaper_common::LAYOUT,
            generation: 1,
            pid,
            seq: self.seq,
            ts: start + self.seq,
            start,
        }
    }

    fn fork(&mut self, pid: u32, start: u64) -> ForkEvent {
        ForkEvent {
            header: self.header(EventKind::Fork, pid, start),
            spawner: GATEWAY,
            ppid: GATEWAY,
            sid: GATEWAY,
            pgid: GATEWAY,
            uid: 0,
            flags: 0,
            spawner_tid: GATEWAY,
            _pad: 0,
            stack: 0,
            py_stack: 0,
            cgroup_id: 1,
            comm: *b"gateway\0\0\0\0\0\0\0\0\0",
        }
    }

    /// Fills `ev` (a record of more than 4 KiB, made once) as the exec of `pid`.
    fn exec(&mut self, ev: &mut ExecEvent, pid: u32, start: u64) {
        ev.header = self.header(EventKind::Exec, pid, start);
        ev.old_tid = pid;
        ev.comm[..4].copy_from_slice(b"true");
        ev.filename[..9].copy_from_slice(b"/bin/true");
        ev.filename_len = 9;
        let argv = b"true\0--serve\0--port=8080\0";
        ev.argv[..argv.len()].copy_from_slice(argv);
        ev.argv_len = argv.len() as u32;
    }

    fn exit(&mut self, pid: u32, start: u64) -> ExitEvent {
        ExitEvent {
            header: self.header(EventKind::Exit, pid, start),
            // One in ten killed by SIGKILL: the signal's name is borrowed, not built.
            status: if pid.is_multiple_of(10) { 9 } else { 0 },
            _pad: 0,
        }
    }

    fn free(&mut self, pid: u32, start: u64) -> FreeEvent {
        FreeEvent {
            header: self.header(EventKind::Free, pid, start),
        }
    }
}

/// A run's ingest path on a seeded gateway, writing NDJSON into a sink.
fn tracer() -> Ingest {
    let gateway = Seed {
        pid: GATEWAY,
        start_ticks: GATEWAY_START_TICKS,
        ppid: 1,
        sid: GATEWAY,
        pgid: GATEWAY,
        comm: Comm::from_c(b"gateway"),
        argv: Args::from_list(["gateway"]),
        is_gateway: true,
        uncertain: false,
    };
    Ingest::new(gateway, 10_000).unwrap()
}

/// Runs `n` processes through the pipeline, pids reused as on a host with `pid_max` 32768,
/// each in its own batch (a wake-up that took in one process).
/// With `exec`, each process also execs (the record is built in that buffer).
fn run(
    tracer: &mut Ingest,
    records: &mut Records,
    first: u64,
    n: u64,
    exec: Option<&mut ExecEvent>,
) {
    let mut exec = exec;
    for i in first..first + n {
        let pid = 1000 + (i % 30_000) as u32;
        let start = 1_000_000_000 + i * 1_000_000;
        tracer.record(as_bytes(&records.fork(pid, start))).unwrap();
        if let Some(ev) = exec.as_deref_mut() {
            records.exec(ev, pid, start);
            let len = EXEC_FIXED_LEN + ev.argv_len as usize;
            tracer.record(&as_bytes(ev)[..len]).unwrap();
        }
        tracer.record(as_bytes(&records.exit(pid, start))).unwrap();
        tracer.record(as_bytes(&records.free(pid, start))).unwrap();
        tracer.end_batch().unwrap();
    }
}

#[test]
fn fork_exit_and_free_allocate_nothing_in_steady_state() {
    let mut tracer = tracer();
    let mut records = Records { seq: 0 };
    run(&mut tracer, &mut records, 0, 20_000, None);
    let n = allocations(|| run(&mut tracer, &mut records, 20_000, 10_000, None));
    assert_eq!(n, 0, "allocations for 10,000 traced fork+exit processes");
    assert_eq!(tracer.undecodable(), 0);
}

#[test]
fn an_exec_allocates_only_what_the_graph_keeps_of_it() {
    let mut tracer = tracer();
    let mut records = Records { seq: 0 };
    // SAFETY: an all-zero ExecEvent is a valid value (integers and byte arrays).
    let mut record: Box<ExecEvent> = Box::new(unsafe { std::mem::zeroed() });
    run(&mut tracer, &mut records, 0, 20_000, Some(&mut record));
    let n = allocations(|| run(&mut tracer, &mut records, 20_000, 10_000, Some(&mut record)));
    // The argv and the filename the lineage keeps: two blocks an exec, nothing else.
    assert_eq!(n, 2 * 10_000, "allocations for 10,000 fork+exec processes");
    assert_eq!(tracer.undecodable(), 0);
}
