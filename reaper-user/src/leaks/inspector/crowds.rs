//! The inspector's `accumulating` judgement: instances counted by gateway and kind (see
//! [`crate::leaks::accumulation`]), flags raised on the older ones and cleared when the count
//! falls back.
use std::rc::Rc;

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use super::{CENSUS_KINDS, CROWD_GRACE, Inspector};
use crate::leaks::accumulation::{self, Instance};
use crate::leaks::findings::{Change, Crowd, Evidence, Flagged, Reason};
use crate::leaks::kinds::Kind;
use crate::lineage::graph::{LineageGraph, NodeId};
use crate::procfs::{self, placement::Placement};

impl Inspector {
    /// Applies `accumulating` (see [`accumulation`]) to every instance: a server, counted on
    /// its outermost process.
    pub(super) fn judge_crowds(
        &mut self,
        graph: &LineageGraph,
        servers: &[Vec<NodeId>],
        now: u64,
        changes: &mut Vec<Change>,
    ) {
        let max = self.opts.max_instances;
        let grace = u64::try_from(CROWD_GRACE.as_nanos()).unwrap_or(u64::MAX);
        let instances: Vec<Instance> = servers
            .iter()
            .filter_map(|s| self.instance(graph, s[0]))
            .collect();
        let groups = accumulation::groups(instances);
        self.census = Some(accumulation::census(&groups, CENSUS_KINDS));
        // Each instance past the limit, and since when: since the instance `max` places
        // younger started (from then on it was not one of the newest `max`).
        let mut over: HashMap<NodeId, u64> = HashMap::default();
        for g in &groups {
            for (k, i) in g.older_than_newest(max).iter().enumerate() {
                over.insert(i.node, g.members[k + max].start);
            }
        }
        // Each stays one too many for the grace before it is flagged (counted again then).
        self.crowd_due = None;
        for (id, w) in self.watches.iter_mut() {
            match over.contains_key(id) {
                true => {
                    let since = *w.over_since.get_or_insert(now);
                    if !w.has(Reason::Accumulating) && now < since.saturating_add(grace) {
                        let due = since.saturating_add(grace);
                        self.crowd_due = Some(self.crowd_due.map_or(due, |t| t.min(due)));
                    }
                }
                false => w.over_since = None,
            }
        }
        let tops: HashSet<NodeId> = servers.iter().map(|s| s[0]).collect();
        let mut ended: Vec<(NodeId, u32)> = self
            .watches
            .iter()
            .filter(|(id, w)| w.has(Reason::Accumulating) && !over.contains_key(id))
            .map(|(id, w)| (*id, w.pid))
            .collect();
        ended.sort_unstable();
        for (id, pid) in ended {
            if let Some(w) = self.watches.get_mut(&id) {
                w.flags.retain(|(r, _)| *r != Reason::Accumulating);
            }
            changes.push(Change::Cleared {
                node: id,
                pid,
                reason: Reason::Accumulating,
                because: match tops.contains(&id) {
                    true => "no more than --max-instances of its kind alive now",
                    false => "part of its spawner's server now",
                },
            });
        }
        let server_of: HashMap<NodeId, &Vec<NodeId>> = servers.iter().map(|s| (s[0], s)).collect();
        for g in &groups {
            let older = g.older_than_newest(max);
            if older.is_empty() {
                continue;
            }
            let crowd = Crowd {
                exe: g.kind().exe().into(),
                pattern: g.pattern(),
                instances: g.members.len(),
                newest: graph.node(g.newest().node).map_or(0, |n| n.pid),
            };
            for i in older {
                let Some(w) = self.watches.get_mut(&i.node) else {
                    continue;
                };
                let confirmed = w
                    .over_since
                    .is_some_and(|since| now >= since.saturating_add(grace));
                if w.has(Reason::Accumulating) || !confirmed {
                    continue;
                }
                let Some(sample) = w.last.clone() else {
                    continue;
                };
                let since = over[&i.node];
                w.flags.push((Reason::Accumulating, since));
                changes.push(Change::Flag(Box::new(Flagged {
                    node: i.node,
                    pid: w.pid,
                    reason: Reason::Accumulating,
                    since,
                    evidence: Some(Evidence {
                        sample,
                        peers: Vec::new(),
                        server: server_of.get(&i.node).map_or(vec![i.node], |s| s.to_vec()),
                        placement: Placement::default(),
                    }),
                    crowd: Some(crowd.clone()),
                })));
            }
        }
    }

    /// `top` as an instance of its kind, once its server is known: it and its spawner were
    /// looked at (a wrapper's child looked at before the wrapper would count as an instance of
    /// its own kind for a moment). None for a process outside any gateway's lineage.
    fn instance(&mut self, graph: &LineageGraph, top: NodeId) -> Option<Instance> {
        let node = graph.node(top)?;
        let spawner_looked = node
            .spawner
            .and_then(|s| self.watches.get(&s))
            .is_none_or(|w| w.last.is_some());
        let w = self.watches.get_mut(&top)?;
        if w.last.is_none() || !spawner_looked {
            return None;
        }
        let gateway = *w.gateway.get_or_insert_with(|| {
            graph
                .chain(top)
                .first()
                .filter(|g| g.is_gateway && g.id != top)
                .map(|g| g.id)
        });
        let kind = match &w.kind {
            Some((execs, kind)) if *execs == node.execs => kind.clone(),
            _ => {
                // The program it runs as /proc names it (links resolved), for every instance
                // alike: one exec'd as /usr/bin/python3 and one found running at start are
                // the same python3.11. The exec's path if /proc cannot say.
                let exe = procfs::read_exe(node.pid)
                    .map(Into::into)
                    .or_else(|| node.filename.clone())
                    .unwrap_or_else(|| node.comm.as_bytes().into());
                let kind = Rc::new(Kind::of(exe, &node.argv));
                w.kind = Some((node.execs, kind.clone()));
                kind
            }
        };
        Some(Instance {
            node: top,
            start: node.start.boottime_ns(),
            gateway: gateway?,
            kind,
        })
    }
}
