//! Seeding: the gateways and the descendants they already have, from /proc, into the kernel's
//! tracked map. Runs after the probes are attached, so every fork from a process already in
//! the map is caught by the kernel; repeated passes catch forks that raced a pass.
use crate::identity::{ProcessId, Start};
use std::collections::{HashMap, HashSet, VecDeque};

use anyhow::{Result, bail};
use aya::maps::{HashMap as BpfHashMap, MapData};
use reaper_common::Tracked;

use crate::capture::decode::MAX_ARGS;
use crate::lineage::graph::Seed;
use crate::procfs::{self, Stat};

/// Passes over /proc at most (each after the previous one's inserts took effect).
const MAX_PASSES: usize = 5;

/// The tracked map, as seeding and resyncs use it.
pub type TrackedMap = BpfHashMap<MapData, u32, Tracked>;

/// Checks that `pid` can be a gateway and returns its stat.
pub fn check_gateway(pid: u32, allow_init: bool) -> Result<Stat> {
    let stat = match procfs::read_stat(pid) {
        Ok(s) => s,
        Err(_) => bail!("--gateway-pid {pid}: no such process"),
    };
    if stat.state == b'Z' {
        bail!("--gateway-pid {pid}: the process is a zombie (it has exited)");
    }
    if pid == procfs::own_pid() {
        bail!("--gateway-pid {pid}: that is reaper-trace itself");
    }
    if stat.flags & procfs::PF_KTHREAD != 0 {
        bail!("--gateway-pid {pid}: that is a kernel thread, not a process that spawns helpers");
    }
    if pid == 1 && !allow_init {
        bail!(
            "--gateway-pid 1: that is init, so every process on the host is its descendant; \
             give --allow-init if that is really meant"
        );
    }
    Ok(stat)
}

/// A `--gateway-pid` that has exited, and the error it gives when nothing vouches for it.
pub type ExitedGateway = (u32, anyhow::Error);

/// Checks each `--gateway-pid` (see [`check_gateway`]): returns the running ones' stats, and
/// the ones that have exited with the error they give. One of those may be a kept state's
/// gateway that exited while no run read (what it left, and its exit, wait in the ring):
/// that is decided once the state is read.
pub fn check_gateways(pids: &[u32], allow_init: bool) -> Result<(Vec<Stat>, Vec<ExitedGateway>)> {
    let (mut running, mut exited) = (Vec::new(), Vec::new());
    for &pid in pids {
        match check_gateway(pid, allow_init) {
            Ok(stat) => running.push(stat),
            Err(e) if procfs::read_stat(pid).map_or(true, |s| s.state == b'Z') => {
                exited.push((pid, e))
            }
            Err(e) => return Err(e),
        }
    }
    Ok((running, exited))
}

/// Puts `stat`'s process in the tracked map, then checks it is still the same process; a
/// process that exited in between is taken out again (its pid could be reused).
pub fn track(map: &mut TrackedMap, stat: &Stat) -> Result<bool> {
    // An entry for a dead process that was not removed yet is replaced below.
    if let Ok(entry) = map.get(&stat.pid, 0)
        && (entry.start == 0 || Start::Exact(entry.start).ticks() == stat.start_ticks)
    {
        return Ok(true); // the kernel already tracks this very process
    }
    // Start 0: the kernel learns the exact start time at the process's next event.
    map.insert(stat.pid, Tracked { start: 0 }, 0)?;
    match ProcessId::of_stat(stat).still_same() {
        Some(now) if now.state != b'Z' => Ok(true),
        _ => {
            let _ = map.remove(&stat.pid);
            Ok(false)
        }
    }
}

/// A process as /proc shows it (`stat`, and its cmdline read now), for the graph.
pub fn seed_of(stat: &Stat, is_gateway: bool) -> Seed {
    let argv = procfs::read_cmdline(stat.pid, MAX_ARGS)
        .map(|(a, _)| a)
        .unwrap_or_default();
    Seed {
        pid: stat.pid,
        start_ticks: stat.start_ticks,
        ppid: stat.ppid,
        sid: stat.session,
        pgid: stat.pgrp,
        comm: stat.comm,
        argv,
        is_gateway,
        uncertain: false,
    }
}

/// Tracks the gateways and all their current descendants (by parent pid), and those of
/// `roots` (processes the run already tracks: a checkpoint's). Returns the new ones, parents
/// before children; a gateway that exited meanwhile is not among them.
pub fn seed(map: &mut TrackedMap, gateways: &[Stat], roots: &[u32]) -> Result<Vec<Seed>> {
    let mut seeds = Vec::new();
    let mut known: HashSet<u32> = roots.iter().copied().collect();
    for gw in gateways {
        if track(map, gw)? {
            known.insert(gw.pid);
            seeds.push(seed_of(gw, true));
        }
    }
    for pass in 0..MAX_PASSES {
        let found = descendants_pass(map, &mut known)?;
        let none_new = found.is_empty();
        seeds.extend(found);
        // Two passes at least: the second catches forks that raced the first one's inserts.
        if none_new && pass >= 1 {
            break;
        }
    }
    Ok(seeds)
}

/// One pass: every process whose parent chain reaches a known process, not yet known.
fn descendants_pass(map: &mut TrackedMap, known: &mut HashSet<u32>) -> Result<Vec<Seed>> {
    let all = procfs::snapshot_all()?;
    let mut children: HashMap<u32, Vec<&Stat>> = HashMap::new();
    for stat in all.values() {
        children.entry(stat.ppid).or_default().push(stat);
    }
    let me = procfs::own_pid();
    let mut queue: VecDeque<u32> = known.iter().copied().collect();
    let mut found = Vec::new();
    while let Some(pid) = queue.pop_front() {
        let Some(kids) = children.get(&pid) else {
            continue;
        };
        for kid in kids {
            // reaper-trace itself may run under a gateway (a shell): it never traces itself.
            if known.contains(&kid.pid) || kid.pid == me {
                continue;
            }
            if track(map, kid)? {
                known.insert(kid.pid);
                queue.push_back(kid.pid);
                found.push(seed_of(kid, false));
            }
        }
    }
    Ok(found)
}
