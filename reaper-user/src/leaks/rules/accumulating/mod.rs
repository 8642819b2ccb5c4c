//! `accumulating`: more than `--max-instances` instances of one kind (see [`kinds`]) alive under one gateway instance. Every instance but the newest N
//! is flagged, once that held for [`CROWD_GRACE`]; the flag holds until it exits or the count
//! falls back to N. The count kept across looks is [`Crowds`], the rule's own; what it decides
//! is applied to the flags held here ([`Verdict::apply`]).
//!
//! The symptom in every leak report behind this project (28 `stdio-mcp-binary serve` under one
//! gateway, one Node bridge per conversation turn, 128 slash workers) is a count, not a state:
//! a leaked instance that its gateway still pings moves data, so it is never `idle`. This rule
//! reads no I/O, only the lineage and the kinds. An instance is a server (a process with the
//! wrappers that share its channel, see [`crate::leaks::channels`]), counted once, on its
//! outermost process.
use std::rc::Rc;
use std::time::Duration;

use rustc_hash::FxHashMap as HashMap;

use super::{About, Reason};
use crate::leaks::findings::{Change, Evidence, Flagged};
use crate::leaks::held::HeldFlags;
use crate::leaks::sampler::Sample;
use crate::lineage::graph::NodeId;
use crate::procfs::placement::Placement;
use crate::text::escape_for_terminal;
use kinds::Kind;

mod crowds;
mod kinds;

pub use crowds::{Crowds, Verdict, Watched};

pub const ABOUT: About = About {
    reason: Reason::Accumulating,
    killable: true,
    counts_a_kind: true,
    live: None,
    cleared: |_| FELL_BACK,
    why: |w| {
        let d = w.detail;
        format!(
            "one of {} instances of `{}` alive under gateway {}, older than the newest ({})",
            d.instances.unwrap_or(0),
            escape_for_terminal(d.kind.as_ref().map_or("", |k| &k.pattern).as_bytes()),
            d.lineage.first().copied().unwrap_or(0),
            d.newest.unwrap_or(0),
        )
    },
};

/// The `cleared` event's `because` once its kind's count fell back to `--max-instances`.
pub const FELL_BACK: &str = "no more than --max-instances of its kind alive now";

/// How long an instance must stay one too many of its kind, at the looks that count it, before
/// it is flagged: a pool that replaces each worker as the next one starts is over its limit
/// only for the moment the old worker takes to exit.
pub const CROWD_GRACE: Duration = Duration::from_secs(2);

/// How many kinds the metrics name; the rest are `other` (a metric's labels must stay few).
pub const CENSUS_KINDS: usize = 20;

/// One live instance, as the rule counts it.
#[derive(Clone, Debug)]
pub struct Instance {
    /// Its outermost process.
    pub node: NodeId,
    /// Boot-time ns it started: the order of "newest".
    pub start: u64,
    /// The gateway instance whose descendant it is.
    pub gateway: NodeId,
    pub kind: Rc<Kind>,
}

/// The live instances of one kind under one gateway instance, oldest first.
#[derive(Debug)]
pub struct Group {
    pub gateway: NodeId,
    pub members: Vec<Instance>,
    /// Its command line with the values its instances differ in masked, formed once.
    pattern: String,
}

impl Group {
    /// The group's command line with the values its instances differ in masked.
    pub fn pattern(&self) -> &str {
        &self.pattern
    }

    pub fn kind(&self) -> &Kind {
        &self.members[0].kind
    }

    /// The instances to flag when at most `max` may live: all but the `max` newest.
    pub fn older_than_newest(&self, max: usize) -> &[Instance] {
        &self.members[..self.members.len().saturating_sub(max)]
    }

    pub fn newest(&self) -> &Instance {
        &self.members[self.members.len() - 1]
    }
}

/// The instances grouped by gateway instance and kind, each group oldest first.
#[cfg(test)]
pub fn groups(instances: impl IntoIterator<Item = Instance>) -> Vec<Group> {
    let mut grouping = Grouping::default();
    grouping.add(instances);
    grouping.groups()
}

/// Instances being grouped by gateway instance and kind (each kind's shape hashed), added a
/// slice at a time if the caller wants: what a group's instances agree on is learned as they
/// are added, so that forming the groups at the end is a sort of each (at 10,000 instances of
/// one kind, comparing them there held the reader's thread for half a millisecond more).
#[derive(Default)]
pub struct Grouping(HashMap<(NodeId, Shape), Gathered>);

/// One group's instances as they are added, and the slots of its kind they all agree on
/// with the first (see [`Kind::agree`]).
struct Gathered {
    members: Vec<Instance>,
    agreed: Vec<bool>,
}

impl Grouping {
    pub fn add(&mut self, instances: impl IntoIterator<Item = Instance>) {
        for i in instances {
            let group = self.0.entry((i.gateway, Shape(i.kind.clone())));
            let g = group.or_insert_with(|| Gathered {
                members: Vec::new(),
                agreed: i.kind.agreed(),
            });
            if let Some(first) = g.members.first() {
                first.kind.agree(&i.kind, &mut g.agreed);
            }
            g.members.push(i);
        }
    }

