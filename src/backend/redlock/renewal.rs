//! Renewal: each node renews its share of a round's leases in one call; a lease holds while a
//! majority renewed it.

use std::sync::atomic::Ordering;

use futures::future::join_all;

use super::keys::Keys;
use super::library;
use super::quorum::held_until;
use super::scripts::{Renew, RenewMode};
use super::{RedlockBackend, RedlockTicket};
use crate::backend::handoff::renewal::RenewAnswer;
use crate::backend::redis::kind_code;
use crate::backend::redis::scripts::Renewed;
use crate::backend::{Claim, Renewal, MIN_RENEW_CALL};

impl RedlockBackend {
    pub(super) async fn renew_claims(&self, claims: &[(&Claim, &RedlockTicket)]) -> Vec<Renewal> {
        let n = self.inner.nodes.len();
        let q = self.inner.quorum;
        let keys: Vec<Keys> = claims
            .iter()
            .map(|(claim, _)| Keys::new(claim, &self.inner.client_id))
            .collect();
        let mut args = Renew::default();
        for ((claim, ticket), keys) in claims.iter().zip(&keys) {
            let mode = match (ticket.held.load(Ordering::Acquire), kind_code(claim.kind())) {
                (true, None) => RenewMode::Mutex,
                (true, Some(_)) => RenewMode::Shared,
                (false, _) => RenewMode::Waiting,
            };
            let renewed = Renewed {
                keys,
                ttl: claim.ttl(),
            };
            args.claims.push((renewed, mode));
        }
        let inv = library::call(&args);
        // Bounded per node, within half the window the renewal engine gives the whole call (a
        // third of the shortest TTL, at least 50 ms), so one silent node cannot hold up the
        // others' answers until the engine gives up on all of them.
        let limit = claims
            .iter()
            .map(|(c, _)| c.ttl() / 3)
            .min()
            .unwrap_or_default()
            .max(MIN_RENEW_CALL)
            / 2;
        let per_node = join_all(self.inner.nodes.iter().map(|node| {
            let inv = &inv;
            async move {
                match node.call_within::<Vec<i64>>(limit, "renew", inv).await {
                    Ok((r, sent)) if r.len() == claims.len() => Some((r, sent)),
                    _ => None,
                }
            }
        }))
        .await;
        claims
            .iter()
            .enumerate()
            .map(|(i, (claim, _))| {
                let mut extended = Vec::new();
                let (mut kept, mut refused) = (None, 0);
                for (r, sent) in per_node.iter().flatten() {
                    // A claim whose keys a node could not read counts for nothing there.
                    match r.get(i).and_then(|&code| RenewAnswer::of_code(code)) {
                        Some(RenewAnswer::Lease) => extended.push(*sent + claim.ttl()),
                        Some(RenewAnswer::Place) => kept = Some(*sent + claim.ttl()),
                        Some(RenewAnswer::Neither) => refused += 1,
                        None => {}
                    }
                }
                let succeeded = extended.len();
                if let Some(until) = held_until(extended, q) {
                    Renewal::Extended(until)
                } else if let Some(until) = kept {
                    Renewal::Queued(until)
                } else if refused > n - q {
                    Renewal::NotOwner
                } else {
                    Renewal::Failed(self.no_quorum(succeeded, "renew"))
                }
            })
            .collect()
    }
}
