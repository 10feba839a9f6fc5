//! The session hub: one task per backend that owns the ZooKeeper session and turns its states
//! into what locks need to know.
//!
//! - Every change bumps a counter that waiters watch: a waiter lists again after any change.
//! - An *epoch* numbers the sessions. The hub declares a session lost when the server ends it
//!   (expired, refused), or when we have been disconnected for a whole granted session timeout
//!   (the way Curator simulates LOST). Then every lock granted in it is marked lost, the
//!   session's client is dropped (which closes it, so a server restarted on its data cannot
//!   bring it back to life with our abandoned nodes in it), and a new session is opened.
//! - Every node is tracked with the epoch it was made in. The nodes of a lost session, and any
//!   node whose delete failed, go to a guaranteed-delete set: retried at every reconnect and,
//!   while connected, with a back-off, until each is gone (Curator's `delete().guaranteed()`).
//! - The session, and the hub's tasks, run on the runtime that opened it, and go when that
//!   runtime shuts down, as the client does.
//! - The requests each session had acknowledged are remembered (the last few): together with
//!   the writes that went through the quorum after them, they tell from when the *leader* has
//!   certainly heard from the session, and a lease is valid for a session timeout from then
//!   ([`super::proof`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::time::Duration;

use tokio::sync::{mpsc, watch, Notify};
use tokio::time::{sleep, sleep_until, Instant};

use super::client::{self, Failure, Link, Session, Settings};
use super::proof::Proof;
use super::recipe;
use crate::backend::Claim;
use crate::error::{Error, ErrorKind, Result};
use crate::sync::LockExt;

const RECONNECT_MIN: Duration = Duration::from_millis(100);
const RECONNECT_MAX: Duration = Duration::from_secs(1);
const CLEANUP_MIN: Duration = Duration::from_millis(100);
const CLEANUP_MAX: Duration = Duration::from_secs(5);
/// How long `close` waits for the server to confirm the session is closed.
pub(super) const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// What waiters and the recipe see of the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Conn {
    /// The session number. Nodes made in an older epoch are gone or about to go.
    pub(super) epoch: u64,
    /// Connected.
    pub(super) up: bool,
    /// `shutdown` closed the session.
    pub(super) closed: bool,
    /// Bumped on every change; waiters wake when it moves.
    pub(super) changes: u64,
    /// The session timeout the server granted to the current session.
    pub(super) timeout: Duration,
}

/// A live session, with the state it was read with.
pub(super) struct Up {
    pub(super) conn: Conn,
    pub(super) zk: Arc<Session>,
}

/// A node to delete whatever happens: by path, or by the protection prefix of a create whose
/// outcome is unknown.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Doomed {
    Path(String),
    Prefix { lock_path: String, uuid: String },
}

/// A grant, and the nodes that carry it.
struct HeldClaim {
    claim: Claim,
    nodes: Vec<String>,
}

#[derive(Default)]
struct Nodes {
    /// Nodes we made, by path, with their epoch.
    live: HashMap<String, u64>,
    /// Creates in doubt, by protection UUID: (epoch, lock path).
    doubts: HashMap<String, (u64, String)>,
    doomed: Vec<Doomed>,
}

pub(super) struct SessionHub {
    state: watch::Sender<Conn>,
    /// The current session. Changed together with `state` (under this lock), so a reader of
    /// both sees them agree.
    session: StdMutex<Option<Arc<Session>>>,
    /// Granted claims by owner token, with the epoch they were granted in. The lock also
    /// orders registration against epoch changes.
    held: StdMutex<HashMap<Arc<str>, HeldClaim>>,
    nodes: StdMutex<Nodes>,
    /// What the leader is known to have heard of the current session.
    proof: StdMutex<Proof>,
    cleanup: Arc<Notify>,
    /// Moves on every reconnect (the same session back, or a new one).
    reconnects: watch::Sender<u64>,
    /// Where the current session reports its states.
    links: mpsc::UnboundedSender<(u64, Link)>,
    settings: Settings,
}

