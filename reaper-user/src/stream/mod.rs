//! What the stream says: the wire types of every event, with their evidence and the fields
//! that name a process, and of the API's answer about a process ([`answer`]). Every step builds these and returns them; only [`crate::output`]
//! writes them (NDJSON, readable lines, metrics), and [`crate::report`] reads them back.
pub mod answer;
pub mod events;
pub mod evidence;
pub mod fields;
pub mod kinds;
pub mod label;
mod members;
pub mod readable;
pub mod reading;
pub mod reason;
pub mod words;

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
