//! Pid namespaces and current names: a gateway's descendant inside a new pid namespace is
//! reported with the pids the host sees (its `setsid` session included) and, in its flag, with
//! the pid it has inside (`nspid`), its cgroup, and the name it gave itself after the fork.
//! Needs root (see `require_root`).
use reaper_tests::{Then, pid, read_json, require_root, run_shape_until};
use serde_json::{Value, json};

#[test]
fn a_descendant_in_a_pid_namespace_is_reported_with_host_pids_and_its_own_name() {
    let test = "a_descendant_in_a_pid_namespace_is_reported_with_host_pids_and_its_own_name";
    if !require_root(test) {
        return;
    }
    let (run, truth) = run_shape_until(
        &["--scan-interval", "250ms"],
        "leak-pidns",
        &[],
        ("an orphaned flag", Then::Release),
        |events| {
            events
                .iter()
                .any(|e| e["event"] == "flag" && e["reason"] == "orphaned")
        },
    );
    let (gw, a, b) = (pid(&truth["gateway"]), pid(&truth["a"]), pid(&truth["b"]));
    let forked_by = |spawner: u64| -> Vec<u64> {
        run.all("fork")
            .iter()
            .filter(|f| f["spawner"].as_u64() == Some(spawner))
            .map(|f| pid(&f["pid"]))
            .collect()
    };
    assert_eq!(forked_by(a), [b], "B by its host pid");
    let c = match forked_by(b)[..] {
        [c] => c,
        ref other => panic!("B forked {other:?}"),
    };
    assert!(c > 2, "C by its host pid, not its pid inside (2): {c}");
    let setsid: Vec<&Value> = run.all("setsid");
    let c_setsid: Vec<&&Value> = setsid.iter().filter(|s| pid(&s["pid"]) == c).collect();
    assert_eq!(c_setsid.len(), 1, "{setsid:?}");
    assert_eq!(
        c_setsid[0]["sid"].as_u64(),
        Some(c),
        "its session as the host names it (its own host pid), not 2: {}",
        c_setsid[0]
    );
    let flags = run.flags_of(c);
    let orphaned = flags
        .iter()
        .find(|f| f["reason"] == "orphaned")
        .unwrap_or_else(|| panic!("C orphaned: {:?}", run.all("flag")));
    assert_eq!(orphaned["lineage"], json!([gw, a, b, c]));
    assert_eq!(orphaned["nspid"], 2, "its pid inside: {orphaned}");
    assert_eq!(
        orphaned["comm"], "ns-escapee",
        "the name it gave itself, not the one it was forked with: {orphaned}"
    );
    for list in ["ancestors", "chain"] {
        let own = orphaned[list]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["pid"] == c);
        assert_eq!(
            own.map(|e| &e["comm"]),
            Some(&json!("ns-escapee")),
            "one name per process in one event ({list}): {orphaned}"
        );
    }
    let cgroup = orphaned["cgroup"].as_str().unwrap_or_default();
    assert!(cgroup.starts_with('/'), "its cgroup v2 path: {orphaned}");
    assert!(
        run.flags_of(b).is_empty(),
        "B holds only /dev/null: {:?}",
        run.all("flag")
    );
}

#[test]
fn reaper_trace_refuses_to_run_in_a_pid_namespace_of_its_own() {
    let test = "reaper_trace_refuses_to_run_in_a_pid_namespace_of_its_own";
    if !require_root(test) {
        return;
    }
    use std::os::unix::process::CommandExt;
    let mut command = std::process::Command::new(reaper_tests::reaper_trace());
    command.args(["--json", "--", "true"]);
    // SAFETY: between fork and exec only async-signal-safe calls: the child moves its future
    // children to a new pid namespace and forks the one that execs reaper-trace there (as pid
    // 1), then waits for it and exits with its status.
    unsafe {
        command.pre_exec(|| {
            if libc::unshare(libc::CLONE_NEWPID) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let inner = libc::fork();
            if inner < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if inner > 0 {
                let mut status = 0;
                libc::waitpid(inner, &mut status, 0);
                libc::_exit(match libc::WIFEXITED(status) {
                    true => libc::WEXITSTATUS(status),
                    false => 128 + libc::WTERMSIG(status),
                });
            }
            Ok(())
        });
    }
    let out = command
        .output()
        .expect("run reaper-trace in a new pid namespace");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("pid namespace of its own") && stderr.contains("hostPID"),
        "the error says why and what to do: {stderr}"
    );
    assert!(out.stdout.is_empty(), "no event before the refusal");
}

