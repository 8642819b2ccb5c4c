//! Unit tests of `events.rs`.
use super::*;
use crate::leaks::Reason;
use crate::procfs::placement::Placement;
use crate::text::{Args, Comm};

/// The line `body` is written as (its `seq` 3, its `ts` 9), without the newline.
fn written(body: &Event) -> String {
    let mut s = Vec::new();
    Envelope {
        event: body.name(),
        seq: 3,
        ts: 9,
        body,
    }
    .write_json(&mut s)
    .unwrap();
    assert!(!s.contains(&b'\n'));
    String::from_utf8(s).unwrap()
}

fn line(body: &Event) -> serde_json::Value {
    serde_json::from_str(&written(body)).unwrap()
}

#[test]
fn a_line_is_its_envelope_then_its_bodys_fields() {
    assert_eq!(
        written(&Event::Setsid(Setsid { pid: 7, sid: 7 })),
        r#"{"event":"setsid","seq":3,"ts":9,"pid":7,"sid":7}"#
    );
    assert_eq!(
        written(&Event::Reaped(Reaped {
            pid: 7,
            from_proc: false
        })),
        r#"{"event":"reaped","seq":3,"ts":9,"pid":7}"#
    );
}

#[test]
fn exec_line_has_flat_fields_and_exact_bytes_only_when_needed() {
    let v = line(&Event::Exec(Exec {
        pid: 5,
        filename: ProcText::new("filename", &b"/bin/\xffx"[..]),
        argv: Argv::new(Args::from_list([&b"a\nb"[..]])),
        truncated: false,
        tid: 5,
        interpreter: None,
    }));
    assert_eq!(v["event"], "exec");
    assert_eq!(v["seq"], 3);
    assert_eq!(v["argv"][0], "a\nb");
    assert!(v.get("argv_b64").is_none());
    assert_eq!(v["filename_b64"], "L2Jpbi//eA==");
    assert!(v.get("filename").is_some_and(|f| f == "/bin/\u{fffd}x"));

    let v = line(&Event::Exec(Exec {
        pid: 5,
        filename: ProcText::new("filename", &b"/bin/x"[..]),
        argv: Argv::new(Args::from_list([&b"a"[..], &b"\xff"[..]])),
        truncated: false,
        tid: 5,
        interpreter: None,
    }));
    assert_eq!(v["argv"], serde_json::json!(["a", "\u{fffd}"]));
    assert_eq!(v["argv_b64"], serde_json::json!(["YQ==", "/w=="]));
    assert!(v.get("filename_b64").is_none());
}

#[test]
fn wait_status_decoding() {
    assert_eq!(wait_status(3 << 8), (Some(3), None, false));
    assert_eq!(wait_status(9), (None, Some("SIGKILL".into()), false));
    assert_eq!(wait_status(0x80 | 11), (None, Some("SIGSEGV".into()), true));
    assert_eq!(signal_name(41), "SIG41");
}

#[test]
fn a_status_split_is_put_back_together() {
    for status in [0, 3 << 8, 255 << 8, 9, 0x80 | 11, 41] {
        let (code, signal, core) = wait_status(status);
        assert_eq!(wait_status_of(code, signal.as_deref(), core), Some(status));
    }
    assert_eq!(wait_status_of(None, None, false), None);
    assert_eq!(wait_status_of(None, Some("SIGBOGUS"), false), None);
}

#[test]
fn exit_nulls_are_explicit() {
    let v = line(&Event::Exit(Exit {
        pid: 1,
        exit_code: None,
        signal: Some("SIGTERM".into()),
        core: false,
    }));
    assert!(v["exit_code"].is_null());
    assert_eq!(v["signal"], "SIGTERM");
}

