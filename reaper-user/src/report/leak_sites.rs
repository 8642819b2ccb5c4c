//! Leaks by the code that spawned them (`spawned_at`, `--spawn-stacks`), as the report shows
//! them: each flag counted at its spawner's innermost own frames (up to three, past the
//! languages' spawning libraries and libc's fork wrapper, as the readable LEAK line names
//! them), so "27 flags: … < MCPServerTask._run_stdio (mcp_tool.py:1230)" reads at a glance.
use std::collections::BTreeMap;

use crate::stream::evidence::Frame;
use crate::stream::readable::spawn_site_text;

/// At most this many sites are followed (the rest are counted).
pub const MAX_SITES: usize = 500;
/// At most this many pids are kept per site, as examples.
pub const MAX_PIDS: usize = 8;

/// Where leaks were spawned, and what was flagged there.
#[derive(Clone, Debug, Default)]
pub struct LeakSite {
    /// `function (file:line) < caller (file:line) < …`, innermost first.
    pub site: String,
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

/// The sites leaks were spawned at, by their text.
#[derive(Clone, Debug, Default)]
pub struct LeakSites {
    pub sites: BTreeMap<String, LeakSite>,
    /// Flags whose site was past [`MAX_SITES`].
    pub omitted: u64,
}

impl LeakSites {
    /// Takes in a flag raised on `pid` for `reason`, spawned at `frames`. A flag with no frame
    /// of the spawner's own counts nowhere.
    pub fn flag(&mut self, pid: u32, reason: &str, frames: &[Frame]) {
        let Some(site) = spawn_site_text(frames) else {
            return;
        };
        if self.sites.len() >= MAX_SITES && !self.sites.contains_key(&site) {
            self.omitted += 1;
            return;
        }
        let entry = self.sites.entry(site.clone()).or_insert_with(|| LeakSite {
            site,
            ..LeakSite::default()
        });
        *entry.reasons.entry(reason.to_owned()).or_default() += 1;
        if entry.pids.len() < MAX_PIDS {
            entry.pids.push(pid);
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
    fn leaks_count_at_their_spawners_own_innermost_frames() {
        let stdio = vec![
            py(
                "Popen._execute_child",
                "/usr/lib/python3.13/subprocess.py",
                1922,
            ),
            py("open_process", "/venv/anyio/_core/_subprocesses.py", 190),
            py("stdio_client", "/venv/mcp/client/stdio/__init__.py", 120),
            py(
                "_AsyncGeneratorContextManager.__aenter__",
                "/usr/lib/contextlib.py",
                210,
            ),
            py("MCPServerTask._run_stdio", "/opt/h/tools/mcp_tool.py", 812),
            py("MCPServerTask.run", "/opt/h/tools/mcp_tool.py", 1470),
            py("Handle._run", "/usr/lib/python3.13/asyncio/events.py", 89),
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
        assert_eq!(
            top.site,
            "stdio_client (__init__.py:120) < MCPServerTask._run_stdio (mcp_tool.py:812) \
             < MCPServerTask.run (mcp_tool.py:1470)"
        );
        assert_eq!(top.flags(), 27);
        assert_eq!(top.reasons["idle"], 9);
        assert_eq!(top.pids.len(), MAX_PIDS);
        assert_eq!(by_count[1].site, "spawn_bridge (bridge.py:40)");
    }
}