impl SessionHub {
    /// Opens the first session and starts the hub's tasks.
    pub(super) async fn start(settings: Settings) -> Result<Arc<Self>> {
        let (links, links_rx) = mpsc::unbounded_channel();
        let connecting = Instant::now();
        let zk = client::connect(&settings, 1, links.clone()).await?;
        let proof = Proof::new(1, connecting, zk.session_timeout(), settings.server_tick);
        let hub = Arc::new(Self {
            state: watch::Sender::new(Conn {
                epoch: 1,
                up: true,
                closed: false,
                changes: 0,
                timeout: zk.session_timeout(),
            }),
            session: StdMutex::new(Some(zk)),
            held: StdMutex::new(HashMap::new()),
            nodes: StdMutex::new(Nodes::default()),
            proof: StdMutex::new(proof),
            cleanup: Arc::new(Notify::new()),
            reconnects: watch::Sender::new(0),
            links,
            settings,
        });
        tokio::spawn(run(Arc::downgrade(&hub), links_rx));
        tokio::spawn(cleanup(Arc::downgrade(&hub), hub.cleanup.clone()));
        Ok(hub)
    }

    /// A counter that moves every time the link comes back after a drop.
    pub(super) fn reconnects(&self) -> watch::Receiver<u64> {
        self.reconnects.subscribe()
    }

    pub(super) fn now(&self) -> Conn {
        *self.state.borrow()
    }

    pub(super) fn subscribe(&self) -> watch::Receiver<Conn> {
        self.state.subscribe()
    }

    /// The current session if connected, with the state it goes with.
    pub(super) fn current(&self) -> Option<Up> {
        let session = self.session.locked();
        let conn = self.now();
        match (&*session, conn.up && !conn.closed) {
            (Some(zk), true) => Some(Up {
                conn,
                zk: zk.clone(),
            }),
            _ => None,
        }
    }

    /// Waits until connected, at most `patience`.
    ///
    /// # Errors
    ///
    /// A transient backend error if the link stays down, a closed error after `shutdown`.
    pub(super) async fn until_up(&self, patience: Duration) -> Result<Up> {
        let deadline = Instant::now() + patience;
        let mut rx = self.state.subscribe();
        loop {
            if rx.borrow_and_update().closed {
                return Err(Error::closed());
            }
            if let Some(up) = self.current() {
                return Ok(up);
            }
            if tokio::time::timeout_at(deadline, rx.changed())
                .await
                .is_err()
            {
                return Err(Error::new(
                    ErrorKind::Backend,
                    format!("zookeeper: not connected for {patience:?}"),
                )
                .transient());
            }
        }
    }

    /// Records a grant made in `epoch`. False if the epoch has moved on meanwhile: the node is
    /// gone with its session and the grant must not be reported.
    pub(super) fn register(&self, claim: &Claim, epoch: u64, nodes: Vec<String>) -> bool {
        let mut held = self.held.locked();
        if self.now().epoch != epoch {
            return false;
        }
        let claim = claim.clone();
        held.insert(claim.owner().into(), HeldClaim { claim, nodes });
        true
    }

    /// Whether `claim` holds its lock in the current session through the node `path`.
    pub(super) fn holds_by(&self, claim: &Claim, path: &str) -> bool {
        self.held
            .locked()
            .get(claim.owner())
            .is_some_and(|h| h.nodes.iter().any(|n| n == path))
    }

    /// A held claim's lock now rests on `nodes` (a downgrade swapped its write node for a read
    /// node).
    pub(super) fn carried_by(&self, claim: &Claim, nodes: Vec<String>) {
        if let Some(h) = self.held.locked().get_mut(claim.owner()) {
            h.nodes = nodes;
        }
    }

    pub(super) fn unregister(&self, claim: &Claim) {
        self.held.locked().remove(claim.owner());
    }

    /// A node we made in `epoch`.
    pub(super) fn made(&self, epoch: u64, path: &str) {
        self.nodes.locked().live.insert(path.to_owned(), epoch);
    }

