//! Every kernel kind taken around: a record decoded and applied to the run's graph, its event
//! written as a line, the line read back and replayed into a second graph, which must then
//! know the process as the first does.
use std::mem::size_of;

use reaper_common::{
    ARGV_MAX, COMM_LEN, EventHeader, EventKind, ExecEvent, ExitEvent, FILENAME_MAX, ForkEvent,
    FreeEvent, GatewayEvent, LAYOUT, MatchedAt, SetsidEvent,
};

use crate::capture::decode::decode;
use crate::gateways::announce::Announcer;
use crate::lineage::graph::LineageGraph;
use crate::stream::events::{Envelope, Event};

const GATEWAY: u32 = 100;
const CHILD: u32 = 101;

/// The story every kind is told in, in order: each kind of the table is in it.
const STORY: [EventKind; 6] = [
    EventKind::Gateway,
    EventKind::Fork,
    EventKind::Exec,
    EventKind::Setsid,
    EventKind::Exit,
    EventKind::Free,
];

fn bytes_of<T>(v: &T) -> Vec<u8> {
    // SAFETY: reading the bytes of a plain #[repr(C)] record.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()) }.to_vec()
}

fn header(kind: EventKind, pid: u32, seq: u64) -> EventHeader {
    EventHeader {
        kind: kind as u8,
        layout: LAYOUT,
        generation: 0,
        pid,
        seq,
        ts: 1_000_000 * seq,
        start: 5_000 + u64::from(pid),
    }
}

fn comm(name: &[u8]) -> [u8; COMM_LEN] {
    let mut c = [0; COMM_LEN];
    c[..name.len()].copy_from_slice(name);
    c
}

/// The record of `kind` in the story, as the kernel writes it.
fn record(kind: EventKind, seq: u64) -> Vec<u8> {
    match kind {
        EventKind::Gateway => bytes_of(&GatewayEvent {
            header: header(kind, GATEWAY, seq),
            selector: 0,
            matched_at: MatchedAt::Fork as u32,
            ppid: 1,
            sid: 1,
            pgid: 1,
            _pad: 0,
            cgroup_id: 9,
            comm: comm(b"gateway"),
        }),
        EventKind::Fork => bytes_of(&ForkEvent {
            header: header(kind, CHILD, seq),
            spawner: GATEWAY,
            ppid: GATEWAY,
            sid: 1,
            pgid: GATEWAY,
            uid: 1000,
            flags: 0,
            spawner_tid: GATEWAY,
            _pad: 0,
            stack: 0,
            py_stack: 0,
            cgroup_id: 9,
            comm: comm(b"gateway"),
        }),
        EventKind::Exec => {
            // SAFETY: a plain record of integers and byte arrays: all zeros is one.
            let mut ev: ExecEvent = unsafe { std::mem::zeroed() };
            ev.header = header(kind, CHILD, seq);
            ev.old_tid = CHILD;
            let filename = b"/usr/bin/mcp-server";
            ev.filename[..filename.len()].copy_from_slice(filename);
            ev.filename_len = filename.len() as u32;
            let argv = b"mcp-server\0--stdio\0";
            ev.argv[..argv.len()].copy_from_slice(argv);
            ev.argv_len = argv.len() as u32;
            ev.comm = comm(b"mcp-server");
            assert!(filename.len() < FILENAME_MAX && argv.len() < ARGV_MAX);
            bytes_of(&ev)[..reaper_common::EXEC_FIXED_LEN + argv.len()].to_vec()
        }
        EventKind::Setsid => bytes_of(&SetsidEvent {
            header: header(kind, CHILD, seq),
            sid: CHILD,
            _pad: 0,
        }),
        EventKind::Exit => bytes_of(&ExitEvent {
            header: header(kind, CHILD, seq),
            status: 15,
            _pad: 0,
        }),
        EventKind::Free => bytes_of(&FreeEvent {
            header: header(kind, CHILD, seq),
        }),
    }
}

/// What a graph knows of the process that has `pid` now (or last had it).
fn known(graph: &LineageGraph, pid: u32) -> Option<String> {
    let n = graph.current(pid)?;
    Some(format!(
        "pid {} start {} spawner {:?} ppid {} sid {} comm {:?} filename {:?} argv {:?} \
         gateway {} setsid {} exited {:?} alive {} zombie {}",
        n.pid,
        n.start.ticks(),
        n.spawner_pid,
        n.ppid,
        n.sid,
        n.comm,
        n.filename,
        n.argv,
        n.is_gateway,
        n.called_setsid,
        n.exited.map(|e| e.status),
        n.alive(),
        n.zombie(),
    ))
}

#[test]
fn every_kernel_kind_read_back_from_its_line_leaves_the_graph_as_its_record_did() {
    for kind in EventKind::ALL {
        assert!(STORY.contains(&kind), "{kind:?} is not in the story");
    }
    let mut run = LineageGraph::new(100);
    let mut replayed = LineageGraph::new(100);
    let mut announcer = Announcer::new(vec!["exe:/usr/bin/gateway".into()]);
    for (seq, kind) in STORY.into_iter().enumerate() {
        let ev = decode(&record(kind, seq as u64 + 1)).unwrap();
        let change = run.apply(&ev);
        let event = match kind {
            // A gateway's event is its announcement, named by its selector.
            EventKind::Gateway => announcer.on_change(&run, &change, ev.ts).map(|s| *s.event),
            _ => change.event(&run, ev.pid, None),
        };
        let event: Event = event.unwrap_or_else(|| panic!("{kind:?} wrote no event"));
        let mut line = Vec::new();
        let envelope = Envelope {
            event: event.kind().name,
            seq: seq as u64,
            ts: ev.ts,
            body: &event,
        };
        envelope.write_json(&mut line).unwrap();
        let read = Event::read(event.kind().name, &line).unwrap().unwrap();
        assert!(
            replayed.replay(ev.ts, &read),
            "{kind:?}: not a lineage line"
        );
        assert_eq!(
            known(&replayed, ev.pid),
            known(&run, ev.pid),
            "{kind:?}: the line {} left the replayed graph unlike the run's",
            String::from_utf8_lossy(&line)
        );
    }
}
