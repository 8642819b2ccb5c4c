//! `reaper-trace top` in a real terminal (tmux, 80x24) against a run that flags accumulating
//! instances: the screen read back names the gateway with its descendants, the kind with its
//! count and the flags; Enter shows the selected process's `why`; `q` quits and gives the
//! terminal back. Against a run with an agent session: `s` lists the sessions, `k` names on
//! its confirmation line what would be signalled, any key but `y` sends nothing, `y` ends
//! the session's processes and not its owner. Host only (the guests have no tmux). Needs root
//! (see `require_root`).
use std::process::Command;

use reaper_tests::{
    Then, exited, flags_for, pid, pid_in, reaper_trace, require_root, run_reaper_until,
    run_shape_until, scratch, session_begun,
};

/// Runs tmux: what it printed, or its complaint (a session already gone, say) as the error,
/// not noise in the log.
fn tmux(args: &[&str]) -> Result<String, String> {
    let out = Command::new("tmux").args(args).output().expect("run tmux");
    match out.status.success() {
        true => Ok(String::from_utf8_lossy(&out.stdout).into_owned()),
        false => Err(String::from_utf8_lossy(&out.stderr).trim().to_owned()),
    }
}

/// The screen of tmux session `name`, as text (or why tmux could not read it).
fn screen(name: &str) -> String {
    tmux(&["capture-pane", "-p", "-t", name])
        .unwrap_or_else(|e| format!("(no screen: tmux capture-pane: {e})"))
}

/// Waits until `name`'s screen shows what `shows` looks for; returns it. A timeout prints the
/// last screen (the pane stays after top exits, so an error top printed is on it).
fn until_shown(name: &str, what: &str, shows: impl Fn(&str) -> bool) -> String {
    reaper_tests::wait_seeing(&format!("the screen to show {what}"), || {
        let text = screen(name);
        match shows(&text) {
            true => Ok(text),
            false => Err(text),
        }
    })
}

/// A tmux session's name; the session is killed when this goes, a failed test's included
/// (its pane may hold a failed `top`'s error, waiting).
struct Session(String);

impl Drop for Session {
    fn drop(&mut self) {
        let _ = tmux(&["kill-session", "-t", &self.0]);
    }
}

#[test]
fn top_shows_the_gateway_the_kinds_count_and_the_flags_and_why_of_one() {
    let test = "top_shows_the_gateway_the_kinds_count_and_the_flags_and_why_of_one";
    if !require_root(test) {
        return;
    }
    let socket = format!("/tmp/reaper-api-top-{}.sock", std::process::id());
    let named = Session(format!("reaper-top-{}", std::process::id()));
    let session = named.0.as_str();
    let mut seen: Option<(String, String, bool)> = None;
    let mut opts = reaper_tests::ACCUMULATING.to_vec();
    opts.extend(["--api", &socket]);
    let (run, _truth) = run_shape_until(
        &opts,
        "leak-accumulate",
        &[],
        ("3 accumulating flags, then top's screen", Then::Release),
        |events| {
            if flags_for(events, "accumulating") < 3 {
                return false;
            }
            let gw = events
                .iter()
                .find(|e| e["event"] == "ready")
                .map(|e| pid(&e["gateway"][0]))
                .unwrap();
            // A top that fails leaves its error on the screen (the pane would close with it).
            let command = format!(
                "{} top --api {socket} --every 200ms || {{ echo \"top failed: $?\"; sleep 3600; }}",
                reaper_trace().display()
            );
            tmux(&[
                "new-session",
                "-d",
                "-s",
                session,
                "-x",
                "80",
                "-y",
                "24",
                &command,
            ])
            .unwrap();
            let main = until_shown(session, "the gateway, a kind's count and 3 flags", |s| {
                s.contains(&format!("{gw} "))
                    && s.lines().filter(|l| l.contains("accumulating")).count() >= 3
                    && s.lines().any(|l| {
                        l.split_whitespace()
                            .next()
                            .and_then(|n| n.parse::<u32>().ok())
                            .is_some_and(|n| n >= 4)
                            && l.contains("stdio-server")
                    })
            });
            tmux(&["send-keys", "-t", session, "Enter"]).unwrap();
            let why = until_shown(session, "the selected flag's why", |s| {
                s.contains("why (Esc") && s.contains("alive under its gateway instance")
            });
            tmux(&["send-keys", "-t", session, "q"]).unwrap();
            // The session ends with top: the terminal was given back.
            let cap = std::time::Instant::now() + reaper_tests::patience();
            let mut ended = false;
            while std::time::Instant::now() < cap {
                if tmux(&["has-session", "-t", session]).is_err() {
                    ended = true;
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            seen = Some((main, why, ended));
            true
        },
    );
    drop(named);
    let (main, why, ended) = seen.expect("top ran");
    eprintln!("{main}\n{why}");
    assert!(run.status.success(), "{}", run.stderr);
    assert!(
        main.contains("GATEWAY") && main.contains("DESCENDANTS") && main.contains("LAST 5 MIN"),
        "{main}"
    );
    assert!(
        main.lines().any(|l| l
            .split_once(' ')
            .is_some_and(|(_, rest)| rest.starts_with("reaper-shapes leak-accumulate "))),
        "the gateway's row names its program by file name, whatever the install path: {main}"
    );
    assert!(
        main.lines()
            .any(|l| l.contains("stdio-server")
                && l.contains(['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'])),
        "the kind's trend beside its count: {main}"
    );
    assert!(
        main.lines().all(|l| l.chars().count() <= 80),
        "fits 80 columns"
    );
    assert!(ended, "q quits");
}

/// Alive, not a zombie: the sleeps' parent never reaps them, so a kill sent by mistake
/// would leave their pids in /proc.
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| Some(stat.rsplit_once(") ")?.1.starts_with(['R', 'S', 'D'])))
        .unwrap_or(false)
}

