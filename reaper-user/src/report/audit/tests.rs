//! Unit tests of `audit.rs`.
use super::*;
use crate::report::timeline::MAX_POINTS;

fn line(ts: u64, body: &str) -> String {
    format!("{{\"seq\":0,\"ts\":{ts},{body}}}\n")
}

#[test]
fn a_long_audit_keeps_a_bounded_timeline_with_its_peaks() {
    let mut text = String::new();
    text += &line(0, r#""event":"ready","gateway":[1],"kernel":"k""#);
    // A day of one fork and exit a second, and one burst of 500 live at noon.
    for s in 0..86_400u64 {
        let ts = s * 1_000_000_000;
        let pid = 2 + (s % 30_000) as u32;
        text += &line(
            ts,
            &format!(r#""event":"fork","pid":{pid},"ppid":1,"spawner":1,"comm":"w""#),
        );
        if s == 43_200 {
            for k in 0..500 {
                text += &line(
                    ts,
                    &format!(
                        r#""event":"fork","pid":{},"ppid":1,"spawner":1,"comm":"b""#,
                        40_000 + k
                    ),
                );
            }
            for k in 0..500 {
                text += &line(ts + 1, &format!(r#""event":"exit","pid":{}"#, 40_000 + k));
            }
        }
        text += &line(ts + 500_000_000, &format!(r#""event":"exit","pid":{pid}"#));
    }
    let audit = Audit::read(text.as_bytes()).unwrap();
    assert!(
        audit.timeline.points().len() <= MAX_POINTS,
        "{}",
        audit.timeline.points().len()
    );
    assert!(audit.timeline.points().len() > MAX_POINTS / 3);
    let peak = audit
        .timeline
        .points()
        .iter()
        .map(|p| p.alive)
        .max()
        .unwrap();
    assert_eq!(peak, 502, "the burst survives downsampling");
    assert_eq!(audit.live.len(), 1, "only the gateway is left");
    assert!(!audit.complete);
}

#[test]
fn the_known_events_are_the_schemas() {
    let schema: serde_json::Value =
        serde_json::from_str(include_str!("../../../../schema/events.schema.json")).unwrap();
    let mut names: Vec<&str> = schema["properties"]["event"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    names.sort_unstable();
    let mut known: Vec<&str> = KINDS.iter().map(|k| k.name).collect();
    known.sort_unstable();
    assert_eq!(names, known);
}

#[test]
fn an_odd_file_cannot_grow_the_state() {
    let mut text = String::new();
    for i in 0..300u32 {
        text += &line(1, &format!(r#""event":"odd{i}","pid":1"#));
        text += &line(
            2,
            &format!(r#""event":"kill","pid":1,"reason":"r{i}","result":"x""#),
        );
    }
    // A chain of 500 forks, each the child of the one before, all alive.
    for pid in 2..502u32 {
        let argv = "a".repeat(1000);
        text += &line(
            3,
            &format!(
                r#""event":"fork","pid":{pid},"spawner":{},"ppid":{},"comm":"c","argv":["{argv}"]"#,
                pid - 1,
                pid - 1
            ),
        );
    }
    let audit = Audit::read(text.as_bytes()).unwrap();
    assert_eq!(audit.events.get("(unknown)"), Some(&300));
    assert!(audit.kills.len() <= MAX_KILL_KINDS + 1);
    assert!(audit.live.values().all(|p| p.lineage.len() <= MAX_DEPTH));
    assert!(
        audit
            .live
            .values()
            .all(|p| p.argv.len() <= MAX_ARGV_CHARS + 3)
    );
}

#[test]
fn flags_clear_and_kills_land_on_their_row() {
    let text = [
        line(1, r#""event":"flag","pid":5,"reason":"orphaned","rss_kib":100,"comm":"x","argv":["x"]"#),
        line(2, r#""event":"kill","pid":5,"comm":"x","reason":"orphaned","signal":"SIGTERM","result":"sent""#),
        line(3, r#""event":"kill","pid":5,"comm":"x","reason":"orphaned","signal":"SIGTERM","result":"exited","secs":0.1"#),
        line(4, r#""event":"cleared","pid":5,"reason":"orphaned","because":"exited""#),
        line(5, r#""event":"summary""#),
    ]
    .concat();
    let audit = Audit::read(text.as_bytes()).unwrap();
    let row = &audit.flags[0];
    assert_eq!(row.cleared, Some((4, "exited".into())));
    assert_eq!(row.kill, Some(("SIGTERM".into(), "exited".into())));
    assert_eq!(audit.kills.values().sum::<u64>(), 2);
    assert_eq!(
        audit.timeline.points().last().unwrap().flagged_rss_kib,
        100,
        "peak kept"
    );
    assert!(audit.complete);
}

#[test]
fn an_orphan_alive_at_the_end_shows_its_parent_after_the_reparent() {
    let text = [
        line(1, r#""event":"ready","gateway":[10],"kernel":"k""#),
        line(
            2,
            r#""event":"fork","pid":10,"ppid":9,"spawner":9,"comm":"gw""#,
        ),
        line(
            3,
            r#""event":"fork","pid":11,"ppid":10,"spawner":10,"comm":"gw""#,
        ),
        line(
            4,
            r#""event":"fork","pid":12,"ppid":11,"spawner":11,"comm":"gw""#,
        ),
        line(5, r#""event":"exit","pid":11"#),
        line(
            6,
            r#""event":"reparent","pid":12,"old_ppid":11,"new_ppid":1"#,
        ),
    ]
    .concat();
    let audit = Audit::read(text.as_bytes()).unwrap();
    let orphan = &audit.live[&12];
    assert_eq!(orphan.lineage, [10, 11, 12]);
    assert_eq!(orphan.ppid, 1, "its real parent now, not its dead spawner");
    assert_eq!(
        audit.live[&10].comm, "gw",
        "the gateway's line has its comm"
    );
}

#[test]
fn an_exec_names_the_process_as_the_run_does_its_program_cut_at_15_bytes() {
    // "ü" is two bytes: the 15th byte is the first half of one.
    let program = "/opt/mcp/bbüüüüüüü-server";
    let text = [
        line(1, r#""event":"ready","gateway":[10],"kernel":"k""#),
        line(
            2,
            r#""event":"fork","pid":10,"ppid":9,"spawner":9,"comm":"gw""#,
        ),
        line(
            3,
            &format!(r#""event":"exec","pid":10,"filename":"{program}","argv":["x"]"#),
        ),
    ]
    .concat();
    let audit = Audit::read(text.as_bytes()).unwrap();
    let run = Comm::of_program(program.as_bytes());
    assert_eq!(audit.live[&10].comm, lossy(run.as_bytes()));
    assert_eq!(audit.live[&10].comm, "bbüüüüüü\u{fffd}");
}
