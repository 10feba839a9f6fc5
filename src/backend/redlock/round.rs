//! One round over every node: ask each (bounded by the node timeout), count the quorum, raise
//! the quorum's fencing counters to the token handed out, hand a minority's grants on, release
//! where a round failed.

use std::time::Duration;

use futures::future::join_all;
use tokio::time::Instant;

use super::keys::Keys;
use super::library;
use super::quorum::held_until;
use super::scripts::{Acquire, AcquireShared, Release, ReleaseShared, Settle, Yield, YieldShared};
use super::{RedlockBackend, RedlockTicket};
use crate::backend::handoff::reply::{lease_left, queued};
use crate::backend::handoff::wait::earliest;
use crate::backend::redis::kind_code;
use crate::backend::wire::{fence_of, kind_mismatch};
use crate::backend::{Attempt, Claim, Grant, LockKind};
use crate::error::{Error, ErrorKind, Result};

/// An election's candidate's value (`value` is its claim's), `None` for every other kind.
fn leads<'a>(claim: &Claim, value: &'a [u8]) -> Option<&'a [u8]> {
    (claim.kind() == LockKind::Leader).then_some(value)
}

/// One node's answer to an acquisition.
pub(super) enum Reply {
    /// The lock is ours there, with `lease` left of it from when the request was sent.
    Granted {
        fence: u64,
        lease: Duration,
        sent: Instant,
    },
    /// Not ours there: look again at `until` (the holder's lease end) at the latest.
    Queued { until: Instant },
    /// The key is in use as another kind of lock there (the family it is).
    Mismatch(String),
    /// No usable answer in time.
    Failed(Error),
}

/// A lock we hold on one node, as the quorum check sees it.
pub(super) struct NodeHold {
    pub(super) node: usize,
    pub(super) fence: u64,
    /// Granted in this very call with the full TTL.
    pub(super) fresh: bool,
    pub(super) until: Instant,
}

impl RedlockBackend {
    /// The error of a call that `succeeded` on fewer nodes than a quorum (the cause, where one
    /// is known, goes after it). It counts the nodes where the call did what it asked, not the
    /// ones that answered: a node that answers with an error (a counter it refuses to draw
    /// from) or with a refusal failed as surely as one that did not answer.
    pub(super) fn no_quorum(&self, succeeded: usize, what: &str) -> Error {
        Error::new(
            ErrorKind::Backend,
            format!(
                "redlock {what}: {succeeded} of {} nodes succeeded, a quorum needs {}",
                self.inner.nodes.len(),
                self.inner.quorum
            ),
        )
        .transient()
    }

    /// [`no_quorum`](Self::no_quorum), with the first node's error as its cause, if any.
    pub(super) fn no_quorum_from(
        &self,
        succeeded: usize,
        what: &str,
        first_error: Option<Error>,
    ) -> Error {
        let err = self.no_quorum(succeeded, what);
        match first_error {
            Some(cause) => err.with_source(cause),
            None => err,
        }
    }

