//! Gateways by what they are (`--gateway-exe`, `--gateway-cgroup`, `--gateway-pidfile`): new
//! instances are found as they start, each is its own root of lineage, and reaper-trace keeps
//! running between them. Each test drives its instances from the stream: the next one starts
//! when the event proving the last one arrives. Needs root (see `require_root`).
use std::{collections::HashMap, os::unix::fs::PermissionsExt, path::Path};

use reaper_tests::{
    Instance, Then, cgroup2_root, patience, pid, read_json, remove_cgroup, require_root,
    run_reaper_until, scratch, shapes, wait_for_file,
};
use serde_json::Value;

/// The `orphaned` flags seen so far, as (flagged pid, lineage).
fn orphaned(events: &[Value]) -> Vec<(u64, Vec<u64>)> {
    events
        .iter()
        .filter(|e| e["event"] == "flag" && e["reason"] == "orphaned")
        .map(|e| {
            let lineage = e["lineage"].as_array().unwrap().iter().map(pid).collect();
            (pid(&e["pid"]), lineage)
        })
        .collect()
}

/// Whether an orphan whose lineage starts at `root` has been flagged.
fn orphan_of(events: &[Value], root: u64) -> bool {
    orphaned(events)
        .iter()
        .any(|(_, l)| l.first() == Some(&root))
}

/// The `gateway` events' (pid, selector).
fn gateways(events: &[&Value]) -> Vec<(u64, String)> {
    events
        .iter()
        .map(|g| (pid(&g["pid"]), g["selector"].as_str().unwrap().to_owned()))
        .collect()
}

