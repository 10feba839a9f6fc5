//! What one claim remembers between calls, and where its nodes live.

use std::sync::Mutex as StdMutex;

use super::client::{Failure, NodeStat, Watch};
use super::recipe;
use crate::backend::{Claim, LockKind};
use crate::error::{Error, ErrorKind, Result};
use crate::sync::LockExt;

/// Either a result, or "go round the acquire loop again" (with the failure that caused it).
pub(super) enum Step<T> {
    Ready(T),
    Again(Option<Failure>),
}

/// A node of ours once created.
#[derive(Debug, Clone)]
pub(super) struct Node {
    pub(super) name: String,
    pub(super) path: String,
    pub(super) stat: NodeStat,
    /// The hub epoch it was created in.
    pub(super) epoch: u64,
}

impl Node {
    pub(super) fn new(path: String, stat: NodeStat, epoch: u64) -> Self {
        let name = path.rsplit('/').next().unwrap_or_default().to_owned();
        Self {
            name,
            path,
            stat,
            epoch,
        }
    }
}

/// What one claim keeps between calls: its queue node (the lock node, or a semaphore's
/// admission node), or the protection prefix of a create whose reply was lost; a semaphore's
/// lease nodes; the watch it waits on.
#[derive(Default)]
pub struct ZkTicket {
    state: StdMutex<TicketState>,
}

#[derive(Default)]
pub(super) struct TicketState {
    /// The UUID in our queue node's name; a new one after a session change.
    pub(super) uuid: Option<String>,
    pub(super) node: Option<Node>,
    /// A create was sent and its outcome is unknown (in this epoch).
    pub(super) unsure: Option<u64>,
    pub(super) waiting: Option<Waiting>,
    pub(super) granted: bool,
    /// Counted in [`Parents`](super::parents::Parents) (released once).
    pub(super) entered: bool,
    /// A downgrade's read node, from before its create is sent until it replaces the write
    /// node: a cancelled downgrade leaves nothing behind.
    pub(super) downgrade: Option<String>,
    pub(super) leases: Leases,
    /// The node (its path) whose claim found the key free of other families. Checked once a
    /// node: an ask of another family made after it sees it and is refused, so a node of a
    /// refused ask, gone a moment later, must not turn the claim away on a later look.
    pub(super) family_checked: Option<String>,
}

/// A semaphore claim's second stage, after its admission node reached the head.
#[derive(Default)]
pub(super) struct Leases {
    /// The UUID in our lease nodes' names (one `multi` makes them all).
    pub(super) uuid: Option<String>,
    pub(super) nodes: Vec<Node>,
    /// A lease create was sent and its outcome is unknown (in this epoch).
    pub(super) unsure: Option<u64>,
    /// The epoch our admission node was seen at the head in.
    pub(super) admitted: Option<u64>,
}

pub(super) struct Waiting {
    pub(super) fired: Watch,
    /// The deletion of the watched node alone makes us the holder (or, for a semaphore, the
    /// head of the admission queue).
    pub(super) granted_when_gone: bool,
    /// The watched node's name, and a watch on the node just ahead of it
    /// ([`recipe::ahead_of`]), if any.
    pub(super) predecessor: String,
    pub(super) ahead: Option<Watch>,
    /// The hub's change count before the call that set the watch.
    pub(super) seen: u64,
}

impl std::fmt::Debug for ZkTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.lock();
        f.debug_struct("ZkTicket")
            .field("node", &s.node.as_ref().map(|n| &n.path))
            .field(
                "leases",
                &s.leases.nodes.iter().map(|n| &n.path).collect::<Vec<_>>(),
            )
            .field("granted", &s.granted)
            .finish_non_exhaustive()
    }
}

impl ZkTicket {
    /// Whether the claim has a node in a queue, or a create whose outcome is unknown.
    pub(super) fn has_queued(&self) -> bool {
        let t = self.lock();
        t.node.is_some()
            || t.unsure.is_some()
            || !t.leases.nodes.is_empty()
            || t.leases.unsure.is_some()
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, TicketState> {
        self.state.locked()
    }
}

impl TicketState {
    /// The nodes whose existence is the grant: a semaphore's leases, or the lock node.
    pub(super) fn carriers(&self) -> Vec<Node> {
        if self.leases.nodes.is_empty() {
            self.node.iter().cloned().collect()
        } else {
            self.leases.nodes.clone()
        }
    }
}

/// The lock's node, `/<namespace>/<key>`: Curator's lock path.
pub(super) fn lock_path(claim: &Claim) -> String {
    format!("/{}/{}", claim.namespace(), claim.key())
}

/// Where the claim queues: the lock node itself, or a semaphore's admission node.
pub(super) fn queue_path(claim: &Claim) -> String {
    match claim.kind() {
        LockKind::Permits { .. } => format!("{}/{}", lock_path(claim), recipe::ADMISSION),
        _ => lock_path(claim),
    }
}

/// A semaphore's lease node.
pub(super) fn leases_path(claim: &Claim) -> String {
    format!("{}/{}", lock_path(claim), recipe::LEASES)
}

/// The parents the claim's nodes live under.
pub(super) fn parent_paths(claim: &Claim) -> Vec<String> {
    match claim.kind() {
        LockKind::Permits { .. } => vec![queue_path(claim), leases_path(claim)],
        _ => vec![lock_path(claim)],
    }
}

/// The fencing token a node carries: the zxid that created it.
pub(super) fn fence(stat: &NodeStat) -> Result<u64> {
    u64::try_from(stat.czxid).map_err(|_| {
        Error::new(
            ErrorKind::Backend,
            format!("zookeeper returned an invalid czxid {}", stat.czxid),
        )
    })
}
