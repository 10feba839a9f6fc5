//! The queue every claim joins: create our node (once, protection mode after a lost reply),
//! list, and either hold or watch the one node we wait for.
//!
//! Why a listing never grants early, even from a lagging follower: every listing that can
//! grant comes after our own create on the same session, and a server answers a session only
//! once it has applied everything that session has seen (its own writes included; the client
//! sends its last zxid when it reconnects, and a server behind it refuses). Every node that
//! was ahead of ours was created before ours, so it is in the list; a stale list can only
//! show a node that has already gone, which makes us wait longer, never less. So no `sync`
//! is needed before listing. A semaphore's lease count follows the same rule: our lease
//! nodes are created after the admission node ahead of ours was deleted, which was after its
//! owner's lease nodes were created.

use std::sync::Arc;

use tokio::time::{sleep_until, Instant};

use super::client::{Failure, Fired};
use super::recipe::{self, Other, Place};
use super::session::Up;
use super::ticket::{fence, lock_path, parent_paths, queue_path, Node, Step, Waiting, ZkTicket};
use super::wait::watch_ahead;
use super::Inner;
use crate::backend::{wire, Attempt, Claim, Grant, LockKind};
use crate::error::Result;

impl Inner {
    /// The node a create with a lost reply made, found by its protection prefix.
    pub(super) async fn find_ours(
        &self,
        up: &Up,
        lock_path: &str,
        uuid: &str,
    ) -> std::result::Result<Option<String>, Failure> {
        let prefix = recipe::protection_prefix(uuid);
        match up.zk.children(lock_path).await {
            Ok(kids) => Ok(kids.into_iter().find(|k| k.starts_with(&prefix))),
            Err(Failure::NoNode) => Ok(None),
            Err(f) => Err(f),
        }
    }

    /// Creates `lock_path` and its missing ancestors, as containers.
    pub(super) async fn create_parents(&self, up: &Up, lock_path: &str) -> Result<()> {
        let mut at = 0;
        while let Some(next) = lock_path[at + 1..].find('/').map(|i| i + at + 1) {
            self.create_parent(up, &lock_path[..next]).await?;
            at = next;
        }
        self.create_parent(up, lock_path).await
    }

    async fn create_parent(&self, up: &Up, path: &str) -> Result<()> {
        match up.zk.create_parent(path).await {
            Ok(()) | Err(Failure::NodeExists) => Ok(()),
            Err(f) => Err(f.into_error(&format!("create {path}"))),
        }
    }

    /// Nodes (or creates in doubt) from an older session are gone or about to go: hand them to
    /// the guaranteed deletes (in case the session survived after all) and draw new protection
    /// UUIDs. Nothing is forgotten before it is handed over.
    fn discard_stale(&self, claim: &Claim, ticket: &ZkTicket, epoch: u64) {
        let mut t = ticket.lock();
        let stale = t.node.take_if(|n| n.epoch != epoch);
        let doubt = match t.unsure {
            Some(e) if e != epoch => t.uuid.clone(),
            _ => None,
        };
        if let Some(stale) = &stale {
            self.hub.doom(&stale.path);
        }
        if let Some(uuid) = &doubt {
            self.hub.doom_doubt(&queue_path(claim), uuid);
        }
        if stale.is_some() || doubt.is_some() {
            t.unsure = None;
            t.uuid = Some(uuid::Uuid::new_v4().hyphenated().to_string());
        }
        let leases = &mut t.leases;
        if leases.admitted.is_some_and(|e| e != epoch) {
            leases.admitted = None;
        }
        let stale_leases = leases.nodes.first().is_some_and(|n| n.epoch != epoch);
        if stale_leases {
            for node in std::mem::take(&mut leases.nodes) {
                self.hub.doom(&node.path);
            }
        }
        let lease_doubt = match leases.unsure {
            Some(e) if e != epoch => leases.uuid.clone(),
            _ => None,
        };
        if let Some(uuid) = &lease_doubt {
            self.hub
                .doom_doubt(&super::ticket::leases_path(claim), uuid);
        }
        if stale_leases || lease_doubt.is_some() {
            leases.unsure = None;
            leases.uuid = None;
        }
    }

