//! What the stream says: the wire types of every event, with their evidence and the fields
//! that name a process. Every step builds these and returns them; only [`crate::output`]
//! writes them (NDJSON, readable lines, metrics), and [`crate::report`] reads them back.
pub mod events;
pub mod evidence;
pub mod fields;
pub mod kinds;
mod members;
pub mod reading;

use events::Event;

/// An event and the boot-time ns it stands for: what a step returns for output to write.
/// Boxed: steps return these rarely (an upkeep finding, a gateway found), but an empty
/// `Option<Stamped>` moves on every record.
#[derive(Debug)]
pub struct Stamped {
    pub ts: u64,
    pub event: Box<Event>,
}

impl Stamped {
    pub fn new(ts: u64, event: Event) -> Stamped {
        Stamped {
            ts,
            event: Box::new(event),
        }
    }
}
