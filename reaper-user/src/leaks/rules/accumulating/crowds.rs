//! The count kept across looks: each instance's kind and gateway instance (looked up once),
//! since when it has been one too many, when instances are next counted, and the census the
//! metrics take. The inspector gathers the instances ([`Crowds::instances`]) and calls
//! [`Crowds::judge`] when a look or an exit may have changed a count, and applies what it
//! decides to the flags it keeps.
use std::rc::Rc;

use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

use super::kinds::Kind;
use super::{CENSUS_KINDS, CROWD_GRACE, FELL_BACK, Group, Instance, census};
use crate::leaks::findings::Crowd;
use crate::lineage::graph::{LineageGraph, Node, NodeId};

/// What the count remembers of one process it counted.
#[derive(Default)]
struct Member {
    /// Its kind, formed at a look after the exec it is from (by the graph's exec count): until
    /// a look after its next exec, what it ran before.
    kind: Option<(u32, Rc<Kind>)>,
    /// The gateway instance it descends from, once looked up (the lineage edge never moves).
    gateway: Option<Option<NodeId>>,
    /// Since when it has been one instance too many of its kind (at the looks since).
    over_since: Option<u64>,
}

/// The `accumulating` count across looks.
#[derive(Default)]
pub struct Crowds {
    members: HashMap<NodeId, Member>,
    /// A counted process exited since instances were last counted.
    changed: bool,
    /// When the earliest instance one too many has been so for [`CROWD_GRACE`].
    due: Option<u64>,
    /// The kinds with the most instances at the last count, taken by the next metrics update.
    census: Option<Vec<(String, u64)>>,
    /// Each instance's kind and count at the last count, by its outermost process (a `why`
    /// names them).
    counted: HashMap<NodeId, Rc<Crowd>>,
}

/// What the inspector knows of a server's outermost process that the count needs.
pub trait Watched {
    /// Whether it was looked at (a sample of it is held); `None` for a process not watched
    /// (a gateway, one gone).
    fn looked_at(&self, id: NodeId) -> Option<bool>;
    /// It holds an `accumulating` flag.
    fn flagged(&self, id: NodeId) -> bool;
}

/// What a count decided: flags to raise (with since when, and the crowd they are part of),
/// and flags to clear (with why).
#[derive(Default)]
pub struct Verdict {
    pub raise: Vec<(NodeId, u64, Crowd)>,
    pub clear: Vec<(NodeId, &'static str)>,
}

impl Crowds {
    /// A watched process ended: instances are counted again at the next look (a wrapper's
    /// end changes its server, an instance's its count).
    pub fn ended(&mut self, id: NodeId) {
        self.members.remove(&id);
        self.changed = true;
    }

    /// Whether instances are to be counted at a look at `now` that sampled nothing new: one
    /// ended, or an instance's grace is over.
    pub fn due(&mut self, now: u64) -> bool {
        std::mem::take(&mut self.changed) || self.due.is_some_and(|t| now >= t)
    }

    /// When an instance's grace ends (boot-time ns): instances are counted again then.
    pub fn next_look(&self) -> Option<u64> {
        self.due
    }

    /// Process `node` was looked at, and the program it runs read (`exe`, as /proc names it,
    /// links resolved; none when /proc could not say): its kind at its current exec is
    /// formed, from that program for every instance alike (one exec'd as /usr/bin/python3
    /// and one found running at start are the same python3.11), else from the exec's path.
    pub fn looked_at(&mut self, node: &Node, exe: Option<Box<[u8]>>) {
        let exe = exe
            .map(Into::into)
            .or_else(|| node.filename.clone())
            .unwrap_or_else(|| node.comm.as_bytes().into());
        let kind = Rc::new(Kind::of(exe, &node.argv));
        self.members.entry(node.id).or_default().kind = Some((node.execs, kind));
    }