    /// The claim's node: the one it has, the one a create with a lost reply made (protection
    /// mode: looked up before making another), or a new one.
    async fn ensure_node(
        &self,
        claim: &Claim,
        ticket: &ZkTicket,
        up: &Up,
        lock_path: &str,
    ) -> Result<Step<Node>> {
        let epoch = up.conn.epoch;
        let (node, unsure, uuid) = {
            let mut t = ticket.lock();
            let uuid = t
                .uuid
                .get_or_insert_with(|| claim.owner().to_owned())
                .clone();
            (t.node.clone(), t.unsure.is_some(), uuid)
        };
        if let Some(node) = node {
            return Ok(Step::Ready(node));
        }
        let found = if unsure {
            match self.find_ours(up, lock_path, &uuid).await {
                Ok(found) => found,
                Err(f @ Failure::Unknown(_)) => return Ok(Step::Again(Some(f))),
                Err(f) => return Err(f.into_error(&format!("list {lock_path}"))),
            }
        } else {
            None
        };
        let made = match found {
            Some(name) => {
                let path = format!("{lock_path}/{name}");
                match up.zk.exists(&path).await {
                    Ok(Some(stat)) => Ok((path, stat)),
                    Ok(None) => Err(Failure::NoNode),
                    Err(f) => Err(f),
                }
            }
            None => {
                ticket.lock().unsure = Some(epoch);
                self.hub.doubt(epoch, lock_path, &uuid);
                let prefix = format!("{lock_path}/{}", recipe::node_prefix(&uuid, claim.kind()));
                let sent = Instant::now();
                // A latch participant's node carries its id, as Curator's `LeaderLatch` does.
                let value = claim.value();
                let made = up.zk.create_lock_node(&prefix, &value).await;
                if made.is_ok() {
                    self.hub.acked(epoch, sent, true);
                }
                made
            }
        };
        match made {
            Ok((path, stat)) => {
                let node = Node::new(path, stat, epoch);
                self.hub.made(epoch, &node.path);
                self.hub.settled(&uuid);
                {
                    let mut t = ticket.lock();
                    t.unsure = None;
                    t.node = Some(node.clone());
                }
                // An admission node carries no grant: nothing to guard.
                if !matches!(claim.kind(), LockKind::Permits { .. }) {
                    self.guard_node(claim, &node);
                }
                Ok(Step::Ready(node))
            }
            Err(Failure::NoNode) => {
                ticket.lock().unsure = None;
                self.hub.settled(&uuid);
                self.create_parents(up, lock_path).await?;
                Ok(Step::Again(None))
            }
            Err(f @ Failure::Unknown(_)) => Ok(Step::Again(Some(f))),
            Err(f) => {
                ticket.lock().unsure = None;
                self.hub.settled(&uuid);
                Err(f.into_error(&format!("create in {lock_path}")))
            }
        }
    }

    /// The instant a grant on `up` counts its lease from: the one the leader is known to have
    /// heard from the session at or after ([`super::proof`]), if it leaves enough of a lease
    /// ([`Proof::lasting`](super::proof::Proof::lasting)). Otherwise, after a quiet spell, a
    /// quorum `check` of our node proves the last request we made, once it may: it is sent
    /// a report interval (under a tick) after that request's ack, so it costs that wait. If
    /// the last request is too old to prove anything useful, the check itself is then proven
    /// by a second one. Three checks at most; a lease that is still short after them is short
    /// but valid (the layer above asks again if it is too short to use).
    ///
    /// Cancel safe: it only sleeps and checks; the node is the claim's, released with it.
    pub(super) async fn proof(
        &self,
        up: &Up,
        node: &Node,
    ) -> std::result::Result<Instant, Failure> {
        let epoch = up.conn.epoch;
        let changed = || Failure::Unknown("the session changed".into());
        for _ in 0..3 {
            let proof = self.hub.proof(epoch).ok_or_else(changed)?;
            if proof.lasting(Instant::now()) {
                return Ok(proof.proven());
            }
            if let Some(at) = proof.provable_at() {
                tracing::debug!(
                    path = %node.path,
                    wait = ?at.saturating_duration_since(Instant::now()),
                    "zookeeper: the session was quiet; proving it fresh at the leader before the grant"
                );
                sleep_until(at).await;
            }
            let sent = Instant::now();
            let checked = up.zk.check(std::slice::from_ref(&node.path)).await;
            match checked.into_iter().next() {
                Some(Ok(())) => self.hub.acked(epoch, sent, true),
                Some(Err(f)) => return Err(f),
                None => return Err(Failure::Unknown("no check result".into())),
            }
        }
        self.hub.proven(epoch).ok_or_else(changed)
    }

