//! Unit tests of `state.rs`.
use super::*;
use crate::lineage::graph::saved::{Bytes, SavedNode, SavedStart};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("reaper-state-{}-{name}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    dir
}

fn node(pid: u32) -> SavedNode {
    SavedNode {
        pid,
        start: SavedStart::Exact(7),
        spawner: None,
        spawner_pid: None,
        ppid: 1,
        sid: pid,
        pgid: pid,
        uid: None,
        cgroup_id: None,
        comm: Bytes(b"w\xffrk".to_vec()),
        filename: None,
        argv: vec![Bytes(b"a b".to_vec())],
        execs: 0,
        forked_at: None,
        spawning_thread: None,
        exited: None,
        is_gateway: true,
        seeded: false,
        called_setsid: false,
        session: None,
        native_stack: None,
        python_stack: None,
    }
}

#[test]
fn a_checkpoint_reads_back_as_written_and_release_removes_it() {
    let dir = scratch("roundtrip");
    let state = StateDir::open(&dir).unwrap();
    let mode = fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "made private");
    assert!(state.load().unwrap().is_none(), "nothing yet");
    let checkpoint = Checkpoint {
        format: FORMAT,
        boot_id: boot_id().unwrap(),
        selectors: vec!["pid".into()],
        written: 5,
        nodes: vec![node(10)],
        build_ids: Vec::new(),
        unwound: Vec::new(),
        sessions: Some("cgroup".into()),
        kernel: None,
    };
    state
        .write(&serde_json::to_vec(&checkpoint).unwrap())
        .unwrap();
    let file_mode = fs::metadata(dir.join(CHECKPOINT))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(file_mode, 0o600);
    let back = state.load().unwrap().unwrap();
    assert_eq!(back.nodes, checkpoint.nodes, "the exact bytes came back");
    assert_eq!(
        back.sessions.as_deref(),
        Some("cgroup"),
        "where sessions were read"
    );
    assert_eq!(check(&back, &dir, &["pid".into()]).unwrap(), Verdict::Adopt);
    let removed = release(&dir).unwrap();
    assert!(removed.contains(CHECKPOINT), "{removed}");
    assert!(!dir.exists(), "an empty state dir goes too");
    let again = release(&dir).unwrap_err().to_string();
    assert!(again.contains("no such directory"), "{again}");
}

#[test]
fn other_selectors_or_format_are_refused_naming_release_state_another_boot_is_stale() {
    let dir = scratch("refused");
    let mut checkpoint = Checkpoint {
        format: FORMAT,
        boot_id: "another-boot".into(),
        selectors: vec!["pid".into()],
        written: 5,
        nodes: Vec::new(),
        build_ids: Vec::new(),
        unwound: Vec::new(),
        sessions: Some("cgroup".into()),
        kernel: None,
    };
    let Verdict::Stale(why) = check(&checkpoint, &dir, &["pid".into()]).unwrap() else {
        panic!("a checkpoint of another boot is not taken back");
    };
    assert!(why.contains("another boot"), "{why}");
    checkpoint.boot_id = boot_id().unwrap();
    let err = check(&checkpoint, &dir, &["exe:/x".into()])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("this run traces exe:/x") && err.contains("--release-state"),
        "{err}"
    );
    checkpoint.format = FORMAT + 1;
    let err = check(&checkpoint, &dir, &["pid".into()])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("format") && err.contains("--release-state"),
        "{err}"
    );
}

#[test]
fn a_state_dir_others_can_write_is_refused() {
    let dir = scratch("open");
    fs::create_dir_all(&dir).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
    let err = StateDir::open(&dir).err().unwrap().to_string();
    assert!(err.contains("writable by group or others"), "{err}");
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
    StateDir::open(&dir).unwrap();
    fs::write(dir.join(CHECKPOINT), b"{not json").unwrap();
    let err = format!("{:#}", StateDir::open(&dir).unwrap().load().unwrap_err());
    assert!(err.contains("--release-state"), "{err}");
    fs::remove_dir_all(&dir).unwrap();
}
