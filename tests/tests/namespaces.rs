//! Pid namespaces and current names: a gateway's descendant inside a new pid namespace is
//! reported with the pids the host sees (its `setsid` session included) and, in its flag, with
//! the pid it has inside (`nspid`), its cgroup, and the name it gave itself after the fork.
//! Needs root (see `require_root`).
use reaper_tests::{Then, pid, require_root, run_shape_until};
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
