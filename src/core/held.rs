//! A held lease with its RAII release ([`Held`], the part every guard type shares), and the
//! count of releases still running that `shutdown` waits for ([`Pending`]).

use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use tokio::time::Instant;

use super::lease::{Lease, Verdict};
use super::Core;
use crate::backend::{DynBackend, Renewal};
use crate::error::{Error, Result};
use crate::sync::LockExt;

/// A held lease with its RAII release: the part every guard type shares.
pub(crate) struct Held {
    client: Arc<Core>,
    lease: Arc<Lease>,
    fence: u64,
    armed: bool,
    /// What the service last accepted as the claim's value (a leadership's): the value it was
    /// granted with, then each value a proclaim published.
    accepted: StdMutex<Arc<[u8]>>,
}

impl Held {
    pub(crate) fn new(client: Arc<Core>, lease: Arc<Lease>) -> Self {
        let fence = lease.fence();
        let accepted = StdMutex::new(lease.claim.value());
        super::metrics::held(&client.metrics, &lease.claim);
        Self {
            client,
            lease,
            fence,
            armed: true,
            accepted,
        }
    }

    pub(crate) fn key(&self) -> &str {
        self.lease.claim.key()
    }

    pub(crate) fn fencing_token(&self) -> u64 {
        self.fence
    }

    /// What the claim proclaims (a leadership's value), as the service last accepted it.
    pub(crate) fn claim_value(&self) -> Arc<[u8]> {
        self.accepted.locked().clone()
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.lease.is_lost()
    }

    pub(crate) async fn lost(&self) {
        self.lease.lost().await;
    }

    /// How long the lease certainly lasts from now, drift margin included: zero once lost.
    pub(crate) fn lease_left(&self) -> Duration {
        if self.is_lost() {
            return Duration::ZERO;
        }
        self.lease.lost_at().map_or(Duration::ZERO, |at| {
            at.saturating_duration_since(Instant::now())
        })
    }

    pub(crate) fn valid_until(&self) -> Option<std::time::Instant> {
        self.lease.valid_until()
    }

    /// Turns background renewal of this lease on or off; off is refused where the lease is the
    /// session's (see [`session_lease`]).
    pub(crate) fn set_auto_renew(&self, on: bool) -> Result<()> {
        if !on {
            session_lease(&*self.client.backend, format_args!("`{}`", self.key()))?;
        }
        self.lease.set_renews(on);
        // The engine times the lease again: a renewal timer added, or dropped.
        self.client.retrack(&self.lease);
        Ok(())
    }

    /// One renewal now, asking the server for a lease of `ttl` (later renewals ask for it
    /// too).
    pub(crate) async fn extend(&self, ttl: Duration) -> Result<()> {
        super::rules::validate_ttl(ttl)?;
        if self
            .client
            .backend
            .lease()
            .is_some_and(|lease| lease != ttl)
        {
            session_lease(&*self.client.backend, format_args!("`{}`", self.key()))?;
        }
        let sent = Instant::now();
        let Some(generation) = self.lease.begin_extend(ttl, sent) else {
            return Err(Error::lost(self.key()));
        };
        self.client.retrack(&self.lease);
        let claim = &self.lease.claim;
        let reply = self
            .client
            .backend
            .renew(&[(claim, &self.lease.ticket)])
            .await
            .into_iter()
            .next();
        let verdict = match reply {
            Some(Renewal::Extended(until)) => self.lease.extend(generation, sent, until),
            Some(Renewal::NotOwner | Renewal::Queued(_)) => self.lease.refused(generation),
            Some(Renewal::Failed(e)) => return Err(e),
            None => {
                return Err(Error::new(
                    crate::ErrorKind::Backend,
                    "the backend answered no renewal",
                ))
            }
        };
        self.client.retrack(&self.lease);
        match verdict {
            Verdict::Lost => {
                claim.mark_lost();
                Err(Error::lost(self.key()))
            }
            // Stale: a later extension or a downgrade moved the lease on meanwhile.
            Verdict::Kept | Verdict::Stale if !self.is_lost() => Ok(()),
            _ => Err(Error::lost(self.key())),
        }
    }