    /// Runs the acquire script on every node at once.
    pub(super) async fn ask_all(
        &self,
        claim: &Claim,
        ticket: &RedlockTicket,
        keys: &Keys,
        wait: bool,
    ) -> Vec<Reply> {
        let value = claim.value();
        let acquire = Acquire {
            keys,
            ttl: claim.ttl(),
            wait,
            priority: ticket.priority(),
            handoff_ttl: self.inner.handoff_ttl,
            rejoin_ms: self.rejoin_ms(),
            leads: leads(claim, &value),
        };
        let inv = match kind_code(claim.kind()) {
            Some(kind) => library::call(&AcquireShared {
                acquire,
                kind: &kind,
            }),
            None => library::call(&acquire),
        };
        let tickets = ticket.nodes(self.inner.nodes.len());
        let calls = self.inner.nodes.iter().zip(tickets).map(|(node, nt)| {
            let inv = &inv;
            async move {
                match node
                    .call::<(i64, ::redis::Value, i64)>("acquire", inv)
                    .await
                {
                    Ok(((-1, family, _), _)) => {
                        Reply::Mismatch(::redis::from_redis_value_ref(&family).unwrap_or_default())
                    }
                    Ok(((1, fence, lease), sent)) => {
                        let fence = ::redis::from_redis_value_ref::<i64>(&fence)
                            .map_err(|e| {
                                Error::new(ErrorKind::Backend, "redlock: unexpected acquire reply")
                                    .with_source(e)
                            })
                            .and_then(|f| fence_of("redis", f));
                        match fence {
                            Ok(fence) => Reply::Granted {
                                fence,
                                lease: Duration::from_millis(u64::try_from(lease).unwrap_or(0)),
                                sent,
                            },
                            Err(e) => Reply::Failed(e),
                        }
                    }
                    Ok(((_, wait_ms, server_ms), sent)) => {
                        let wait_ms = ::redis::from_redis_value_ref::<i64>(&wait_ms).unwrap_or(-2);
                        // A lease without expiry (-1) cannot be ours to wait out: look again
                        // within a TTL; nobody holding it (-2, or any other negative): within
                        // the handoff lease.
                        let wait = match wait_ms {
                            -1 => claim.ttl(),
                            ms if ms < 0 => self.inner.handoff_ttl,
                            ms => lease_left(ms),
                        };
                        Reply::Queued {
                            until: queued(&nt.clock, sent, server_ms, wait),
                        }
                    }
                    Err(e) => Reply::Failed(e),
                }
            }
        });
        join_all(calls).await
    }

    /// Makes the locks in `held` one grant: token `T` = the largest of theirs; every node's
    /// counter raised to `T` and its lease set to the full TTL while we still hold it there,
    /// unless a quorum of them was freshly granted at `T` already (an election's candidate's
    /// fresh grants carry its value already). `None` if fewer than a quorum could be settled.
    /// An election's candidate leads on each node it settles.
    pub(super) async fn settle(
        &self,
        claim: &Claim,
        keys: &Keys,
        held: &[NodeHold],
    ) -> Option<Grant> {
        let shared = kind_code(claim.kind()).is_some();
        let q = self.inner.quorum;
        let token = held.iter().map(|h| h.fence).max()?;
        let ready: Vec<Instant> = held
            .iter()
            .filter(|h| h.fresh && h.fence == token)
            .map(|h| h.until)
            .collect();
        if let Some(valid_until) = held_until(ready, q) {
            return Some(Grant::new(token, valid_until));
        }
        let value = claim.value();
        let settled = self
            .settle_nodes(keys, held, claim.ttl(), token, shared, leads(claim, &value))
            .await;
        let valid_until = held_until(
            settled.into_iter().map(|sent| sent + claim.ttl()).collect(),
            q,
        )?;
        Some(Grant::new(token, valid_until))
    }

    /// Sets the lease of our lock on each node of `held` to `px` and raises its counter to
    /// `token` (an election's candidate's hold takes the value `leads`); returns when each node
    /// that still held it was asked.
    pub(super) async fn settle_nodes(
        &self,
        keys: &Keys,
        held: &[NodeHold],
        px: Duration,
        token: u64,
        shared: bool,
        leads: Option<&[u8]>,
    ) -> Vec<Instant> {
        let inv = library::call(&Settle {
            keys,
            lease: px,
            token,
            shared,
            leads,
        });
        let calls = held.iter().map(|h| {
            let inv = &inv;
            async move {
                match self
                    .inner
                    .nodes
                    .get(h.node)?
                    .call::<i64>("settle", inv)
                    .await
                {
                    Ok((1, sent)) => Some(sent),
                    _ => None,
                }
            }
        });
        join_all(calls).await.into_iter().flatten().collect()
    }

