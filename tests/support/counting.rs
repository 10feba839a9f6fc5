//! A pass-through backend that counts the renewal calls the layer above makes (every other call
//! goes straight to the real backend it wraps): how a test sees how often a client renews.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock::backend::{Attempt, Backend, Claim, Grant, LockKind, Renewal};
use distlock::{Inspection, Result};
use tokio::sync::watch;
use tokio::time::Instant;

/// `inner`, with its `renew` calls counted.
pub struct Counting<B> {
    inner: B,
    renews: Arc<AtomicU64>,
}

impl<B: Backend> Counting<B> {
    /// Wraps `inner`; the counter reads how many `renew` calls went through it.
    pub fn new(inner: B) -> (Self, Arc<AtomicU64>) {
        let renews = Arc::new(AtomicU64::new(0));
        (
            Self {
                inner,
                renews: renews.clone(),
            },
            renews,
        )
    }
}

/// The count now.
pub fn count(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::SeqCst)
}

impl<B: Backend> Backend for Counting<B> {
    type Ticket = B::Ticket;
    const RENEWS_WAITERS: bool = B::RENEWS_WAITERS;

    fn supports(&self, kind: LockKind) -> bool {
        self.inner.supports(kind)
    }

    fn validate_key(&self, key: &str) -> Result<()> {
        self.inner.validate_key(key)
    }

    async fn acquire(&self, claim: &Claim, ticket: &B::Ticket, wait: bool) -> Result<Attempt> {
        self.inner.acquire(claim, ticket, wait).await
    }

    async fn wait(
        &self,
        claim: &Claim,
        ticket: &B::Ticket,
        recheck_at: Option<Instant>,
    ) -> Result<Option<Grant>> {
        self.inner.wait(claim, ticket, recheck_at).await
    }

    async fn release(&self, claim: &Claim, ticket: &B::Ticket) -> Result<bool> {
        self.inner.release(claim, ticket).await
    }

    async fn downgrade(&self, claim: &Claim, ticket: &B::Ticket) -> Result<Grant> {
        self.inner.downgrade(claim, ticket).await
    }

    async fn renew(&self, claims: &[(&Claim, &B::Ticket)]) -> Vec<Renewal> {
        self.renews.fetch_add(1, Ordering::SeqCst);
        self.inner.renew(claims).await
    }

    fn reconnects(&self) -> Option<watch::Receiver<u64>> {
        self.inner.reconnects()
    }

    fn lease(&self) -> Option<Duration> {
        self.inner.lease()
    }

    fn name(&self) -> &'static str {
        self.inner.name()
    }

    async fn inspect(&self, namespace: &str, key: &str) -> Result<Inspection> {
        self.inner.inspect(namespace, key).await
    }

    async fn shutdown(&self) {
        self.inner.shutdown().await;
    }
}
