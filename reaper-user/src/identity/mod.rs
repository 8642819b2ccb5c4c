//! Which process a pid names: see [`ProcessId`] and [`PidRef`].
mod pidfd;

pub use pidfd::PidFd;
