//! A held claim: renewal, release, and a write lock's downgrade.

use tokio::time::Instant;

use super::client::Failure;
use super::recipe;
use super::ticket::{fence, leases_path, lock_path, parent_paths, queue_path, Node, ZkTicket};
use super::Inner;
use crate::backend::{Claim, Grant, Renewal};
use crate::error::{Error, ErrorKind, Result};

impl Inner {
    pub(super) async fn release(&self, claim: &Claim, ticket: &ZkTicket) -> Result<bool> {
        self.hub.unregister(claim);
        let (node, leases, doubts, downgrade, granted, entered) = {
            let mut t = ticket.lock();
            t.waiting = None;
            let mut doubts = Vec::new();
            if let Some(uuid) = t.unsure.take().and(t.uuid.clone()) {
                doubts.push((queue_path(claim), uuid));
            }
            if let Some(uuid) = t.leases.unsure.take().and(t.leases.uuid.clone()) {
                doubts.push((leases_path(claim), uuid));
            }
            t.leases.admitted = None;
            (
                t.node.take(),
                std::mem::take(&mut t.leases.nodes),
                doubts,
                t.downgrade.take(),
                std::mem::take(&mut t.granted),
                std::mem::take(&mut t.entered),
            )
        };
        for (parent, uuid) in &doubts {
            // Whatever that create made goes, found by its prefix, now or after a reconnect.
            self.hub.doom_doubt(parent, uuid);
        }
        // The nodes that carry the grant first (a semaphore's leases, or the lock node), then
        // an admission node or a downgrade's half-made read node.
        let mut nodes: Vec<(Node, bool)> = Vec::new();
        if leases.is_empty() {
            nodes.extend(node.map(|n| (n, true)));
        } else {
            nodes.extend(leases.into_iter().map(|n| (n, true)));
            nodes.extend(node.map(|n| (n, false)));
        }
        let mut outcome = Ok(false);
        for (node, carries) in &nodes {
            let deleted = self.delete_node(node, granted && *carries).await;
            outcome = match (outcome, deleted) {
                (Err(e), _) | (Ok(_), Err(e)) => Err(e),
                (Ok(a), Ok(b)) => Ok(a || b),
            };
        }
        if let Some(path) = downgrade {
            self.delete_path(&path).await;
        }
        if entered {
            for parent in parent_paths(claim) {
                self.parents.leave(&parent);
            }
        }
        outcome
    }

    /// Deletes our node, through a passing outage, up to a session timeout; after that it is
    /// left to the guaranteed deletes. Returns whether it still held the lock.
    pub(super) async fn delete_node(&self, node: &Node, granted: bool) -> Result<bool> {
        let conn = self.hub.now();
        if node.epoch != conn.epoch {
            // Its session was lost, and the hub has doomed the node with it.
            self.hub.doom(&node.path);
            return Ok(false);
        }
        let give_up = Instant::now() + conn.timeout;
        // A delete whose reply was lost may have done its work: a retry that finds nothing
        // then says nothing about the lock being lost.
        let mut in_doubt = false;
        loop {
            let patience = give_up.saturating_duration_since(Instant::now());
            let up = match self.hub.until_up(patience).await {
                Ok(up) => up,
                Err(e) => {
                    self.hub.doom(&node.path);
                    return Err(e);
                }
            };
            if up.conn.epoch != node.epoch {
                self.hub.doom(&node.path);
                return Ok(false);
            }
            let sent = Instant::now();
            match up.zk.delete(&node.path).await {
                Ok(()) => {
                    self.hub.gone(&node.path);
                    self.hub.acked(node.epoch, sent, true);
                    return Ok(granted);
                }
                Err(Failure::NoNode) => {
                    self.hub.gone(&node.path);
                    return Ok(granted && in_doubt);
                }
                Err(Failure::Unknown(why)) if Instant::now() < give_up => {
                    in_doubt = true;
                    tracing::debug!(path = %node.path, %why, "zookeeper: delete in doubt, retrying");
                }
                Err(f) => {
                    self.hub.doom(&node.path);
                    return Err(f.into_error(&format!("delete {}", node.path)));
                }
            }
        }
    }