    /// Whether `node`'s kind at its current exec is known (else its next look is to read the
    /// program it runs).
    pub fn knows_kind(&self, node: &Node) -> bool {
        let member = self.members.get(&node.id);
        member.is_some_and(|m| {
            m.kind
                .as_ref()
                .is_some_and(|(execs, _)| *execs == node.execs)
        })
    }

    /// The census of the last count, if one was taken since the last call.
    pub fn take_census(&mut self) -> Option<Vec<(String, u64)>> {
        self.census.take()
    }

    /// The instances among `servers` (each outermost process first), to be grouped for
    /// [`Crowds::judge`]: gathered a slice of servers at a time, if the caller wants.
    pub fn instances(
        &mut self,
        graph: &LineageGraph,
        servers: &[Vec<NodeId>],
        watched: &impl Watched,
    ) -> Vec<Instance> {
        servers
            .iter()
            .filter_map(|s| self.instance(graph, s[0], watched))
            .collect()
    }

    /// Counts every instance (`groups`, by gateway instance and kind, gathered from
    /// `servers`: a server, on its outermost process): all but the newest `max` of a kind
    /// are over, and flagged once over for [`CROWD_GRACE`]; a flag whose process is no longer
    /// over clears.
    pub fn judge(
        &mut self,
        graph: &LineageGraph,
        servers: &[Vec<NodeId>],
        groups: Vec<Group>,
        watched: &impl Watched,
        max: usize,
        now: u64,
    ) -> Verdict {
        let grace = u64::try_from(CROWD_GRACE.as_nanos()).unwrap_or(u64::MAX);
        self.census = Some(census(&groups, CENSUS_KINDS));
        self.counted.clear();
        for g in &groups {
            let crowd = Rc::new(Crowd {
                exe: g.kind().exe().into(),
                pattern: g.pattern().to_owned(),
                instances: g.members.len(),
                newest: graph.node(g.newest().node).map_or(0, |n| n.pid),
            });
            for i in &g.members {
                self.counted.insert(i.node, crowd.clone());
            }
        }
        // Each instance past the limit, and since when: since the instance `max` places
        // younger started (from then on it was not one of the newest `max`).
        let mut over: HashMap<NodeId, u64> = HashMap::default();
        for g in &groups {
            for (k, i) in g.older_than_newest(max).iter().enumerate() {
                over.insert(i.node, g.members[k + max].start);
            }
        }
        // Each stays one too many for the grace before it is flagged (counted again then).
        self.due = None;
        for (id, m) in self.members.iter_mut() {
            match over.contains_key(id) {
                true => {
                    let since = *m.over_since.get_or_insert(now);
                    let due = since.saturating_add(grace);
                    if !watched.flagged(*id) && now < due {
                        self.due = Some(self.due.map_or(due, |t| t.min(due)));
                    }
                }
                false => m.over_since = None,
            }
        }
        let mut verdict = Verdict::default();
        let tops: HashSet<NodeId> = servers.iter().map(|s| s[0]).collect();
        let mut ended: Vec<NodeId> = self
            .members
            .keys()
            .copied()
            .filter(|id| watched.flagged(*id) && !over.contains_key(id))
            .collect();
        ended.sort_unstable();
        for id in ended {
            let because = match tops.contains(&id) {
                true => FELL_BACK,
                false => "part of its spawner's server now",
            };
            verdict.clear.push((id, because));
        }
        for g in &groups {
            let older = g.older_than_newest(max);
            if older.is_empty() {
                continue;
            }
            let crowd = Crowd {
                exe: g.kind().exe().into(),
                pattern: g.pattern().to_owned(),
                instances: g.members.len(),
                newest: graph.node(g.newest().node).map_or(0, |n| n.pid),
            };
            for i in older {
                let confirmed = self.members.get(&i.node).is_some_and(|m| {
                    m.over_since
                        .is_some_and(|since| now >= since.saturating_add(grace))
                });
                if confirmed && !watched.flagged(i.node) {
                    verdict.raise.push((i.node, over[&i.node], crowd.clone()));
                }
            }
        }
        verdict
    }

