//! Replica acknowledgements (`replicas_ack`): a grant or a renewal round counts once enough
//! replicas have it, else it is undone (a grant) or counted as failed (a renewal).

use std::time::Duration;

use super::{lock_name, RedisBackend, RedisTicket};
use crate::backend::{Backend, Claim};
use crate::error::{Error, ErrorKind, Result};

/// How many replicas must acknowledge a grant or a renewal, and how long to wait for them.
#[derive(Debug, Clone, Copy)]
pub(super) struct Ack {
    pub(super) replicas: u32,
    pub(super) within: Duration,
}

impl RedisBackend {
    /// With `replicas_ack`, waits until the replicas have a renewal round's extensions; a
    /// round they did not acknowledge in time counts as failed.
    pub(super) async fn renewal_acknowledged(&self, members: &[&Claim]) -> Result<()> {
        let (Some(ack), Some(first)) = (self.inner.replicas_ack, members.first()) else {
            return Ok(());
        };
        let key = lock_name(first.namespace(), first.key());
        let n = self
            .inner
            .commands
            .acked_by(&key, ack.replicas, ack.within)
            .await?;
        if n >= i64::from(ack.replicas) {
            Ok(())
        } else {
            Err(Error::new(
                ErrorKind::Backend,
                format!(
                    "redis: a renewal reached {n} of {} replicas within {:?}",
                    ack.replicas, ack.within
                ),
            )
            .transient())
        }
    }

    /// Waits until `ack.replicas` replicas have every write this backend made to the claim's
    /// key (its grant among them). If they do not in time, releases the grant: it could vanish
    /// in a failover, so nobody may rely on it.
    pub(super) async fn acknowledged(
        &self,
        claim: &Claim,
        ticket: &RedisTicket,
        ack: Ack,
    ) -> Result<()> {
        let acked = self
            .inner
            .commands
            .acked_by(
                &lock_name(claim.namespace(), claim.key()),
                ack.replicas,
                ack.within,
            )
            .await;
        match acked {
            Ok(n) if n >= i64::from(ack.replicas) => Ok(()),
            answer => {
                let _ = Backend::release(self, claim, ticket).await;
                let seen = answer.as_ref().map_or(0, |n| *n);
                let err = Error::new(
                    ErrorKind::Backend,
                    format!(
                        "redis: the grant of `{}` reached {seen} of {} replicas within {:?}; released",
                        claim.key(),
                        ack.replicas,
                        ack.within
                    ),
                );
                Err(match answer {
                    Err(cause) => err.with_source(cause),
                    Ok(_) => err,
                })
            }
        }
    }
}
