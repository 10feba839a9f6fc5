//! What a claim keeps to hear of a handoff: its hub's registration while it waits, and the
//! pairing of its clock with the server's.

use std::sync::{Arc, Mutex as StdMutex};

use super::{Mailbox, ServerClock};
use crate::sync::LockExt;

/// A claim's registration with a notification hub (a pub/sub subscription, a LISTEN
/// registration): it holds the claim's mailbox, and dropping it unregisters the claim.
pub(crate) trait Listening {
    /// Where the hub puts the claim's wake-ups.
    fn mailbox(&self) -> &Arc<Mailbox>;
}

/// What one claim keeps, on one server, to hear of a handoff: its registration `L` while it
/// waits, and the pairing of local and server clocks from its last request, to place a
/// handoff on the local clock.
pub(crate) struct HandoffTicket<L> {
    listening: StdMutex<Option<L>>,
    pub(crate) clock: ServerClock,
}

impl<L> Default for HandoffTicket<L> {
    fn default() -> Self {
        Self {
            listening: StdMutex::new(None),
            clock: ServerClock::default(),
        }
    }
}

impl<L: Listening> HandoffTicket<L> {
    /// Whether the claim is registered.
    pub(crate) fn is_listening(&self) -> bool {
        self.listening.locked().is_some()
    }

    /// Registers the claim (`Some`) or unregisters it (`None`).
    pub(crate) fn set(&self, listening: Option<L>) {
        // Dropped outside the lock: dropping unregisters from the hub.
        let old = std::mem::replace(&mut *self.listening.locked(), listening);
        drop(old);
    }

    /// The claim's mailbox while it is registered.
    pub(crate) fn mailbox(&self) -> Option<Arc<Mailbox>> {
        self.listening
            .locked()
            .as_ref()
            .map(|l| l.mailbox().clone())
    }
}
