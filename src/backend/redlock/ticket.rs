//! What the backend keeps about one claim between calls, per node and for the quorum.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use crate::backend::handoff::HandoffTicket;
use crate::backend::redis::call::wall_clock_us;
use crate::backend::redis::notify::Subscription;
use crate::backend::Grant;

/// What one claim keeps between calls: its priority, whether it holds a quorum, and per node
/// its subscription while it waits and the pairing of local and server clocks.
#[derive(Default)]
pub struct RedlockTicket {
    pub(super) priority: OnceLock<u64>,
    pub(super) held: AtomicBool,
    pub(super) nodes: OnceLock<Vec<NodeTicket>>,
}

/// What the claim keeps on one node: its subscription while it waits, and the pairing of
/// local and node clocks.
pub(super) type NodeTicket = HandoffTicket<Subscription>;

impl std::fmt::Debug for RedlockTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedlockTicket")
            .field("held", &self.held.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl RedlockTicket {
    pub(super) fn nodes(&self, n: usize) -> &[NodeTicket] {
        self.nodes
            .get_or_init(|| (0..n).map(|_| NodeTicket::default()).collect())
    }

    /// The waiter's place, the same on every node: this machine's clock in µs when it first
    /// asked.
    pub(super) fn priority(&self) -> u64 {
        *self.priority.get_or_init(wall_clock_us)
    }

    pub(super) fn unsubscribe(&self) {
        for node in self.nodes.get().into_iter().flatten() {
            node.set(None);
        }
    }

    pub(super) fn holds(&self, granted: Grant) -> Grant {
        self.held.store(true, Ordering::Release);
        self.unsubscribe();
        granted
    }
}
