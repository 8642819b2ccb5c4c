//! Which agent session each process is in, as the pipeline keeps it: the reads it hands to
//! the slow side and the values they found, each written to the stream, and across a
//! restart (`--state-dir`), where the checkpoint's values were read.
use anyhow::Result;

use super::Pipeline;
use crate::lineage::graph::NodeId;
use crate::lineage::sessions::{Read, Sessions, ToRead};
use crate::procfs::boottime_now;
use crate::stream::events::{Event, ProcText, Session};

/// What a checkpoint says its sessions were read from while a restart reads them again.
const REREADING: &str = "read again, under way";

impl Pipeline {
    /// Reads which agent session each process is in (`--session-env` or `--session-cgroup`).
    pub fn read_sessions(&mut self, sessions: Sessions) {
        self.sessions = Some(sessions);
    }

    /// Where this run reads sessions (see `lineage::sessions::Source::describe`).
    fn session_source(&self) -> String {
        (self.sessions.as_ref()).map_or_else(|| "none".into(), |s| s.source().describe())
    }

    /// Where the sessions a checkpoint keeps now were read: this run's source; while a read
    /// [`Pipeline::resume_sessions`] asked for waits, [`REREADING`], which no source is, so
    /// that whatever reads the next run does, it reads them all again (the values kept then
    /// are of two kinds).
    pub fn sessions_kept_as(&mut self) -> String {
        let graph = &self.graph;
        (self.sessions_rereading).retain(|&id| graph.node(id).is_some_and(|n| n.session_pending));
        if self.sessions_rereading.is_empty() {
            self.session_source()
        } else {
            REREADING.into()
        }
    }

    /// Takes back where the sessions of the checkpoint written at boot-time `written` were
    /// read (`saved`; none from a release that did not say: they are kept as they are). Read
    /// elsewhere (other `--session-env` names or order, `--session-cgroup`, `none`), they
    /// are another kind of value: none is kept, each end written at `written` (a `session`
    /// event with an empty value, as for an exec that dropped one), and every live process
    /// is read again. A session that began at a process gone meanwhile cannot be read
    /// again: what it spawned names its own, or none.
    pub fn resume_sessions(&mut self, saved: Option<&str>, written: u64) -> Result<()> {
        if saved.is_none_or(|s| s == self.session_source()) {
            return Ok(());
        }
        for id in self.graph.session_values() {
            if self.graph.set_session(id, None) {
                self.write_session(id, written)?;
            }
        }
        if let Some(sessions) = self.sessions.as_mut() {
            let alive: Vec<NodeId> = self.graph.alive().map(|n| n.id).collect();
            for &id in &alive {
                sessions.note(&mut self.graph, id);
            }
            self.sessions_rereading = alive;
        }
        Ok(())
    }

    /// The environments waiting to be read for their session, for the slow side (gathered
    /// while records `stream`: see [`Sessions::take`]).
    pub fn sessions_to_read(&mut self, stream: bool) -> Result<Option<ToRead>> {
        let Some(sessions) = self.sessions.as_mut() else {
            return Ok(None);
        };
        if let Some(note) = sessions.take_note() {
            self.out.note(&note)?;
        }
        Ok(self.sessions.as_mut().and_then(|s| s.take(stream)))
    }

    /// The sessions the slow side found (`found`: each process and what its environment
    /// names): kept by the graph, and a `session` event written where one begins (or, with
    /// an empty value, where an exec dropped one), with the value the graph kept.
    pub fn sessions_read(&mut self, found: Vec<(NodeId, Read)>) -> Result<()> {
        let now = boottime_now();
        for (id, read) in found {
            let value = match read {
                Read::Names(value) => Some(value),
                Read::NamesNone => None,
                Read::Unknown => {
                    self.graph.session_read_ended(id);
                    continue;
                }
            };
            if self.graph.set_session(id, value.as_deref()) {
                self.write_session(id, now)?;
            }
        }
        Ok(())
    }

    /// A `session` event for process `id`, with the value the graph keeps for it (empty for
    /// none).
    fn write_session(&mut self, id: NodeId, now: u64) -> Result<()> {
        let Some(node) = self.graph.node(id) else {
            return Ok(());
        };
        let kept = node.session.as_deref().unwrap_or_default();
        let event = Event::Session(Session {
            pid: node.pid,
            start: node.start.boottime_ns(),
            session: ProcText::new("session", kept),
        });
        self.out.event(now, event)
    }

    /// The session reads of `ids` were given up (their job was refused, or panicked): each
    /// keeps what an earlier read found.
    pub fn sessions_given_up(&mut self, ids: &[NodeId]) {
        for &id in ids {
            self.graph.session_read_ended(id);
        }
    }
}