    /// Watches our own node from the moment it exists (the request goes out without delaying
    /// the acquisition): if it is deleted behind our back while we hold the lock, the lock is
    /// marked lost at once rather than at the next renewal. The watch ends when the node goes
    /// (our own delete included: the claim is no longer registered as held by then), or with
    /// the session; it is never removed early, which would cost a request.
    pub(super) fn guard_node(&self, claim: &Claim, node: &Node) {
        let hub = Arc::downgrade(&self.hub);
        let (claim, path, epoch) = (claim.clone(), node.path.clone(), node.epoch);
        tokio::spawn(async move {
            loop {
                let watch = {
                    let Some(up) = hub.upgrade().and_then(|h| h.current()) else {
                        return;
                    };
                    if up.conn.epoch != epoch {
                        return;
                    }
                    up.zk.watch(&path).await
                };
                match watch {
                    Ok(watch) => match watch.await {
                        Fired::Deleted => break,
                        // Curator's revocation request, or someone's data: not a loss.
                        Fired::Changed => {}
                        // The hub marks every lock of a lost session.
                        Fired::SessionEnded => return,
                    },
                    Err(Failure::NoNode) => break,
                    // Renewal and the hub cover a session in trouble.
                    Err(_) => return,
                }
            }
            // A waiter whose node vanished finds out when it lists again; a node that no longer
            // carries the grant (a downgrade's write node, an admission node) is no loss.
            if hub.upgrade().is_some_and(|h| h.holds_by(&claim, &path)) {
                tracing::warn!(
                    key = claim.key(),
                    "lock lost: our zookeeper node was deleted"
                );
                claim.mark_lost();
            }
        });
    }

    /// Records the grant, carried by `nodes`; false if the session was lost meanwhile.
    pub(super) fn granted(&self, claim: &Claim, ticket: &ZkTicket, nodes: &[Node]) -> bool {
        let Some(epoch) = nodes.first().map(|n| n.epoch) else {
            return false;
        };
        let paths = nodes.iter().map(|n| n.path.clone()).collect();
        if !self.hub.register(claim, epoch, paths) {
            return false;
        }
        ticket.lock().granted = true;
        true
    }

