//! [`Backend::acquire`](crate::backend::Backend::acquire) for a backend whose waiters hear of
//! handoffs by message: a waiting claim listens before it queues, and stops once granted.

use std::future::Future;

use crate::backend::{Attempt, Claim};
use crate::error::Result;

/// One claim as [`acquire`] asks for it: the backend `B`, the claim, its ticket `T`, and its
/// names on the server `N` (its keys; `()` where the backend works them out per call). Each
/// backend implements [`Listener`] for its own.
pub(crate) struct Asking<'a, B, T, N> {
    pub(crate) backend: &'a B,
    pub(crate) claim: &'a Claim,
    pub(crate) ticket: &'a T,
    pub(crate) names: &'a N,
}

impl<B, T, N> Clone for Asking<'_, B, T, N> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B, T, N> Copy for Asking<'_, B, T, N> {}

/// How a backend that hands locks on by message asks the server for one claim, and how the
/// claim listens for its handoff.
pub(crate) trait Listener {
    /// Asks the server once: the lock, or with `wait` a place in its queue (kept if it has one).
    fn ask(&self, wait: bool) -> impl Future<Output = Result<Attempt>> + Send;

    /// Whether the claim listens already, or starts to where that needs no I/O.
    fn listening(&self) -> bool;

    /// Starts listening, with I/O. `Some(attempt)`: it cannot listen for now, and answers
    /// `attempt` instead of queueing.
    fn listen(&self) -> impl Future<Output = Result<Option<Attempt>>> + Send;

    /// Stops listening: the claim holds the lock.
    fn stop_listening(&self);
}

/// Asks for the lock. A waiting claim listens before it queues, so no handoff to it is
/// published unheard; where listening costs I/O it looks first without queueing, so a free
/// lock costs one round trip, and listens only if it must wait (`seen_busy`: the caller just
/// found it busy, so it need not look). A granted claim stops listening.
pub(crate) async fn acquire<'a, B, T, N>(
    backend: &'a B,
    claim: &'a Claim,
    ticket: &'a T,
    names: &'a N,
    wait: bool,
    seen_busy: bool,
) -> Result<Attempt>
where
    Asking<'a, B, T, N>: Listener,
{
    let asking = Asking {
        backend,
        claim,
        ticket,
        names,
    };
    if wait && !asking.listening() {
        if !seen_busy {
            let first = asking.ask(false).await?;
            if matches!(first, Attempt::Granted(_)) {
                return Ok(first);
            }
        }
        if let Some(instead) = asking.listen().await? {
            return Ok(instead);
        }
    }
    let attempt = asking.ask(wait).await?;
    if matches!(attempt, Attempt::Granted(_)) {
        asking.stop_listening();
    }
    Ok(attempt)
}
