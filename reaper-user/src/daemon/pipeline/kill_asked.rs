//! A kill asked for through the API (`POST /v1/kill`, `reaper-trace kill`): the processes a
//! request picks, ended through the kill protocol (`kill::Killer::asked`), each step written
//! to the stream with who asked.
use rustc_hash::FxHashSet as HashSet;

use super::Pipeline;
use crate::api::{AskedBy, KillAnswer, KillRequest, KillStep};
use crate::leaks::Reason;
use crate::lineage::graph::NodeId;
use crate::procfs::boottime_now;
use crate::text::lossy;

impl Pipeline {
    /// Ends what `request` picks, for `asked_by` (root: the server checked). The answer says
    /// what was started and what refused, or why nothing was done (`refused`).
    pub fn kill_asked(&mut self, request: &KillRequest, asked_by: AskedBy) -> KillAnswer {
        let mut answer = KillAnswer {
            now: boottime_now(),
            dry_run: request.dry_run || self.killer.dry_run(),
            ..KillAnswer::default()
        };
        let picked = match self.picked(request, &mut answer.steps) {
            Ok(picked) => picked,
            Err(why) => {
                answer.refused = Some(why);
                return answer;
            }
        };
        let held = self.inspector.held();
        let reason_of = |id: NodeId| held.of(id).first().map(|h| h.reason);
        let started = self
            .killer
            .asked(&self.graph, &picked, reason_of, asked_by, request.dry_run);
        for r in started.refused {
            answer.steps.push(KillStep {
                pid: r.pid,
                comm: lossy(r.comm.as_bytes()).into_owned(),
                result: r.result.name().into(),
            });
            // A line that cannot be written is the outlet's failure, which ends the run at
            // its next write; the answer stands.
            let _ = self.report_kill(r);
        }
        answer
            .steps
            .extend(started.signalled.iter().map(|(pid, comm)| KillStep {
                pid: *pid,
                comm: lossy(comm.as_bytes()).into_owned(),
                result: "signalled".into(),
            }));
        answer
    }

    /// The live processes `request` picks, outermost only (one picked below another is
    /// killed with it); a pid that is not one is said in `steps`. An error: the request
    /// picks nothing this run could know (no selector, an unknown reason or gateway).
    fn picked(
        &self,
        request: &KillRequest,
        steps: &mut Vec<KillStep>,
    ) -> Result<Vec<NodeId>, String> {
        let pids = request.pid_list()?;
        let (session, reason) = (request.session_value()?, request.reason);
        if pids.is_empty() && session.is_none() && reason.is_none() {
            return Err("nothing named: give pids, a session or a reason".into());
        }
        if reason == Some(Reason::Other) {
            let names = Reason::ALL.map(Reason::name).join(", ");
            return Err(format!("an unknown reason (use {names})"));
        }
        if request.gateway.is_some() && session.is_none() && reason.is_none() {
            return Err("a gateway narrows a session or a reason, not pids".into());
        }
        let under = match request.gateway {
            Some(pid) => Some(
                self.graph
                    .current(pid)
                    .map(|n| n.id)
                    .ok_or_else(|| format!("pid {pid} is not tracked by this run"))?,
            ),
            None => None,
        };
        let graph = &self.graph;
        let in_scope = |id: NodeId| under.is_none_or(|g| graph.descends_from(id, g));
        let mut picked = Vec::new();
        for pid in pids {
            let (id, result) = match graph.current(pid) {
                Some(n) if n.alive() => (Some(n.id), ""),
                Some(_) => (None, "not_alive"),
                None => (None, "not_tracked"),
            };
            match id {
                Some(id) => picked.push(id),
                None => steps.push(KillStep {
                    pid,
                    comm: String::new(),
                    result: result.into(),
                }),
            }
        }
        if let Some(value) = &session {
            let mut sessions = graph.sessions_of();
            for node in graph.alive().filter(|n| in_scope(n.id)) {
                let Some(session) = sessions.of(node.id) else {
                    continue;
                };
                // Its owner only by its pid: a session's end is its owner's to make.
                let owner = sessions.owner(&session).is_some_and(|o| o.id == node.id);
                if *session.value == *value && !owner {
                    picked.push(node.id);
                }
            }
        }
        if let Some(reason) = reason {
            let flagged = self.inspector.active().filter(|&(_, r, _)| r == reason);
            picked.extend(flagged.map(|(id, _, _)| id).filter(|&id| in_scope(id)));
        }
        let set: HashSet<NodeId> = picked.iter().copied().collect();
        let above = |id: NodeId| {
            graph
                .chain(id)
                .iter()
                .rev()
                .skip(1)
                .any(|a| set.contains(&a.id))
        };
        let mut outermost: Vec<NodeId> = set.iter().copied().filter(|&id| !above(id)).collect();
        outermost.sort_unstable();
        Ok(outermost)
    }
}
