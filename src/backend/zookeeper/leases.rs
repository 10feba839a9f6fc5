//! A semaphore's second stage, Curator's `InterProcessSemaphoreV2`: once our admission node
//! (under `locks`) is first, create our lease nodes under `leases` and hold once there are no
//! more than `max` of them in all; until then only we, the admission head, watch `leases` (no
//! herd). On success or failure the admission node goes, and the next claim is admitted.
//!
//! Curator takes `acquire(n)` one lease at a time, through the admission queue each time. We
//! make our `count` lease nodes in one `multi` (all or none, one czxid: the fencing token), so
//! a lost reply leaves either all of them, found by their protection prefix, or nothing. To a
//! Curator client they are `count` ordinary leases.

use tokio::time::Instant;

use super::client::Failure;
use super::recipe::{self, Other};
use super::session::Up;
use super::ticket::{fence, leases_path, lock_path, Node, Step, Waiting, ZkTicket};
use super::Inner;
use crate::backend::{Attempt, Claim, Grant};
use crate::error::Result;

impl Inner {
    /// The lease stage of an admitted semaphore claim.
    pub(super) async fn take_leases(
        &self,
        claim: &Claim,
        ticket: &ZkTicket,
        up: &Up,
        count: u32,
        max: u32,
        wait: bool,
    ) -> Result<Step<Attempt>> {
        let leases = match self.ensure_leases(claim, ticket, up, count).await? {
            Step::Ready(leases) => leases,
            Step::Again(f) => return Ok(Step::Again(f)),
        };
        let path = leases_path(claim);
        let (kids, changed) = match up.zk.watch_children(&path).await {
            Ok(listed) => listed,
            Err(f @ Failure::Unknown(_)) => return Ok(Step::Again(Some(f))),
            Err(Failure::NoNode) => {
                self.forget_leases(ticket);
                return Ok(Step::Again(None));
            }
            Err(f) => return Err(f.into_error(&format!("list {path}"))),
        };
        if !leases.iter().all(|n| kids.contains(&n.name)) {
            // Deleted behind our back: make them again.
            self.forget_leases(ticket);
            return Ok(Step::Again(None));
        }
        if kids.len() > max as usize {
            if !wait {
                self.withdraw(claim, ticket).await;
                return Ok(Step::Ready(Attempt::Queued { recheck_at: None }));
            }
            ticket.lock().waiting = Some(Waiting {
                fired: changed,
                granted_when_gone: false,
                predecessor: String::new(),
                ahead: None,
                seen: up.conn.changes,
            });
            return Ok(Step::Ready(Attempt::Queued { recheck_at: None }));
        }
        let since = match self.proof(up, &leases[0]).await {
            Ok(at) => at,
            Err(f @ Failure::Unknown(_)) => return Ok(Step::Again(Some(f))),
            Err(Failure::NoNode) => {
                self.forget_leases(ticket);
                return Ok(Step::Again(None));
            }
            Err(f) => return Err(f.into_error(&format!("check {}", leases[0].path))),
        };
        if !self.granted(claim, ticket, &leases) {
            return Ok(Step::Again(None));
        }
        self.leave_admission(ticket).await;
        Ok(Step::Ready(Attempt::Granted(Grant::new(
            fence(&leases[0].stat)?,
            since + up.conn.timeout,
        ))))
    }

    /// Checks once per claim that the lock node holds no mutex or read-write lock nodes
    /// (they would not exclude our leases, nor we theirs). Our admission node exists by now,
    /// so a mutex or read-write claim arriving later sees `locks` in use and refuses itself.
    pub(super) async fn no_other_family(
        &self,
        up: &Up,
        claim: &Claim,
    ) -> std::result::Result<Option<Other>, Failure> {
        let kids = up.zk.children(&lock_path(claim)).await?;
        Ok(recipe::other_family(claim.kind(), &kids))
    }

