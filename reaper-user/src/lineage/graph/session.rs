//! Which agent session a process belongs to (`--session-env` or `--session-cgroup`), by the
//! lineage. A process's session is the value of the first of the session variables (in their
//! order) that the environment its last exec gave it sets, a value of reaper-trace's own
//! environment apart (with `--session-cgroup`: the cgroup below its gateway's that it runs
//! in); without one of its own (it scrubbed its environment, `env -i`, a wrapper that drops
//! variables) it is its spawner's, however it escaped (`setsid`, a double fork, a reparent),
//! up to its gateway. The graph keeps a value only where a session begins: on a process whose
//! environment names another value than its spawner's session ([`LineageGraph::set_session`]);
//! every other process's is found walking up its spawner edges ([`LineageGraph::session_of`]).
//! A value read from a process's environment is never a guess from /proc: which process is
//! in which session is decided by the exact lineage alone.
//!
//! A value the gateway itself carries is the environment it runs in (a CI runner's
//! `RUNNER_TRACKING_ID`, the agent shell an operator started it from), not a session it
//! started: it is kept on the gateway, and the same value below it begins nothing. A session
//! begins below a gateway, never at it.
//!
//! A session's **owner** is the process whose exit ends it, where one is seen
//! ([`SessionsOf::owner`]). Let `top` be the process where the session begins:
//! - its spawner put the value into its environment and has no session itself (a per-session
//!   process that starts its servers with the value, as claude-code's CLI does): that spawner
//!   owns it, unless it is a gateway. (A launcher that starts a session and goes at once,
//!   `setsid -f env X=.. agent`, is such a spawner too: nothing in the lineage tells it from
//!   a per-session process whose session ended, so its exit ends the session.)
//! - else `top` owns it (a per-session process started with the value in its own environment,
//!   which its servers inherit; or a server that a gateway started with the value: then the
//!   server owns its own session, and no end is seen apart from its own, see `leaks`).
//!
//! A double fork or `( cmd & )` inside a running session ends nothing: the owner is above it.
use std::sync::Arc;

use rustc_hash::FxHashMap as HashMap;

use super::{LineageGraph, Node, NodeId};

/// A session's value, as long as a process's environment may give it; the rest is cut.
pub const SESSION_MAX: usize = 256;

/// `value` cut at [`SESSION_MAX`] bytes; at the start of the character the cut falls in, so
/// that a UTF-8 value stays UTF-8 (one that is not is cut at the byte).
pub fn cut_session(value: &[u8]) -> &[u8] {
    if value.len() <= SESSION_MAX {
        return value;
    }
    let cut = &value[..SESSION_MAX];
    match std::str::from_utf8(cut) {
        // Only the last character is incomplete: it goes.
        Err(e) if e.error_len().is_none() => &cut[..e.valid_up_to()],
        _ => cut,
    }
}

/// A session's value as a request names it: `session` when it is UTF-8, else `session_b64`.
pub fn name_session(value: &[u8]) -> (Option<String>, Option<String>) {
    match std::str::from_utf8(value) {
        Ok(text) => (Some(text.to_owned()), None),
        Err(_) => (None, crate::text::exact_b64(value)),
    }
}

/// The session a request names by `text` or by `b64`, as bytes cut as the run cuts a
/// session's value (a value given whole names the session it begins); an error for both, or
/// for base64 that is not.
pub fn session_value(text: Option<&str>, b64: Option<&str>) -> Result<Option<Vec<u8>>, String> {
    use base64::Engine as _;
    let value = match (text, b64) {
        (Some(_), Some(_)) => return Err("name the session once: session or session_b64".into()),
        (Some(text), None) => text.as_bytes().to_vec(),
        (None, Some(b64)) => base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|e| format!("session_b64 is not base64: {e}"))?,
        (None, None) => return Ok(None),
    };
    Ok(Some(cut_session(&value).to_vec()))
}

/// The session a process is in: its value, and the process where it begins.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionOf {
    pub value: Arc<[u8]>,
    /// The process where it begins (the nearest on the spawn chain, itself included, whose
    /// environment names it).
    pub top: NodeId,
}

