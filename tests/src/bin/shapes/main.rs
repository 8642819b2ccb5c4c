//! `reaper-shapes SHAPE TRUTH_FILE`: makes one process shape as a gateway would, and writes
//! what it did (pids, exit codes) to TRUTH_FILE as JSON, for the integration tests to compare
//! with what reaper-trace reported. Plain libc on purpose: each shape is the exact syscall
//! pattern it names.

use serde_json::json;

mod channels;
mod crowds;
mod hostile;
mod leaks;
mod lineage;
mod spawn_site;
mod sys;

use channels::*;
use crowds::*;
use leaks::*;
use lineage::*;
use sys::*;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).is_some_and(|a| a == "stdio-server") {
        // What the gateways of the accumulation shapes start: a stdio server with a command
        // line of its own (`stdio-server --session-key K1 --model m`), reading until EOF.
        read_stdin_to_eof();
        std::process::exit(0);
    }
    if args.get(1).is_some_and(|a| a == "fork-through-c-and-exit") {
        spawn_site::fork_through_c_and_exit(&args[2..]);
    }
    if args.get(1).is_some_and(|a| a == "subreaper") {
        subreaper_exec(&args[2..]);
    }
    if args.get(1).is_some_and(|a| a == "cgroup-exec") {
        cgroup_exec(&args[2..]);
    }
    if args.get(1).is_some_and(|a| a == "hostile-python") {
        hostile::python(&args);
    }
    let (Some(shape), Some(truth)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: reaper-shapes SHAPE TRUTH_FILE");
        std::process::exit(2);
    };
    let result = match shape.as_str() {
        "basic" => basic(),
        "threads" => threads(),
        "exec-from-thread" => exec_from_thread(),
        "spawn" => spawn(),
        "setsid-double-fork" => setsid_double_fork(truth),
        "clone-parent" => clone_parent(),
        "storm" => storm(count_arg(&args, 5000), false),
        "storm-exec" => storm(count_arg(&args, 5000), true),
        "sleepers" => sleepers(
            truth,
            count_arg(&args, 1000),
            args.get(4).and_then(|s| s.parse().ok()).unwrap_or(1.0),
        ),
        "tree" => tree(truth),
        "leak-orphan" => leak_orphan(truth),
        "leak-spawn-site" => spawn_site::leak_spawn_site(truth),
        "leak-spawn-site-c-fp" => spawn_site::leak_spawn_site_c(truth, true),
        "leak-spawn-site-c-nofp" => spawn_site::leak_spawn_site_c(truth, false),
        "leak-spawn-site-c-exec" => spawn_site::leak_spawn_site_c_exec(truth),
        "leak-spawn-site-c-two" => spawn_site::leak_spawn_site_c_two(truth),
        "leak-spawn-site-command" => spawn_site::leak_spawn_site_command(truth),
        "spawn-site-gap" => spawn_site::spawn_site_gap(truth),
        "orphan-later" => orphan_later(truth, false),
        "spawn-later" => orphan_later(truth, true),
        "leak-idle" => leak_idle(truth),
        "leak-agent-kill" => leak_agent_kill(truth),
        "leak-deaf" => leak_deaf(truth),
        "leak-accumulate" => leak_accumulate(truth),
        "leak-crash" => leak_crash(truth),
        "leak-pty-held" => leak_pty(truth, false),
        "leak-tcp" => leak_tcp(truth),
        "leak-pty-hungup" => leak_pty(truth, true),
        "leak-zombies" => leak_zombies(truth),
        "leak-pidns" => leak_pidns(truth),
        "normal" => normal(),
        "respawner" => respawner(truth),
        "hostile" => hostile(),
        "hostile-loop" => hostile::fork_loop_when_let_go(truth),
        "hostile-fds" => hostile::many_fds(truth),
        "hostile-maps" => hostile::many_mappings(truth),
        "hostile-zombies" => hostile::many_zombies(truth),
        "hostile-peers" => hostile::many_peers(truth),
        "hostile-args" => hostile::huge_args(truth),
        "hostile-args-run" => hostile::huge_args_run(truth),
        "hostile-library" => hostile::library(
            truth,
            args.get(3).map_or("", String::as_str),
            args.get(4).map_or("/tmp", String::as_str),
        ),
        "into-cgroup" => into_cgroup(&args),
        other => {
            eprintln!("unknown shape {other}");
            std::process::exit(2);
        }
    };
    let mut truth_value = result;
    truth_value["gateway"] = json!(std::process::id());
    write_truth(truth, &truth_value);
}

fn count_arg(args: &[String], default: usize) -> usize {
    args.get(3).and_then(|n| n.parse().ok()).unwrap_or(default)
}