#[test]
fn a_gateway_program_restarted_three_times_is_followed_instance_by_instance() {
    let test = "a_gateway_program_restarted_three_times_is_followed_instance_by_instance";
    if !require_root(test) {
        return;
    }
    let dir = scratch("gateway-exe");
    // The gateway program, and a program of the same name and bytes at another path.
    let program = dir.join("bin").join("hermes");
    let impostor = dir.join("other").join("hermes");
    for p in [&program, &impostor] {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::copy(shapes(), p).unwrap();
    }
    // A `#!` script gateway, run by its path: its shell is the instance.
    let script = dir.join("gw.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\n\"$REAPER_SHAPES_BIN\" leak-orphan \"$1\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();

    let mut instances: Vec<Instance> = Vec::new();
    let mut impostor_run: Option<Instance> = None;
    let program_arg = program.to_str().unwrap().to_owned();
    let script_arg = script.to_str().unwrap().to_owned();
    let audit = dir.join("audit.ndjson");
    let audit_arg = audit.to_str().unwrap().to_owned();
    let run = run_reaper_until(
        &[
            "--scan-interval",
            "250ms",
            "--output",
            &audit_arg,
            "--gateway-exe",
            &program_arg,
            "--gateway-exe",
            &script_arg,
        ],
        &[],
        &dir.join("release"),
        ("each of four instances' orphan flagged", Then::Interrupt),
        |events| {
            let last = events.last().unwrap();
            if last["event"] == "ready" {
                let imp =
                    Instance::start(&dir, "impostor", &impostor, &["leak-orphan"], None, false);
                wait_for_file(&dir.join("impostor.json.ready"), patience());
                impostor_run = Some(imp);
                instances.push(Instance::start(
                    &dir,
                    "i1",
                    &program,
                    &["leak-orphan"],
                    None,
                    false,
                ));
                return false;
            }
            let Some(current) = instances.last_mut() else {
                return false;
            };
            if !orphan_of(events, current.pid()) {
                return false;
            }
            // This instance's leak is proven: restart (the fourth is the script).
            current.finish();
            let n = instances.len();
            match n {
                1 | 2 => {
                    let name = format!("i{}", n + 1);
                    instances.push(Instance::start(
                        &dir,
                        &name,
                        &program,
                        &["leak-orphan"],
                        None,
                        false,
                    ));
                    false
                }
                3 => {
                    instances.push(Instance::start(&dir, "script", &script, &[], None, false));
                    false
                }
                _ => true,
            }
        },
    );
    if let Some(mut imp) = impostor_run {
        imp.finish();
    }
    let gateway_events = run.all("gateway");
    let expected: Vec<(u64, String)> = instances
        .iter()
        .enumerate()
        .map(|(i, inst)| {
            let path = if i < 3 { &program_arg } else { &script_arg };
            (inst.pid(), format!("exe:{path}"))
        })
        .collect();
    assert_eq!(
        gateways(&gateway_events),
        expected,
        "one gateway event per instance, in order, by its selector"
    );
    for g in &gateway_events {
        assert!(g["start"].as_u64().unwrap() > 0, "{g}");
    }
    let flagged = orphaned(&run.events);
    for inst in &instances {
        let b = inst.orphan();
        let lineage = flagged
            .iter()
            .find(|(p, _)| *p == b)
            .map(|(_, l)| l.clone())
            .unwrap_or_else(|| panic!("orphan {b} flagged: {flagged:?}"));
        assert_eq!(
            lineage.first(),
            Some(&inst.pid()),
            "the lineage of {b} starts at its own instance: {lineage:?}"
        );
    }
    // The impostor ran while tracing, and nothing of it was followed.
    let imp_truth = read_json(&dir.join("impostor.json.ready"));
    let (imp_a, imp_b) = (pid(&imp_truth["a"]), pid(&imp_truth["b"]));
    let mentioned: Vec<&Value> = run
        .events
        .iter()
        .filter(|e| e["pid"].as_u64().is_some_and(|p| p == imp_a || p == imp_b))
        .collect();
    assert!(
        mentioned.is_empty(),
        "a same-named program elsewhere is not a gateway: {mentioned:?}"
    );
    assert_eq!(
        run.all("ready")[0]["gateway"],
        serde_json::json!([]),
        "no instance was running at start"
    );

    // The report lists the four instances, each with its one flag, and marks each start on
    // the timeline's two plots.
    let page = dir.join("report.html");
    reaper_tests::render_report(&audit, &page);
    let html = std::fs::read_to_string(&page).unwrap();
    let table = html
        .split("id=\"instance-table\"")
        .nth(1)
        .and_then(|t| t.split("</table>").next())
        .expect("the report has an instance table");
    for inst in &instances {
        let p = inst.pid();
        assert!(
            table.contains(&format!("data-sort=\"{p}\">{p}</td>")),
            "instance {p} listed: {table}"
        );
    }
    assert_eq!(
        table.matches("data-sort=\"1\">1</td></tr>").count(),
        4,
        "each instance with its one flag: {table}"
    );
    assert_eq!(html.matches("class=\"restart\"").count(), 2 * 4);
}

/// Writes the calling process's pid into `dir/cgroup.procs` (in a child before exec).
fn move_self_into(dir: &Path) -> Box<dyn FnMut() -> std::io::Result<()> + Send + Sync> {
    let procs = std::ffi::CString::new(dir.join("cgroup.procs").to_str().unwrap()).unwrap();
    Box::new(move || {
        // SAFETY: open/write/close of a path prepared before the fork.
        unsafe {
            let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let written = libc::write(fd, b"0".as_ptr().cast(), 1);
            libc::close(fd);
            if written != 1 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    })
}

#[test]
fn cgroup_gateways_are_found_at_start_when_moved_in_and_when_started_into_a_new_cgroup() {
    let test =
        "cgroup_gateways_are_found_at_start_when_moved_in_and_when_started_into_a_new_cgroup";
    if !require_root(test) {
        return;
    }
    let dir = scratch("gateway-cgroup");
    let root = cgroup2_root();
    let name = format!("reaper-test-{}", std::process::id());
    let selected = root.join(&name);
    // Like a unit that is not running yet: selected by path, made later.
    let later = root.join(format!("{name}-later"));
    remove_cgroup(&later);
    remove_cgroup(&selected);
    std::fs::create_dir(&selected).expect("make a cgroup");
    let shapes = shapes();
    // Already inside when tracing starts.
    let mut before = Instance::start(
        &dir,
        "before",
        &shapes,
        &["leak-orphan"],
        Some(move_self_into(&selected)),
        true,
    );

    let mut moved: Option<Instance> = None;
    let mut started: Option<Instance> = None;
    let (selected_arg, later_arg) = (
        selected.to_str().unwrap().to_owned(),
        later.to_str().unwrap().to_owned(),
    );
    let run = run_reaper_until(
        &[
            "--scan-interval",
            "250ms",
            "--gateway-cgroup",
            &selected_arg,
            "--gateway-cgroup",
            &later_arg,
        ],
        &[],
        &dir.join("release"),
        ("three cgroup gateways' orphans flagged", Then::Interrupt),
        |events| {
            if events.last().unwrap()["event"] == "ready" {
                before.go();
            }
            if !orphan_of(events, before.pid()) {
                return false;
            }
            let Some(m) = &moved else {
                moved = Some(Instance::start(
                    &dir,
                    "moved",
                    &shapes,
                    &["leak-orphan"],
                    Some(move_self_into(&selected)),
                    false,
                ));
                return false;
            };
            if !orphan_of(events, m.pid()) {
                return false;
            }
            let Some(s) = &started else {
                std::fs::create_dir(&later).expect("make the later cgroup");
                started = Some(Instance::start(
                    &dir,
                    "started",
                    &shapes,
                    &["into-cgroup", later.to_str().unwrap(), "leak-orphan"],
                    None,
                    false,
                ));
                return false;
            };
            // `into-cgroup` starts `leak-orphan` as its child, straight into the cgroup.
            let inside: Vec<u64> = std::fs::read_to_string(later.join("cgroup.procs"))
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.parse().ok())
                .collect();
            let _ = s;
            inside.iter().any(|&p| orphan_of(events, p))
        },
    );
    let started_gateway = run
        .all("gateway")
        .iter()
        .find(|g| g["selector"] == format!("cgroup:{later_arg}"))
        .map(|g| pid(&g["pid"]));
    for inst in [
        &mut before,
        moved.as_mut().unwrap(),
        started.as_mut().unwrap(),
    ] {
        inst.finish();
    }
    remove_cgroup(&selected);
    remove_cgroup(&later);

    let found = gateways(&run.all("gateway"));
    let by_pid: HashMap<u64, String> = found.iter().cloned().collect();
    let selected_label = format!("cgroup:{selected_arg}");
    assert_eq!(
        by_pid.get(&before.pid()),
        Some(&selected_label),
        "the process inside at start: {found:?}"
    );
    assert_eq!(
        by_pid.get(&moved.as_ref().unwrap().pid()),
        Some(&selected_label),
        "the process moved in: {found:?}"
    );
    let started_gateway = started_gateway
        .unwrap_or_else(|| panic!("a gateway started into the new cgroup: {found:?}"));
    assert_ne!(
        started_gateway,
        started.as_ref().unwrap().pid(),
        "the gateway is the process started inside, not the one that started it"
    );
    assert_eq!(
        found.len(),
        3,
        "no other process is a gateway (the orphans' parents are inside): {found:?}"
    );
    assert_eq!(
        run.all("ready")[0]["gateway"],
        serde_json::json!([before.pid()])
    );
    for root in [before.pid(), moved.as_ref().unwrap().pid(), started_gateway] {
        assert!(
            orphan_of(&run.events, root),
            "an orphan with lineage from {root}: {:?}",
            orphaned(&run.events)
        );
    }
}

#[test]
fn a_pidfile_rewritten_across_a_restart_follows_the_new_instance() {
    let test = "a_pidfile_rewritten_across_a_restart_follows_the_new_instance";
    if !require_root(test) {
        return;
    }
    let dir = scratch("gateway-pidfile");
    let pidfile = dir.join("hermes.pid");
    let shapes = shapes();
    let write_pidfile = |pid: u64| {
        // As daemons do: a new file renamed into place.
        let tmp = dir.join("hermes.pid.tmp");
        std::fs::write(&tmp, format!("{pid}\n")).unwrap();
        std::fs::rename(&tmp, &pidfile).unwrap();
    };
    let mut first = Instance::start(&dir, "first", &shapes, &["leak-orphan"], None, true);
    write_pidfile(first.pid());
    let mut second: Option<Instance> = None;
    let pidfile_arg = pidfile.to_str().unwrap().to_owned();
    let run = run_reaper_until(
        &[
            "--scan-interval",
            "250ms",
            "--gateway-pidfile",
            &pidfile_arg,
        ],
        &[],
        &dir.join("release"),
        ("both instances' orphans flagged", Then::Interrupt),
        |events| {
            let last = events.last().unwrap();
            // Each instance makes its leak once it is announced as a gateway.
            if last["event"] == "gateway" {
                let announced = pid(&last["pid"]);
                for inst in std::iter::once(&first).chain(second.as_ref()) {
                    if inst.pid() == announced {
                        inst.go();
                    }
                }
            }
            if !orphan_of(events, first.pid()) {
                return false;
            }
            match &second {
                None => {
                    first.finish();
                    let s = Instance::start(&dir, "second", &shapes, &["leak-orphan"], None, true);
                    write_pidfile(s.pid());
                    second = Some(s);
                    false
                }
                Some(s) => orphan_of(events, s.pid()),
            }
        },
    );
    let mut second = second.unwrap();
    second.finish();
    let label = format!("pidfile:{pidfile_arg}");
    assert_eq!(
        gateways(&run.all("gateway")),
        vec![(first.pid(), label.clone()), (second.pid(), label)],
    );
    assert_eq!(
        run.all("ready")[0]["gateway"],
        serde_json::json!([first.pid()])
    );
}

/// A pid file rewritten to name a process reaper-trace will not take as a gateway (init) is
/// told, not the end of the run: a `note` event in the stream for tools (checked against the
/// schema with every other event), the same text on stderr for people, even with `--quiet`.
#[test]
fn a_pidfile_naming_no_gateway_is_a_note_in_the_stream_and_on_stderr() {
    let test = "a_pidfile_naming_no_gateway_is_a_note_in_the_stream_and_on_stderr";
    if !require_root(test) {
        return;
    }
    let dir = scratch("gateway-pidfile-note");
    let pidfile = dir.join("gateway.pid");
    let mut gateway = std::process::Command::new("sleep")
        .arg("3600.75")
        .spawn()
        .expect("start a gateway");
    std::fs::write(&pidfile, format!("{}\n", gateway.id())).unwrap();
    let pidfile_arg = pidfile.to_str().unwrap().to_owned();
    let told = |e: &Value| {
        e["event"] == "note"
            && e["text"]
                .as_str()
                .is_some_and(|t| t.contains(&pidfile_arg) && t.contains("waiting for it to change"))
    };
    let run = run_reaper_until(
        &["--gateway-pidfile", &pidfile_arg],
        &[],
        &dir.join("release"),
        ("the note on the pid file", Then::Interrupt),
        |events| {
            let last = events.last().unwrap();
            if last["event"] == "gateway" {
                std::fs::write(&pidfile, "1\n").unwrap();
            }
            told(last)
        },
    );
    let _ = gateway.kill();
    let _ = gateway.wait();
    let note = run
        .all("note")
        .into_iter()
        .find(|e| told(e))
        .expect("the note");
    let text = note["text"].as_str().unwrap();
    assert!(
        run.stderr.contains(&format!("reaper-trace: {text}\n")),
        "the note's line on stderr:\n{}",
        run.stderr
    );
}