    /// Turns a write hold into a read hold on the server, keeping the lease and its fencing
    /// token. On an error the hold is released (this `Held` is dropped).
    pub(crate) async fn downgrade(self) -> Result<Self> {
        if self.is_lost() {
            return Err(Error::lost(self.key()));
        }
        let (generation, sent) = (self.lease.schedule().generation, Instant::now());
        let grant = self
            .client
            .backend
            .downgrade(&self.lease.claim, &self.lease.ticket)
            .await?;
        // The hold so far was a write hold: recorded as one, and the read hold starts now.
        if let Some(held) = self.lease.restart_hold() {
            super::metrics::released(&self.client.metrics, self.lease.claim.kind(), held);
        }
        self.lease.claim.set_downgraded();
        super::metrics::downgraded(&self.client.metrics, &self.lease.claim);
        // A downgrade that also refreshed the lease moves it, by the usual rule.
        let _ = self.lease.extend(generation, sent, grant.valid_until);
        Ok(self)
    }

    /// Publishes `value` as what this leadership claim says, keeping the hold.
    pub(crate) async fn proclaim(&self, value: Arc<[u8]>) -> Result<()> {
        if self.is_lost() {
            return Err(Error::lost(self.key()));
        }
        let claim = &self.lease.claim;
        claim.set_value(value.clone());
        let done = self
            .client
            .backend
            .proclaim(claim, &self.lease.ticket)
            .await;
        match &done {
            Ok(()) => *self.accepted.locked() = value,
            Err(e) if e.is_lost() => claim.mark_lost(),
            Err(_) => {}
        }
        done
    }

    pub(crate) async fn release(mut self) -> Result<()> {
        self.armed = false;
        let was_lost = self.is_lost();
        if !self.client.stop(&self.lease) {
            // Shutdown released it already.
            return Err(Error::lost(self.key()));
        }
        let held = self.client.release_now(&self.lease).await?;
        if was_lost || !held {
            return Err(Error::lost(self.key()));
        }
        Ok(())
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.armed {
            // The result is logged by the task; nobody is left to receive it.
            self.client.spawn_release(self.lease.clone());
        }
    }
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard")
            .field("key", &self.key())
            .field("fencing_token", &self.fence)
            .field("lost", &self.is_lost())
            .finish()
    }
}

/// Counts spawned releases so `shutdown` can wait for them.
#[derive(Default)]
pub(crate) struct Pending {
    count: StdMutex<usize>,
    idle: tokio::sync::Notify,
}

impl Pending {
    pub(crate) fn start(self: &Arc<Self>) -> PendingToken {
        *self.count.locked() += 1;
        PendingToken(self.clone())
    }

    pub(crate) async fn idle(&self) {
        loop {
            let notified = self.idle.notified();
            if *self.count.locked() == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// Decrements the pending count when dropped, even if its task never ran.
pub(crate) struct PendingToken(Arc<Pending>);

impl Drop for PendingToken {
    fn drop(&mut self) {
        let mut count = self.0.count.locked();
        *count = count.saturating_sub(1);
        if *count == 0 {
            self.0.idle.notify_waiters();
        }
    }
}

/// Refuses lease control for `key` on a backend whose lease is its session's (ZooKeeper): every
/// lock lives as long as the session, which the client keeps alive while it can reach the
/// ensemble. A lease of another length, or one not renewed, would end for the guard while the
/// server still held the lock, and nobody else would get it.
pub(crate) fn session_lease(backend: &dyn DynBackend, what: impl std::fmt::Display) -> Result<()> {
    match backend.lease() {
        Some(lease) => Err(Error::unsupported(format_args!(
            "{what}: this backend's lease is its session's ({lease:?}), the same for every lock \
             and renewed with the session; a lock cannot ask for another or stop renewing"
        ))),
        None => Ok(()),
    }
}