impl LineageGraph {
    /// Process `id`'s environment names session `value` (cut at [`SESSION_MAX`]), or none
    /// (`None`: an exec dropped the variable). A value is kept where it begins a session:
    /// when it is neither the session `id`'s spawner is in nor its gateway's own (a session
    /// inside another begins too). A gateway keeps its own, which begins nothing. Returns
    /// whether what `id` keeps changed (to write it in the stream: a gateway's too, so that
    /// a replay knows it as the live graph does).
    pub fn set_session(&mut self, id: NodeId, value: Option<&[u8]>) -> bool {
        self.session_read_ended(id);
        let Some(node) = self.nodes.get(id) else {
            return false;
        };
        let value = value.map(cut_session);
        let is_gateway = node.is_gateway;
        let begins = match (value, node.spawner) {
            (Some(v), _) if is_gateway => Some(v),
            (Some(v), Some(spawner)) => {
                let inherited = self.session_of(spawner);
                let ambient = self.ambient_of(spawner);
                let same = |s: &[u8]| s == v;
                let begins = !inherited.is_some_and(|s| same(&s.value))
                    && !ambient.as_deref().is_some_and(same);
                begins.then_some(v)
            }
            (v, _) => v,
        };
        let node = self.nodes.get_mut(id).expect("looked up above");
        if node.session.as_deref() == begins {
            return false;
        }
        let had = node.session.is_some();
        node.session = begins.map(Into::into);
        self.session_values =
            self.session_values + usize::from(begins.is_some()) - usize::from(had);
        true
    }

    /// Process `id`'s environment is to be read for its session: until it is
    /// ([`LineageGraph::set_session`]), what its chain's sessions are is not known.
    pub fn session_asked(&mut self, id: NodeId) {
        if let Some(node) = self.nodes.get_mut(id)
            && !node.session_pending
        {
            node.session_pending = true;
            self.sessions_pending += 1;
        }
    }

    /// The read of process `id`'s environment ended, whatever it found (a read given up
    /// included: its process keeps what an earlier read found).
    pub fn session_read_ended(&mut self, id: NodeId) {
        if let Some(node) = self.nodes.get_mut(id)
            && node.session_pending
        {
            node.session_pending = false;
            self.sessions_pending -= 1;
        }
    }

    /// Whether the session process `id` is in may not be known yet: its environment, or that
    /// of a process on its spawn chain (to its gateway), waits to be read. A rule that judges
    /// by the session waits (a session's value read after the break it would have covered).
    pub fn session_unsettled(&self, id: NodeId) -> bool {
        if self.sessions_pending == 0 {
            return false;
        }
        let Some(mut at) = self.nodes.get(id) else {
            return false;
        };
        for _ in 0..=self.nodes.len() {
            if at.session_pending {
                return true;
            }
            if at.is_gateway {
                return false;
            }
            match at.spawner.and_then(|s| self.nodes.get(s)) {
                Some(spawner) => at = spawner,
                None => return false,
            }
        }
        false
    }

    /// The session process `id` is in: its own, or the nearest one up its spawn chain (to
    /// its gateway, excluded, whose own value begins nothing). It begins at the highest
    /// process of the chain that names that value with no other value between (a value read
    /// late, after a child's, is the same session as the child's).
    pub fn session_of(&self, id: NodeId) -> Option<SessionOf> {
        // Asked once (an exec's read, on the reader's thread): nothing to remember.
        let mut once = self.sessions_of();
        once.remember = false;
        once.of(id)
    }

    /// The value the gateway above `id` (or `id`, a gateway) carries itself: its
    /// environment's, not a session.
    fn ambient_of(&self, id: NodeId) -> Option<Arc<[u8]>> {
        self.gateway_of(id)?.session.clone()
    }

    /// [`Self::session_of`] for many processes (an answer about all of them): each spawn
    /// chain is walked once, what a walk found kept for the processes above.
    pub fn sessions_of(&self) -> SessionsOf<'_> {
        SessionsOf {
            graph: self,
            known: HashMap::default(),
            remember: true,
            path: Vec::new(),
        }
    }
}

