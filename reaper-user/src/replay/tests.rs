use std::io::Write as _;
use std::path::PathBuf;

use serde_json::{Value, json};

use super::*;
use crate::leaks::Reason;

const S: u64 = 1_000_000_000;

/// An audit file of `lines`, each numbered in its run (`seq` 0 where a run begins).
struct Audit {
    file: tempfile::NamedTempFile,
    seq: u64,
}

impl Audit {
    fn new() -> Audit {
        Audit {
            file: tempfile::NamedTempFile::new().unwrap(),
            seq: 0,
        }
    }

    fn path(&self) -> Vec<PathBuf> {
        vec![self.file.path().to_owned()]
    }

    /// Writes one line: `event` at `ts` seconds, with `body`'s fields.
    fn line(&mut self, event: &str, ts: u64, body: Value) -> &mut Audit {
        let mut line = json!({"event": event, "seq": self.seq, "ts": ts * S});
        line.as_object_mut()
            .unwrap()
            .extend(body.as_object().unwrap().clone());
        writeln!(self.file, "{line}").unwrap();
        self.seq += 1;
        self
    }

    fn new_run(&mut self) -> &mut Audit {
        self.seq = 0;
        self
    }

    fn ready(&mut self, ts: u64, resumed: bool) -> &mut Audit {
        let mut body = json!({"schema": 2, "gateway": [], "tracked": 0,
            "setsid_hook": "tracepoint", "kernel": "6.18", "booted_at_unix_ns": 1_000 * S});
        if resumed {
            body["resumed"] = json!({"state_dir": "/s", "gap_ns": 1, "adopted": 1, "gone": 0});
        }
        self.line("ready", ts, body)
    }

    fn fork(&mut self, ts: u64, pid: u32, spawner: u32, start: u64) -> &mut Audit {
        let body = json!({"pid": pid, "ppid": spawner, "spawner": spawner, "comm": "gw",
            "start": start * S, "sid": 1, "pgid": 1, "uid": 0, "cgroup_id": 1});
        self.line("fork", ts, body)
    }

    fn exec(&mut self, ts: u64, pid: u32, program: &str) -> &mut Audit {
        let body = json!({"pid": pid, "filename": program, "argv": [program, "--stdio"],
            "truncated": false, "tid": pid});
        self.line("exec", ts, body)
    }

    fn exit(&mut self, ts: u64, pid: u32) -> &mut Audit {
        let body = json!({"pid": pid, "exit_code": 0, "signal": null, "core": false});
        self.line("exit", ts, body)
            .line("reaped", ts, json!({"pid": pid}))
    }

    fn flag(&mut self, ts: u64, pid: u32, since: u64) -> &mut Audit {
        let body = json!({"pid": pid, "reason": "orphaned", "since": since * S,
            "lineage": [10, pid], "rss_kib": 300, "state": "S (sleeping)",
            "spawned_at": [{"function": "_run_stdio", "file": "mcp_tool.py", "line": 812}]});
        self.line("flag", ts, body)
    }

    /// The gateway 10 (started by the run: `-- CMD`).
    fn gateway(&mut self) -> &mut Audit {
        self.ready(1, false).fork(1, 10, 1, 1).line(
            "gateway",
            1,
            json!({"pid": 10, "start": S, "selector": "command", "comm": "gw", "argv": ["gw"]}),
        )
    }
}

