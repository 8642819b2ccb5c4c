//! Gateways by what they are: the selectors of the command line, numbered, and how each finds
//! its processes — at start in /proc, later in the kernel as they appear (executables and
//! cgroups, see `reaper-ebpf/src/probes/gateway.rs`) or when a pidfile changes.
//!
//! A selector's number is its index here; the kernel's maps carry it, the `gateway` event
//! names it by its label (`"exe:/usr/local/bin/hermes"`, `"pid"`, `"unit:hermes.service"`).
pub mod announce;
pub mod cgroup;
pub mod exe;
pub mod pidfile;

use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::Result;

use crate::capture::loader::{SelectorMaps, SelectorNeeds};
use crate::procfs::Stat;
use cgroup::CgroupDir;
use exe::{Exe, ExeKind};
use pidfile::Pidfile;

/// How a selector finds processes.
#[derive(Debug)]
pub enum Selector {
    /// `--gateway-pid`: the processes named at start.
    Pid,
    /// `-- CMD`: the command reaper-trace starts.
    Command,
    Exe(Exe),
    Cgroup(CgroupDir),
    Pidfile(Pidfile),
}

/// Every selector of a run, numbered.
#[derive(Debug)]
pub struct Selectors {
    entries: Vec<(String, Selector)>,
}

/// The selectors the command line asks for, beside `--gateway-pid` and `-- CMD` (which
/// always have their numbers): `--gateway-exe`, `--gateway-unit`, `--gateway-cgroup`,
/// `--gateway-pidfile`.
pub struct Asked<'a> {
    pub exes: &'a [PathBuf],
    pub units: &'a [String],
    pub cgroups: &'a [PathBuf],
    pub pidfiles: &'a [PathBuf],
}

impl Selectors {
    /// The number of `--gateway-pid`.
    pub const PID: usize = 0;
    /// The number of `-- CMD`.
    pub const COMMAND: usize = 1;

    /// Checks every selector asked for (before the kernel is touched: a typo costs nothing).
    pub fn asked(asked: &Asked) -> Result<Selectors> {
        let mut entries = vec![
            ("pid".to_owned(), Selector::Pid),
            ("command".to_owned(), Selector::Command),
        ];
        for path in asked.exes {
            let label = format!("exe:{}", path.display());
            entries.push((label, Selector::Exe(Exe::resolve(path)?)));
        }
        for name in asked.units {
            let label = format!("unit:{name}");
            entries.push((label, Selector::Cgroup(CgroupDir::of_unit(name)?)));
        }
        for path in asked.cgroups {
            let label = format!("cgroup:{}", path.display());
            entries.push((label, Selector::Cgroup(CgroupDir::resolve(path)?)));
        }
        for path in asked.pidfiles {
            let label = format!("pidfile:{}", path.display());
            entries.push((label, Selector::Pidfile(Pidfile::new(path)?)));
        }
        Ok(Selectors { entries })
    }

    /// The label of selector `index` (as the `gateway` event's `selector`).
    pub fn label(&self, index: usize) -> &str {
        self.entries.get(index).map_or("unknown", |(l, _)| l)
    }

    /// Every label, by number.
    pub fn labels(&self) -> Vec<String> {
        self.entries.iter().map(|(l, _)| l.clone()).collect()
    }

    /// Whether gateways may appear at any time: then the run does not end when the gateways
    /// it has exited.
    pub fn watches(&self) -> bool {
        self.entries.iter().any(|(_, s)| {
            matches!(
                s,
                Selector::Exe(_) | Selector::Cgroup(_) | Selector::Pidfile(_)
            )
        })
    }

