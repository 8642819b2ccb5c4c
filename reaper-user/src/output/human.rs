//! Events for people: one readable line per event (each kind's is beside its struct, in
//! the words of [`crate::stream::readable`]), and a scan's flags of one kind folded into one.
use crate::stream::events::Event;

mod fold;
pub use fold::human_lines;

/// One line a person reads (see [`Readable`]): every string that came from a process is
/// escaped.
pub fn human_line(ts: u64, ev: &Event) -> String {
    ev.readable(ts)
}