#[test]
fn a_reused_pid_is_answered_per_process_and_at_a_moment_by_the_one_that_had_it() {
    let mut audit = Audit::new();
    audit
        .gateway()
        .fork(2, 11, 10, 2)
        .exec(2, 11, "/usr/bin/node")
        .exit(5, 11)
        .fork(6, 11, 10, 6)
        .exec(6, 11, "/usr/bin/python3")
        .exit(7, 10)
        .flag(9, 11, 7)
        .line("note", 20, json!({"text": "the end"}));
    let all = why(&audit.path(), 11, None).unwrap();
    assert_eq!(all.len(), 2, "{all:?}");
    let (first, second) = (&all[0].answer, &all[1].answer);
    assert_eq!((first.start, first.exited), (2 * S, Some(5 * S)));
    assert_eq!(first.now, 5 * S, "answered as at its exit");
    assert_eq!(first.detail.argv.text(), "/usr/bin/node --stdio");
    assert!(first.flags.is_empty());
    assert_eq!((second.start, second.alive), (6 * S, true));
    assert_eq!(second.detail.lineage, [10, 11]);
    assert_eq!(second.detail.ancestors[0].exited, Some(7 * S));
    assert_eq!(second.flags.len(), 1);
    assert_eq!(
        (second.flags[0].reason, second.flags[0].since),
        (Reason::Orphaned, 7 * S)
    );
    assert_eq!(
        second.detail.rss_kib,
        Some(300),
        "its evidence as its flag recorded it"
    );
    assert_eq!(
        second.detail.spawned_at[0].function.as_deref(),
        Some("_run_stdio")
    );
    assert_eq!(second.now, 20 * S, "the live one as at the audit's end");

    // At a moment: the one that had the pid then, alive or the last one.
    let at = |t: u64| why(&audit.path(), 11, Some(At::Boot(t * S))).unwrap();
    let then = at(3);
    assert_eq!(then.len(), 1);
    assert_eq!((then[0].answer.start, then[0].answer.alive), (2 * S, true));
    assert_eq!(then[0].answer.now, 3 * S);
    let between = at(5);
    assert_eq!(between[0].answer.exited, Some(5 * S));
    let before_its_flag = at(8);
    assert_eq!(before_its_flag[0].answer.start, 6 * S);
    assert!(before_its_flag[0].answer.flags.is_empty());
    assert!(at(1).is_empty(), "nobody had it yet");
    assert_eq!(
        all[1].moment(),
        "1970-01-01T00:17:00Z",
        "the wall clock of the audit's end (boot at 1000 s, 20 s in)"
    );
}

#[test]
fn the_tree_at_a_moment_is_the_live_tree_then_with_its_flags() {
    let mut audit = Audit::new();
    audit
        .gateway()
        .fork(2, 11, 10, 2)
        .fork(3, 12, 11, 3)
        .exit(4, 11)
        .flag(6, 12, 4)
        .exit(9, 12)
        .line(
            "cleared",
            9,
            json!({"pid": 12, "reason": "orphaned", "because": "exited"}),
        );
    let tree_at = |t: Option<u64>| {
        tree(
            &audit.path(),
            &TreeFilter::default(),
            t.map(|t| At::Boot(t * S)),
        )
        .unwrap()
        .answer
        .unwrap()
    };
    let flagged = tree_at(Some(7));
    let g = &flagged[0];
    assert_eq!((g.pid, g.gateway), (10, true));
    let b = &g.spawned[0].spawned[0];
    assert_eq!((b.pid, b.flags.as_slice()), (12, &[Reason::Orphaned][..]));
    let at_end = tree_at(None);
    assert_eq!(at_end.len(), 1);
    assert!(at_end[0].spawned.is_empty(), "{at_end:?}");
    let by_reason = TreeFilter {
        reason: Some(Reason::Orphaned),
        ..Default::default()
    };
    let picked = tree(
        &audit.path(),
        &by_reason,
        Some(At::Since(std::time::Duration::from_secs(5))),
    )
    .unwrap();
    assert_eq!(picked.now, 6 * S, "5 s after the first line");
    assert_eq!(picked.answer.unwrap().len(), 1);
    let untracked = TreeFilter {
        gateway: Some(99),
        ..Default::default()
    };
    assert!(
        tree(&audit.path(), &untracked, None)
            .unwrap()
            .answer
            .is_none()
    );
}

