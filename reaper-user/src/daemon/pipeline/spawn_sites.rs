//! The code that spawned each process (`--spawn-stacks`), as the pipeline keeps it: what a
//! record's change means for the spawn sites, the stack copies handed to the unwinding thread
//! and taken back (`daemon/unwinds.rs`), and what naming a spawn needs and names.
use anyhow::Result;

use super::{Pipeline, SpawnedAt, ToName};
use crate::capture::decode::KernelEvent;
use crate::daemon::unwinds::Unwinds;
use crate::lineage::graph::Change;
use crate::sites::{Asked, NamedSites, Naming, SpawnSites};

impl Pipeline {
    /// Names the code that spawned each flagged process (`--spawn-stacks`).
    pub fn name_spawn_sites(&mut self, sites: SpawnSites) {
        self.sites = Some(sites);
    }

    /// Unwinds the sites' stack copies on `unwinds`' thread (see `daemon/unwinds.rs`); those
    /// that came before it wait for it there.
    pub(in crate::daemon) fn unwind_on(&mut self, unwinds: Unwinds) {
        self.unwinds = Some(unwinds);
        self.hand_on_copies();
    }

    /// What a record's change means for spawn sites (see [`SpawnSites::on_change`]):
    /// returns an exec's interpreter; what the operator is to know is written.
    pub(super) fn spawn_sites(
        &mut self,
        change: &Change,
        ev: &mut KernelEvent,
    ) -> Result<Option<String>> {
        let Some(sites) = self.sites.as_mut() else {
            return Ok(None);
        };
        let seen = sites.on_change(&self.graph, change, ev);
        self.tell(&seen.notes)?;
        self.hand_on_copies();
        Ok(seen.interpreter)
    }

    /// Hands the stack copies the sites took on to the unwinding thread; a copy its full
    /// queue refuses is not unwound.
    pub(super) fn hand_on_copies(&mut self) {
        let (Some(sites), Some(unwinds)) = (self.sites.as_mut(), self.unwinds.as_mut()) else {
            return;
        };
        if !sites.has_to_unwind() {
            return;
        }
        for job in sites.take_to_unwind() {
            if let Some(job) = unwinds.hand_on(job) {
                sites.not_handed(job);
            }
        }
    }

    /// Takes what the unwinding thread gave (see [`SpawnSites::take_unwound`]), hands on
    /// what waits for it (hosts to forget come at upkeep, not with a record), and says once
    /// when copies went without it.
    pub fn take_unwound(&mut self) -> Result<()> {
        self.hand_on_copies();
        let (Some(sites), Some(unwinds)) = (self.sites.as_mut(), self.unwinds.as_mut()) else {
            return Ok(());
        };
        for unwound in unwinds.take() {
            sites.take_unwound(unwound);
        }
        let missed = sites.refused();
        if missed > 0 && !self.told_not_unwound {
            self.told_not_unwound = true;
            let note = format!(
                "spawn sites: {missed} jobs of the unwinding thread (stack copies, sites to \
                 locate, a gateway's objects) came faster than it took them and were not done \
                 (its queue was full, or held a JIT host's share): their sites keep their \
                 frame-pointer walk (located at the spawner's next fork from there, named \
                 until then by what needs no reading), a JIT host's children have no frames; \
                 said once"
            );
            self.out.note(&note)?;
        }
        Ok(())
    }

    /// Waits here for the stack copies handed on so far to be unwound (see
    /// `daemon/unwinds.rs`), and takes them: only at the run's end (`--check`'s verdict, the
    /// last checkpoint), when the ring no longer waits on the reader.
    pub fn settle_copies(&mut self) -> Result<()> {
        if let Some(unwinds) = &self.unwinds {
            unwinds.settle_here();
        }
        self.take_unwound()
    }

    /// A wait for the stack copies handed on so far to be unwound (see
    /// `daemon/unwinds.rs`), before a spawn is named; none when nothing is under way.
    pub fn copies_settled(&self) -> Option<impl std::future::Future<Output = ()> + use<>> {
        self.unwinds.as_ref()?.settled()
    }

    /// What naming the frames that spawned each of `pids` needs (see `sites::naming`): none
    /// without `--spawn-stacks`, or when nothing is to be read.
    pub(super) fn spawns_to_name(&mut self, pids: impl IntoIterator<Item = u32>) -> Option<ToName> {
        // A note that cannot be written is the outlet's to report, not the naming's.
        let _ = self.take_unwound();
        let sites = self.sites.as_mut()?;
        let mut naming = Naming::default();
        let asked = pids
            .into_iter()
            .map(|pid| (pid, sites.ask(&self.graph, pid, &mut naming)))
            .collect();
        Some(ToName { naming, asked })
    }

    /// Keeps what naming `to_name` read (none when it could not be read: the frames are
    /// then left out), and gives each pid asked about its frames.
    pub(super) fn spawns_named(
        &mut self,
        asked: Vec<(u32, Asked)>,
        named: Option<NamedSites>,
    ) -> SpawnedAt {
        let (Some(sites), Some(named)) = (self.sites.as_mut(), named) else {
            return SpawnedAt::default();
        };
        let remembered = sites.remember(named);
        asked
            .into_iter()
            .map(|(pid, at)| (pid, remembered.of(at)))
            .collect()
    }

    /// The frames that spawned each of `pids`, named here, on the reader's thread: only at
    /// the run's end (`--check`'s verdict), when the ring no longer waits on it.
    pub(super) fn spawned_at_the_end(&mut self, pids: impl IntoIterator<Item = u32>) -> SpawnedAt {
        let pids: Vec<u32> = pids.into_iter().collect();
        if !pids.is_empty() {
            // A note that cannot be written is the outlet's to report, not the verdict's.
            let _ = self.settle_copies();
        }
        match self.spawns_to_name(pids) {
            Some(ToName { naming, asked }) => self.spawns_named(asked, Some(naming.name())),
            None => SpawnedAt::default(),
        }
    }

    /// Interpreters whose library was not mapped at their exec, looked at again.
    pub fn look_again_for_interpreters(&mut self) -> Result<()> {
        let notes = self.sites.as_mut().map(|s| s.look_again());
        self.tell(&notes.unwrap_or_default())
    }

    /// Learns the objects gateway `pid` runs, so the code of its spawns is named after it
    /// (and every process sharing its code) is gone.
    pub(super) fn learn_gateway_code(&mut self, pid: u32) {
        if let Some(sites) = self.sites.as_mut() {
            sites.gateway_found(pid);
        }
    }

    /// Whether spawns are named (`--spawn-stacks`).
    pub fn names_spawn_sites(&self) -> bool {
        self.sites.is_some()
    }

    /// Interpreters wait to be looked at again (their libpython not mapped at their exec).
    pub fn has_pending_interpreters(&self) -> bool {
        self.sites.as_ref().is_some_and(|s| s.has_pending())
    }
}