    /// What an `accumulating` flag would say of the kind of the server whose outermost process
    /// is `top`, at the last count: its kind under its gateway instance, and how many live
    /// instances it had. None for a process that was no instance then (not looked at, or
    /// outside any gateway's lineage).
    pub fn crowd_of(&self, top: NodeId) -> Option<Crowd> {
        self.counted.get(&top).map(|c| (**c).clone())
    }

    /// `top` as an instance of its kind, once its server is known: it and its spawner were
    /// looked at (a wrapper's child looked at before the wrapper would count as an instance of
    /// its own kind for a moment), and its kind formed at a look. None for a process outside
    /// any gateway's lineage.
    fn instance(
        &mut self,
        graph: &LineageGraph,
        top: NodeId,
        watched: &impl Watched,
    ) -> Option<Instance> {
        let node = graph.node(top)?;
        let spawner_looked = node
            .spawner
            .and_then(|s| watched.looked_at(s))
            .is_none_or(|looked| looked);
        if watched.looked_at(top) != Some(true) || !spawner_looked {
            return None;
        }
        let m = self.members.entry(top).or_default();
        let gateway = *m.gateway.get_or_insert_with(|| {
            graph
                .chain(top)
                .first()
                .filter(|g| g.is_gateway && g.id != top)
                .map(|g| g.id)
        });
        // One that exec'd since its last look counts as what it ran until it is looked at
        // again (at the next round: see `Inspector::due`), not dropped from its count.
        let kind = m.kind.as_ref()?.1.clone();
        Some(Instance {
            node: top,
            start: node.start.boottime_ns(),
            gateway: gateway?,
            kind,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::decode::What;
    use crate::leaks::rules::accumulating::Grouping;
    use crate::lineage::graph::testing::{fork, gateway, record};
    use crate::text::{Args, Comm};

    const SEC: u64 = 1_000_000_000;
    /// Pids above `pid_max` (32768 here): none names a real process.
    const GATEWAY: u32 = 40_000;

    /// A gateway and `n` instances of `srv --session N`, each a server of one process.
    fn instances(n: u32) -> (LineageGraph, Vec<Vec<NodeId>>) {
        let mut g = LineageGraph::new(100);
        g.add_seed(gateway(GATEWAY));
        for pid in GATEWAY + 1..=GATEWAY + n {
            let ts = u64::from(pid);
            record(&mut g, ts, (pid, ts), fork(GATEWAY));
            let session = (pid - GATEWAY).to_string();
            let exec = What::Exec {
                old_tid: pid,
                comm: Comm::from_c(b"srv"),
                filename: b"/bin/srv".as_slice().into(),
                argv: Args::from_list(["srv", "--session", &session]),
                truncated: false,
                interpreter: None,
            };
            record(&mut g, ts, (pid, ts), exec);
        }
        let servers = (GATEWAY + 1..=GATEWAY + n)
            .map(|pid| vec![g.current(pid).unwrap().id])
            .collect();
        (g, servers)
    }

    /// Every process looked at; the flagged ones as given.
    struct Flags(Vec<NodeId>);

    impl Watched for Flags {
        fn looked_at(&self, _: NodeId) -> Option<bool> {
            Some(true)
        }
        fn flagged(&self, id: NodeId) -> bool {
            self.0.contains(&id)
        }
    }

    /// A count of `servers` with two instances of a kind allowed, each looked at since its
    /// last exec (its program unread: the exec's path).
    fn count(
        crowds: &mut Crowds,
        graph: &LineageGraph,
        servers: &[Vec<NodeId>],
        watched: &Flags,
        now: u64,
    ) -> Verdict {
        for node in servers.iter().filter_map(|s| graph.node(s[0])) {
            if !crowds.knows_kind(node) {
                crowds.looked_at(node, None);
            }
        }
        let mut grouping = Grouping::default();
        grouping.add(crowds.instances(graph, servers, watched));
        crowds.judge(graph, servers, grouping.groups(), watched, 2, now)
    }

    #[test]
    fn the_oldest_over_the_limit_are_flagged_after_the_grace_and_cleared_when_the_count_falls() {
        let (graph, servers) = instances(4);
        let (oldest, second) = (servers[0][0], servers[1][0]);
        let mut crowds = Crowds::default();
        let now = 10 * SEC;
        let first = count(&mut crowds, &graph, &servers, &Flags(vec![]), now);
        assert!(
            first.raise.is_empty(),
            "one too many for less than the grace"
        );
        let grace = u64::try_from(CROWD_GRACE.as_nanos()).unwrap();
        assert_eq!(crowds.next_look(), Some(now + grace));
        assert!(!crowds.due(now + grace - 1) && crowds.due(now + grace));

        let later = count(&mut crowds, &graph, &servers, &Flags(vec![]), now + grace);
        let raised: Vec<(NodeId, usize, u32)> = later
            .raise
            .iter()
            .map(|(id, _, crowd)| (*id, crowd.instances, crowd.newest))
            .collect();
        assert_eq!(raised, [(oldest, 4, GATEWAY + 4), (second, 4, GATEWAY + 4)]);
        assert_eq!(
            crowds.take_census(),
            Some(vec![("srv --session *".into(), 4)])
        );

        // The two newest gone: the two oldest are no longer over, and their flags clear.
        let flagged = Flags(vec![oldest, second]);
        let fewer = count(
            &mut crowds,
            &graph,
            &servers[..2],
            &flagged,
            now + 2 * grace,
        );
        assert!(fewer.raise.is_empty());
        assert_eq!(fewer.clear, [(oldest, FELL_BACK), (second, FELL_BACK)]);
    }

    #[test]
    fn an_instance_that_execd_counts_as_what_it_ran_until_a_look_reads_its_new_program() {
        let (mut graph, servers) = instances(2);
        let mut crowds = Crowds::default();
        let (first, second) = (servers[0][0], servers[1][0]);
        for id in [first, second] {
            crowds.looked_at(graph.node(id).unwrap(), Some((*b"/usr/bin/srv3").into()));
        }
        let kinds = |crowds: &mut Crowds, graph: &LineageGraph| -> Vec<(NodeId, Vec<u8>)> {
            let all = crowds.instances(graph, &servers, &Flags(vec![]));
            all.iter()
                .map(|i| (i.node, i.kind.exe().to_vec()))
                .collect()
        };
        let read = b"/usr/bin/srv3".to_vec();
        assert_eq!(
            kinds(&mut crowds, &graph),
            [(first, read.clone()), (second, read.clone())],
            "the program the look read, not the exec's path"
        );

        let pid = graph.node(second).unwrap().pid;
        let exec = What::Exec {
            old_tid: pid,
            comm: Comm::from_c(b"node"),
            filename: b"/bin/node".as_slice().into(),
            argv: Args::from_list(["node", "bridge.js"]),
            truncated: false,
            interpreter: None,
        };
        record(&mut graph, 100_000, (pid, u64::from(pid)), exec);
        let node = graph.node(second).unwrap();
        assert!(
            !crowds.knows_kind(node),
            "its kind is of the program before"
        );
        assert_eq!(
            kinds(&mut crowds, &graph),
            [(first, read.clone()), (second, read.clone())],
            "still counted, as what it ran before, its program not read at the count"
        );
        crowds.looked_at(graph.node(second).unwrap(), None);
        assert_eq!(
            kinds(&mut crowds, &graph),
            [(first, read), (second, b"/bin/node".to_vec())],
            "counted again once looked at: the exec's path when /proc could not say"
        );
    }
}