    pub(super) async fn acquire(
        &self,
        claim: &Claim,
        ticket: &ZkTicket,
        wait: bool,
    ) -> Result<Attempt> {
        let kind = claim.kind();
        if kind == LockKind::Leader {
            recipe::validate_value(claim.key(), &claim.value())?;
        }
        let queue = queue_path(claim);
        {
            let mut t = ticket.lock();
            if !std::mem::replace(&mut t.entered, true) {
                for parent in parent_paths(claim) {
                    self.parents.enter(&parent);
                }
            }
            t.waiting = None;
        }
        let give_up = Instant::now() + self.hub.now().timeout;
        let mut last: Option<Failure> = None;
        loop {
            if Instant::now() >= give_up {
                let why = last.map_or("no progress".into(), |f| f.to_string());
                return Err(Failure::Unknown(why).into_error(&format!("lock {queue}")));
            }
            let up = self.hub.until_up(self.hub.now().timeout).await?;
            let conn = up.conn;

            self.discard_stale(claim, ticket, conn.epoch);
            let node = match self.ensure_node(claim, ticket, &up, &queue).await? {
                Step::Ready(node) => node,
                Step::Again(failure) => {
                    last = failure.or(last);
                    continue;
                }
            };
            if let LockKind::Permits { count, max } = kind {
                if ticket.lock().leases.admitted == Some(conn.epoch) {
                    match self
                        .take_leases(claim, ticket, &up, count, max, wait)
                        .await?
                    {
                        Step::Ready(attempt) => return Ok(attempt),
                        Step::Again(failure) => {
                            last = failure.or(last);
                            continue;
                        }
                    }
                }
            }

            let unchecked = ticket.lock().family_checked.as_deref() != Some(node.path.as_str());
            if matches!(kind, LockKind::Permits { .. }) && unchecked {
                // Before admission, so that no read stands between admission and the lease
                // create (a mutex or read-write claim checks its own listing instead).
                match self.no_other_family(&up, claim).await {
                    Ok(None) => ticket.lock().family_checked = Some(node.path.clone()),
                    Ok(Some(other)) => return Err(self.refuse(claim, ticket, other).await),
                    Err(f) => {
                        self.again(ticket, &node, f, &mut last, || format!("list {queue}"))?;
                        continue;
                    }
                }
            }
            let mut kids = match up.zk.children(&queue).await {
                Ok(kids) => kids,
                Err(f) => {
                    self.again(ticket, &node, f, &mut last, || format!("list {queue}"))?;
                    continue;
                }
            };
            recipe::sort(kind, &mut kids);
            if !matches!(kind, LockKind::Permits { .. }) && unchecked {
                match self.other_family(&up, claim, &node, &kids).await {
                    Ok(None) => ticket.lock().family_checked = Some(node.path.clone()),
                    Ok(Some(other)) => return Err(self.refuse(claim, ticket, other).await),
                    Err(f) => {
                        self.again(ticket, &node, f, &mut last, || format!("list {queue}"))?;
                        continue;
                    }
                }
            }
            match recipe::place(kind, &kids, &node.name) {
                Place::Missing => {
                    // Deleted behind our back, or its session ended: queue again.
                    self.forget_node(ticket, &node);
                }
                Place::Head if matches!(kind, LockKind::Permits { .. }) => {
                    // First in the admission queue: on to the leases.
                    ticket.lock().leases.admitted = Some(conn.epoch);
                }
                Place::Head => {
                    let since = match self.proof(&up, &node).await {
                        Ok(at) => at,
                        Err(f) => {
                            self.again(ticket, &node, f, &mut last, || {
                                format!("check {}", node.path)
                            })?;
                            continue;
                        }
                    };
                    if !self.granted(claim, ticket, std::slice::from_ref(&node)) {
                        continue;
                    }
                    return Ok(Attempt::Granted(Grant::new(
                        fence(&node.stat)?,
                        since + conn.timeout,
                    )));
                }
                Place::Behind { .. } if !wait => {
                    // A try leaves nothing behind.
                    self.withdraw(claim, ticket).await;
                    return Ok(Attempt::Queued { recheck_at: None });
                }
                Place::Behind {
                    predecessor,
                    granted_when_gone,
                } => match up.zk.watch(&format!("{queue}/{predecessor}")).await {
                    Ok(fired) => {
                        let ahead = match watch_ahead(&up, &queue, kind, &kids, predecessor).await {
                            Ok(ahead) => ahead,
                            // Gone already: list again, the predecessor may be first now.
                            Err(Failure::NoNode) => continue,
                            // Without it, we list once the predecessor goes, as Curator does.
                            Err(_) => None,
                        };
                        ticket.lock().waiting = Some(Waiting {
                            fired,
                            granted_when_gone,
                            predecessor: predecessor.to_owned(),
                            ahead,
                            seen: conn.changes,
                        });
                        return Ok(Attempt::Queued { recheck_at: None });
                    }
                    // Gone between the listing and the watch: list again.
                    Err(Failure::NoNode) => {}
                    Err(f @ Failure::Unknown(_)) => last = Some(f),
                    Err(f) => return Err(f.into_error(&format!("watch in {queue}"))),
                },
            }
        }
    }

