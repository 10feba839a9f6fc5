//! The lock operations: acquire (grant, or subscribe then queue), wait for a handoff, release
//! (handing on), downgrade.

use std::time::Duration;

use tokio::time::Instant;

use super::fast::Fast;
use super::scripts::{Acquire, AcquireShared, Downgrade, Release, ReleaseShared};
use super::{kind_code, Keys, RedisBackend, RedisTicket};
use crate::backend::handoff::reply::{downgraded, granted, lease_left, queued, released};
use crate::backend::handoff::{self, wait_for_handoff, Asking, Listener};
use crate::backend::wire::kind_mismatch;
use crate::backend::{Attempt, Claim, Grant, LockKind};
use crate::error::{Error, ErrorKind, Result};

/// How long a fencing counter lives: a lock's (Cluster, Sentinel) an hour past its last use, a
/// single server's namespace counter an hour past its start. After it expires, the next grant
/// starts from server time in microseconds, which is larger than any token handed out before. (Where
/// the client's clock lifts tokens, on Cluster and Sentinel, it lifts them at most half of this
/// above the server's clock, so that still holds: see `next_fence` in `scripts/common.lua`.)
pub(crate) const FENCE_TTL: Duration = Duration::from_secs(3600);

impl RedisBackend {
    pub(super) async fn acquire_claim(
        &self,
        claim: &Claim,
        ticket: &RedisTicket,
        wait: bool,
    ) -> Result<Attempt> {
        if let Some(until) = self.inner.hub.restart_gate(claim.ttl()) {
            tracing::debug!(
                key = claim.key(),
                "the server restarted: no grant until a lease after"
            );
            return Ok(Attempt::Queued {
                recheck_at: wait.then_some(until),
            });
        }
        let attempt = self.acquire_here(claim, ticket, wait).await?;
        if let (Attempt::Granted(_), Some(until)) =
            (&attempt, self.inner.hub.restart_gate(claim.ttl()))
        {
            // Sent before the restart was seen (a call retried across it), and perhaps granted
            // by the restarted server: given back, asked again once the gate opens.
            self.release_claim(claim, ticket).await?;
            return Ok(Attempt::Queued {
                recheck_at: wait.then_some(until),
            });
        }
        if matches!(attempt, Attempt::Granted(_)) {
            ticket.set_holding(Some(self.inner.hub.holding()));
        }
        match (&attempt, self.inner.replicas_ack) {
            (Attempt::Granted(_), Some(ack)) => {
                // Boxed: only a client that asks for replicas' acknowledgements waits for
                // them, and this future would double the size of every lock's.
                Box::pin(self.acknowledged(claim, ticket, ack)).await?;
                Ok(attempt)
            }
            _ => Ok(attempt),
        }
    }

    /// Takes the lock, or joins or keeps the claim's place in its queue (see
    /// [`Backend::acquire`](crate::backend::Backend::acquire)), without the replicas' acknowledgement.
    async fn acquire_here(
        &self,
        claim: &Claim,
        ticket: &RedisTicket,
        wait: bool,
    ) -> Result<Attempt> {
        if claim.kind() == LockKind::Leader {
            super::election::validate_value(claim.key(), &claim.value())?;
        }
        let keys = self.keys_of(ticket, claim);
        let mut busy = false;
        // A key this client waited on a moment ago (its channel still subscribed) is likely
        // busy: the plain commands would cost a round trip for nothing there.
        if self.goes_fast(claim)
            && ticket.first_call()
            && !self.inner.hub.listens_to(keys.channel())
        {
            match self.acquire_fast(claim, keys).await? {
                Fast::Granted(grant) => return Ok(Attempt::Granted(grant)),
                Fast::Busy => busy = wait,
                Fast::Settle => {}
            }
        }
        // Boxed: most locks of a busy service end above (a free key), and the script path's
        // future would make theirs over half as large again.
        Box::pin(handoff::acquire(self, claim, ticket, keys, wait, busy)).await
    }

    pub(super) async fn wait_claim(
        &self,
        claim: &Claim,
        ticket: &RedisTicket,
        recheck_at: Option<Instant>,
    ) -> Result<Option<Grant>> {
        let heard = wait_for_handoff(&ticket.handoff, recheck_at).await?;
        // A handoff must be acknowledged like any grant: `acquire` confirms it (a write of
        // ours, replicated after the handoff) and waits for the replicas. A lead handed to an
        // election's candidate is provisional (not reported, not announced) until its client
        // confirms it by asking again, before the campaign returns.
        let heard =
            heard.filter(|_| self.inner.replicas_ack.is_none() && claim.kind() != LockKind::Leader);
        if heard.is_some() {
            ticket.set_holding(Some(self.inner.hub.holding()));
        }
        Ok(heard)
    }

    pub(super) async fn release_claim(&self, claim: &Claim, ticket: &RedisTicket) -> Result<bool> {
        ticket.handoff.set(None);
        ticket.set_holding(None);
        let election = claim.kind() == LockKind::Leader;
        let release = Release {
            keys: self.keys_of(ticket, claim),
            handoff_ttl: self.inner.handoff_ttl,
            election,
        };
        let call = match ScriptKind::of(claim.kind()) {
            Some(shared) => self.call(&ReleaseShared {
                release,
                kind: &shared.kind,
            }),
            None => self.call(&release),
        };
        let (held, in_doubt, _): (i64, bool, Instant) = if election {
            let commands = &self.inner.commands;
            commands.invoke_noting_doubt("release", &call).await?
        } else {
            self.invoke_coalesced("release", None, call).await?
        };
        Ok(released(usize::from(held == 1), usize::from(in_doubt), 1))
    }

