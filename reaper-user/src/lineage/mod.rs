//! The exact spawn-lineage graph of everything under the gateways ([`graph`]), seeded from
//! /proc at start ([`seed`]) and kept exact while tracing: reparented children read back,
//! processes the kernel could not follow watched in /proc, and the graph repaired after a loss
//! ([`upkeep`]).
pub mod graph;
pub mod seed;
pub mod sessions;
pub mod upkeep;