    /// Renews every held claim of the current session with one quorum write (a `multi` of
    /// `check`s), which a follower cut off from the leader cannot acknowledge (a read it
    /// could). Through a follower, the leader learns of a request only on the follower's next
    /// ping, so a renewal proves not its own send but the last request acknowledged a report
    /// interval before it was sent, typically the previous renewal ([`super::proof`]): the
    /// lease is extended to a session timeout from that instant.
    pub(super) async fn renew(&self, tickets: &[&ZkTicket]) -> Vec<Renewal> {
        let carriers: Vec<Vec<Node>> = tickets.iter().map(|t| t.lock().carriers()).collect();
        let Some(up) = self.hub.current() else {
            let conn = self.hub.now();
            let down = Error::new(ErrorKind::Backend, "zookeeper: disconnected").transient();
            return carriers
                .iter()
                .map(|nodes| match nodes.first() {
                    Some(n) if n.epoch == conn.epoch => Renewal::Failed(down.clone()),
                    _ => Renewal::NotOwner,
                })
                .collect();
        };
        let epoch = up.conn.epoch;
        let current =
            |nodes: &Vec<Node>| !nodes.is_empty() && nodes.iter().all(|n| n.epoch == epoch);
        let paths: Vec<String> = carriers
            .iter()
            .filter(|nodes| current(nodes))
            .flatten()
            .map(|n| n.path.clone())
            .collect();
        let sent = Instant::now();
        let checked: Vec<_> = up.zk.check(&paths).await;
        // Any check that passed is a quorum write acknowledged.
        let until = if checked.iter().any(std::result::Result::is_ok) {
            self.hub.acked(epoch, sent, true);
            self.hub.proven(epoch).map(|at| at + up.conn.timeout)
        } else {
            None
        };
        let mut checked = checked.into_iter();
        carriers
            .iter()
            .map(|nodes| {
                if !current(nodes) {
                    return Renewal::NotOwner;
                }
                // Every node of the claim must still be there.
                let mut verdict = match until {
                    Some(until) => Renewal::Extended(until),
                    // No check passed, or the session was lost meanwhile (its locks are
                    // marked lost): whatever a check says below.
                    None => Renewal::Failed(Error::new(
                        ErrorKind::Backend,
                        "zookeeper: the session changed",
                    )),
                };
                for n in nodes {
                    let this = match checked.next() {
                        Some(Ok(())) => continue,
                        Some(Err(Failure::NoNode)) => Renewal::NotOwner,
                        Some(Err(f)) => Renewal::Failed(f.into_error(&format!("check {}", n.path))),
                        None => Renewal::Failed(Error::new(
                            ErrorKind::Backend,
                            "zookeeper: missing check result",
                        )),
                    };
                    if !matches!(verdict, Renewal::NotOwner) {
                        verdict = this;
                    }
                }
                verdict
            })
            .collect()
    }

    /// Turns our write node into a read node at the same place in the queue (Curator >= 5.5's
    /// layout, see [`recipe::downgraded_name`]): the read node is created first, then the
    /// write node is deleted, so no writer queued behind us can see the lock free in between.
    /// The fencing token stays the write grant's.
    pub(super) async fn downgrade(&self, claim: &Claim, ticket: &ZkTicket) -> Result<Grant> {
        let (write, uuid) = {
            let t = ticket.lock();
            match (&t.node, t.granted) {
                (Some(node), true) => (node.clone(), uuid::Uuid::new_v4().hyphenated().to_string()),
                _ => return Err(Error::lost(claim.key())),
            }
        };
        let Some(name) = recipe::downgraded_name(&write.name, &uuid) else {
            return Err(Error::unsupported(format_args!(
                "`{}` is not held as a write lock",
                claim.key()
            )));
        };
        let path = format!("{}/{name}", lock_path(claim));
        ticket.lock().downgrade = Some(path.clone());
        let give_up = Instant::now() + self.hub.now().timeout;
        let (stat, sent) = loop {
            let patience = give_up.saturating_duration_since(Instant::now());
            let up = self.hub.until_up(patience).await?;
            if up.conn.epoch != write.epoch {
                return Err(Error::lost(claim.key()));
            }
            let sent = Instant::now();
            let made = match up.zk.create_ephemeral(&path).await {
                // Ours, from an attempt whose reply was lost: the name is ours alone.
                Err(Failure::NodeExists) => match up.zk.exists(&path).await {
                    Ok(Some(stat)) => Ok(stat),
                    Ok(None) => Err(Failure::NoNode),
                    Err(f) => Err(f),
                },
                made => made,
            };
            match made {
                Ok(stat) => break (stat, sent),
                Err(Failure::Unknown(why)) if Instant::now() < give_up => {
                    tracing::debug!(%path, %why, "zookeeper: downgrade create in doubt, retrying");
                }
                // The lock node is gone: so is our write node.
                Err(Failure::NoNode) => return Err(Error::lost(claim.key())),
                Err(f) => return Err(f.into_error(&format!("create {path}"))),
            }
        };
        self.hub.acked(write.epoch, sent, true);
        let Some(since) = self.hub.proven(write.epoch) else {
            return Err(Error::lost(claim.key()));
        };
        let read = Node::new(path, stat, write.epoch);
        self.hub.made(read.epoch, &read.path);
        // The read node carries the grant from here on; the write node's deletion is no loss.
        self.hub.carried_by(claim, vec![read.path.clone()]);
        {
            let mut t = ticket.lock();
            t.node = Some(read.clone());
            t.downgrade = None;
        }
        self.guard_node(claim, &read);
        match self.delete_node(&write, true).await {
            // The write node was gone before we deleted it: an operator's unlock (or the
            // session's end) dropped the hold while the read node was being made. The read
            // node must not revive it: the release that follows this error deletes it.
            Ok(false) => return Err(Error::lost(claim.key())),
            Ok(true) => {}
            Err(e) => {
                tracing::warn!(path = %write.path, error = %e, "zookeeper: write node of a downgrade left to the guaranteed deletes");
            }
        }
        Ok(Grant::new(
            fence(&write.stat)?,
            since + self.hub.now().timeout,
        ))
    }

    /// Deletes one node if it is there, in one attempt; anything else is left to the
    /// guaranteed deletes.
    async fn delete_path(&self, path: &str) {
        let Some(up) = self.hub.current() else {
            self.hub.doom(path);
            return;
        };
        match up.zk.delete(path).await {
            Ok(()) | Err(Failure::NoNode) => self.hub.gone(path),
            Err(_) => self.hub.doom(path),
        }
    }
}
