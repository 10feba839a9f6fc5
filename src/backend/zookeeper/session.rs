//! The connection-state hub: one task per backend that turns the client's connection states
//! into what locks need to know.
//!
//! - Every change bumps a counter that waiters watch: `zookeeper-async` does not restore
//!   watches after a reconnect (R1), so a waiter re-lists on every change instead of trusting
//!   its predecessor watch.
//! - An *epoch* numbers the sessions. It moves on when the server says the session expired
//!   (R2), or when we have been disconnected for a whole session timeout (R3, the way Curator
//!   simulates LOST). Every lock granted in an older epoch is marked lost at that moment.
//! - Digest auth is sent again after every reconnect, before anyone is told the link is up (R8).

use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::{sleep_until, Instant};

use super::client::{Link, Zk};
use crate::backend::Claim;
use crate::error::{Error, ErrorKind, Result};

/// What waiters and the recipe see of the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Conn {
    /// The session number. Nodes made in an older epoch are gone or about to go.
    pub(super) epoch: u64,
    /// Connected, with auth re-sent.
    pub(super) up: bool,
    /// `shutdown` closed the session.
    pub(super) closed: bool,
    /// Bumped on every change; waiters wake when it moves.
    pub(super) changes: u64,
}

pub(super) struct Hub {
    state: watch::Sender<Conn>,
    /// Granted claims by owner token, with the epoch they were granted in. The lock also
    /// orders registration against epoch changes.
    held: StdMutex<HashMap<Arc<str>, (u64, Claim)>>,
    session_timeout: Duration,
}

impl Hub {
    pub(super) fn new(session_timeout: Duration) -> Arc<Self> {
        Arc::new(Self {
            state: watch::Sender::new(Conn {
                epoch: 1,
                up: false,
                closed: false,
                changes: 0,
            }),
            held: StdMutex::new(HashMap::new()),
            session_timeout,
        })
    }

    pub(super) fn now(&self) -> Conn {
        *self.state.borrow()
    }

    pub(super) fn subscribe(&self) -> watch::Receiver<Conn> {
        self.state.subscribe()
    }

    /// Waits until connected, at most `patience`.
    ///
    /// # Errors
    ///
    /// A transient backend error if the link stays down, a closed error after `shutdown`.
    pub(super) async fn until_up(&self, patience: Duration) -> Result<Conn> {
        let mut rx = self.state.subscribe();
        let conn = match tokio::time::timeout(patience, rx.wait_for(|c| c.up || c.closed)).await {
            Ok(Ok(conn)) => *conn,
            Ok(Err(_)) => return Err(Error::closed()),
            Err(_) => {
                return Err(Error::new(
                    ErrorKind::Backend,
                    format!("zookeeper: not connected for {patience:?}"),
                )
                .transient())
            }
        };
        if conn.closed {
            return Err(Error::closed());
        }
        Ok(conn)
    }

    /// Records a grant made in `epoch`. False if the epoch has moved on meanwhile: the node is
    /// gone with its session and the grant must not be reported.
    pub(super) fn register(&self, claim: &Claim, epoch: u64) -> bool {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if self.now().epoch != epoch {
            return false;
        }
        held.insert(claim.owner().into(), (epoch, claim.clone()));
        true
    }

    pub(super) fn unregister(&self, claim: &Claim) {
        self.held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(claim.owner());
    }

    fn publish(&self, change: impl FnOnce(&mut Conn)) {
        self.state.send_modify(|c| {
            change(c);
            c.changes += 1;
        });
    }

    /// The session is gone (or must be assumed gone): a new epoch, and every grant of the old
    /// one is lost.
    fn lose_session(&self, why: &str) {
        let lost: Vec<Claim> = {
            let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
            self.publish(|c| c.epoch += 1);
            held.drain().map(|(_, (_, claim))| claim).collect()
        };
        if !lost.is_empty() {
            tracing::warn!(
                locks = lost.len(),
                "zookeeper session lost ({why}): locks lost"
            );
        }
        for claim in lost {
            claim.mark_lost();
        }
    }

    /// Marks the link up after a call proved it, in case the first `Connected` state came
    /// before the listener was installed.
    pub(super) fn confirm_up(&self) {
        if !self.now().up {
            self.publish(|c| c.up = true);
        }
    }

    /// Follows the client's states until it closes. Holds the client weakly so that dropping
    /// the backend still closes the session.
    pub(super) async fn run(
        self: Arc<Self>,
        zk: Weak<dyn Zk>,
        mut links: mpsc::UnboundedReceiver<Link>,
    ) {
        // When the current outage began, and whether it already cost the session.
        let mut down_since: Option<Instant> = None;
        let mut lost_this_outage = false;
        loop {
            let expiry = down_since.map(|t| t + self.session_timeout);
            let link = tokio::select! {
                link = links.recv() => link,
                () = sleep_until(expiry.unwrap_or_else(Instant::now)), if expiry.is_some() && !lost_this_outage => {
                    lost_this_outage = true;
                    self.lose_session("disconnected for longer than the session timeout");
                    continue;
                }
            };
            match link {
                Some(Link::Down) => {
                    down_since.get_or_insert_with(Instant::now);
                    self.publish(|c| c.up = false);
                }
                Some(Link::Expired) => {
                    if !lost_this_outage {
                        lost_this_outage = true;
                        self.lose_session("expired");
                    }
                    down_since.get_or_insert_with(Instant::now);
                    self.publish(|c| c.up = false);
                }
                Some(Link::Up) => {
                    if let Some(zk) = zk.upgrade() {
                        if let Err(e) = zk.authenticate().await {
                            tracing::error!(error = %e, "zookeeper: re-sending digest auth failed");
                        }
                    }
                    down_since = None;
                    lost_this_outage = false;
                    self.publish(|c| c.up = true);
                }
                Some(Link::Closed) | None => {
                    self.lose_session("closed");
                    self.publish(|c| {
                        c.up = false;
                        c.closed = true;
                    });
                    return;
                }
            }
        }
    }
}