    /// A node of ours is gone (deleted, or found missing).
    pub(super) fn gone(&self, path: &str) {
        self.nodes.locked().live.remove(path);
    }

    /// A create was sent in `epoch` whose outcome may stay unknown.
    pub(super) fn doubt(&self, epoch: u64, lock_path: &str, uuid: &str) {
        self.nodes
            .locked()
            .doubts
            .insert(uuid.to_owned(), (epoch, lock_path.to_owned()));
    }

    /// The create in doubt was settled (its node found and tracked, or known not to exist).
    pub(super) fn settled(&self, uuid: &str) {
        self.nodes.locked().doubts.remove(uuid);
    }

    /// `path` must go, whatever happens to its session.
    pub(super) fn doom(&self, path: &str) {
        let mut nodes = self.nodes.locked();
        nodes.live.remove(path);
        nodes.doomed.push(Doomed::Path(path.to_owned()));
        drop(nodes);
        self.cleanup.notify_one();
    }

    /// Whatever node a create with protection UUID `uuid` made under `lock_path` must go.
    pub(super) fn doom_doubt(&self, lock_path: &str, uuid: &str) {
        let mut nodes = self.nodes.locked();
        nodes.doubts.remove(uuid);
        nodes.doomed.push(Doomed::Prefix {
            lock_path: lock_path.to_owned(),
            uuid: uuid.to_owned(),
        });
        drop(nodes);
        self.cleanup.notify_one();
    }

    /// A request of `epoch`'s session, sent at `sent`, was acknowledged just now; `quorum` if
    /// it was a write (committed by the leader). See [`Proof::acked`].
    pub(super) fn acked(&self, epoch: u64, sent: Instant, quorum: bool) {
        let acked = Instant::now();
        let mut proof = self.proof.locked();
        if proof.epoch() == epoch {
            proof.acked(sent, acked, quorum);
        }
    }

    /// What the leader is known to have heard of `epoch`'s session; `None` once it is not the
    /// current one.
    pub(super) fn proof(&self, epoch: u64) -> Option<Proof> {
        let proof = self.proof.locked();
        (proof.epoch() == epoch).then(|| proof.clone())
    }

    /// The instant the leader is known to have heard from `epoch`'s session at or after: a
    /// lease is valid for a session timeout from it.
    pub(super) fn proven(&self, epoch: u64) -> Option<Instant> {
        let proof = self.proof.locked();
        (proof.epoch() == epoch).then(|| proof.proven())
    }

    fn publish(&self, change: impl FnOnce(&mut Conn)) {
        self.state.send_modify(|c| {
            change(c);
            c.changes += 1;
        });
    }