/// The sessions of many processes of one graph, as [`LineageGraph::session_of`] gives them,
/// each spawn chain walked once (see [`LineageGraph::sessions_of`]).
pub struct SessionsOf<'g> {
    graph: &'g LineageGraph,
    /// Each process walked: its session, and its gateway's own value (the ambient one, which
    /// begins nothing).
    known: HashMap<NodeId, Known>,
    /// Whether a walk's processes are kept in `known` (not for one question alone).
    remember: bool,
    /// The walk under way, from the process asked about up.
    path: Vec<NodeId>,
}

/// What a walk found of one process.
#[derive(Clone, Default)]
struct Known {
    session: Option<SessionOf>,
    ambient: Option<Arc<[u8]>>,
}

impl<'g> SessionsOf<'g> {
    /// The session process `id` is in (as [`LineageGraph::session_of`]). A process's session
    /// is its spawner's, but where it names a value of its own: then it is its spawner's if
    /// that is the same value (the session begins higher), else one that begins at it.
    pub fn of(&mut self, id: NodeId) -> Option<SessionOf> {
        let graph = self.graph;
        if graph.session_values == 0 {
            return None;
        }
        // Up to a process known, a gateway (in no session: its value is the ambient one
        // below it) or the top of the known lineage. Bounded like `chain`: a malformed
        // cycle must not hang a walk.
        self.path.clear();
        let mut above = Known::default();
        let mut at = graph.nodes.get(id)?;
        for _ in 0..=graph.nodes.len() {
            if let Some(known) = self.known.get(&at.id) {
                above = known.clone();
                break;
            }
            if at.is_gateway {
                above.ambient = at.session.clone();
                if self.remember {
                    self.known.insert(at.id, above.clone());
                }
                break;
            }
            self.path.push(at.id);
            match at.spawner.and_then(|s| graph.nodes.get(s)) {
                Some(spawner) => at = spawner,
                None => break,
            }
        }
        // Then down again, each process's session from its spawner's.
        while let Some(id) = self.path.pop() {
            let own = graph.nodes.get(id).and_then(|n| n.session.as_ref());
            let own = own.filter(|v| Some(*v) != above.ambient.as_ref());
            if let Some(value) = own
                && above.session.as_ref().is_none_or(|s| s.value != *value)
            {
                above.session = Some(SessionOf {
                    value: value.clone(),
                    top: id,
                });
            }
            if self.remember {
                self.known.insert(id, above.clone());
            }
        }
        above.session
    }

