//! Elections on Redlock: a leadership claim is a Redlock mutex claim (the same quorum acquire,
//! waiting, renewal, and the quorum's fencing token as the term) whose hold on each node says
//! it is an election's and carries the value, as on a single Redis node (`redis/election.rs`).
//!
//! A candidate's fresh grant on a node carries its value at once; a lead handed to a waiting
//! candidate is provisional on that node (`?`) until its client settles the quorum
//! (`settle.lua`), which writes the value there. A lead counts only once a majority of nodes
//! hold it confirmed under one owner and one term: [`leader`](RedlockBackend::leader_of) reads
//! every node and reports nobody unless they do, so a candidate that died in line, or a
//! minority's hold, is never reported. Each node publishes its changes on the election's
//! channel, `<lock>:e`; an observer listens on every node (two majorities share a node, so
//! a majority of subscriptions hears every change of leader) and re-reads after any node's
//! reconnect.

use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use tokio::sync::{mpsc, watch};
use tokio::time::timeout;

use super::keys::Keys;
use super::library;
use super::{RedlockBackend, RedlockTicket};
use crate::backend::redis::election::{channel_of, parse_leader, HeldLead, MAX_VALUE_LEN};
use crate::backend::redis::notify::PubSubHub;
use crate::backend::redis::scripts::{LeaderOf, Proclaim};
use crate::backend::retry::Backoff;
use crate::backend::wire::check_value_len;
use crate::backend::{Claim, Leader, LeaderWatch};
use crate::error::{Error, ErrorKind, Result};

/// The first and the longest pause before an observer's subscription on a node that refused it
/// is tried again.
const RESUBSCRIBE_MIN: Duration = Duration::from_millis(25);
const RESUBSCRIBE_MAX: Duration = Duration::from_secs(1);

/// Refuses a value larger than a node holds (the single-node limit), before any I/O.
pub(super) fn validate_value(key: &str, value: &[u8]) -> Result<()> {
    check_value_len("redlock", key, value, MAX_VALUE_LEN)
}

impl RedlockBackend {
    /// Publishes the claim's value on every node where it leads; done once a majority took it.
    pub(super) async fn proclaim_claim(
        &self,
        claim: &Claim,
        _ticket: &RedlockTicket,
    ) -> Result<()> {
        let value = claim.value();
        validate_value(claim.key(), &value)?;
        let keys = Keys::new(claim, &self.inner.client_id);
        let inv = library::call(&Proclaim {
            keys: &keys,
            value: &value,
        });
        let replies = join_all(self.inner.nodes.iter().map(|node| {
            let inv = &inv;
            async move { node.call::<i64>("proclaim", inv).await }
        }))
        .await;
        let leads = replies.iter().filter(|r| matches!(r, Ok((1, _)))).count();
        let failed = replies.iter().filter(|r| r.is_err()).count();
        let (n, q) = (self.inner.nodes.len(), self.inner.quorum);
        let refused = n - failed - leads;
        if leads >= q {
            Ok(())
        } else if refused > n - q {
            // A majority says we do not lead.
            Err(Error::lost(claim.key()))
        } else {
            Err(self.no_quorum(leads, "proclaim"))
        }
    }

    /// Who leads the election `key` of `namespace`: the confirmed leader a majority of nodes
    /// agree on (one owner, one term), or nobody.
    pub(super) async fn leader_of(&self, namespace: &str, key: &str) -> Result<Option<Leader>> {
        let keys = Keys::named(namespace, key, &self.inner.client_id, "");
        let inv = library::call(&LeaderOf { keys: &keys });
        let replies = join_all(self.inner.nodes.iter().map(|node| {
            let inv = &inv;
            async move { node.call::<Vec<::redis::Value>>("leader", inv).await }
        }))
        .await;
        let (mut leads, mut failed, mut first_error) = (Vec::new(), 0, None);
        for reply in replies {
            match reply {
                Ok((reply, _)) => leads.extend(parse_leader(key, &reply)?),
                Err(e) => {
                    failed += 1;
                    first_error.get_or_insert(e);
                }
            }
        }
        let (n, q) = (self.inner.nodes.len(), self.inner.quorum);
        let with_cause = |err: Error| match first_error {
            Some(cause) => err.with_source(cause),
            None => err,
        };
        if failed > n - q {
            return Err(with_cause(self.no_quorum(n - failed, "leader")));
        }
        match agreed(leads, q, failed) {
            Agreed::Leader(leader) => Ok(Some(leader)),
            Agreed::Nobody => Ok(None),
            // A quorum answered, but the nodes that did not could tip it either way.
            Agreed::Undecided => Err(with_cause(
                Error::new(
                    ErrorKind::Backend,
                    format!(
                        "redlock leader: {} of {n} nodes answered, and no quorum ({q}) of \
                         them agrees on one leader; the {failed} that did not answer could \
                         make one",
                        n - failed
                    ),
                )
                .transient(),
            )),
            Agreed::ValueUndecided => Err(with_cause(
                Error::new(
                    ErrorKind::Backend,
                    format!(
                        "redlock leader: {} of {n} nodes answered and agree on the leader, but \
                         no quorum ({q}) of them holds one value; the {failed} that did not \
                         answer could hold the last one proclaimed",
                        n - failed
                    ),
                )
                .transient(),
            )),
        }
    }

