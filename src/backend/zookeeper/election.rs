//! Elections as Curator's `LeaderLatch` holds them: a leadership claim is a latch participant,
//! the node `<path>/_c_<uuid>-latch-<seq>` (EPHEMERAL_SEQUENTIAL, data = the value it
//! proclaims); the participant with the lowest sequence leads, the others wait in the queue
//! as mutex waiters do ([`super::queue`]). So a Java `LeaderLatch` and a Rust campaign on one
//! path take turns, and each side reads the other's id as the leader's.
//!
//! The term is the czxid of the leading node, the mutex's fencing token: the next leader's
//! node was created after the last one's (it was behind it in sequence order), so its zxid
//! is higher. The lease is the session's: a leader leads while its session lives.
//!
//! A proclaim sets our node's data, where Curator's `getLeader().getId()` reads it. One
//! limit, Curator's: a Curator 5 `LeaderLatch` waiting right behind our node watches it with
//! `getData` and acts only on its deletion, so a data change uses up its one-shot watch and it
//! no longer sees our node go (it re-lists only after a reconnect). Proclaim before a Java
//! participant queues behind the leader, or not at all on an election Java latches share;
//! distlock candidates list again on any change of the node ahead.
//!
//! Who leads is read as Curator's `getLeader` reads it: the first child in latch order, its
//! data the id. [`Inner::watch_leader`] watches the children and the leading node's data
//! (one-shot watches, armed again after each fires and after every reconnect or new session).

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::{sleep, Instant};

use super::client::{Failure, Watch};
use super::queue::other_family_at;
use super::recipe;
use super::session::{SessionHub, Up};
use super::ticket::{fence, ZkTicket};
use super::Inner;
use crate::backend::{wire, Claim, Leader, LeaderWatch, LockKind};
use crate::error::{Error, Result};

/// The first and the longest pause before a watch is armed again after a failed call.
const MIN_PAUSE: Duration = Duration::from_millis(100);
const MAX_PAUSE: Duration = Duration::from_secs(2);

/// The election's node, `/<namespace>/<key>`: Curator's latch path.
fn latch_path(namespace: &str, key: &str) -> String {
    format!("/{namespace}/{key}")
}

impl Inner {
    /// Who leads `key`: the first latch participant's id, its node's czxid as the term, and
    /// the session timeout as the lease left.
    pub(super) async fn leader(&self, namespace: &str, key: &str) -> Result<Option<Leader>> {
        let path = latch_path(namespace, key);
        let up = self.hub.until_up(self.hub.now().timeout).await?;
        loop {
            let mut kids = match up.zk.children(&path).await {
                Ok(kids) => kids,
                Err(Failure::NoNode) => return Ok(None),
                Err(f) => return Err(f.into_error(&format!("list {path}"))),
            };
            match other_family_at(&up, &path, LockKind::Leader, &kids).await {
                Ok(None) => {}
                Ok(Some(other)) => return Err(wire::mismatch(key, other, LockKind::Leader)),
                Err(f) => return Err(f.into_error(&format!("list {path}"))),
            }
            recipe::sort(LockKind::Leader, &mut kids);
            let Some(first) = kids.first() else {
                return Ok(None);
            };
            let head = format!("{path}/{first}");
            match up.zk.get_data(&head).await {
                Ok((value, stat)) => {
                    return Ok(Some(Leader::new(value, fence(&stat)?, up.conn.timeout)));
                }
                // It stepped down since the listing: the next one leads.
                Err(Failure::NoNode) => {}
                Err(f) => return Err(f.into_error(&format!("read {head}"))),
            }
        }
    }

    /// Sets our latch node's data to the claim's value (Curator's `LeaderLatch` reads it as
    /// the participant's id). `Lost` if the node is gone or belongs to a lost session.
    pub(super) async fn proclaim(&self, claim: &Claim, ticket: &ZkTicket) -> Result<()> {
        let node = {
            let t = ticket.lock();
            match (&t.node, t.granted) {
                (Some(node), true) => node.clone(),
                _ => return Err(Error::lost(claim.key())),
            }
        };
        let value = claim.value();
        recipe::validate_value(claim.key(), &value)?;
        let give_up = Instant::now() + self.hub.now().timeout;
        loop {
            let patience = give_up.saturating_duration_since(Instant::now());
            let up = self.hub.until_up(patience).await?;
            if up.conn.epoch != node.epoch {
                return Err(Error::lost(claim.key()));
            }
            match up.zk.set_data(&node.path, &value).await {
                Ok(()) => return Ok(()),
                Err(Failure::NoNode) => return Err(Error::lost(claim.key())),
                // Setting the same value again is harmless.
                Err(Failure::Unknown(why)) if Instant::now() < give_up => {
                    tracing::debug!(path = %node.path, %why, "zookeeper: proclaim in doubt, retrying");
                }
                Err(f) => return Err(f.into_error(&format!("set data of {}", node.path))),
            }
        }
    }