    /// Our lease nodes: those we have, those a create with a lost reply made (found by their
    /// protection prefix), or new ones.
    async fn ensure_leases(
        &self,
        claim: &Claim,
        ticket: &ZkTicket,
        up: &Up,
        count: u32,
    ) -> Result<Step<Vec<Node>>> {
        let epoch = up.conn.epoch;
        let path = leases_path(claim);
        let (have, unsure, uuid) = {
            let mut t = ticket.lock();
            let leases = &mut t.leases;
            let uuid = leases
                .uuid
                .get_or_insert_with(|| uuid::Uuid::new_v4().hyphenated().to_string())
                .clone();
            (leases.nodes.clone(), leases.unsure.is_some(), uuid)
        };
        if !have.is_empty() {
            return Ok(Step::Ready(have));
        }
        if unsure {
            let prefix = recipe::protection_prefix(&uuid);
            let found: Vec<String> = match up.zk.children(&path).await {
                Ok(kids) => kids
                    .into_iter()
                    .filter(|k| k.starts_with(&prefix))
                    .collect(),
                Err(Failure::NoNode) => Vec::new(),
                Err(f @ Failure::Unknown(_)) => return Ok(Step::Again(Some(f))),
                Err(f) => return Err(f.into_error(&format!("list {path}"))),
            };
            if !found.is_empty() {
                let mut nodes = Vec::with_capacity(found.len());
                for name in found {
                    let at = format!("{path}/{name}");
                    match up.zk.exists(&at).await {
                        Ok(Some(stat)) => nodes.push(Node::new(at, stat, epoch)),
                        Ok(None) => {}
                        Err(f @ Failure::Unknown(_)) => return Ok(Step::Again(Some(f))),
                        Err(f) => return Err(f.into_error(&format!("stat {at}"))),
                    }
                }
                nodes.sort_by(|a, b| a.name.cmp(&b.name));
                return Ok(Step::Ready(self.keep_leases(claim, ticket, &uuid, nodes)));
            }
        }
        {
            ticket.lock().leases.unsure = Some(epoch);
            self.hub.doubt(epoch, &path, &uuid);
        }
        let prefix = format!("{path}/{}", recipe::lease_prefix(&uuid));
        let sent = Instant::now();
        match up.zk.create_lease_nodes(&prefix, count).await {
            Ok(made) => {
                self.hub.acked(epoch, sent, true);
                let nodes = made
                    .into_iter()
                    .map(|(p, stat)| Node::new(p, stat, epoch))
                    .collect();
                Ok(Step::Ready(self.keep_leases(claim, ticket, &uuid, nodes)))
            }
            Err(Failure::NoNode) => {
                ticket.lock().leases.unsure = None;
                self.hub.settled(&uuid);
                self.create_parents(up, &path).await?;
                Ok(Step::Again(None))
            }
            Err(f @ Failure::Unknown(_)) => Ok(Step::Again(Some(f))),
            Err(f) => {
                ticket.lock().leases.unsure = None;
                self.hub.settled(&uuid);
                Err(f.into_error(&format!("create in {path}")))
            }
        }
    }

    /// Records lease nodes as ours (and as live in their epoch) and guards them.
    fn keep_leases(
        &self,
        claim: &Claim,
        ticket: &ZkTicket,
        uuid: &str,
        nodes: Vec<Node>,
    ) -> Vec<Node> {
        for node in &nodes {
            self.hub.made(node.epoch, &node.path);
        }
        self.hub.settled(uuid);
        {
            let mut t = ticket.lock();
            t.leases.unsure = None;
            t.leases.nodes.clone_from(&nodes);
        }
        for node in &nodes {
            self.guard_node(claim, node);
        }
        nodes
    }

    /// Our lease nodes are gone: make new ones.
    fn forget_leases(&self, ticket: &ZkTicket) {
        let gone = std::mem::take(&mut ticket.lock().leases.nodes);
        for node in gone {
            self.hub.gone(&node.path);
        }
    }

    /// Deletes our admission node once the leases are ours (Curator's `finally`), letting the
    /// next claim in. A delete that fails is left to the guaranteed deletes.
    async fn leave_admission(&self, ticket: &ZkTicket) {
        let Some(node) = ticket.lock().node.take() else {
            return;
        };
        let Some(up) = self.hub.current().filter(|up| up.conn.epoch == node.epoch) else {
            self.hub.doom(&node.path);
            return;
        };
        match up.zk.delete(&node.path).await {
            Ok(()) | Err(Failure::NoNode) => self.hub.gone(&node.path),
            Err(_) => self.hub.doom(&node.path),
        }
    }
}
