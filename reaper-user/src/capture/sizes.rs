//! How big the probes' sized maps are made: from the options, or, for a state kept across runs
//! (`--state-dir`), as its first run made them (a pinned map keeps its size).
use anyhow::Result;
use reaper_common::{SPAWN_STACKS_NATIVE, SPAWN_STACKS_PYTHON, names};

use super::loader::LoadOptions;
use crate::capture::pins::PinDir;

/// Distinct spawn stacks the kernel keeps (each up to 32 frames with their build ids: ~1 KiB,
/// allocated as used).
const STACKS_KEPT: u32 = 16384;
/// Distinct Python stacks the kernel keeps (528 bytes each, allocated as used).
const PY_STACKS_KEPT: u32 = 16384;

/// The capacities of the maps whose size is chosen at load.
pub struct MapSizes {
    pub tracked: u32,
    pub ring_bytes: u32,
    pub stacks: u32,
    pub py_stacks: u32,
}

impl MapSizes {
    /// The sizes the options ask for; a store `--spawn-stacks` does not use holds one entry.
    pub fn asked(opts: &LoadOptions) -> MapSizes {
        let native = opts.spawn_stacks & SPAWN_STACKS_NATIVE != 0;
        let python = opts.spawn_stacks & SPAWN_STACKS_PYTHON != 0;
        MapSizes {
            tracked: opts.max_tracked,
            ring_bytes: opts.ring_bytes,
            stacks: if native { STACKS_KEPT } else { 1 },
            py_stacks: if python { PY_STACKS_KEPT } else { 1 },
        }
    }

    /// Takes the sizes of the maps a kept state pinned; returns a note for each that differs
    /// from what was asked.
    pub fn keep_pinned(&mut self, pins: &PinDir) -> Result<Vec<String>> {
        let mut notes = Vec::new();
        for (name, size, option) in [
            (names::TRACKED, &mut self.tracked, "--max-tracked"),
            (names::EVENTS, &mut self.ring_bytes, "--ring-size"),
            (
                names::STACKS,
                &mut self.stacks,
                "the spawn stacks kept (--spawn-stacks)",
            ),
            (
                names::PY_STACKS,
                &mut self.py_stacks,
                "the Python stacks kept (--spawn-stacks)",
            ),
        ] {
            match pins.capacity(name)? {
                Some(pinned) if pinned != *size => {
                    notes.push(format!(
                        "{option} {size}: the kept state's is {pinned}, made by its first run \
                         (--release-state starts afresh)"
                    ));
                    *size = pinned;
                }
                _ => {}
            }
        }
        Ok(notes)
    }
}
