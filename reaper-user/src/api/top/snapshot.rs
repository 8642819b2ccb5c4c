//! What one refresh of `top` reads of a run over its API: its status and kinds, and at
//! every few refreshes its tree (the gateways' descendants, their memory, the flags) and
//! sessions.
use anyhow::{Result, bail};

use super::{clip, program_by_file_name};
use crate::api::client::get;
use crate::api::{Branch, KindCount, Sessions, Status};
use crate::output::tree::State;
use crate::procfs::facts::read_rss_kib;

/// What one refresh read.
#[derive(Default)]
pub(super) struct Snapshot {
    pub(super) status: Status,
    pub(super) gateways: Vec<GatewayRow>,
    pub(super) kinds: Vec<KindCount>,
    pub(super) flags: Vec<FlagRow>,
    pub(super) sessions: Sessions,
}

/// A gateway as its row shows it.
pub(super) struct GatewayRow {
    pub(super) text: String,
    pub(super) descendants: usize,
    pub(super) rss_kib: u64,
}

/// A flagged process as its row shows it.
pub(super) struct FlagRow {
    pub(super) pid: u32,
    pub(super) text: String,
}

/// The tree (the gateways' descendants and memory, the flags) is read at every this many
/// refreshes, the status and the kinds at each: with 10,000 tracked processes the tree is 3 MB
/// of JSON and 10,000 `statm` files, most of `top`'s CPU.
pub(super) const TREE_EVERY: u64 = 5;

/// Reads the run's status and kinds and, when `whole`, its tree and the memory of each
/// gateway's descendants.
pub(super) async fn snapshot(socket: &std::path::Path, whole: bool) -> Result<Snapshot> {
    let ask = async |path: &str| -> Result<bytes::Bytes> {
        let (status, body) = get(socket, path).await?;
        match status.is_success() {
            true => Ok(body),
            false => bail!("{} answered {status} to {path}", socket.display()),
        }
    };
    let status: Status = serde_json::from_slice(&ask("/v1/status").await?)?;
    let kinds: Vec<KindCount> = serde_json::from_slice(&ask("/v1/kinds").await?)?;
    let (roots, sessions): (Vec<Branch>, Sessions) = match whole {
        true => (
            serde_json::from_slice(&ask("/v1/tree").await?)?,
            serde_json::from_slice(&ask("/v1/sessions").await?)?,
        ),
        false => Default::default(),
    };
    let mut snap = Snapshot {
        status,
        kinds,
        sessions,
        ..Snapshot::default()
    };
    for root in &roots {
        let mut alive = Vec::new();
        walk(root, &mut |b| {
            if b.state != State::Alive {
                return;
            }
            if !b.gateway || !std::ptr::eq(b, root) {
                alive.push(b.pid);
            }
            if !b.flags.is_empty() {
                let flags: Vec<&str> = b.flags.iter().map(|r| r.name()).collect();
                snap.flags.push(FlagRow {
                    pid: b.pid,
                    text: format!(
                        "{:>7} {:<16} {}",
                        b.pid,
                        clip(&b.comm.for_terminal(), 16),
                        flags.join(", ")
                    ),
                });
            }
        });
        if root.gateway {
            snap.gateways.push(GatewayRow {
                text: format!(
                    "{} {}",
                    root.pid,
                    program_by_file_name(&root.argv.for_terminal())
                ),
                descendants: alive.len(),
                rss_kib: alive.iter().filter_map(|&p| read_rss_kib(p)).sum(),
            });
        }
    }
    Ok(snap)
}

fn walk<'a>(b: &'a Branch, visit: &mut impl FnMut(&'a Branch)) {
    visit(b);
    for kid in &b.spawned {
        walk(kid, visit);
    }
}