    /// Another family of lock in use on the lock node, seen among its children. A
    /// semaphore's `locks` and `leases` nodes count only while they have children (they are
    /// containers, and may linger empty for a while).
    pub(super) async fn other_family(
        &self,
        up: &Up,
        claim: &Claim,
        node: &Node,
        kids: &[String],
    ) -> std::result::Result<Option<Other>, Failure> {
        let earlier = recipe::made_before(kids, &node.name);
        let base = lock_path(claim);
        match other_family_at(up, &base, claim.kind(), &earlier).await? {
            // Only a semaphore node made before ours counts (they have no place in the key's
            // sequence: their creation order says it).
            Some(Other::Semaphore) => {
                for part in [recipe::ADMISSION, recipe::LEASES] {
                    let at = format!("{base}/{part}");
                    let inner = match up.zk.children(&at).await {
                        Ok(inner) => inner,
                        Err(Failure::NoNode) => continue,
                        Err(f) => return Err(f),
                    };
                    for name in inner {
                        match up.zk.exists(&format!("{at}/{name}")).await {
                            Ok(Some(stat)) if stat.czxid < node.stat.czxid => {
                                return Ok(Some(Other::Semaphore))
                            }
                            Ok(_) | Err(Failure::NoNode) => {}
                            Err(f) => return Err(f),
                        }
                    }
                }
                Ok(None)
            }
            other => Ok(other),
        }
    }

    /// Removes every trace of a claim that is giving up without an error (a try that found the
    /// lock busy): the layer above will not release it.
    pub(super) async fn withdraw(&self, claim: &Claim, ticket: &ZkTicket) {
        if let Err(e) = self.release(claim, ticket).await {
            tracing::debug!(key = claim.key(), error = %e, "zookeeper: withdrawing a try");
        }
    }

    /// Triage of a failed call on our node inside the acquire loop: `Ok` to go round again
    /// (the node is gone, so queue with a new one; or the outcome is unknown, so retry), `Err`
    /// for anything the server refused.
    pub(super) fn again(
        &self,
        ticket: &ZkTicket,
        node: &Node,
        failure: Failure,
        last: &mut Option<Failure>,
        what: impl FnOnce() -> String,
    ) -> Result<()> {
        match failure {
            Failure::NoNode => {
                self.forget_node(ticket, node);
                Ok(())
            }
            f @ Failure::Unknown(_) => {
                *last = Some(f);
                Ok(())
            }
            f => Err(f.into_error(&what())),
        }
    }

    /// Refuses the claim: the key is `other`'s. Our node goes before the refusal returns, so
    /// nothing of the claim is seen after it (else the layer above releases it).
    async fn refuse(&self, claim: &Claim, ticket: &ZkTicket, other: Other) -> crate::Error {
        let _ = self.release(claim, ticket).await;
        wire::mismatch(claim.key(), other, claim.kind())
    }

    /// Our node is gone: queue again with a new one.
    pub(super) fn forget_node(&self, ticket: &ZkTicket, node: &Node) {
        ticket.lock().node = None;
        self.hub.gone(&node.path);
    }
}

/// [`Inner::other_family`] for a `kind` claim on the lock node `base`, whose children are
/// `kids`.
pub(super) async fn other_family_at(
    up: &Up,
    base: &str,
    kind: LockKind,
    kids: &[String],
) -> std::result::Result<Option<Other>, Failure> {
    match recipe::other_family(kind, kids) {
        Some(Other::Semaphore) => {
            for part in [recipe::ADMISSION, recipe::LEASES] {
                match up.zk.children(&format!("{base}/{part}")).await {
                    Ok(inner) if !inner.is_empty() => return Ok(Some(Other::Semaphore)),
                    Ok(_) | Err(Failure::NoNode) => {}
                    Err(f) => return Err(f),
                }
            }
            Ok(None)
        }
        other => Ok(other),
    }
}
