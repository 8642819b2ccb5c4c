//! Unit tests of `readable.rs` and of the readable lines built with it.
use super::*;
use crate::leaks::Reason;
use crate::leaks::rules::line::flag_line;
use crate::output::human::human_line;
use crate::stream::events::{Ancestor, Argv, Event, Exec, Peer, ProcText, Ready, Resumed};
use crate::stream::words::human_duration;
use crate::text::{Args, Comm};

#[test]
fn human_lines_escape_the_exact_bytes() {
    let line = human_line(
        0,
        &Event::Exec(Exec {
            pid: 7,
            filename: ProcText::new("filename", &b"/bin/\xff\x1b[31m"[..]),
            argv: Argv::new(Args::from_list([&b"a\nb"[..], &b"\xfe"[..]])),
            truncated: false,
            tid: 7,
            interpreter: None,
        }),
    );
    assert_eq!(line, "exec     7 /bin/\\xff\\x1b[31m: a\\x0ab \\xfe");
}

fn ancestor(pid: u32, argv: &[&str], exited: Option<u64>) -> Ancestor {
    Ancestor {
        process: member(pid, argv),
        exited,
    }
}

fn detail(ancestors: Vec<Ancestor>, ppid: u32, escaped: bool) -> LeakDetail {
    LeakDetail {
        lineage: ancestors.iter().map(|a| a.process.pid).collect(),
        pipes: vec![PipeInfo {
            fd: 0,
            kind: "pipe".into(),
            inode: Some(88123),
            end: "read".into(),
            other_end: "open".into(),
            peers: vec![Peer {
                pid: 4705,
                fd: 5,
                end: "write".into(),
                comm: ProcText::new("comm", Comm::from_c(b"sleep\x1b")),
            }],
            ..PipeInfo::default()
        }],
        chain: Vec::new(),
        ancestors,
        state: "S (sleeping)".into(),
        rss_kib: Some(312 * 1024),
        ppid,
        escaped,
        placement: Default::default(),
        comm: ProcText::new("comm", Comm::from_c(b"node")),
        argv: Argv::new(Args::from_list([&b"node"[..], &b"bridge.cjs"[..]])),
        ..LeakDetail::default()
    }
}

const SEC: u64 = 1_000_000_000;

fn member(pid: u32, argv: &[&str]) -> ProcessLabel {
    ProcessLabel {
        pid,
        comm: ProcText::new("comm", Comm::from_c(b"x")),
        argv: Argv::new(Args::from_list(argv)),
    }
}

#[test]
fn a_node_servers_line_names_the_host_socket_shows_the_chain_and_counts_the_plumbing() {
    let socket = |fd, inode, peer_inode, internal, peers: Vec<Peer>| PipeInfo {
        fd,
        kind: "socket".into(),
        inode: Some(inode),
        end: "both".into(),
        other_end: "open".into(),
        peer_inode: Some(peer_inode),
        index: None,
        protocol: None,
        remote: None,
        internal,
        peers,
        peers_omitted: 0,
    };
    let host = |fd| Peer {
        pid: 4700,
        fd,
        end: "both".into(),
        comm: ProcText::new("comm", Comm::from_c(b"node")),
    };
    let mut d = detail(
        vec![ancestor(4700, &["node", "host.js"], None)],
        4700,
        false,
    );
    d.pipes = vec![
        socket(0, 900, 901, false, vec![host(21)]),
        socket(1, 902, 903, false, vec![host(23)]),
        socket(6, 904, 905, true, Vec::new()),
        socket(7, 905, 904, true, Vec::new()),
    ];
    d.chain = vec![
        member(4701, &["node", "npm", "exec", "srv"]),
        member(4702, &["sh", "-c", "srv"]),
        member(4703, &["node", "server.js"]),
    ];
    d.argv = Argv::new(Args::from_list(["node", "npm", "exec", "srv"]));
    d.rss_kib = None;
    let line = flag_line(70 * SEC, 4701, Reason::Idle, 10 * SEC, &d);
    assert_eq!(
        line,
        "LEAK idle pid 4701 (npm exec srv): waiting for input, no I/O for 1m00s; server 4701 \
         > 4702 (-c srv) > 4703 (server.js); fd 0 socket:[900], other end held by 4700 \
         (node) fd 21; fd 1 socket:[902], other end held by 4700 (node) fd 23; 2 fds of its \
         own internal channels"
    );
}