    /// A signal that moves whenever the children of the latch path or the leading node's
    /// data may have changed, or the session came back. The first watches are armed before
    /// this returns; a task arms them again each time one fires and ends once no receiver
    /// is left (or the backend is gone).
    pub(super) async fn watch_leader(&self, namespace: &str, key: &str) -> Result<LeaderWatch> {
        let path = latch_path(namespace, key);
        let up = self.hub.until_up(self.hub.now().timeout).await?;
        let armed = arm(&up, &path)
            .await
            .map_err(|f| f.into_error(&format!("watch {path}")))?;
        let (tx, rx) = watch::channel(0u64);
        tokio::spawn(follow(
            Arc::downgrade(&self.hub),
            path,
            Some(armed),
            up.conn.changes,
            tx,
        ));
        Ok(LeaderWatch::new(rx))
    }
}

/// The watches that cover a change of leader: the latch path's children (or, while the path
/// does not exist, its creation) and the leading node's data.
struct Armed {
    children: Watch,
    head: Option<Watch>,
}

/// Lists the latch path with a watch, and watches the data of the first participant.
async fn arm(up: &Up, path: &str) -> std::result::Result<Armed, Failure> {
    loop {
        let (mut kids, children) = match up.zk.watch_children(path).await {
            Ok(listed) => listed,
            Err(Failure::NoNode) => match up.zk.watch_exists(path).await {
                // Made since the listing: list it.
                Ok((true, _)) => continue,
                Ok((false, created)) => {
                    return Ok(Armed {
                        children: created,
                        head: None,
                    })
                }
                Err(f) => return Err(f),
            },
            Err(f) => return Err(f),
        };
        recipe::sort(LockKind::Leader, &mut kids);
        let head = match kids.first() {
            Some(first) => match up.zk.watch(&format!("{path}/{first}")).await {
                Ok(head) => Some(head),
                // Gone already: the children watch has fired.
                Err(Failure::NoNode) => None,
                Err(f) => return Err(f),
            },
            None => None,
        };
        return Ok(Armed { children, head });
    }
}

/// Moves `tx` after every change [`arm`]'s watches (or the session) report, once the watches
/// are armed again, so a reader that reads after the move cannot miss the next change.
async fn follow(
    hub: Weak<SessionHub>,
    path: String,
    mut armed: Option<Armed>,
    mut armed_at: u64,
    tx: watch::Sender<u64>,
) {
    let mut pause = Duration::ZERO;
    loop {
        let Some(mut states) = hub.upgrade().map(|h| h.subscribe()) else {
            return;
        };
        match armed.take() {
            Some(Armed { children, head }) => {
                tokio::select! {
                    _ = children => {}
                    _ = async { match head { Some(head) => head.await, None => std::future::pending().await } } => {}
                    // A reconnect or a new session: watches set meanwhile may be gone.
                    _ = states.wait_for(|c| c.changes != armed_at || c.closed) => {}
                    () = tx.closed() => return,
                }
            }
            // The last try failed: again after a pause, or once the connection changes.
            None => {
                tokio::select! {
                    () = sleep(pause) => {}
                    _ = states.wait_for(|c| c.changes != armed_at || c.closed) => {}
                    () = tx.closed() => return,
                }
            }
        }
        let up = {
            let Some(hub) = hub.upgrade() else {
                return;
            };
            let conn = hub.now();
            if conn.closed {
                return;
            }
            armed_at = conn.changes;
            hub.current()
        };
        let Some(up) = up else {
            // Down: wait for the link to come back.
            pause = MAX_PAUSE;
            continue;
        };
        armed_at = up.conn.changes;
        match arm(&up, &path).await {
            Ok(again) => {
                armed = Some(again);
                pause = Duration::ZERO;
            }
            Err(why) => {
                tracing::debug!(%path, %why, "zookeeper: watching an election failed; trying again");
                pause = (pause * 2).clamp(MIN_PAUSE, MAX_PAUSE);
            }
        }
        drop(up);
        // Armed (or not): readers look again.
        tx.send_modify(|n| *n = n.wrapping_add(1));
    }
}
