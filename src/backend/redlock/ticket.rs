//! What the backend keeps about one claim between calls, per node and for the quorum.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex as StdMutex, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::backend::handoff::ServerClock;
use crate::backend::redis::notify::Subscription;
use crate::backend::Grant;
use crate::sync::LockExt;

/// What one claim keeps between calls: its priority, whether it holds a quorum, and per node
/// its subscription while it waits and the pairing of local and server clocks.
#[derive(Default)]
pub struct RedlockTicket {
    pub(super) priority: OnceLock<u64>,
    pub(super) held: AtomicBool,
    pub(super) nodes: OnceLock<Vec<NodeTicket>>,
}

#[derive(Default)]
pub(super) struct NodeTicket {
    pub(super) sub: StdMutex<Option<Subscription>>,
    pub(super) clock: ServerClock,
}

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
        *self.priority.get_or_init(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        })
    }

    pub(super) fn unsubscribe(&self) {
        for node in self.nodes.get().into_iter().flatten() {
            let old = node.sub.locked().take();
            drop(old);
        }
    }

    pub(super) fn holds(&self, granted: Grant) -> Grant {
        self.held.store(true, Ordering::Release);
        self.unsubscribe();
        granted
    }
}
