//! reaper-trace's own exit statuses (documented in the README). With `-- CMD`, a run that ends
//! normally exits with CMD's status instead: its exit code, or 128 + the signal that killed it.

/// A run-time failure: the message says why.
pub const FAILURE: i32 = 1;
/// A bad command line.
pub const USAGE: i32 = 2;
/// `--check`: descendants were left behind.
pub const LEAKED: i32 = 3;
/// `--check`: the command failed, and nothing was left behind.
pub const GATEWAY_FAILED: i32 = 4;