#[test]
fn a_flag_in_a_container_says_where_it_runs() {
    let mut d = detail(vec![ancestor(4700, &["gw"], Some(0))], 1, true);
    d.pipes.clear();
    d.rss_kib = None;
    d.placement = crate::procfs::placement::Placement {
        nspid: Some(2),
        cgroup: Some("/kubepods/besteffort/podX/0123456789abcdef".into()),
        container: Some(crate::procfs::placement::Container {
            runtime: "containerd".into(),
            id: "0123456789abcdef0123".into(),
            pod_uid: Some("6f1c1a52-1111-4c2e-9a5b-0123456789ab".into()),
        }),
    };
    let line = flag_line(SEC, 4711, Reason::Deaf, 0, &d);
    assert!(
        line.ends_with(
            ", pid 2 in its pid namespace, in containerd container 0123456789ab of pod \
             6f1c1a52-1111-4c2e-9a5b-0123456789ab"
        ),
        "{line}"
    );
}

#[test]
fn orphaned_line_names_the_exited_spawner_the_peer_and_the_rss() {
    let d = detail(
        vec![
            ancestor(4700, &["hermes", "--tui"], Some(10 * SEC)),
            ancestor(4711, &["node", "bridge.cjs"], None),
        ],
        1,
        true,
    );
    let line = flag_line(202 * SEC, 4711, Reason::Orphaned, 10 * SEC, &d);
    assert_eq!(
        line,
        "LEAK orphaned pid 4711 (bridge.cjs): spawner 4700 (hermes --tui) exited 3m12s \
         ago, now a child of 1, escaped (another session, group or cgroup than the \
         gateway's); fd 0 pipe:[88123] read end, other end held by 4705 (sleep\\x1b) fd 5 \
         write end; RSS 312.0 MiB"
    );
}

#[test]
fn a_line_counts_the_channels_and_holders_the_flag_did_not_list() {
    let mut d = detail(
        vec![ancestor(4711, &["node", "bridge.cjs"], None)],
        1,
        false,
    );
    d.pipes[0].peers_omitted = 1_983;
    d.pipes_omitted = 18_926;
    let line = flag_line(2 * SEC, 4711, Reason::Deaf, SEC, &d);
    assert!(
        line.contains(
            "other end held by 4705 (sleep\\x1b) fd 5 write end and 1983 more; 18926 more \
             fds of pipes, sockets or terminals;"
        ),
        "{line}"
    );
}

#[test]
fn an_exited_grandparent_is_an_ancestor_and_zombies_say_how_long() {
    let d = detail(
        vec![
            ancestor(1, &["gw"], Some(SEC)),
            ancestor(2, &["sh"], None),
            ancestor(3, &["sleep"], None),
        ],
        2,
        false,
    );
    let line = flag_line(5 * SEC, 3, Reason::Orphaned, SEC, &d);
    assert!(line.contains(": ancestor 1 (gw) exited 4s ago;"), "{line}");
    assert!(!line.contains("now a child"), "{line}");
    let line = flag_line(65 * SEC, 3, Reason::Zombie, 4 * SEC, &d);
    assert!(
        line.contains("exited 1m01s ago, not reaped by its parent 2"),
        "{line}"
    );
    assert_eq!(human_duration(7300 * SEC), "2h01m");
}

#[test]
fn a_resumed_runs_ready_line_says_what_it_took_back_and_where_the_gap_is() {
    let ready = |resumed| {
        human_line(
            0,
            &Event::Ready(Ready {
                schema: 2,
                gateway: vec![40],
                tracked: 3,
                setsid_hook: "tracepoint".into(),
                kernel: "6.18".into(),
                booted_at_unix_ns: None,
                resumed,
            }),
        )
    };
    let kept = ready(Some(Resumed {
        state_dir: "/var/lib/reaper-trace".into(),
        gap_ns: 4_200_000_000,
        adopted: 12,
        gone: 0,
        kernel_kept: true,
        unsaved: 0,
    }));
    assert!(
        kept.ends_with(
            "; resumed 12 processes from /var/lib/reaper-trace after a 4.2s gap: its events \
             follow from the kept ring (negative times)"
        ),
        "{kept}"
    );
    let killed = ready(Some(Resumed {
        kernel_kept: false,
        gone: 2,
        unsaved: 5,
        ..Resumed::default()
    }));
    assert!(
        killed.contains("the kernel side was not kept: 2 gone, read from /proc")
            && killed.contains("taking 5 records it did not save"),
        "{killed}"
    );
    assert!(!ready(None).contains("resumed"));
}

