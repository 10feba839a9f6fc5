//! The lock operations over the quorum: acquire (subscribe on every node, then a round), wait
//! for grant messages from a majority, release everywhere, downgrade.

use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use tokio::time::Instant;

use super::keys::Keys;
use super::library;
use super::quorum::held_until;
use super::round::NodeHold;
use super::scripts::Downgrade;
use super::{RedlockBackend, RedlockTicket};
use crate::backend::handoff::reply::released;
use crate::backend::handoff::wait::{before, earliest, heard, recheck, Heard};
use crate::backend::handoff::{self, Asking, Listener, Mailbox, Wake};
use crate::backend::wire::fence_of;
use crate::backend::{Attempt, Claim, Grant, LockKind};
use crate::error::{Error, Result};

/// How long a waiter that heard of grants from a minority of nodes waits for the rest before
/// it asks every node.
const SPLIT_GRACE: Duration = Duration::from_millis(10);

impl RedlockBackend {
    pub(super) async fn acquire_claim(
        &self,
        claim: &Claim,
        ticket: &RedlockTicket,
        wait: bool,
    ) -> Result<Attempt> {
        if claim.kind() == LockKind::Leader {
            super::election::validate_value(claim.key(), &claim.value())?;
        }
        let keys = Keys::new(claim, &self.inner.client_id);
        handoff::acquire(self, claim, ticket, &keys, wait, false).await
    }

    pub(super) async fn wait_claim(
        &self,
        claim: &Claim,
        ticket: &RedlockTicket,
        recheck_at: Option<Instant>,
    ) -> Result<Option<Grant>> {
        let tickets = ticket.nodes(self.inner.nodes.len());
        let mailboxes: Vec<(usize, Arc<Mailbox>)> = tickets
            .iter()
            .enumerate()
            .filter_map(|(i, nt)| Some((i, nt.mailbox()?)))
            .collect();
        if mailboxes.is_empty() {
            return recheck(recheck_at).await;
        }
        let mut deadline = recheck_at;
        // Grants announced to us so far, per node.
        let mut held: Vec<NodeHold> = Vec::new();
        loop {
            let next = futures::future::select_all(
                mailboxes
                    .iter()
                    .map(|(i, m)| Box::pin(async move { (*i, m.recv().await) })),
            );
            let Some(((node, wake), ..)) = before(next, deadline).await else {
                return Ok(None);
            };
            let clock = &tickets[node].clock;
            // A provisional lease handed out before this node answered our last request: that
            // answer's re-check moment already covers it. (Every grant tells the first waiters
            // in line on every node; asking again for each such message made each grant cost
            // several rounds over every node.)
            if matches!(wake, Wake::NextInLine(end) if clock.predates(end.server_ms)) {
                continue;
            }
            match heard(clock, wake, &mut deadline) {
                Heard::Ask => return Ok(None),
                Heard::Wait => {}
                Heard::Granted { fence, until } => {
                    held.retain(|h| h.node != node);
                    held.push(NodeHold {
                        node,
                        fence,
                        fresh: false,
                        until,
                    });
                    // The other nodes' grants normally follow within a moment (the holder
                    // released everywhere at once); if they do not, ask every node soon: the
                    // lock may have split between waiters.
                    earliest(&mut deadline, (Instant::now() + SPLIT_GRACE).min(until));
                    if held.len() >= self.inner.quorum {
                        let keys = Keys::new(claim, &self.inner.client_id);
                        return Ok(self
                            .settle(claim, &keys, &held)
                            .await
                            .map(|g| ticket.holds(g)));
                    }
                }
            }
        }
    }

    pub(super) async fn release_claim(
        &self,
        claim: &Claim,
        ticket: &RedlockTicket,
    ) -> Result<bool> {
        ticket.unsubscribe();
        let keys = Keys::new(claim, &self.inner.client_id);
        let (held, failed) = self.release_on(claim, &keys).await;
        if failed == self.inner.nodes.len() {
            return Err(self.no_quorum(0, "release"));
        }
        Ok(released(held, failed, self.inner.quorum))
    }