/// The DaemonSet way without `hostPID`: reaper-trace in a pid namespace of its own, reading the
/// host's processes in the host's /proc mounted elsewhere (here a bind mount, in a mount
/// namespace of its own). A gateway named by its host pid is followed, its descendants by
/// their host pids, and the orphan it leaks is flagged with its lineage.
#[test]
fn with_the_hosts_proc_mounted_elsewhere_it_runs_in_a_pid_namespace_of_its_own() {
    let test = "with_the_hosts_proc_mounted_elsewhere_it_runs_in_a_pid_namespace_of_its_own";
    if !require_root(test) {
        return;
    }
    let dir = reaper_tests::scratch("proc-root");
    let host_proc = dir.join("host-proc");
    std::fs::create_dir(&host_proc).unwrap();
    let mut gateway = reaper_tests::Instance::start(
        &dir,
        "gateway",
        &reaper_tests::shapes(),
        &["leak-orphan"],
        None,
        true,
    );
    let gw = gateway.pid();
    let (gw_arg, root_arg) = (gw.to_string(), host_proc.to_str().unwrap().to_owned());
    let mount_point = std::ffi::CString::new(root_arg.clone()).unwrap();
    let run = reaper_tests::run_reaper_until_in(
        &[
            "--scan-interval",
            "250ms",
            "--proc-root",
            &root_arg,
            "--gateway-pid",
            &gw_arg,
        ],
        &[],
        // Released, the gateway ends its leak and exits, and so does reaper-trace.
        &dir.join("gateway.release"),
        ("the orphan's flag", Then::Release),
        |events| {
            if events.last().unwrap()["event"] == "ready" {
                gateway.go();
            }
            events
                .iter()
                .any(|e| e["event"] == "flag" && e["reason"] == "orphaned")
        },
        move |command| {
            use std::os::unix::process::CommandExt;
            // SAFETY: between fork and exec only async-signal-safe calls: new pid and mount
            // namespaces, /proc bound at the mount point, then a fork: the child (pid 1 there)
            // goes on to exec reaper-trace; this one waits and exits with its status.
            unsafe {
                command.pre_exec(move || {
                    let fail = || Err(std::io::Error::last_os_error());
                    if libc::unshare(libc::CLONE_NEWPID | libc::CLONE_NEWNS) != 0 {
                        return fail();
                    }
                    let (none, no_data) = (std::ptr::null(), std::ptr::null());
                    let root = c"/".as_ptr();
                    let private = libc::MS_REC | libc::MS_PRIVATE;
                    if libc::mount(none, root, none, private, no_data) != 0 {
                        return fail();
                    }
                    let proc_ = c"/proc".as_ptr();
                    let at = mount_point.as_ptr();
                    if libc::mount(proc_, at, none, libc::MS_BIND, no_data) != 0 {
                        return fail();
                    }
                    let inner = libc::fork();
                    if inner < 0 {
                        return fail();
                    }
                    if inner == 0 {
                        return Ok(());
                    }
                    // This one never execs: it lets go of std's exec-status pipe (and every
                    // other inherited fd) so that spawn() returns once the child has.
                    libc::close_range(3, u32::MAX, 0);
                    let mut status = 0;
                    libc::waitpid(inner, &mut status, 0);
                    libc::_exit(match libc::WIFEXITED(status) {
                        true => libc::WEXITSTATUS(status),
                        false => 128 + libc::WTERMSIG(status),
                    });
                });
            }
        },
    );
    gateway.finish();
    let truth = read_json(&dir.join("gateway.json"));
    let (a, b) = (pid(&truth["a"]), pid(&truth["b"]));
    assert_eq!(
        run.all("ready")[0]["gateway"],
        json!([gw]),
        "by its host pid"
    );
    let forks: Vec<u64> = run.all("fork").iter().map(|f| pid(&f["pid"])).collect();
    assert!(
        forks.contains(&a) && forks.contains(&b),
        "host pids: {forks:?}"
    );
    let flag = run
        .flags_of(b)
        .into_iter()
        .find(|f| f["reason"] == "orphaned")
        .unwrap_or_else(|| panic!("B orphaned: {:?}", run.all("flag")));
    assert_eq!(flag["lineage"], json!([gw, a, b]));
}

#[test]
fn a_proc_root_that_is_not_the_hosts_is_refused() {
    let test = "a_proc_root_that_is_not_the_hosts_is_refused";
    if !require_root(test) {
        return;
    }
    let out = std::process::Command::new(reaper_tests::reaper_trace())
        .args([
            "--proc-root",
            "/nonexistent",
            "--gateway-pid",
            "1",
            "--allow-init",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("not a mounted /proc"), "{stderr}");
}