#[test]
fn a_flag_names_the_spawners_own_frames_past_its_libcs_fork() {
    let frame = |function: &str, file: &str, line, object: &str| crate::stream::evidence::Frame {
        function: Some(function.into()),
        file: (!file.is_empty()).then(|| file.into()),
        line,
        object: Some(object.into()),
        build_id: None,
        offset: 0,
        language: None,
    };
    let frames = vec![
        frame("_Fork", "", None, "/usr/lib/x86_64-linux-gnu/libc.so.6"),
        frame("start_server", "/src/gw/tools.c", Some(812), "/usr/bin/gw"),
        frame("connect", "/src/gw/tools.c", Some(40), "/usr/bin/gw"),
        frame("main", "/src/gw/main.c", Some(9), "/usr/bin/gw"),
        frame(
            "__libc_start_main",
            "",
            None,
            "/usr/lib/x86_64-linux-gnu/libc.so.6",
        ),
    ];
    assert_eq!(
        super::spawn_site_text(&frames).as_deref(),
        Some("start_server (tools.c:812) < connect (tools.c:40) < main (main.c:9)")
    );
    assert_eq!(
        super::spawn_site_text(&frames[..1]),
        None,
        "libc alone names nothing"
    );
    let stripped = crate::stream::evidence::Frame {
        object: Some("/usr/bin/dash".into()),
        offset: 0xd527,
        ..Default::default()
    };
    assert_eq!(
        super::spawn_site_text(&[frames[0].clone(), stripped, frames[3].clone()]).as_deref(),
        Some("dash+0xd527 < main (main.c:9)"),
        "a stripped program's frame is named by its object and offset"
    );
}

#[test]
fn a_python_spawners_line_starts_past_subprocess_and_asyncio() {
    let frame = |function: &str, file: &str, line| crate::stream::evidence::Frame {
        function: Some(function.into()),
        file: Some(file.into()),
        line: Some(line),
        language: Some("python".into()),
        ..Default::default()
    };
    let frames = vec![
        frame(
            "Popen._execute_child",
            "/usr/lib/python3.13/subprocess.py",
            1922,
        ),
        frame("Popen.__init__", "/usr/lib/python3.13/subprocess.py", 1040),
        frame(
            "create_subprocess_exec",
            "/usr/lib/python3.13/asyncio/subprocess.py",
            224,
        ),
        frame("_run_stdio", "/opt/hermes/tools/mcp_tool.py", 812),
        frame("connect", "/opt/hermes/tools/mcp_tool.py", 90),
    ];
    assert_eq!(
        super::spawn_site_text(&frames).as_deref(),
        Some("_run_stdio (mcp_tool.py:812) < connect (mcp_tool.py:90)")
    );
}

#[test]
fn a_rust_hosts_line_starts_past_std_and_tokios_command() {
    let frame = |function: &str, file: &str, object: &str| crate::stream::evidence::Frame {
        function: Some(function.into()),
        file: Some(file.into()),
        line: Some(7),
        object: Some(object.into()),
        ..Default::default()
    };
    let (libc, host) = ("/usr/lib/x86_64-linux-gnu/libc.so.6", "/usr/bin/host");
    let std = "/rustc/0/library/std/src";
    let frames = vec![
        frame("__spawni", "./posix/spawni.c", libc),
        frame(
            "<std::sys::process::unix::common::Command>::spawn",
            &format!("{std}/sys/process/unix/common.rs"),
            host,
        ),
        frame(
            "<std::process::Command>::spawn",
            &format!("{std}/process.rs"),
            host,
        ),
        frame(
            "<tokio::process::Command>::spawn",
            "/tokio/src/process/mod.rs",
            host,
        ),
        frame("host::mcp::start_server", "/src/host/src/mcp.rs", host),
    ];
    assert_eq!(
        super::spawn_site_text(&frames).as_deref(),
        Some("host::mcp::start_server (mcp.rs:7)")
    );
}