    /// What the kernel programs must look at (load-time switches).
    pub fn needs(&self) -> SelectorNeeds {
        let mut needs = SelectorNeeds::default();
        for (_, s) in &self.entries {
            match s {
                Selector::Exe(Exe {
                    kind: ExeKind::Binary(_),
                    ..
                }) => needs.exes = true,
                Selector::Exe(Exe {
                    kind: ExeKind::Script(_),
                    ..
                }) => needs.paths = true,
                Selector::Cgroup(_) => needs.cgroups = true,
                _ => {}
            }
        }
        needs
    }

    /// Fills the kernel's selector maps. Runs after the probes are attached, so a cgroup made
    /// while the existing ones are listed is selected by the kernel (its parent is already).
    pub fn arm(&self, maps: &mut SelectorMaps) -> Result<()> {
        for (index, (_, s)) in self.entries.iter().enumerate() {
            let index = index as u32;
            match s {
                Selector::Exe(exe) => match &exe.kind {
                    ExeKind::Binary(key) => maps.exes.insert(key, index, 0)?,
                    ExeKind::Script(paths) => {
                        for p in paths {
                            maps.paths.insert(exe::path_key(p)?, index, 0)?;
                        }
                    }
                },
                Selector::Cgroup(c) => {
                    maps.cgroup_paths.insert(
                        exe::path_key(std::path::Path::new(&c.path))?,
                        index,
                        0,
                    )?;
                    for id in c.existing() {
                        maps.cgroups.insert(id, index, 0)?;
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Processes running now that a selector names (not `--gateway-pid`, checked on its own),
    /// with the selector's number. One process is named once, by its first selector.
    pub fn running(&mut self, all: &HashMap<u32, Stat>) -> Vec<(usize, Stat)> {
        let me = crate::procfs::own_pid();
        let mut found: Vec<(usize, Stat)> = Vec::new();
        let mut stats: Vec<&Stat> = all.values().collect();
        stats.sort_by_key(|s| s.pid);
        let cgroups = match self
            .entries
            .iter()
            .any(|(_, s)| matches!(s, Selector::Cgroup(_)))
        {
            true => cgroup::Cgroups::read(all),
            false => cgroup::Cgroups::default(),
        };
        for (index, (_, s)) in self.entries.iter_mut().enumerate() {
            let mut take = |stat: &Stat| {
                let kernel_thread = stat.flags & crate::procfs::PF_KTHREAD != 0;
                if stat.pid != me
                    && stat.state != b'Z'
                    && !kernel_thread
                    && !found.iter().any(|(_, f)| f.pid == stat.pid)
                {
                    found.push((index, stat.clone()));
                }
            };
            match s {
                Selector::Exe(exe) => stats
                    .iter()
                    .filter(|st| exe.is_running_in(st))
                    .for_each(|st| take(st)),
                Selector::Cgroup(c) => stats
                    .iter()
                    .filter(|st| c.is_entry(st, &cgroups))
                    .for_each(|st| take(st)),
                Selector::Pidfile(pf) => {
                    if let Some(Ok(pid)) = pf.changed()
                        && let Some(st) = all.get(&pid)
                    {
                        take(st);
                    }
                }
                _ => {}
            }
        }
        found
    }

    /// Pidfiles rewritten since the last look: (selector, the pid or what is wrong with it).
    pub fn pidfile_changes(&mut self) -> Vec<(usize, Result<u32>)> {
        let mut out = Vec::new();
        for (index, (_, s)) in self.entries.iter_mut().enumerate() {
            if let Selector::Pidfile(pf) = s
                && let Some(change) = pf.changed()
            {
                out.push((index, change));
            }
        }
        out
    }

    /// Pidfiles that are unreadable as pids right now (at start: a clear error).
    pub fn check_pidfiles(&self) -> Result<()> {
        for (_, s) in &self.entries {
            if let Selector::Pidfile(pf) = s
                && let Ok(text) = pidfile::read(&pf.path)
            {
                pidfile::parse_pid(&text)
                    .map_err(|e| anyhow::anyhow!("--gateway-pidfile {}: {e}", pf.path.display()))?;
            }
        }
        Ok(())
    }
}