    /// The groups, each oldest first, in a stable order.
    pub fn groups(self) -> Vec<Group> {
        let mut out: Vec<Group> = (self.0)
            .into_iter()
            .map(
                |(
                    (gateway, _),
                    Gathered {
                        mut members,
                        agreed,
                    },
                )| {
                    // (Two instances are never the same process: no order left to keep.)
                    members.sort_unstable_by_key(|i| (i.start, i.node));
                    let pattern = members[0].kind.masked(&agreed);
                    Group {
                        gateway,
                        members,
                        pattern,
                    }
                },
            )
            .collect();
        // A stable order for the stream: by gateway, then by the oldest instance.
        out.sort_by_key(|g| (g.gateway, g.members[0].start, g.members[0].node));
        out
    }
}

/// A kind as a map key: its shape ([`Kind::key`]), not copied out of it.
struct Shape(Rc<Kind>);

impl PartialEq for Shape {
    fn eq(&self, other: &Shape) -> bool {
        self.0.key() == other.0.key()
    }
}

impl Eq for Shape {}

impl std::hash::Hash for Shape {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.key().hash(state);
    }
}

/// The `top` kinds with the most instances under one gateway instance, most first, as
/// (pattern, instances); every other kind counts as `other`, with the most any of them has.
/// One kind under several gateway instances shows its largest group.
pub fn census(groups: &[Group], top: usize) -> Vec<(String, u64)> {
    let mut by_pattern: HashMap<&str, u64> = HashMap::default();
    for g in groups {
        let n = by_pattern.entry(g.pattern()).or_default();
        *n = (*n).max(g.members.len() as u64);
    }
    let mut all: Vec<(String, u64)> = (by_pattern.into_iter())
        .map(|(pattern, n)| (pattern.to_owned(), n))
        .collect();
    all.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    if all.len() > top {
        let rest = all.split_off(top);
        let most = rest.iter().map(|(_, n)| *n).max().unwrap_or(0);
        all.push(("other".to_owned(), most));
    }
    all
}

/// What the count decided, applied to the flags held: a flag cleared, or raised on the sample
/// of the instance's last look (`last`: its pid and that sample; none not looked at yet is
/// raised), with its server (`servers`, each outermost process first) as its evidence.
impl Verdict {
    pub fn apply(
        self,
        held: &mut HeldFlags,
        last: impl Fn(NodeId) -> Option<(u32, Sample)>,
        servers: &[Vec<NodeId>],
        changes: &mut Vec<Change>,
    ) {
        for (id, because) in self.clear {
            if let Some(pid) = held.clear(id, Reason::Accumulating) {
                changes.push(Change::Cleared {
                    pid,
                    reason: Reason::Accumulating,
                    because,
                });
            }
        }
        let server_of: HashMap<NodeId, &Vec<NodeId>> = servers.iter().map(|s| (s[0], s)).collect();
        for (id, since, crowd) in self.raise {
            let Some((pid, sample)) = last(id) else {
                continue;
            };
            if !held.raise(id, pid, Reason::Accumulating, since) {
                continue;
            }
            changes.push(Change::Flag(Box::new(Flagged {
                node: id,
                pid,
                reason: Reason::Accumulating,
                since,
                evidence: Some(Evidence {
                    sample,
                    peers: Vec::new(),
                    server: server_of.get(&id).map_or(vec![id], |s| s.to_vec()),
                    placement: Placement::default(),
                }),
                crowd: Some(crowd),
            })));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::Args;

    fn instance(node: NodeId, start: u64, gateway: NodeId, argv: &[&str]) -> Instance {
        Instance {
            node,
            start,
            gateway,
            kind: Rc::new(Kind::of((*b"/bin/srv").into(), &Args::from_list(argv))),
        }
    }

    #[test]
    fn all_but_the_newest_n_of_a_kind_are_older() {
        let mut all: Vec<Instance> = (1..=5)
            .map(|n| instance(n, 100 - n, 1, &["srv", "--session", &n.to_string()]))
            .collect();
        all.push(instance(9, 1, 1, &["srv", "other"]));
        let groups = groups(all);
        assert_eq!(groups.len(), 2);
        let servers = groups.iter().find(|g| g.members.len() == 5).unwrap();
        let older: Vec<NodeId> = servers
            .older_than_newest(3)
            .iter()
            .map(|i| i.node)
            .collect();
        assert_eq!(
            older,
            [5, 4],
            "started first, flagged; the 3 newest are not"
        );
        assert_eq!(servers.newest().node, 1);
        assert_eq!(servers.pattern(), "srv --session *");
        assert!(servers.older_than_newest(5).is_empty());
    }

    #[test]
    fn the_census_names_the_largest_kinds_and_bounds_the_rest() {
        let mut all = Vec::new();
        for k in 0..5u64 {
            for n in 0..=k {
                all.push(instance(k * 10 + n, n, 1, &["srv", &format!("k{k}")]));
            }
        }
        let census = census(&groups(all), 2);
        assert_eq!(
            census,
            [
                ("srv k4".to_owned(), 5),
                ("srv k3".to_owned(), 4),
                ("other".to_owned(), 3),
            ]
        );
    }

    #[test]
    fn instances_under_two_gateways_are_two_groups() {
        let groups = groups([instance(1, 1, 10, &["srv"]), instance(2, 2, 11, &["srv"])]);
        assert_eq!(groups.len(), 2);
    }
}
