//! What the backend keeps about one claim between calls.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex as StdMutex, OnceLock};
use std::time::Duration;

use super::notify::{Holding, Subscription};
use super::{Counter, Keys};
use crate::backend::handoff::HandoffTicket;
use crate::backend::Claim;
use crate::sync::LockExt;

/// What one claim keeps between calls: its keys' names, and what it keeps to hear of a
/// handoff (its subscription while it waits, and the pairing of local and server clocks from
/// its last request, to place a handoff on the local clock).
#[derive(Default)]
pub struct RedisTicket {
    keys: OnceLock<Keys>,
    pub(super) handoff: HandoffTicket<Subscription>,
    /// The pause before the next try after a subscription failed on a claim that found the
    /// lock busy (doubling while it keeps failing; reset once subscribed).
    sub_pause: StdMutex<Option<Duration>>,
    /// Set while the claim holds the lock.
    holding: StdMutex<Option<Holding>>,
    /// Set by the claim's first acquire call.
    called: AtomicBool,
}

impl std::fmt::Debug for RedisTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTicket").finish_non_exhaustive()
    }
}

impl RedisTicket {
    /// The claim's keys and owner token, named at its first call (a ticket serves one claim).
    pub(super) fn keys(&self, claim: &Claim, client_id: &str, counter: Counter) -> &Keys {
        self.keys
            .get_or_init(|| Keys::new(claim, client_id, counter))
    }

    /// Whether this is the claim's first acquire call (it may go by plain commands, see
    /// `fast.rs`; later ones keep or settle what the first left).
    pub(super) fn first_call(&self) -> bool {
        !self.called.swap(true, Ordering::Relaxed)
    }

    /// Marks the claim as holding (`Some`) or not (`None`).
    pub(super) fn set_holding(&self, mark: Option<Holding>) {
        let old = std::mem::replace(&mut *self.holding.locked(), mark);
        drop(old);
    }

    /// The next pause after a failed subscription: 50 ms, doubling up to 2 s.
    pub(super) fn sub_failed(&self) -> Duration {
        let mut pause = self.sub_pause.locked();
        let next = pause.map_or(Duration::from_millis(50), |p| {
            (p * 2).min(Duration::from_secs(2))
        });
        *pause = Some(next);
        next
    }

    /// Subscribes the claim, which ends the pauses after failed subscriptions.
    pub(super) fn subscribed(&self, sub: Subscription) {
        *self.sub_pause.locked() = None;
        self.handoff.set(Some(sub));
    }
}