    /// A signal that moves at every message on the election's channel of any node, and
    /// whenever one node's messages may have been missed (its reconnect, a subscription it
    /// ended, a node subscribed late). Subscribed on a majority before this returns (each node
    /// within the node timeout; the others join in the background), so no change of leader
    /// made after this call is missed.
    pub(super) async fn watch_leader_of(&self, namespace: &str, key: &str) -> Result<LeaderWatch> {
        let keys = Keys::named(namespace, key, &self.inner.client_id, "");
        let channel: Arc<str> = channel_of(&keys).into();
        let (tx, rx) = watch::channel(0u64);
        let tx = Arc::new(tx);
        let n = self.inner.nodes.len();
        let (ready_tx, mut ready) = mpsc::channel(n);
        for node in &self.inner.nodes {
            tokio::spawn(follow(
                node.hub.clone(),
                channel.clone(),
                tx.clone(),
                ready_tx.clone(),
            ));
        }
        drop(ready_tx);
        let mut subscribed = 0;
        let _ = timeout(self.inner.node_timeout, async {
            while subscribed < n && ready.recv().await.is_some() {
                subscribed += 1;
            }
        })
        .await;
        if subscribed < self.inner.quorum {
            // Dropping the receiver ends the tasks.
            return Err(self.no_quorum(subscribed, "observe"));
        }
        Ok(LeaderWatch::new(rx))
    }
}

/// Follows the election's channel on one node for as long as anyone holds the watch `tx`
/// moves: says on `ready` once subscribed, then moves `tx` at every move of the node's own
/// counter. A node it cannot subscribe on is tried again with a growing pause; subscribed late,
/// it moves `tx` (a change may have been missed meanwhile).
async fn follow(
    hub: PubSubHub,
    channel: Arc<str>,
    tx: Arc<watch::Sender<u64>>,
    ready: mpsc::Sender<()>,
) {
    let mut pause = Backoff::new(RESUBSCRIBE_MIN, RESUBSCRIBE_MAX);
    let mut ready = Some(ready);
    let (mut changes, _subscription) = loop {
        tokio::select! {
            watched = hub.watch(&channel) => match watched {
                Ok(watched) => break watched,
                Err(e) => {
                    tracing::debug!(%channel, %e, "redlock: observing an election on a node failed; trying again");
                }
            },
            () = tx.closed() => return,
        }
        // Late from here on: the caller went on without this node.
        ready = None;
        tokio::select! {
            () = tokio::time::sleep(pause.current()) => pause.grow(),
            () = tx.closed() => return,
        }
    };
    match ready {
        Some(ready) => {
            let _ = ready.send(()).await;
        }
        None => tx.send_modify(|n| *n += 1),
    }
    loop {
        tokio::select! {
            moved = changes.changed() => {
                if moved.is_err() {
                    // The node's hub is gone (the backend shut down).
                    return;
                }
                tx.send_modify(|n| *n += 1);
            }
            () = tx.closed() => return,
        }
    }
}

/// What the nodes' leaders say together.
#[derive(Debug)]
enum Agreed {
    /// A majority holds one confirmed lead (one owner, one term).
    Leader(Leader),
    /// No majority does, and the nodes that did not answer could not make one.
    Nobody,
    /// No majority does among the nodes that answered, but the `unknown` ones could make one.
    Undecided,
    /// A majority holds one lead, but its value is held by no majority of the nodes that
    /// answered, and the `unknown` ones could tip it (a proclaim that reached a majority may be
    /// on them).
    ValueUndecided,
}

