//! One module per kernel event. Each entry point is a thin wrapper around plain functions.
mod exec;
mod exit;
mod fork;
mod free;
mod gateway;
mod setsid;