#[test]
fn top_lists_the_sessions_and_k_ends_the_selected_one_once_confirmed() {
    let test = "top_lists_the_sessions_and_k_ends_the_selected_one_once_confirmed";
    if !require_root(test) {
        return;
    }
    // A short name: the socket's path must fit a UNIX socket's 108 bytes.
    let dir = scratch("top-k");
    let d = dir.display();
    let socket = dir.join("api.sock");
    let socket = socket.to_str().unwrap();
    // One agent session: its owner (it becomes `sleep 615`) started a server and a double
    // fork's grandchild.
    let script = format!(
        "AGENT_SESSION_ID=sess-top sh -c 'sleep 613 & echo $! > {d}/inner; \
         ( sleep 614 & echo $! > {d}/forked ); echo $$ > {d}/owner; exec sleep 615' &\n\
         while [ ! -e \"$REAPER_SHAPES_RELEASE\" ]; do sleep 0.05; done\n\
         kill $(cat {d}/owner {d}/inner {d}/forked) 2>/dev/null\n"
    );
    let named = Session(format!("reaper-top-k-{}", std::process::id()));
    let session = named.0.as_str();
    let mut seen: Vec<String> = Vec::new();
    let mut asked: Option<(u32, u32)> = None;
    let run = run_reaper_until(
        &["--api", socket, "--", "sh", "-c", &script],
        &[],
        &dir.join("release"),
        ("the session's processes ended from top", Then::Release),
        |events| {
            if let Some((inner, forked)) = asked {
                return exited(events, inner) && exited(events, forked);
            }
            let begun = session_begun(events, "sess-top");
            let pids = ["inner", "forked", "owner"].map(|n| pid_in(&dir, n));
            let [Some(inner), Some(forked), Some(_)] = pids else {
                return false;
            };
            if !begun {
                return false;
            }
            let command = format!(
                "{} top --api {socket} --every 200ms || {{ echo \"top failed: $?\"; sleep 3600; }}",
                reaper_trace().display()
            );
            let size = ["-x", "80", "-y", "24"];
            let mut args = vec!["new-session", "-d", "-s", session];
            args.extend(size);
            args.push(&command);
            tmux(&args).unwrap();
            until_shown(session, "the flags' pane", |s| s.contains("FLAGS"));
            tmux(&["send-keys", "-t", session, "s"]).unwrap();
            seen.push(until_shown(session, "the session listed", |s| {
                s.contains("SESSIONS")
                    && s.lines()
                        .any(|l| l.starts_with("sess-top") && l.contains("running"))
            }));
            // The question first, whole, then what it names (its words, wrapped at 80).
            let names_both = |s: &str| {
                let s = s.split_whitespace().collect::<Vec<_>>().join(" ");
                s.contains("kill 2 processes? y: SIGTERM now")
                    && s.contains("any other key: no.")
                    && s.contains(&format!("{inner} (sleep)"))
                    && s.contains(&format!("{forked} (sleep)"))
            };
            tmux(&["send-keys", "-t", session, "k"]).unwrap();
            seen.push(until_shown(session, "the confirmation line", names_both));
            tmux(&["send-keys", "-t", session, "n"]).unwrap();
            seen.push(until_shown(session, "the kill cancelled", |s| {
                s.contains("kill cancelled: nothing sent")
            }));
            assert!(
                alive(inner) && alive(forked),
                "a cancelled kill sent nothing: {seen:?}"
            );
            tmux(&["send-keys", "-t", session, "k"]).unwrap();
            until_shown(session, "the confirmation line again", names_both);
            tmux(&["send-keys", "-t", session, "y"]).unwrap();
            seen.push(until_shown(session, "what the kill did", |s| {
                s.contains("SIGTERM sent")
            }));
            asked = Some((inner, forked));
            false
        },
    );
    tmux(&["send-keys", "-t", session, "q"]).unwrap();
    drop(named);
    for screen in &seen {
        eprintln!("{screen}");
    }
    assert!(run.status.success(), "{}", run.stderr);
    let (inner, forked) = asked.expect("top asked for the kill");
    let owner = pid_in(&dir, "owner").unwrap();
    let steps = |p: u32| -> Vec<&serde_json::Value> {
        (run.events.iter())
            .filter(|e| e["event"] == "kill" && e["pid"].as_u64() == Some(u64::from(p)))
            .collect()
    };
    for p in [inner, forked] {
        let steps = steps(p);
        assert!(
            steps
                .iter()
                .any(|e| e["signal"] == "SIGTERM" && e["result"] == "sent"),
            "{p}: {steps:?}"
        );
        assert!(steps.iter().all(|e| e["asked_by"]["uid"] == 0), "{steps:?}");
    }
    let owner_steps = steps(owner);
    assert!(
        owner_steps.is_empty(),
        "the session's owner is never picked by its session: {owner_steps:?}"
    );
    run.assert_well_formed();
}