#[test]
fn a_run_that_took_the_lineage_back_goes_on_from_it_and_any_other_starts_afresh() {
    let mut resumed = Audit::new();
    resumed
        .gateway()
        .fork(2, 11, 10, 2)
        .flag(3, 11, 2)
        .new_run()
        .fork(4, 12, 11, 4)
        .ready(5, true);
    let answers = why(&resumed.path(), 12, None).unwrap();
    assert_eq!(
        answers[0].answer.detail.lineage,
        [10, 11, 12],
        "the gap's fork, before ready"
    );
    let eleven = why(&resumed.path(), 11, None).unwrap();
    assert_eq!(eleven.len(), 1);
    assert!(eleven[0].answer.flags.is_empty(), "each run judges afresh");

    let mut restarted = Audit::new();
    restarted
        .gateway()
        .fork(2, 11, 10, 2)
        .new_run()
        .line(
            "snapshot",
            4,
            json!({"pid": 10, "start": S, "ppid": 1, "spawner": null, "comm": "gw",
                   "argv": ["gw"], "sid": 1, "pgid": 1, "cgroup": "/"}),
        )
        .ready(4, false);
    let eleven = why(&restarted.path(), 11, None).unwrap();
    assert_eq!(eleven.len(), 1, "answered as the first run left it");
    assert!(eleven[0].answer.alive);
    assert_eq!(eleven[0].answer.now, 2 * S);
    let roots = tree(&restarted.path(), &TreeFilter::default(), None).unwrap();
    let roots = roots.answer.unwrap();
    assert_eq!(roots.len(), 1);
    assert_eq!(roots[0].pid, 10);
    assert!(
        roots[0].spawned.is_empty(),
        "the second run knows only what it found"
    );
    // The second run's first process after the gateway has the first run's node's place in
    // its graph: it is answered too, and not with the first run's flag.
    restarted.fork(5, 11, 10, 5);
    let both = why(&restarted.path(), 11, None).unwrap();
    assert_eq!(both.len(), 2, "{both:?}");
    assert_eq!(both[1].answer.start, 5 * S);
}

#[test]
fn a_wall_clock_moment_needs_the_audits_clock_and_bad_files_say_why() {
    let mut audit = Audit::new();
    audit.gateway().fork(2, 11, 10, 2);
    let wall = At::Wall((1_000 + 3) * S);
    assert_eq!(
        why(&audit.path(), 11, Some(wall)).unwrap()[0].answer.now,
        2 * S
    );

    let mut old = Audit::new();
    old.line(
        "ready",
        1,
        json!({"schema": 2, "gateway": [], "tracked": 0,
            "setsid_hook": "tracepoint", "kernel": "6.18"}),
    )
    .fork(2, 11, 1, 2);
    let err = why(&old.path(), 11, Some(wall)).unwrap_err().to_string();
    assert!(err.contains("booted_at_unix_ns"), "{err}");
    assert_eq!(why(&old.path(), 11, None).unwrap().len(), 1);

    let mut junk = Audit::new();
    writeln!(junk.file, "not json\n{{\"no\": \"event\"}}").unwrap();
    let err = why(&junk.path(), 11, None).unwrap_err().to_string();
    assert!(err.contains("holds no reaper-trace events"), "{err}");
    let err = why(&[PathBuf::from("/nonexistent/audit.ndjson")], 11, None).unwrap_err();
    assert!(format!("{err:#}").contains("cannot read /nonexistent/audit.ndjson"));

    // Junk among the lines is skipped, not fatal.
    writeln!(
        audit.file,
        "{{\"event\": \"fork\", \"pid\": \"x\"}}\ngarbage"
    )
    .unwrap();
    audit.exit(4, 11);
    assert_eq!(
        why(&audit.path(), 11, None).unwrap()[0].answer.exited,
        Some(4 * S)
    );
}

#[test]
fn an_inner_process_of_a_flagged_server_is_answered_with_the_server_from_its_outermost() {
    let mut audit = Audit::new();
    audit
        .gateway()
        .fork(2, 11, 10, 2)
        .exec(2, 11, "/usr/bin/npm")
        .fork(3, 12, 11, 3)
        .exec(3, 12, "/usr/bin/node")
        .line(
            "flag",
            9,
            json!({"pid": 11, "reason": "idle", "since": 3 * S, "lineage": [10, 11],
                   "chain": [{"pid": 11, "comm": "npm", "argv": ["npm", "exec"]},
                             {"pid": 12, "comm": "node", "argv": ["node", "server.js"]}]}),
        );
    let inner = &why(&audit.path(), 12, None).unwrap()[0].answer;
    assert!(inner.flags.is_empty(), "the flag is the server's");
    let server = inner.server.as_ref().expect("part of a server");
    assert_eq!(server.pid, 11);
    assert_eq!(server.flags[0].reason, Reason::Idle);
    let chain: Vec<u32> = inner.detail.chain.iter().map(|m| m.pid).collect();
    assert_eq!(chain, [11, 12]);
    let outer = &why(&audit.path(), 11, None).unwrap()[0].answer;
    assert!(outer.server.is_none(), "the outermost is the server");
}
