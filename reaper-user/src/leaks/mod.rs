//! Leaks: the rules that flag a descendant left behind ([`rules`], one module per reason), the inspector that samples
//! /proc on a cadence a days-long run can afford ([`inspector`]), who holds the other end of a
//! pipe ([`peers`]), and the flags as the evidence a person or a tool acts on ([`flags`]).
pub mod answer;
mod channels;
mod findings;
pub mod flags;
pub mod held;
mod inspector;
mod peers;
pub mod rules;
mod sampler;

pub use findings::*;
pub use inspector::*;
pub use sampler::{FdFact, Sample};