#[test]
fn the_evidence_reads_back_exactly_as_written() {
    let odd = ProcText::new("comm", &b"w\xffrk"[..]);
    let detail = LeakDetail {
        lineage: vec![1, 2],
        ancestors: vec![Ancestor {
            process: ProcessLabel {
                pid: 1,
                comm: ProcText::new("comm", &b"gw"[..]),
                argv: Argv::new(Args::from_list(["gw"])),
            },
            exited: Some(5),
        }],
        pipes: vec![PipeInfo {
            fd: 0,
            kind: "socket".into(),
            inode: Some(7),
            end: "both".into(),
            other_end: "open".into(),
            peer_inode: Some(8),
            index: None,
            protocol: None,
            remote: None,
            internal: false,
            peers: vec![Peer {
                pid: 1,
                fd: 9,
                end: "both".into(),
                comm: ProcText::new("comm", &b"gw"[..]),
            }],
            peers_omitted: 1_983,
        }],
        pipes_omitted: 18_926,
        chain: vec![ProcessLabel {
            pid: 2,
            comm: ProcText::new("comm", &b"w"[..]),
            argv: Argv::new(Args::from_list(["w"])),
        }],
        state: "S (sleeping)".into(),
        rss_kib: Some(100),
        ppid: 1,
        escaped: true,
        placement: Placement {
            nspid: Some(2),
            cgroup: Some("/machine.slice/libpod-x.scope".into()),
            container: Some(crate::procfs::placement::Container {
                runtime: "podman".into(),
                id: "x".into(),
                pod_uid: None,
            }),
        },
        comm: odd,
        argv: Argv::new(Args::from_list([&b"w\xffrk"[..], b"--x"])),
        ..LeakDetail::default()
    };
    let text = serde_json::to_string(&Event::Flag(Flag {
        pid: 2,
        reason: Reason::Orphaned,
        since: 1,
        idle_secs: None,
        detail: Box::new(detail.clone()),
    }))
    .unwrap();
    let back: LeakDetail = serde_json::from_str(&text).unwrap();
    assert_eq!(
        serde_json::to_string(&back).unwrap(),
        serde_json::to_string(&detail).unwrap()
    );
    assert_eq!(back.comm.text(), "w\u{fffd}rk");
    assert_eq!(
        back.comm.for_terminal(),
        "w\\xffrk",
        "the exact bytes came back"
    );
    // A line missing most fields still reads, with defaults.
    let sparse: LeakDetail = serde_json::from_str(r#"{"comm":"x","lineage":[3]}"#).unwrap();
    assert_eq!(
        (sparse.lineage, sparse.comm.text().into_owned()),
        (vec![3], "x".into())
    );
}

/// One event of each kind, with a non-UTF-8 name where it has one.
fn one_of_each() -> Vec<Event> {
    let odd = || ProcText::new("comm", &b"w\xffrk"[..]);
    let argv = || Argv::new(Args::from_list([&b"w\xffrk"[..], b"--x"]));
    vec![
        Snapshot {
            pid: 3,
            spawner: Some(2),
            comm: odd(),
            argv: argv(),
            ..Default::default()
        }
        .into(),
        Gateway {
            pid: 2,
            selector: "exe:/usr/bin/gw".into(),
            comm: odd(),
            argv: argv(),
            ..Default::default()
        }
        .into(),
        Ready {
            schema: SCHEMA_VERSION,
            gateway: vec![2],
            setsid_hook: "tracepoint".into(),
            ..Default::default()
        }
        .into(),
        Fork {
            pid: 4,
            comm: odd(),
            thread: SpawningThread::of(Some((5, Comm::default()))),
            untracked: true,
            ..Default::default()
        }
        .into(),
        Exec {
            pid: 4,
            filename: ProcText::new("filename", &b"/bin/\xffx"[..]),
            argv: argv(),
            ..Default::default()
        }
        .into(),
        Exit {
            pid: 4,
            signal: Some("SIGKILL".into()),
            core: true,
            ..Default::default()
        }
        .into(),
        Reaped {
            pid: 4,
            from_proc: true,
        }
        .into(),
        Setsid { pid: 4, sid: 4 }.into(),
        Session {
            pid: 4,
            start: 7_000,
            session: ProcText::new("session", &b"sess\xff\n\x1b[31m"[..]),
        }
        .into(),
        Reparent {
            pid: 4,
            old_ppid: 3,
            new_ppid: 1,
        }
        .into(),
        Lost {
            count: 2,
            kinds: [("fork".into(), 2)].into(),
            affected: vec![4],
        }
        .into(),
        Box::new(Summary {
            kills: [("orphaned".into(), [("exited".into(), 1)].into())].into(),
            ..Default::default()
        })
        .into(),
        Flag {
            pid: 4,
            reason: Reason::Orphaned,
            since: 1,
            idle_secs: Some(1.5),
            detail: Box::new(LeakDetail {
                session: Some(SessionEvidence {
                    id: ProcText::new("id", &b"s\xff"[..]),
                    begins: 3,
                    owner: Some(2),
                    ended: Some(9),
                }),
                ..Default::default()
            }),
        }
        .into(),
        Kill {
            pid: 4,
            comm: odd(),
            reason: Some(Reason::Orphaned),
            signal: "SIGTERM".into(),
            result: "sent".into(),
            secs: None,
            asked_by: None,
        }
        .into(),
        Kill {
            pid: 5,
            comm: odd(),
            reason: None,
            signal: "SIGKILL".into(),
            result: "exited".into(),
            secs: Some(1.5),
            asked_by: Some(AskedBy { uid: 0, pid: 77 }),
        }
        .into(),
        Cleared {
            pid: 4,
            reason: Reason::Orphaned,
            because: "exited".into(),
        }
        .into(),
        Check {
            verdict: "leaked".into(),
            leaked: vec![LeakedProcess::default()],
            ..Default::default()
        }
        .into(),
        StopCommand {
            pid: 2,
            signal: "SIGTERM".into(),
            because: "duration".into(),
        }
        .into(),
        Note::event("pid 7: its Python frames are not read: \"no libpython\""),
    ]
}

#[test]
fn every_kind_reads_back_as_written() {
    let events = one_of_each();
    for kind in KINDS {
        assert!(
            events.iter().any(|e| e.name() == kind.name),
            "{} has no case here",
            kind.name
        );
    }
    for event in events {
        let written = line(&event).to_string();
        let back = Event::read(event.name(), written.as_bytes())
            .expect("a kind of the stream")
            .unwrap_or_else(|e| panic!("{written}: {e}"));
        assert_eq!(back.name(), event.name());
        assert_eq!(line(&back).to_string(), written);
    }
    assert!(Event::read("no_such_event", b"{}").is_none());
}

#[test]
fn every_kind_has_a_readable_line_with_no_raw_control_byte() {
    for event in one_of_each() {
        let text = event.readable(9);
        assert!(!text.is_empty(), "{}", event.name());
        assert!(
            !text.chars().any(|c| c.is_control() && c != '\n'),
            "{}: {text:?}",
            event.name()
        );
    }
}

#[test]
fn a_reason_is_written_by_its_name_and_one_this_build_does_not_know_reads_as_other() {
    for reason in Reason::ALL {
        assert_eq!(serde_json::to_value(reason).unwrap(), reason.name());
        let back: Reason = serde_json::from_value(reason.name().into()).unwrap();
        assert_eq!(back, reason);
    }
    // A later build's reason: the line still reads, with all it says but the reason's name.
    let flag: Flag = serde_json::from_str(r#"{"pid":7,"reason":"frozen","since":1}"#).unwrap();
    assert_eq!((flag.pid, flag.reason, flag.since), (7, Reason::Other, 1));
}

/// A record's events are built from what the graph made of it: a fork from another thread of
/// its spawner (its `thread`), while the tracked map was full (`untracked`), then its exec,
/// setsid, exit and free, each line byte for byte.
#[test]
fn a_records_event_is_built_from_the_graphs_change() {
    use crate::capture::decode::{KernelEvent, What};
    use crate::lineage::graph::{LineageGraph, testing::gateway};
    let mut graph = LineageGraph::new(100);
    graph.add_seed(gateway(100));
    let record = |what| KernelEvent {
        seq: 0,
        generation: 1,
        ts: 5,
        pid: 200,
        start: 7_000,
        what,
    };
    let mut lines = Vec::new();
    let mut take = |what, interpreter: Option<&str>| {
        let ev = record(what);
        let change = graph.apply(&ev);
        let event = change.event(&graph, ev.pid, interpreter.map(str::to_owned));
        lines.push(event.map(|e| written(&e)).unwrap_or_default());
    };
    take(
        What::Fork {
            spawner: 100,
            ppid: 100,
            sid: 100,
            pgid: 100,
            uid: 1000,
            cgroup_id: 42,
            comm: Comm::from_c(b"gw"),
            spawner_tid: 101,
            stack: Default::default(),
            copy: None,
            untracked: true,
        },
        None,
    );
    take(
        What::Exec {
            old_tid: 200,
            comm: Comm::from_c(b"python3.12"),
            filename: b"/usr/bin/python3.12".as_slice().into(),
            argv: Args::from_list(["python3", "-m", "server"]),
            truncated: false,
            interpreter: None,
        },
        Some("python3.12"),
    );
    take(What::Setsid { sid: 200 }, None);
    take(What::Exit { status: 9 }, None);
    take(What::Free, None);
    take(What::Free, None);
    assert_eq!(
        lines,
        [
            r#"{"event":"fork","seq":3,"ts":9,"pid":200,"ppid":100,"spawner":100,"comm":"gw","start":7000,"sid":100,"pgid":100,"uid":1000,"cgroup_id":42,"untracked":true,"thread":{"tid":101,"comm":"gw"}}"#,
            r#"{"event":"exec","seq":3,"ts":9,"pid":200,"filename":"/usr/bin/python3.12","argv":["python3","-m","server"],"truncated":false,"tid":200,"interpreter":"python3.12"}"#,
            r#"{"event":"setsid","seq":3,"ts":9,"pid":200,"sid":200}"#,
            r#"{"event":"exit","seq":3,"ts":9,"pid":200,"exit_code":null,"signal":"SIGKILL","core":false}"#,
            r#"{"event":"reaped","seq":3,"ts":9,"pid":200}"#,
            // The second free changed nothing: no event.
            "",
        ]
    );
}