    /// Runs the yield script on the nodes of a minority hold.
    pub(super) async fn yield_minority(
        &self,
        claim: &Claim,
        ticket: &RedlockTicket,
        keys: &Keys,
        held: &[NodeHold],
    ) {
        let yielding = Yield {
            keys,
            priority: ticket.priority(),
            ttl: claim.ttl(),
            handoff_ttl: self.inner.handoff_ttl,
        };
        let inv = match kind_code(claim.kind()) {
            Some(kind) => library::call(&YieldShared {
                yielding,
                kind: &kind,
            }),
            None => library::call(&yielding),
        };
        let calls = held.iter().filter_map(|h| {
            let node = self.inner.nodes.get(h.node)?;
            let inv = &inv;
            Some(async move { node.call::<i64>("yield", inv).await })
        });
        join_all(calls).await;
    }

    /// Releases the claim on every node; returns how many said it held the lock there, and how
    /// many could not be asked.
    pub(super) async fn release_on(&self, claim: &Claim, keys: &Keys) -> (usize, usize) {
        let release = Release {
            keys,
            handoff_ttl: self.inner.handoff_ttl,
            rejoin_ms: self.rejoin_ms(),
            election: claim.kind() == LockKind::Leader,
        };
        let inv = match kind_code(claim.kind()) {
            Some(kind) => library::call(&ReleaseShared {
                release,
                kind: &kind,
            }),
            None => library::call(&release),
        };
        let calls = self.inner.nodes.iter().map(|node| {
            let inv = &inv;
            async move { node.call::<i64>("release", inv).await }
        });
        let replies = join_all(calls).await;
        let held = replies.iter().filter(|r| matches!(r, Ok((1, _)))).count();
        let failed = replies.iter().filter(|r| r.is_err()).count();
        (held, failed)
    }

    pub(super) fn rejoin_ms(&self) -> u64 {
        u64::try_from(self.inner.rejoin_delay.as_millis()).unwrap_or(u64::MAX)
    }

    /// One round: ask every node; a quorum of grants is settled into one grant.
    pub(super) async fn round(
        &self,
        claim: &Claim,
        ticket: &RedlockTicket,
        keys: &Keys,
        wait: bool,
    ) -> Result<Attempt> {
        let replies = self.ask_all(claim, ticket, keys, wait).await;
        let mut held = Vec::new();
        let mut failed = 0;
        let mut recheck_at: Option<Instant> = None;
        let mut first_error = None;
        let mut mismatch = None;
        for (node, reply) in replies.into_iter().enumerate() {
            match reply {
                Reply::Granted { fence, lease, sent } => {
                    let until = sent + lease;
                    held.push(NodeHold {
                        node,
                        fence,
                        fresh: lease >= claim.ttl(),
                        until,
                    });
                }
                Reply::Queued { until } => earliest(&mut recheck_at, until),
                Reply::Mismatch(family) => {
                    mismatch.get_or_insert(family);
                }
                Reply::Failed(e) => {
                    failed += 1;
                    first_error.get_or_insert(e);
                }
            }
        }
        if let Some(family) = mismatch {
            // Another kind of lock holds the key (the layer above releases whatever of ours a
            // node kept, as after any error).
            return Err(kind_mismatch(claim.key(), &family, claim.kind()));
        }
        let n = self.inner.nodes.len();
        if held.len() >= self.inner.quorum {
            if let Some(grant) = self.settle(claim, keys, &held).await {
                return Ok(Attempt::Granted(ticket.holds(grant)));
            }
        }
        let unreachable = failed > n - self.inner.quorum;
        if !wait {
            // A try leaves nothing behind: release wherever we got it or could not tell.
            if !held.is_empty() || failed > 0 {
                self.release_on(claim, keys).await;
            }
        } else if !held.is_empty() {
            // A minority: hand each on to a better-placed waiter queued there, or keep it only
            // under the handoff lease, never renewed, so that if nobody reaches a quorum the
            // nodes hand the lock on in priority order.
            self.yield_minority(claim, ticket, keys, &held).await;
            earliest(&mut recheck_at, Instant::now() + self.inner.handoff_ttl);
        }
        if unreachable {
            return Err(self.no_quorum_from(n - failed, "acquire", first_error));
        }
        Ok(Attempt::Queued {
            recheck_at: recheck_at.or_else(|| Some(Instant::now() + self.inner.handoff_ttl)),
        })
    }
}