    pub(super) async fn downgrade_claim(
        &self,
        claim: &Claim,
        _ticket: &RedlockTicket,
    ) -> Result<Grant> {
        let keys = Keys::new(claim, &self.inner.client_id);
        let inv = library::call(&Downgrade {
            keys: &keys,
            ttl: claim.ttl(),
            handoff_ttl: self.inner.handoff_ttl,
            rejoin_ms: self.rejoin_ms(),
        });
        let replies = join_all(self.inner.nodes.iter().map(|node| {
            let inv = &inv;
            async move { node.call::<(i64, i64)>("downgrade", inv).await }
        }))
        .await;
        let (mut done, mut refused, mut fence) = (Vec::new(), 0, 0);
        for reply in &replies {
            match reply {
                Ok(((1, f), sent)) => {
                    done.push(*sent + claim.ttl());
                    fence = fence.max(*f);
                }
                Ok(_) => refused += 1,
                Err(_) => {}
            }
        }
        let (n, q, succeeded) = (self.inner.nodes.len(), self.inner.quorum, done.len());
        match held_until(done, q) {
            // Each node keeps the token the grant settled there, the quorum's `T`.
            Some(valid_until) => Ok(Grant::new(fence_of("redis", fence)?, valid_until)),
            None if refused > n - q => Err(Error::lost(claim.key())),
            None => Err(self.no_quorum(succeeded, "downgrade")),
        }
    }

    /// Subscribes the claim to its channel on every node where it is not yet, each within the
    /// node timeout; a node skipped as down is passed over at once, and one whose pub/sub is
    /// down after the node timeout (its grants are found by the re-check at the holder's
    /// deadline instead).
    async fn subscribe_all(&self, ticket: &RedlockTicket, keys: &Keys) {
        let tickets = ticket.nodes(self.inner.nodes.len());
        let calls = self
            .inner
            .nodes
            .iter()
            .zip(tickets)
            .map(|(node, nt)| async move {
                if nt.is_listening() || node.skipped() {
                    return;
                }
                let sub = match node.hub.subscribe_if_ready(keys.channel(), keys.owner()) {
                    Some(sub) => Some(sub),
                    None => tokio::time::timeout(
                        self.inner.node_timeout,
                        node.hub.subscribe(keys.channel(), keys.owner()),
                    )
                    .await
                    .ok()
                    .and_then(Result::ok),
                };
                nt.set(sub);
            });
        join_all(calls).await;
    }

    /// Whether the claim is subscribed on every node not skipped as down, registering it where
    /// the channel is subscribed already (no I/O).
    fn subscribed_everywhere(&self, ticket: &RedlockTicket, keys: &Keys) -> bool {
        let tickets = ticket.nodes(self.inner.nodes.len());
        let mut all = true;
        for (node, nt) in self.inner.nodes.iter().zip(tickets) {
            if !nt.is_listening() {
                let sub = node.hub.subscribe_if_ready(keys.channel(), keys.owner());
                all &= sub.is_some() || node.skipped();
                nt.set(sub);
            }
        }
        all
    }
}

/// A round over every node, subscribed on each.
impl Listener for Asking<'_, RedlockBackend, RedlockTicket, Keys> {
    async fn ask(&self, wait: bool) -> Result<Attempt> {
        self.backend
            .round(self.claim, self.ticket, self.names, wait)
            .await
    }

    fn listening(&self) -> bool {
        self.backend.subscribed_everywhere(self.ticket, self.names)
    }

    async fn listen(&self) -> Result<Option<Attempt>> {
        self.backend.subscribe_all(self.ticket, self.names).await;
        Ok(None)
    }

    /// Unsubscribes on every node (the round that settled the grant did already, in
    /// [`RedlockTicket::holds`]).
    fn stop_listening(&self) {
        self.ticket.unsubscribe();
    }
}
