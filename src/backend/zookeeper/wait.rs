//! Waiting in the queue: on the watch of the node ahead of ours (and, for a claim whose
//! predecessor is not yet first, on the node ahead of that one), or on a change of
//! connection; and what a fired watch means — granted at once when our predecessor's deletion
//! alone makes us the holder, else list again.

use tokio::time::{sleep_until, Instant};

use super::client::{Failure, Fired, Watch};
use super::recipe::{self, Place};
use super::session::Up;
use super::ticket::{fence, queue_path, Node, Waiting, ZkTicket};
use super::Inner;
use crate::backend::{Claim, Grant, LockKind};
use crate::error::Result;

impl Inner {
    /// Waits for what can change our place in the queue: the watch on the node ahead of us
    /// (granted at once when its deletion alone makes us the holder), the node ahead of our
    /// predecessor going, a reconnect or new session, or `recheck_at` when the last attempt
    /// left no watch. `Ok(None)`: go round the acquire loop again.
    pub(super) async fn wait(
        &self,
        claim: &Claim,
        ticket: &ZkTicket,
        recheck_at: Option<Instant>,
    ) -> Result<Option<Grant>> {
        let (waiting, node) = {
            let mut t = ticket.lock();
            (t.waiting.take(), t.node.clone())
        };
        let mut states = self.hub.subscribe();
        let (Some(waiting), Some(node)) = (waiting, node) else {
            // No watch to wait on (the last attempt failed): sleep until the pause the layer
            // above asked for, or until the connection changes.
            let seen = self.hub.now().changes;
            match recheck_at {
                Some(at) => tokio::select! {
                    () = sleep_until(at) => {}
                    _ = states.wait_for(|c| c.changes != seen) => {}
                },
                None => {
                    let _ = states.wait_for(|c| c.changes != seen).await;
                }
            }
            return Ok(None);
        };
        let mut waiting = waiting;
        loop {
            tokio::select! {
                _ = poll_some(&mut waiting.ahead) => {
                    // The node ahead of our predecessor went (while the predecessor may still
                    // hold): if the predecessor heads the queue now, its deletion alone will
                    // make us the holder.
                    waiting.ahead = None;
                    if !self.ahead_gone(claim, &node, &mut waiting).await {
                        return Ok(None);
                    }
                    continue;
                }
                fired = &mut waiting.fired => {
                    return self.predecessor_gone(claim, ticket, &node, fired, waiting.granted_when_gone).await;
                }
                // A reconnect or a new session: list again.
                () = async { let _ = states.wait_for(|c| c.changes != waiting.seen).await; } => return Ok(None),
            }
        }
    }

    /// After the node ahead of our predecessor went: lists the queue and updates `waiting`
    /// (the predecessor first now: granted when it goes; else the new node ahead of it,
    /// watched). False to go round the acquire loop instead (our predecessor or our node went,
    /// the session changed, a call failed).
    async fn ahead_gone(&self, claim: &Claim, node: &Node, waiting: &mut Waiting) -> bool {
        let Some(up) = self.hub.current().filter(|up| up.conn.epoch == node.epoch) else {
            return false;
        };
        let queue = queue_path(claim);
        let Ok(mut kids) = up.zk.children(&queue).await else {
            return false;
        };
        recipe::sort(claim.kind(), &mut kids);
        match recipe::place(claim.kind(), &kids, &node.name) {
            Place::Behind {
                predecessor,
                granted_when_gone,
            } if predecessor == waiting.predecessor => {
                waiting.granted_when_gone = granted_when_gone;
                match watch_ahead(&up, &queue, claim.kind(), &kids, predecessor).await {
                    Ok(ahead) => {
                        waiting.ahead = ahead;
                        true
                    }
                    Err(_) => false,
                }
            }
            _ => false,
        }
    }

    /// Our predecessor's watch fired: the grant if its deletion alone makes us the holder (and
    /// the session is the one our node lives in); `None` to list again.
    async fn predecessor_gone(
        &self,
        claim: &Claim,
        ticket: &ZkTicket,
        node: &Node,
        fired: Fired,
        granted_when_gone: bool,
    ) -> Result<Option<Grant>> {
        // The node ahead went, and only nodes created after ours can have appeared since our
        // listing: we are the holder (or first in a semaphore's admission queue), no need to
        // list again, if the session is the one our node lives in and was proven alive
        // recently.
        if fired != Fired::Deleted || !granted_when_gone {
            return Ok(None);
        }
        let Some(up) = self.hub.current().filter(|up| up.conn.epoch == node.epoch) else {
            return Ok(None);
        };
        if matches!(claim.kind(), LockKind::Permits { .. }) {
            ticket.lock().leases.admitted = Some(node.epoch);
            return Ok(None);
        }
        let Ok(since) = self.proof(&up, node).await else {
            return Ok(None);
        };
        if !self.granted(claim, ticket, std::slice::from_ref(node)) {
            return Ok(None);
        }
        Ok(Some(Grant::new(
            fence(&node.stat)?,
            since + up.conn.timeout,
        )))
    }
}

/// Watches the node just ahead of `predecessor` among the sorted `kids` of `queue`, if a
/// `kind` claim watches one ([`recipe::ahead_of`]).
pub(super) async fn watch_ahead(
    up: &Up,
    queue: &str,
    kind: LockKind,
    kids: &[String],
    predecessor: &str,
) -> std::result::Result<Option<Watch>, Failure> {
    match recipe::ahead_of(kind, kids, predecessor) {
        Some(ahead) => up.zk.watch(&format!("{queue}/{ahead}")).await.map(Some),
        None => Ok(None),
    }
}

/// Awaits the future in `slot`, or forever if there is none (a `select!` branch for a watch
/// that may not be set).
async fn poll_some<F: std::future::Future + Unpin>(slot: &mut Option<F>) -> F::Output {
    match slot {
        Some(f) => f.await,
        None => std::future::pending().await,
    }
}