/// The leader `q` of the nodes agree on, from the confirmed leads the nodes that answered
/// hold (`leads`, in node order), with `unknown` nodes not heard; its lease what the `q`-th
/// longest of theirs has left.
///
/// Its value: the one `q` of those nodes hold. A proclaim that succeeded reached `q` nodes, and
/// any two sets of `q` nodes share one, so once it did no earlier value is on `q` nodes: that
/// value is the last proclaim that took (or a later one on its way). Where no value is on `q`
/// of the nodes that answered and the unknown ones could put one there, the read cannot tell
/// ([`Agreed::ValueUndecided`]). Where they could not (every node that can answer did, and a
/// proclaim is half way), the value most of them hold, the earliest node's on a tie.
fn agreed(leads: Vec<HeldLead>, q: usize, unknown: usize) -> Agreed {
    let mut groups: Vec<Vec<HeldLead>> = Vec::new();
    for lead in leads {
        match groups
            .iter_mut()
            .find(|g| g[0].owner == lead.owner && g[0].term == lead.term)
        {
            Some(group) => group.push(lead),
            None => groups.push(vec![lead]),
        }
    }
    let Some(group) = groups.into_iter().max_by_key(Vec::len) else {
        return if unknown >= q {
            Agreed::Undecided
        } else {
            Agreed::Nobody
        };
    };
    if group.len() < q {
        return if group.len() + unknown >= q {
            Agreed::Undecided
        } else {
            Agreed::Nobody
        };
    }
    let mut leases: Vec<Duration> = group.iter().map(|l| l.lease_left).collect();
    leases.sort_unstable_by(|a, b| b.cmp(a));
    let lease_left = leases.get(q - 1).copied().unwrap_or_default();
    let term = group[0].term;
    let count = |v: &[u8]| group.iter().filter(|l| l.value == v).count();
    let mut best = &group[0].value;
    for lead in &group {
        if count(&lead.value) > count(best) {
            best = &lead.value;
        }
    }
    if count(best) < q && unknown > 0 {
        return Agreed::ValueUndecided;
    }
    Agreed::Leader(Leader::new(best.clone(), term, lease_left))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lead(owner: &str, term: u64, value: &str, left_ms: u64) -> HeldLead {
        HeldLead {
            term,
            lease_left: Duration::from_millis(left_ms),
            value: value.as_bytes().to_vec(),
            owner: owner.to_owned(),
        }
    }

    #[test]
    fn a_majority_under_one_owner_and_term_leads() {
        let leads = vec![lead("a", 7, "x", 900), lead("a", 7, "x", 800)];
        let Agreed::Leader(l) = agreed(leads, 2, 1) else {
            panic!("no leader")
        };
        assert_eq!((l.term(), l.value()), (7, &b"x"[..]));
        assert_eq!(l.lease_left(), Duration::from_millis(800));
    }

    #[test]
    fn a_minority_never_leads() {
        // One node of three holds a, the others answered nobody.
        assert!(matches!(
            agreed(vec![lead("a", 7, "x", 900)], 2, 0),
            Agreed::Nobody
        ));
        // ... or one did not answer: it could be a's.
        assert!(matches!(
            agreed(vec![lead("a", 7, "x", 900)], 2, 1),
            Agreed::Undecided
        ));
        // Same owner, two terms; same term, two owners: no agreement.
        let split = vec![lead("a", 7, "x", 900), lead("a", 8, "x", 900)];
        assert!(matches!(agreed(split, 2, 0), Agreed::Nobody));
        let split = vec![lead("a", 7, "x", 900), lead("b", 7, "y", 900)];
        assert!(matches!(agreed(split, 2, 0), Agreed::Nobody));
    }

    #[test]
    fn a_proclaim_half_way_reports_the_value_most_nodes_hold() {
        let leads = vec![
            lead("a", 7, "old", 900),
            lead("a", 7, "new", 900),
            lead("a", 7, "new", 900),
        ];
        let Agreed::Leader(l) = agreed(leads, 3, 0) else {
            panic!("no leader")
        };
        assert_eq!(l.value(), b"new");
    }

    #[test]
    fn a_value_on_no_quorum_is_undecided_while_nodes_are_unheard() {
        // Five nodes: a proclaim of "new" took on 0-2; 2-4 answer.
        let leads = vec![
            lead("a", 7, "new", 900),
            lead("a", 7, "old", 900),
            lead("a", 7, "old", 900),
        ];
        assert!(matches!(agreed(leads, 3, 2), Agreed::ValueUndecided));
        // A value on a quorum of the nodes that answered is the last that took.
        let leads = vec![
            lead("a", 7, "new", 900),
            lead("a", 7, "new", 900),
            lead("a", 7, "new", 900),
            lead("a", 7, "old", 900),
        ];
        let Agreed::Leader(l) = agreed(leads, 3, 1) else {
            panic!("no leader")
        };
        assert_eq!(l.value(), b"new");
    }
}