    /// The session is gone (or must be assumed gone): every grant of it is lost, its nodes
    /// are doomed, and its client is dropped so that it closes for good.
    fn lose_session(&self, why: &str) {
        let (lost, old) = {
            let mut held = self.held.locked();
            let mut session = self.session.locked();
            let old_epoch = self.now().epoch;
            self.publish(|c| {
                c.epoch += 1;
                c.up = false;
            });
            let old = session.take();
            let mut nodes = self.nodes.locked();
            let Nodes {
                live,
                doubts,
                doomed,
            } = &mut *nodes;
            live.retain(|path, epoch| {
                let keep = *epoch != old_epoch;
                if !keep {
                    doomed.push(Doomed::Path(path.clone()));
                }
                keep
            });
            doubts.retain(|uuid, (epoch, lock_path)| {
                let keep = *epoch != old_epoch;
                if !keep {
                    doomed.push(Doomed::Prefix {
                        lock_path: lock_path.clone(),
                        uuid: uuid.clone(),
                    });
                }
                keep
            });
            let lost: Vec<Claim> = held.drain().map(|(_, h)| h.claim).collect();
            (lost, old)
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
        drop(old);
    }

    /// Puts a new session in place (its epoch was set when the old one was lost), whose
    /// connect began at `connecting`.
    fn install(&self, zk: Arc<Session>, connecting: Instant) {
        let mut session = self.session.locked();
        let timeout = zk.session_timeout();
        *self.proof.locked() = Proof::new(
            self.now().epoch,
            connecting,
            timeout,
            self.settings.server_tick,
        );
        *session = Some(zk);
        self.publish(|c| {
            c.up = true;
            c.timeout = timeout;
        });
        drop(session);
        self.cleanup.notify_one();
    }

    /// At shutdown, before the lock parents are deleted: deletes every node of ours still
    /// there (doomed ones, creates in doubt, and live ones the session's close would remove
    /// anyway). A node left to the close goes only after the parents' deletes, which it made
    /// fail, and would leave its lock parent behind. Bounded by a short wait.
    pub(super) async fn delete_own_now(&self) {
        let Some(up) = self.current() else { return };
        let work: Vec<Doomed> = {
            let mut nodes = self.nodes.locked();
            let mut work = std::mem::take(&mut nodes.doomed);
            work.extend(nodes.live.drain().map(|(path, _)| Doomed::Path(path)));
            work.extend(
                nodes
                    .doubts
                    .drain()
                    .map(|(uuid, (_, lock_path))| Doomed::Prefix { lock_path, uuid }),
            );
            work
        };
        let deletes = async {
            for doomed in &work {
                if let Err(f) = delete_doomed(&up.zk, doomed).await {
                    tracing::debug!(node = ?doomed, failure = %f, "zookeeper: delete at shutdown failed; the session's close removes it");
                }
            }
        };
        let _ = tokio::time::timeout(CLOSE_WAIT, deletes).await;
    }

    /// Closes the session for good: waiters get `Closed`, held locks are lost. Returns once
    /// the server confirmed the close, or after a short wait.
    pub(super) async fn close(&self) {
        if let Some(zk) = self.ended() {
            let done = zk.closed();
            drop(zk);
            let _ = tokio::time::timeout(CLOSE_WAIT, done).await;
        }
    }

    /// Marks the hub closed (waiters get `Closed`) and every held lock lost; returns the
    /// session's client, if it had one, for the caller to close or drop.
    fn ended(&self) -> Option<Arc<Session>> {
        let (session, lost) = {
            let mut held = self.held.locked();
            let mut session = self.session.locked();
            self.publish(|c| {
                c.up = false;
                c.closed = true;
            });
            let lost: Vec<Claim> = held.drain().map(|(_, h)| h.claim).collect();
            (session.take(), lost)
        };
        for claim in lost {
            claim.mark_lost();
        }
        session
    }
}

/// Follows the current session's states; declares it lost when it ends or stays down for a
/// session timeout, then opens the next one. Holds the hub weakly, so that dropping the
/// backend still closes the session. It ends only when the hub is closed or gone, or with its
/// runtime, which takes the session's own task too: the hub is closed then, so that calls and
/// waiters of other runtimes get `Closed` at once instead of waiting on a session that cannot
/// answer.
async fn run(hub: Weak<SessionHub>, mut links: mpsc::UnboundedReceiver<(u64, Link)>) {
    let _ended = scopeguard::guard(hub.clone(), |hub| {
        if let Some(hub) = hub.upgrade() {
            hub.ended();
        }
    });
    // When the current outage began.
    let mut down_since: Option<Instant> = None;
    loop {
        let Some(conn) = hub.upgrade().map(|h| h.now()) else {
            return;
        };
        if conn.closed {
            return;
        }
        let expiry = down_since.map(|t| t + conn.timeout);
        let event = tokio::select! {
            link = links.recv() => match link {
                Some(link) => Some(link),
                None => return,
            },
            () = sleep_until(expiry.unwrap_or_else(Instant::now)), if expiry.is_some() => None,
        };
        let Some(h) = hub.upgrade() else { return };
        match event {
            // News of a session already replaced.
            Some((epoch, _)) if epoch != conn.epoch => {}
            Some((_, Link::Up)) => {
                let was_down = down_since.take().is_some() || !conn.up;
                h.publish(|c| c.up = true);
                h.cleanup.notify_one();
                if was_down {
                    h.reconnects.send_modify(|n| *n += 1);
                }
            }
            Some((_, Link::Down)) => {
                down_since.get_or_insert_with(Instant::now);
                h.publish(|c| c.up = false);
            }
            Some((_, Link::Gone)) => {
                down_since = None;
                h.lose_session("ended by the server");
                drop(h);
                reconnect(&hub).await;
            }
            None => {
                down_since = None;
                h.lose_session("disconnected for longer than the session timeout");
                drop(h);
                reconnect(&hub).await;
            }
        }
    }
}

/// Opens a new session, retrying with a growing pause, until it works or the hub closes.
async fn reconnect(hub: &Weak<SessionHub>) {
    let mut pause = RECONNECT_MIN;
    loop {
        let Some(h) = hub.upgrade() else { return };
        let conn = h.now();
        if conn.closed {
            return;
        }
        let mut closing = h.subscribe();
        let settings = h.settings.clone();
        let links = h.links.clone();
        drop(h);
        let connecting = Instant::now();
        let attempt = tokio::select! {
            r = client::connect(&settings, conn.epoch, links) => r,
            _ = closing.wait_for(|c| c.closed) => return,
        };
        match attempt {
            Ok(zk) => {
                if let Some(h) = hub.upgrade() {
                    if !h.now().closed {
                        h.install(zk, connecting);
                    }
                }
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, pause = ?pause, "zookeeper: no new session yet");
            }
        }
        tokio::select! {
            () = sleep(pause) => {}
            _ = closing.wait_for(|c| c.closed) => return,
        }
        pause = (pause * 2).min(RECONNECT_MAX);
    }
}