    /// The process whose exit ends the session `session` (see the module documentation).
    pub fn owner(&mut self, session: &SessionOf) -> Option<&'g Node> {
        let graph = self.graph;
        let top = graph.nodes.get(session.top)?;
        let spawner = top
            .spawner
            .filter(|_| !top.is_gateway)
            .and_then(|s| graph.nodes.get(s));
        match spawner {
            Some(p) if !p.is_gateway && self.of(p.id).is_none() => Some(p),
            _ => Some(top),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::decode::What;
    use crate::lineage::graph::testing::{fork, gateway, record};

    const GW: u32 = 100;

    /// The node of live pid `pid`.
    fn id(g: &LineageGraph, pid: u32) -> NodeId {
        g.current(pid).unwrap().id
    }

    /// A gateway (100) and processes forked by `(pid, spawner)`, in order.
    fn tree(forks: &[(u32, u32)]) -> LineageGraph {
        let mut g = LineageGraph::new(100);
        g.add_seed(gateway(GW));
        for (at, &(pid, spawner)) in forks.iter().enumerate() {
            record(
                &mut g,
                at as u64 + 1,
                (pid, 5_000 + u64::from(pid)),
                fork(spawner),
            );
        }
        g
    }

    /// Gives the node `id` the value `value` of its environment.
    trait SetTo {
        fn set_session_to(&mut self, id: NodeId, value: &[u8]) -> bool;
    }

    impl SetTo for LineageGraph {
        fn set_session_to(&mut self, id: NodeId, value: &[u8]) -> bool {
            self.set_session(id, Some(value))
        }
    }

    fn session(g: &LineageGraph, pid: u32) -> Option<String> {
        let s = g.session_of(id(g, pid))?;
        Some(String::from_utf8_lossy(&s.value).into_owned())
    }

    fn owner(g: &LineageGraph, pid: u32) -> Option<u32> {
        let mut sessions = g.sessions_of();
        let s = sessions.of(id(g, pid))?;
        sessions.owner(&s).map(|n| n.pid)
    }

    #[test]
    fn a_process_without_a_value_of_its_own_is_in_its_spawners_session_however_it_escaped() {
        // 200 names A; 201 (its child, scrubbed: env -i) and 202 (a double fork's grandchild,
        // reparented to init) name nothing: both are in A, by the lineage.
        let mut g = tree(&[(200, GW), (201, 200), (202, 201)]);
        assert!(g.set_session_to(id(&g, 200), b"A"));
        record(&mut g, 10, (201, 5_201), What::Exit { status: 0 });
        g.reparent(id(&g, 202), 1);
        assert_eq!(session(&g, 201).as_deref(), Some("A"));
        assert_eq!(session(&g, 202).as_deref(), Some("A"));
        assert_eq!(session(&g, GW), None, "the gateway's is its own");
        assert!(
            !g.set_session_to(id(&g, 202), b"A"),
            "the same value begins nothing"
        );
    }

    #[test]
    fn a_process_naming_another_value_begins_a_session_inside_the_first() {
        let mut g = tree(&[(200, GW), (201, 200), (202, 201)]);
        g.set_session_to(id(&g, 200), b"A");
        assert!(g.set_session_to(id(&g, 201), b"B"));
        assert_eq!(session(&g, 202).as_deref(), Some("B"));
        assert_eq!(session(&g, 200).as_deref(), Some("A"));
    }

    #[test]
    fn the_owner_is_the_per_session_process_above_the_servers_or_the_server_itself() {
        // (a) 200, a per-session process without a value, starts 201 and 202 with A: 200
        // owns A. (b) 300 is started with B and its server 301 inherits: 300 owns B. (c) the
        // gateway starts 400 with C: 400 owns C itself.
        let mut g = tree(&[
            (200, GW),
            (201, 200),
            (202, 200),
            (300, GW),
            (301, 300),
            (400, GW),
        ]);
        g.set_session_to(id(&g, 201), b"A");
        g.set_session_to(id(&g, 202), b"A");
        g.set_session_to(id(&g, 300), b"B");
        g.set_session_to(id(&g, 400), b"C");
        assert_eq!(owner(&g, 201), Some(200));
        assert_eq!(owner(&g, 202), Some(200));
        assert_eq!(owner(&g, 301), Some(300));
        assert_eq!(owner(&g, 400), Some(400));
        assert_eq!(owner(&g, 200), None, "200 is in no session");
    }

    #[test]
    fn many_asked_at_once_are_each_in_the_session_one_asked_alone_is_in() {
        // The gateway carries X; 200 (X: ambient) > 201 (A) > 202 (-) > 203 (A) > 204 (B)
        // > 205 (-); 300 (-) > 301 (C); 400 (A) beside them. Asked bottom up, top down and
        // alone, each process is in the same session.
        let mut g = tree(&[
            (200, GW),
            (201, 200),
            (202, 201),
            (203, 202),
            (204, 203),
            (205, 204),
            (300, GW),
            (301, 300),
            (400, GW),
        ]);
        for (pid, value) in [
            (GW, &b"X"[..]),
            (200, b"X"),
            (201, b"A"),
            (203, b"A"),
            (204, b"B"),
            (301, b"C"),
            (400, b"A"),
        ] {
            g.set_session_to(id(&g, pid), value);
        }
        let pids = [GW, 200, 201, 202, 203, 204, 205, 300, 301, 400];
        let alone: Vec<_> = pids.iter().map(|&p| g.session_of(id(&g, p))).collect();
        let tops: Vec<_> = (alone.iter())
            .map(|s| s.as_ref().map(|s| g.node(s.top).unwrap().pid))
            .collect();
        let (a, b, c) = (Some(201), Some(204), Some(301));
        assert_eq!(
            tops,
            [None, None, a, a, a, b, b, None, c, Some(400)],
            "A begins at 201 (203's is the same), B at 204"
        );
        for order in [pids.to_vec(), pids.iter().rev().copied().collect()] {
            let mut at_once = g.sessions_of();
            for pid in order {
                let i = pids.iter().position(|&p| p == pid).unwrap();
                assert_eq!(at_once.of(id(&g, pid)), alone[i], "pid {pid}");
            }
        }
    }

    #[test]
    fn a_value_read_after_a_childs_is_still_the_session_its_child_is_in() {
        // 300 is started with B, its server 301 too; 301's environment is read first.
        let mut g = tree(&[(300, GW), (301, 300)]);
        assert!(g.set_session_to(id(&g, 301), b"B"));
        assert!(g.set_session_to(id(&g, 300), b"B"));
        let s = g.session_of(id(&g, 301)).unwrap();
        assert_eq!(s.top, id(&g, 300));
        assert_eq!(owner(&g, 301), Some(300));
    }

    #[test]
    fn the_gateways_own_value_is_its_environment_and_begins_nothing() {
        // The gateway runs with X (a CI job's id): 200 inherits X and begins nothing, so the
        // chain rule judges it; 201 names Y, a session of its own, below the gateway.
        let mut g = tree(&[(200, GW), (201, GW), (202, 201)]);
        assert!(
            g.set_session_to(id(&g, GW), b"X"),
            "written: a replay keeps it as the run does"
        );
        assert!(!g.set_session_to(id(&g, 200), b"X"));
        assert_eq!(session(&g, 200), None);
        assert_eq!(session(&g, GW), None);
        assert!(g.set_session_to(id(&g, 201), b"Y"));
        assert_eq!(session(&g, 202).as_deref(), Some("Y"));
        assert_eq!(owner(&g, 202), Some(201));
        // Read in the other order (the child's environment first): the same answer.
        let mut g = tree(&[(200, GW)]);
        g.set_session_to(id(&g, 200), b"X");
        g.set_session_to(id(&g, GW), b"X");
        assert_eq!(session(&g, 200), None);
    }

    #[test]
    fn an_exec_that_drops_the_value_ends_the_session_beginning_there() {
        let mut g = tree(&[(200, GW), (201, 200)]);
        assert!(g.set_session_to(id(&g, 200), b"A"));
        assert!(!g.set_session_to(id(&g, 200), b"A"), "unchanged");
        assert!(g.set_session(id(&g, 200), None));
        assert_eq!(session(&g, 201), None);
        assert!(!g.set_session(id(&g, 200), None));
    }

    #[test]
    fn a_chain_whose_environment_waits_to_be_read_is_not_settled() {
        // 201 (a server of 200's session) is read before 200: until 200's read ends, what
        // session 201 is in is not known.
        let mut g = tree(&[(200, GW), (201, 200), (300, GW)]);
        g.session_asked(id(&g, 200));
        g.session_asked(id(&g, 201));
        g.set_session_to(id(&g, 201), b"A");
        assert!(g.session_unsettled(id(&g, 201)));
        assert!(!g.session_unsettled(id(&g, 300)), "another chain");
        g.set_session_to(id(&g, 200), b"A");
        assert!(!g.session_unsettled(id(&g, 201)));
        assert_eq!(owner(&g, 201), Some(200));
        // A read given up settles it as well.
        g.session_asked(id(&g, 300));
        g.session_read_ended(id(&g, 300));
        assert!(!g.session_unsettled(id(&g, 300)));
    }

    #[test]
    fn a_value_is_cut_at_its_cap() {
        let mut g = tree(&[(200, GW)]);
        g.set_session_to(id(&g, 200), &[b'x'; 100 * 1024]);
        assert_eq!(g.session_of(id(&g, 200)).unwrap().value.len(), SESSION_MAX);
    }

    #[test]
    fn a_utf8_value_is_cut_at_a_characters_start_and_other_bytes_at_the_byte() {
        // "é" is two bytes: the 256th byte would be the first half of one.
        let mut utf8 = vec![b'x'; SESSION_MAX - 1];
        utf8.extend("éé".as_bytes());
        assert_eq!(cut_session(&utf8), &utf8[..SESSION_MAX - 1]);
        let bytes = [0xff; SESSION_MAX + 10];
        assert_eq!(cut_session(&bytes).len(), SESSION_MAX);
        // Short values are kept whole, an incomplete last character included.
        assert_eq!(cut_session(b"bad\xe2\x82"), b"bad\xe2\x82");
    }
}
