//! The backend seam with its types erased ([`DynBackend`]), so that one `LockClient` type
//! serves every backend: tickets become `Box<dyn Any>`, futures are boxed.

use std::any::Any;

use futures::future::BoxFuture;
use tokio::sync::watch;
use tokio::time::Instant;

use super::{Attempt, Backend, Claim, Grant, Leader, LeaderWatch, LockKind, Renewal};
use crate::error::{Error, ErrorKind, Result};
use crate::inspect::{ForceReleased, Inspection};

/// A type-erased ticket.
pub(crate) type AnyTicket = Box<dyn Any + Send + Sync>;

/// [`Backend`] with its types erased, so that one `LockClient` type serves every backend.
pub(crate) trait DynBackend: Send + Sync + 'static {
    fn new_ticket(&self) -> AnyTicket;
    fn renews_waiters(&self) -> bool;
    fn has_queued(&self, ticket: &AnyTicket) -> bool;
    fn supports(&self, kind: LockKind) -> bool;
    fn validate_key(&self, key: &str) -> Result<()>;
    fn acquire<'a>(
        &'a self,
        claim: &'a Claim,
        ticket: &'a AnyTicket,
        wait: bool,
    ) -> BoxFuture<'a, Result<Attempt>>;
    fn wait<'a>(
        &'a self,
        claim: &'a Claim,
        ticket: &'a AnyTicket,
        recheck_at: Option<Instant>,
    ) -> BoxFuture<'a, Result<Option<Grant>>>;
    fn release<'a>(
        &'a self,
        claim: &'a Claim,
        ticket: &'a AnyTicket,
    ) -> BoxFuture<'a, Result<bool>>;
    fn downgrade<'a>(
        &'a self,
        claim: &'a Claim,
        ticket: &'a AnyTicket,
    ) -> BoxFuture<'a, Result<Grant>>;
    fn renew<'a>(&'a self, claims: &'a [(&'a Claim, &'a AnyTicket)])
        -> BoxFuture<'a, Vec<Renewal>>;
    fn name(&self) -> &'static str;
    fn lease(&self) -> Option<std::time::Duration>;
    fn reconnects(&self) -> Option<watch::Receiver<u64>>;
    fn inspect<'a>(&'a self, namespace: &'a str, key: &'a str)
        -> BoxFuture<'a, Result<Inspection>>;
    fn force_release<'a>(
        &'a self,
        namespace: &'a str,
        key: &'a str,
    ) -> BoxFuture<'a, Result<ForceReleased>>;
    fn proclaim<'a>(&'a self, claim: &'a Claim, ticket: &'a AnyTicket)
        -> BoxFuture<'a, Result<()>>;
    fn leader<'a>(
        &'a self,
        namespace: &'a str,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<Leader>>>;
    fn watch_leader<'a>(
        &'a self,
        namespace: &'a str,
        key: &'a str,
    ) -> BoxFuture<'a, Result<LeaderWatch>>;
    fn shutdown(&self) -> BoxFuture<'_, ()>;
}

fn typed<T: 'static>(ticket: &AnyTicket) -> Result<&T> {
    ticket.downcast_ref::<T>().ok_or_else(|| {
        Error::new(
            ErrorKind::Backend,
            "internal error: a ticket was passed to a backend that did not create it",
        )
    })
}

impl<B: Backend> DynBackend for B {
    fn new_ticket(&self) -> AnyTicket {
        Box::new(B::Ticket::default())
    }

    fn renews_waiters(&self) -> bool {
        B::RENEWS_WAITERS
    }

    fn has_queued(&self, ticket: &AnyTicket) -> bool {
        typed(ticket).is_ok_and(|t| Backend::has_queued(self, t))
    }

    fn supports(&self, kind: LockKind) -> bool {
        Backend::supports(self, kind)
    }

    fn validate_key(&self, key: &str) -> Result<()> {
        Backend::validate_key(self, key)
    }

    fn acquire<'a>(
        &'a self,
        claim: &'a Claim,
        ticket: &'a AnyTicket,
        wait: bool,
    ) -> BoxFuture<'a, Result<Attempt>> {
        // The backend's own future, boxed as it is (not wrapped in one more): every lock pays
        // for this box, by its size.
        match typed(ticket) {
            Ok(ticket) => Box::pin(Backend::acquire(self, claim, ticket, wait)),
            Err(e) => Box::pin(std::future::ready(Err(e))),
        }
    }

    fn wait<'a>(
        &'a self,
        claim: &'a Claim,
        ticket: &'a AnyTicket,
        recheck_at: Option<Instant>,
    ) -> BoxFuture<'a, Result<Option<Grant>>> {
        Box::pin(async move { Backend::wait(self, claim, typed(ticket)?, recheck_at).await })
    }

    fn release<'a>(
        &'a self,
        claim: &'a Claim,
        ticket: &'a AnyTicket,
    ) -> BoxFuture<'a, Result<bool>> {
        match typed(ticket) {
            Ok(ticket) => Box::pin(Backend::release(self, claim, ticket)),
            Err(e) => Box::pin(std::future::ready(Err(e))),
        }
    }

    fn downgrade<'a>(
        &'a self,
        claim: &'a Claim,
        ticket: &'a AnyTicket,
    ) -> BoxFuture<'a, Result<Grant>> {
        Box::pin(async move { Backend::downgrade(self, claim, typed(ticket)?).await })
    }

    fn renew<'a>(
        &'a self,
        claims: &'a [(&'a Claim, &'a AnyTicket)],
    ) -> BoxFuture<'a, Vec<Renewal>> {
        Box::pin(async move {
            // Every ticket comes from this backend's `new_ticket`: a stranger fails them all.
            let typed: Result<Vec<(&Claim, &B::Ticket)>> = claims
                .iter()
                .map(|(claim, ticket)| Ok((*claim, typed::<B::Ticket>(ticket)?)))
                .collect();
            match typed {
                Ok(typed) => Backend::renew(self, &typed).await,
                Err(e) => vec![Renewal::Failed(e); claims.len()],
            }
        })
    }

    fn lease(&self) -> Option<std::time::Duration> {
        Backend::lease(self)
    }

    fn name(&self) -> &'static str {
        Backend::name(self)
    }

    fn reconnects(&self) -> Option<watch::Receiver<u64>> {
        Backend::reconnects(self)
    }

    fn inspect<'a>(
        &'a self,
        namespace: &'a str,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Inspection>> {
        Box::pin(Backend::inspect(self, namespace, key))
    }

    fn force_release<'a>(
        &'a self,
        namespace: &'a str,
        key: &'a str,
    ) -> BoxFuture<'a, Result<ForceReleased>> {
        Box::pin(Backend::force_release(self, namespace, key))
    }

    fn proclaim<'a>(
        &'a self,
        claim: &'a Claim,
        ticket: &'a AnyTicket,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move { Backend::proclaim(self, claim, typed(ticket)?).await })
    }

    fn leader<'a>(
        &'a self,
        namespace: &'a str,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<Leader>>> {
        Box::pin(Backend::leader(self, namespace, key))
    }

    fn watch_leader<'a>(
        &'a self,
        namespace: &'a str,
        key: &'a str,
    ) -> BoxFuture<'a, Result<LeaderWatch>> {
        Box::pin(Backend::watch_leader(self, namespace, key))
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(Backend::shutdown(self))
    }
}