/// Deletes doomed nodes whenever connected: woken by a reconnect or a new doomed node, and
/// again after a growing pause while some deletes fail.
async fn cleanup(hub: Weak<SessionHub>, wake: Arc<Notify>) {
    let mut pause: Option<Duration> = None;
    loop {
        match pause {
            Some(p) => {
                tokio::select! {
                    () = wake.notified() => {}
                    () = sleep(p) => {}
                }
            }
            None => wake.notified().await,
        }
        let Some(h) = hub.upgrade() else { return };
        if h.now().closed {
            return;
        }
        let Some(up) = h.current() else {
            // A reconnect wakes us.
            continue;
        };
        let work = std::mem::take(&mut h.nodes.locked().doomed);
        if work.is_empty() {
            pause = None;
            continue;
        }
        let mut failed = Vec::new();
        for doomed in work {
            match delete_doomed(&up.zk, &doomed).await {
                Ok(()) => {}
                Err(Failure::Unknown(_)) => failed.push(doomed),
                Err(f) => {
                    tracing::warn!(node = ?doomed, failure = %f, "zookeeper: giving up a guaranteed delete");
                }
            }
        }
        if failed.is_empty() {
            pause = None;
        } else {
            h.nodes.locked().doomed.extend(failed);
            pause = Some(pause.map_or(CLEANUP_MIN, |p| (p * 2).min(CLEANUP_MAX)));
        }
    }
}

async fn delete_doomed(zk: &Session, doomed: &Doomed) -> client::Outcome<()> {
    let paths = match doomed {
        Doomed::Path(path) => vec![path.clone()],
        Doomed::Prefix { lock_path, uuid } => {
            // Every node the create made: a semaphore's lease create makes several.
            let prefix = recipe::protection_prefix(uuid);
            match zk.children(lock_path).await {
                Ok(kids) => kids
                    .into_iter()
                    .filter(|k| k.starts_with(&prefix))
                    .map(|name| format!("{lock_path}/{name}"))
                    .collect(),
                Err(Failure::NoNode) => return Ok(()),
                Err(f) => return Err(f),
            }
        }
    };
    for path in paths {
        match zk.delete(&path).await {
            Ok(()) | Err(Failure::NoNode) => {}
            Err(f) => return Err(f),
        }
    }
    Ok(())
}
