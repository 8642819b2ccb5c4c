//! The event schema itself: a valid JSON Schema, strict enough to fail a wrong event, and in
//! step with the table of events in docs/events.md. (Every event every integration test produces is
//! validated against it where it is parsed: `Run::from_output`.)
use reaper_tests::{EVENT_SCHEMA, event_schema};
use serde_json::{Value, json};

fn valid(ev: &Value) -> bool {
    event_schema().is_valid(ev)
}

#[test]
fn the_schema_is_a_valid_draft_2020_12_schema() {
    let schema: Value = serde_json::from_str(EVENT_SCHEMA).unwrap();
    assert!(jsonschema::meta::is_valid(&schema));
}

#[test]
fn the_schema_accepts_real_shapes_and_refuses_wrong_ones() {
    let fork = json!({"event": "fork", "seq": 3, "ts": 5, "pid": 10, "ppid": 9, "spawner": 9,
        "comm": "sh", "start": 4, "sid": 1, "pgid": 1, "uid": 0, "cgroup_id": 77});
    assert!(valid(&fork));
    let mut b64 = fork.clone();
    b64["comm_b64"] = json!("/w==");
    assert!(valid(&b64), "the exact-bytes twin is allowed");
    for field in ["pid", "comm", "seq", "ts"] {
        let mut missing = fork.clone();
        missing.as_object_mut().unwrap().remove(field);
        assert!(!valid(&missing), "a fork without {field} is refused");
    }
    let mut extra = fork.clone();
    extra["surprise"] = json!(1);
    assert!(!valid(&extra), "an undocumented field is refused");
    let mut wrong = fork.clone();
    wrong["pid"] = json!(-1);
    assert!(!valid(&wrong));
    assert!(!valid(&json!({"event": "forked", "seq": 0, "ts": 0})));
    let flag = json!({"event": "flag", "seq": 9, "ts": 9, "pid": 12, "reason": "orphaned",
        "since": 8, "lineage": [1, 12], "ancestors": [{"pid": 1, "comm": "gw", "argv": ["gw"],
        "exited": 7}], "chain": [{"pid": 12, "comm": "helper", "argv": ["helper", "--stdio"]}],
        "pipes": [{"fd": 0, "kind": "pipe", "inode": 55, "end": "read",
        "other_end": "open", "peers": [{"pid": 13, "fd": 1, "end": "write", "comm": "x"}]}],
        "state": "S (sleeping)", "rss_kib": 1000, "ppid": 1, "escaped": true, "nspid": 2,
        "cgroup": "/system.slice/hermes.service",
        "comm": "helper", "argv": ["helper", "--stdio"]});
    assert!(valid(&flag));
    let mut bad_peer = flag.clone();
    bad_peer["pipes"][0]["peers"][0]["end"] = json!("sideways");
    assert!(!valid(&bad_peer), "nested objects are checked too");
    let mut odd_runtime = flag.clone();
    odd_runtime["container"] = json!({"runtime": "lxc", "id": "x"});
    assert!(
        !valid(&odd_runtime),
        "a container's runtime is one reaper-trace names"
    );
    let mut no_chain = flag.clone();
    no_chain["chain"] = json!([]);
    assert!(
        !valid(&no_chain),
        "a flagged server has at least its own process"
    );
    let mut internal_false = flag.clone();
    internal_false["pipes"][0]["internal"] = json!(false);
    assert!(
        !valid(&internal_false),
        "`internal` is written only when true"
    );
}

#[test]
fn the_schema_names_every_event_the_readme_documents() {
    let schema: Value = serde_json::from_str(EVENT_SCHEMA).unwrap();
    let mut in_schema: Vec<&str> = schema["properties"]["event"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let readme = include_str!("../../docs/events.md");
    let table = readme
        .split("| event | fields | when |")
        .nth(1)
        .expect("the table of events in docs/events.md");
    let mut in_readme: Vec<&str> = table
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with("| `"))
        .map(|l| l[3..].split('`').next().unwrap())
        .collect();
    in_schema.sort_unstable();
    in_readme.sort_unstable();
    assert_eq!(in_schema, in_readme);
}