    pub(super) async fn downgrade_claim(
        &self,
        claim: &Claim,
        ticket: &RedisTicket,
    ) -> Result<Grant> {
        let keys = self.keys_of(ticket, claim);
        let inv = self.call(&Downgrade {
            keys,
            ttl: claim.ttl(),
            handoff_ttl: self.inner.handoff_ttl,
        });
        let ((done, fence), sent): ((i64, i64), Instant) =
            self.inner.commands.invoke_timed("downgrade", &inv).await?;
        downgraded("redis", claim, done == 1, sent, || Ok(fence))
    }
}

impl Listener for Asking<'_, RedisBackend, RedisTicket, Keys> {
    async fn ask(&self, wait: bool) -> Result<Attempt> {
        let (backend, claim, keys) = (self.backend, self.claim, self.names);
        // Only a candidate's value is read (a mutex's acquire takes no lock for it).
        let value = (claim.kind() == LockKind::Leader).then(|| claim.value());
        let leads = value.as_deref();
        let ttl = claim.ttl();
        let acquire = Acquire {
            keys,
            ttl,
            wait,
            handoff_ttl: backend.inner.handoff_ttl,
            leads,
        };
        let call = match ScriptKind::of(claim.kind()) {
            Some(shared) => backend.call(&AcquireShared {
                acquire,
                kind: &shared.kind,
                permits: shared.max,
            }),
            None => backend.call(&acquire),
        };
        let (reply, _, sent): (Vec<::redis::Value>, bool, Instant) = if leads.is_some() {
            let commands = &backend.inner.commands;
            commands.invoke_noting_doubt("acquire", &call).await?
        } else {
            backend
                .invoke_coalesced("acquire", Some(claim), call)
                .await?
        };
        let (code, value, server_ms) = parse_acquire(claim, &reply)?;
        if code == 1 {
            return Ok(Attempt::Granted(granted("redis", claim, value, sent)?));
        }
        // How long the blocking lease has left. -1 (a key without expiry, not ours): after our
        // own TTL. -2 (nothing holds the lock, yet the claim must wait): a state nothing
        // announces the end of, so look again after a handoff lease, never in a tight loop.
        let wait = match value {
            -1 => claim.ttl(),
            -2 => backend.inner.handoff_ttl,
            ms => lease_left(ms),
        };
        Ok(Attempt::Queued {
            recheck_at: Some(queued(&self.ticket.handoff.clock, sent, server_ms, wait)),
        })
    }

    /// Subscribed already, or now on a channel this client listens to (that costs nothing).
    fn listening(&self) -> bool {
        let (ticket, keys) = (self.ticket, self.names);
        if ticket.handoff.is_listening() {
            return true;
        }
        let hub = &self.backend.inner.hub;
        match hub.subscribe_if_ready(keys.channel(), keys.owner()) {
            Some(sub) => {
                ticket.subscribed(sub);
                true
            }
            None => false,
        }
    }

    async fn listen(&self) -> Result<Option<Attempt>> {
        let (ticket, keys) = (self.ticket, self.names);
        let hub = &self.backend.inner.hub;
        match hub.subscribe(keys.channel(), keys.owner()).await {
            Ok(sub) => {
                ticket.subscribed(sub);
                Ok(None)
            }
            // The server answered and the lock is busy, but the pub/sub link is down (a
            // reconnect under way): the claim waits like a queued one through an outage,
            // trying again after a growing pause, until its own deadline.
            Err(e) if e.is_transient() => {
                let pause = ticket.sub_failed();
                tracing::debug!(error = %e, ?pause, "redis subscribe failed; trying again");
                Ok(Some(Attempt::Queued {
                    recheck_at: Some(Instant::now() + pause),
                }))
            }
            Err(e) => Err(e),
        }
    }

    fn stop_listening(&self) {
        self.ticket.handoff.set(None);
    }
}

/// How a read-write lock or semaphore claim is written in the shared scripts; `None` for a
/// mutex.
struct ScriptKind {
    /// `r`, `w`, or the permit count.
    kind: String,
    /// The semaphore's permits (0 for a read-write lock).
    max: u32,
}

impl ScriptKind {
    fn of(kind: LockKind) -> Option<Self> {
        let max = match kind {
            LockKind::Permits { max, .. } => max,
            _ => 0,
        };
        Some(Self {
            kind: kind_code(kind)?,
            max,
        })
    }
}

/// Reads an acquire script's reply: `{1, fence, 0}`, `{0, ms to wait, server ms}`, or
/// `{-1, family}` when the key is another kind of lock.
fn parse_acquire(claim: &Claim, reply: &[::redis::Value]) -> Result<(i64, i64, i64)> {
    let int = |i: usize| -> Option<i64> { ::redis::from_redis_value_ref(reply.get(i)?).ok() };
    match (int(0), reply.get(1)) {
        (Some(-1), Some(family)) => {
            let family: String = ::redis::from_redis_value_ref(family).unwrap_or_default();
            Err(kind_mismatch(claim.key(), &family, claim.kind()))
        }
        (Some(code), _) => match (int(1), int(2)) {
            (Some(value), Some(server_ms)) => Ok((code, value, server_ms)),
            _ => Err(Error::new(
                ErrorKind::Backend,
                "redis acquire returned a malformed reply",
            )),
        },
        _ => Err(Error::new(
            ErrorKind::Backend,
            "redis acquire returned a malformed reply",
        )),
    }
}
