//! Leaks by the code that spawned them (`spawned_at`, `--spawn-stacks`), as the report shows
//! them: each flag counted at its spawner's innermost own frame (past the languages' spawning
//! libraries and libc's fork wrapper), so "27 leaks spawned at tools/mcp_tool.py:812
//! `_run_stdio`" reads at a glance.
use std::collections::BTreeMap;

use crate::stream::evidence::Frame;

/// At most this many sites are followed (the rest are counted).
pub const MAX_SITES: usize = 500;
/// At most this many pids are kept per site, as examples.
pub const MAX_PIDS: usize = 8;

/// Where leaks were spawned: one function at one line.
#[derive(Clone, Debug, Default)]
pub struct LeakSite {
    pub function: String,
    pub file: Option<String>,
    pub line: Option<u32>,
    /// Flags raised on processes spawned here, by reason.
    pub reasons: BTreeMap<String, u64>,
    /// The first flagged processes' pids.
    pub pids: Vec<u32>,
}

impl LeakSite {
    pub fn flags(&self) -> u64 {
        self.reasons.values().sum()
    }
}

/// The sites leaks were spawned at, by `file:line function`.
#[derive(Clone, Debug, Default)]
pub struct LeakSites {
    pub sites: BTreeMap<String, LeakSite>,
    /// Flags whose site was past [`MAX_SITES`].
    pub omitted: u64,
}

impl LeakSites {
    /// Takes in a flag raised on `pid` for `reason`, spawned at `frames`. A flag with no named
    /// frame of the spawner's own counts nowhere.
    pub fn flag(&mut self, pid: u32, reason: &str, frames: &[Frame]) {
        let Some(own) = frames
            .iter()
            .find(|f| !f.in_spawning_library() && f.function.is_some())
        else {
            return;
        };
        let function = own.function.clone().unwrap_or_default();
        let key = format!(
            "{}:{} {function}",
            own.file.as_deref().unwrap_or("?"),
            own.line.unwrap_or(0)
        );
        if self.sites.len() >= MAX_SITES && !self.sites.contains_key(&key) {
            self.omitted += 1;
            return;
        }
        let site = self.sites.entry(key).or_insert_with(|| LeakSite {
            function,
            file: own.file.clone(),
            line: own.line,
            ..LeakSite::default()
        });
        *site.reasons.entry(reason.to_owned()).or_default() += 1;
        if site.pids.len() < MAX_PIDS {
            site.pids.push(pid);
        }
    }

    /// The sites, most flags first.
    pub fn by_count(&self) -> Vec<&LeakSite> {
        let mut sites: Vec<&LeakSite> = self.sites.values().collect();
        sites.sort_by_key(|s| std::cmp::Reverse(s.flags()));
        sites
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn py(function: &str, file: &str, line: u32) -> Frame {
        Frame {
            function: Some(function.into()),
            file: Some(file.into()),
            line: Some(line),
            language: Some("python".into()),
            ..Frame::default()
        }
    }

    #[test]
    fn leaks_count_at_their_spawners_own_innermost_frame() {
        let stdio = vec![
            py(
                "Popen._execute_child",
                "/usr/lib/python3.13/subprocess.py",
                1922,
            ),
            py("MCPServerTask._run_stdio", "/opt/h/tools/mcp_tool.py", 812),
            py("MCPServerTask.run", "/opt/h/tools/mcp_tool.py", 1470),
        ];
        let bridge = vec![py("spawn_bridge", "/opt/h/bridge.py", 40)];
        let mut sites = LeakSites::default();
        for pid in 0..27 {
            sites.flag(
                100 + pid,
                if pid % 3 == 0 { "idle" } else { "orphaned" },
                &stdio,
            );
        }
        sites.flag(900, "deaf", &bridge);
        sites.flag(901, "deaf", &[]);
        let by_count = sites.by_count();
        assert_eq!(by_count.len(), 2, "{sites:?}");
        let top = by_count[0];
        assert_eq!(top.function, "MCPServerTask._run_stdio");
        assert_eq!((top.line, top.flags()), (Some(812), 27));
        assert_eq!(top.reasons["idle"], 9);
        assert_eq!(top.pids.len(), MAX_PIDS);
        assert_eq!(by_count[1].function, "spawn_bridge");
    }
}
