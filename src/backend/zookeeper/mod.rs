//! The ZooKeeper backend: Curator `InterProcessMutex` compatible locks.
//!
//! A lock on key `k` in namespace `ns` is the znode `/ns/k`; each claim is an
//! EPHEMERAL_SEQUENTIAL child `_c_<uuid>-lock-<seq>`, the exact names and order Curator uses, so
//! a Java service locking `/ns/k` with Curator 5 and a Rust service locking `k` exclude each
//! other. A waiter watches only the child just before its own (no herd). The fencing token is
//! the czxid of the claim's node.
//!
//! See [`session`] for how connection states, expiry and reconnects reach the locks, and
//! [`client`] for the workarounds `zookeeper-async` needs.

mod client;
mod parents;
mod recipe;
mod session;

use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use self::client::{AsyncZk, Failure, Fired, NodeStat, Settings, Zk};
use self::parents::Parents;
use self::recipe::Place;
use self::session::Hub;
use super::{Attempt, Backend, Claim, Grant, Renewal};
use crate::error::{Error, ErrorKind, Result};

/// Default session timeout: how long the ensemble keeps our session (and locks) without
/// hearing from us, and how long a disconnect may last before our guards report lost.
pub const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(10);

/// Who may touch the nodes the backend creates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ZkAcl {
    /// Anyone may do anything (`world:anyone`, all permissions), Curator's default.
    #[default]
    Open,
    /// Only the identity that created a node (needs [`ZkBackendBuilder::digest`]).
    CreatorAll,
    /// The creator may do anything; everyone else may read.
    CreatorAllWorldRead,
}

/// Locks on a ZooKeeper ensemble, interoperable with Curator's `InterProcessMutex`.
///
/// One session per backend. Locks live as long as it does: if the session expires, or we stay
/// disconnected for a whole session timeout, every guard reports [`lost`](crate::MutexGuard::lost).
/// A shorter blip keeps the locks, and waiters re-check as soon as the link is back.
/// `ZkBackend` is a cheap `Clone` handle.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use distlock::{backend::ZkBackend, LockClient};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), distlock::Error> {
/// let backend = ZkBackend::builder("zk1:2181,zk2:2181,zk3:2181/apps")
///     .session_timeout(Duration::from_secs(15))
///     .build()
///     .await?;
/// // Curator on the Java side locks the same node: `new InterProcessMutex(client, "/billing/invoice-7")`.
/// let client = LockClient::builder(backend).namespace("billing").build()?;
/// let guard = client.mutex("invoice-7").lock().await?;
/// guard.release().await?;
/// client.shutdown().await;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct ZkBackend {
    inner: Arc<Inner>,
}

struct Inner {
    zk: Arc<dyn Zk>,
    hub: Arc<Hub>,
    parents: Arc<Parents>,
    session_timeout: Duration,
}

impl std::fmt::Debug for ZkBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZkBackend")
            .field("session_timeout", &self.inner.session_timeout)
            .field("connection", &self.inner.hub.now())
            .finish_non_exhaustive()
    }
}

/// Configures a [`ZkBackend`].
#[derive(Debug, Clone)]
pub struct ZkBackendBuilder {
    settings: Settings,
}

impl ZkBackend {
    /// Starts configuring a backend for `connect`: `host:port[,host:port...][/chroot]`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use distlock::backend::{ZkAcl, ZkBackend};
    ///
    /// let builder = ZkBackend::builder("127.0.0.1:2181")
    ///     .session_timeout(Duration::from_secs(10))
    ///     .digest("app:secret")
    ///     .acl(ZkAcl::CreatorAll);
    /// # drop(builder);
    /// ```
    pub fn builder(connect: impl Into<String>) -> ZkBackendBuilder {
        ZkBackendBuilder {
            settings: Settings {
                connect: connect.into(),
                session_timeout: DEFAULT_SESSION_TIMEOUT,
                connect_timeout: Duration::from_secs(10),
                call_timeout: Duration::from_secs(5),
                digest: None,
                acl: ZkAcl::Open,
            },
        }
    }

    /// Connects with the defaults; see [`builder`](Self::builder).
    ///
    /// # Errors
    ///
    /// As [`ZkBackendBuilder::build`].
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the half-open client, which closes its session.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let backend = distlock::backend::ZkBackend::connect("127.0.0.1:2181").await?;
    /// # drop(backend); Ok(()) }
    /// ```
    pub async fn connect(connect: &str) -> Result<Self> {
        Self::builder(connect).build().await
    }

    /// The session timeout asked of the ensemble.
    pub fn session_timeout(&self) -> Duration {
        self.inner.session_timeout
    }
}

impl ZkBackendBuilder {
    /// How long the ensemble keeps the session without hearing from us (default 10 s). Keep it
    /// within the server's `minSessionTimeout`..`maxSessionTimeout`: the backend counts on the
    /// value it asked for.
    pub fn session_timeout(mut self, timeout: Duration) -> Self {
        self.settings.session_timeout = timeout;
        self
    }

    /// How long [`build`](Self::build) may take to reach a server (default 10 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.settings.connect_timeout = timeout;
        self
    }

    /// The deadline of every single call (default 5 s). A call past it has an unknown outcome
    /// and is handled like a lost connection.
    pub fn call_timeout(mut self, timeout: Duration) -> Self {
        self.settings.call_timeout = timeout;
        self
    }

    /// Authenticates as `user:password` (scheme `digest`), again after every reconnect.
    pub fn digest(mut self, user_password: impl Into<String>) -> Self {
        self.settings.digest = Some(user_password.into());
        self
    }

    /// The ACL of every node the backend creates (default [`ZkAcl::Open`]).
    pub fn acl(mut self, acl: ZkAcl) -> Self {
        self.settings.acl = acl;
        self
    }

    /// Connects and waits for the session.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidConfig`] for a bad connect string, zero timeouts, or a creator ACL
    /// without digest auth; [`ErrorKind::Backend`] if no server answers within the connect
    /// timeout or the server refuses the session or the credentials.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the half-open client, which closes its session.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// use distlock::backend::ZkBackend;
    /// let backend = ZkBackend::builder("127.0.0.1:2181/locks").build().await?;
    /// # drop(backend); Ok(()) }
    /// ```
    pub async fn build(self) -> Result<ZkBackend> {
        let s = self.settings;
        if s.connect.trim().is_empty() {
            return Err(Error::invalid_config("empty zookeeper connect string"));
        }
        for (name, d) in [
            ("session timeout", s.session_timeout),
            ("connect timeout", s.connect_timeout),
            ("call timeout", s.call_timeout),
        ] {
            if d.is_zero() {
                return Err(Error::invalid_config(format!("zero zookeeper {name}")));
            }
        }
        if s.acl != ZkAcl::Open && s.digest.is_none() {
            return Err(Error::invalid_config(
                "a creator ACL needs digest auth: call .digest(\"user:password\")",
            ));
        }
        if s.digest.as_deref().is_some_and(|d| !d.contains(':')) {
            return Err(Error::invalid_config("digest auth must be `user:password`"));
        }
        let (links_tx, links_rx) = mpsc::unbounded_channel();
        let (session_timeout, connect_timeout) = (s.session_timeout, s.connect_timeout);
        let connect = s.connect.clone();
        let zk: Arc<dyn Zk> = Arc::new(AsyncZk::connect(s, links_tx).await?);
        let hub = Hub::new(session_timeout);
        tokio::spawn(hub.clone().run(Arc::downgrade(&zk), links_rx));

        // The first `Connected` may have come before the listener was installed: one call
        // proves the session (and sends the credentials ahead of it).
        let proven = tokio::time::timeout(connect_timeout, async {
            zk.authenticate().await?;
            zk.exists("/").await
        })
        .await;
        match proven {
            Ok(Ok(_)) => hub.confirm_up(),
            Ok(Err(f)) => {
                zk.close().await;
                return Err(f.into_error(&format!("session at `{connect}`")));
            }
            Err(_) => {
                zk.close().await;
                return Err(Error::new(
                    ErrorKind::Backend,
                    format!("no zookeeper session at `{connect}` within {connect_timeout:?}"),
                )
                .transient());
            }
        }
        Ok(ZkBackend {
            inner: Arc::new(Inner {
                parents: Parents::new(zk.clone()),
                zk,
                hub,
                session_timeout,
            }),
        })
    }
}

/// Either a result, or "go round the acquire loop again" (with the failure that caused it).
enum Step<T> {
    Ready(T),
    Again(Option<Failure>),
}

/// A claim's node once created.
#[derive(Debug, Clone)]
struct Node {
    name: String,
    path: String,
    stat: NodeStat,
    /// The hub epoch it was created in.
    epoch: u64,
}

/// What one claim keeps between calls: its node, or the protection prefix of a create whose
/// reply was lost, and its predecessor watch while it waits.
#[derive(Default)]
pub struct ZkTicket {
    state: StdMutex<TicketState>,
}

#[derive(Default)]
struct TicketState {
    /// The UUID in our node's name; a new one after a session change.
    uuid: Option<String>,
    node: Option<Node>,
    /// A create was sent and its outcome is unknown (in this epoch).
    unsure: Option<u64>,
    waiting: Option<Waiting>,
    granted: bool,
    /// Counted in [`Parents`] (released once).
    entered: bool,
}

struct Waiting {
    fired: oneshot::Receiver<Fired>,
    /// The predecessor was the holder: its deletion makes us the head.
    behind_head: bool,
    /// When the call that set the watch was sent, and the hub's change count before it.
    sent: Instant,
    seen: u64,
}

impl std::fmt::Debug for ZkTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.lock();
        f.debug_struct("ZkTicket")
            .field("node", &s.node.as_ref().map(|n| &n.path))
            .field("granted", &s.granted)
            .finish_non_exhaustive()
    }
}

impl ZkTicket {
    fn lock(&self) -> std::sync::MutexGuard<'_, TicketState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn lock_path(claim: &Claim) -> String {
    format!("/{}/{}", claim.namespace(), claim.key())
}

fn fence(stat: &NodeStat) -> Result<u64> {
    u64::try_from(stat.czxid).map_err(|_| {
        Error::new(
            ErrorKind::Backend,
            format!("zookeeper returned an invalid czxid {}", stat.czxid),
        )
    })
}

impl Inner {
    /// The node a create with a lost reply made, found by its protection prefix.
    async fn find_ours(
        &self,
        lock_path: &str,
        uuid: &str,
    ) -> std::result::Result<Option<String>, Failure> {
        let prefix = recipe::protection_prefix(uuid);
        match self.zk.children(lock_path).await {
            Ok(kids) => Ok(kids.into_iter().find(|k| k.starts_with(&prefix))),
            Err(Failure::NoNode) => Ok(None),
            Err(f) => Err(f),
        }
    }

    /// Creates `lock_path` and its missing ancestors.
    async fn create_parents(&self, lock_path: &str) -> Result<()> {
        let mut at = 0;
        while let Some(next) = lock_path[at + 1..].find('/').map(|i| i + at + 1) {
            self.create_parent(&lock_path[..next]).await?;
            at = next;
        }
        self.create_parent(lock_path).await
    }

    async fn create_parent(&self, path: &str) -> Result<()> {
        match self.zk.create_parent(path).await {
            Ok(()) | Err(Failure::NodeExists) => Ok(()),
            Err(f) => Err(f.into_error(&format!("create {path}"))),
        }
    }

    /// A node (or a create in doubt) from an older session is gone or about to go: delete it
    /// in case the session survived after all, and draw a new protection UUID.
    async fn discard_stale(&self, ticket: &ZkTicket, lock_path: &str, epoch: u64) {
        let (stale, doubt) = {
            let mut t = ticket.lock();
            let stale = t.node.take_if(|n| n.epoch != epoch);
            let doubt = match t.unsure {
                Some(e) if e != epoch => t.uuid.clone(),
                _ => None,
            };
            if stale.is_some() || doubt.is_some() {
                t.unsure = None;
                t.uuid = Some(uuid::Uuid::new_v4().hyphenated().to_string());
            }
            (stale, doubt)
        };
        if let Some(stale) = stale {
            let _ = self.zk.delete(&stale.path).await;
        }
        if let Some(uuid) = doubt {
            if let Ok(Some(name)) = self.find_ours(lock_path, &uuid).await {
                let _ = self.zk.delete(&format!("{lock_path}/{name}")).await;
            }
        }
    }

    /// The claim's node: the one it has, the one a create with a lost reply made (protection
    /// mode: looked up before making another), or a new one.
    async fn ensure_node(
        &self,
        claim: &Claim,
        ticket: &ZkTicket,
        lock_path: &str,
        epoch: u64,
    ) -> Result<Step<Node>> {
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
            match self.find_ours(lock_path, &uuid).await {
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
                match self.zk.exists(&path).await {
                    Ok(Some(stat)) => Ok((path, stat)),
                    Ok(None) => Err(Failure::NoNode),
                    Err(f) => Err(f),
                }
            }
            None => {
                ticket.lock().unsure = Some(epoch);
                let prefix = format!("{lock_path}/{}", recipe::node_prefix(&uuid));
                self.zk.create_lock_node(&prefix).await
            }
        };
        match made {
            Ok((path, stat)) => {
                let name = path.rsplit('/').next().unwrap_or_default().to_owned();
                let node = Node {
                    name,
                    path,
                    stat,
                    epoch,
                };
                let mut t = ticket.lock();
                t.unsure = None;
                t.node = Some(node.clone());
                Ok(Step::Ready(node))
            }
            Err(Failure::NoNode) => {
                ticket.lock().unsure = None;
                self.create_parents(lock_path).await?;
                Ok(Step::Again(None))
            }
            Err(f @ Failure::Unknown(_)) => Ok(Step::Again(Some(f))),
            Err(f) => {
                ticket.lock().unsure = None;
                Err(f.into_error(&format!("create in {lock_path}")))
            }
        }
    }

    async fn acquire(&self, claim: &Claim, ticket: &ZkTicket, wait: bool) -> Result<Attempt> {
        let lock_path = lock_path(claim);
        {
            let mut t = ticket.lock();
            if !std::mem::replace(&mut t.entered, true) {
                self.parents.enter(&lock_path);
            }
            t.waiting = None;
        }
        let give_up = Instant::now() + self.session_timeout;
        let mut last: Option<Failure> = None;
        loop {
            if Instant::now() >= give_up {
                let why = last.map_or("no progress".into(), |f| f.to_string());
                return Err(Failure::Unknown(why).into_error(&format!("lock {lock_path}")));
            }
            let conn = self.hub.until_up(self.session_timeout).await?;

            self.discard_stale(ticket, &lock_path, conn.epoch).await;
            let node = match self
                .ensure_node(claim, ticket, &lock_path, conn.epoch)
                .await?
            {
                Step::Ready(node) => node,
                Step::Again(failure) => {
                    last = failure.or(last);
                    continue;
                }
            };

            let sent = Instant::now();
            let mut kids = match self.zk.children(&lock_path).await {
                Ok(kids) => kids,
                Err(Failure::NoNode) => {
                    ticket.lock().node = None;
                    continue;
                }
                Err(f @ Failure::Unknown(_)) => {
                    last = Some(f);
                    continue;
                }
                Err(f) => return Err(f.into_error(&format!("list {lock_path}"))),
            };
            recipe::sort(&mut kids);
            match recipe::place(&kids, &node.name) {
                Place::Missing => {
                    // Deleted behind our back, or its session ended: queue again.
                    ticket.lock().node = None;
                }
                Place::Head => {
                    if !self.hub.register(claim, node.epoch) {
                        continue;
                    }
                    ticket.lock().granted = true;
                    return Ok(Attempt::Granted(Grant {
                        fence: fence(&node.stat)?,
                        valid_until: sent + self.session_timeout,
                    }));
                }
                Place::Behind { .. } if !wait => {
                    // A try leaves nothing behind.
                    match self.zk.delete(&node.path).await {
                        Ok(()) | Err(Failure::NoNode) => {}
                        Err(f) => return Err(f.into_error(&format!("delete {}", node.path))),
                    }
                    let mut t = ticket.lock();
                    t.node = None;
                    if std::mem::take(&mut t.entered) {
                        self.parents.leave(&lock_path);
                    }
                    return Ok(Attempt::Queued { recheck_at: None });
                }
                Place::Behind {
                    predecessor,
                    predecessor_is_head,
                } => {
                    let sent = Instant::now();
                    match self.zk.watch(&format!("{lock_path}/{predecessor}")).await {
                        Ok(fired) => {
                            ticket.lock().waiting = Some(Waiting {
                                fired,
                                behind_head: predecessor_is_head,
                                sent,
                                seen: conn.changes,
                            });
                            return Ok(Attempt::Queued { recheck_at: None });
                        }
                        // Gone between the listing and the watch: list again.
                        Err(Failure::NoNode) => {}
                        Err(f @ Failure::Unknown(_)) => last = Some(f),
                        Err(f) => return Err(f.into_error(&format!("watch in {lock_path}"))),
                    }
                }
            }
        }
    }

    async fn wait(&self, claim: &Claim, ticket: &ZkTicket) -> Result<Option<Grant>> {
        let (waiting, node) = {
            let mut t = ticket.lock();
            (t.waiting.take(), t.node.clone())
        };
        let (Some(waiting), Some(node)) = (waiting, node) else {
            return Ok(None);
        };
        let mut states = self.hub.subscribe();
        tokio::select! {
            fired = waiting.fired => {
                // The holder's node went, and only nodes created after ours can have appeared
                // since our listing: we are the head, no need to list again. The watch came
                // over the same session, and the call that set it proves the session alive
                // from `sent` on; list again if that proof is old.
                let fresh = waiting.sent + self.session_timeout / 3 > Instant::now();
                let conn = self.hub.now();
                if fired == Ok(Fired::Deleted)
                    && waiting.behind_head
                    && fresh
                    && conn.up
                    && conn.epoch == node.epoch
                    && self.hub.register(claim, node.epoch)
                {
                    ticket.lock().granted = true;
                    return Ok(Some(Grant {
                        fence: fence(&node.stat)?,
                        valid_until: waiting.sent + self.session_timeout,
                    }));
                }
                Ok(None)
            }
            // Watches do not survive a reconnect: any change means list again.
            _ = states.wait_for(|c| c.changes != waiting.seen) => Ok(None),
        }
    }

    async fn release(&self, claim: &Claim, ticket: &ZkTicket) -> Result<bool> {
        self.hub.unregister(claim);
        let lock_path = lock_path(claim);
        let (mut node, mut doubt, granted, entered) = {
            let mut t = ticket.lock();
            t.waiting = None;
            let doubt = t.unsure.take().and(t.uuid.clone());
            (
                t.node.take(),
                doubt,
                std::mem::take(&mut t.granted),
                std::mem::take(&mut t.entered),
            )
        };
        let mut held = granted
            && node
                .as_ref()
                .is_some_and(|n| n.epoch == self.hub.now().epoch);
        // Retried through a passing outage, up to a session timeout; after that the node goes
        // with the session (closed at shutdown at the latest).
        let give_up = Instant::now() + self.session_timeout;
        let outcome = loop {
            let patience = give_up.saturating_duration_since(Instant::now());
            if let Err(e) = self.hub.until_up(patience).await {
                break Err(e);
            }
            if let Some(n) = &node {
                match self.zk.delete(&n.path).await {
                    Ok(()) => break Ok(()),
                    Err(Failure::NoNode) => {
                        held = false;
                        break Ok(());
                    }
                    Err(Failure::Unknown(why)) if Instant::now() < give_up => {
                        tracing::debug!(path = %n.path, %why, "zookeeper: delete in doubt, retrying");
                    }
                    Err(f) => break Err(f.into_error(&format!("delete {}", n.path))),
                }
            } else if let Some(uuid) = &doubt {
                match self.find_ours(&lock_path, uuid).await {
                    Ok(Some(name)) => {
                        node = Some(Node {
                            path: format!("{lock_path}/{name}"),
                            name,
                            stat: NodeStat {
                                czxid: 0,
                                session: 0,
                            },
                            epoch: 0,
                        });
                    }
                    Ok(None) => {
                        doubt = None;
                    }
                    Err(Failure::Unknown(_)) if Instant::now() < give_up => {}
                    Err(f) => break Err(f.into_error(&format!("list {lock_path}"))),
                }
            } else {
                break Ok(());
            }
        };
        if entered {
            self.parents.leave(&lock_path);
        }
        outcome.map(|()| held)
    }

    async fn renew_one(&self, ticket: &ZkTicket) -> Renewal {
        let node = ticket.lock().node.clone();
        let conn = self.hub.now();
        let Some(node) = node.filter(|n| n.epoch == conn.epoch) else {
            return Renewal::NotOwner;
        };
        if !conn.up {
            return Renewal::Failed(
                Error::new(ErrorKind::Backend, "zookeeper: disconnected").transient(),
            );
        }
        let sent = Instant::now();
        match self.zk.exists(&node.path).await {
            Ok(Some(stat)) if stat.session == node.stat.session => {
                Renewal::Extended(sent + self.session_timeout)
            }
            Ok(_) | Err(Failure::NoNode) => Renewal::NotOwner,
            Err(f) => Renewal::Failed(f.into_error(&format!("check {}", node.path))),
        }
    }
}

impl Backend for ZkBackend {
    type Ticket = ZkTicket;

    fn validate_key(&self, key: &str) -> Result<()> {
        recipe::validate_key(key)
    }

    async fn acquire(&self, claim: &Claim, ticket: &ZkTicket, wait: bool) -> Result<Attempt> {
        self.inner.acquire(claim, ticket, wait).await
    }

    async fn wait(
        &self,
        claim: &Claim,
        ticket: &ZkTicket,
        _recheck_at: Option<Instant>,
    ) -> Result<Option<Grant>> {
        self.inner.wait(claim, ticket).await
    }

    async fn release(&self, claim: &Claim, ticket: &ZkTicket) -> Result<bool> {
        self.inner.release(claim, ticket).await
    }

    async fn renew(&self, claims: &[(&Claim, &ZkTicket)]) -> Vec<Renewal> {
        futures::future::join_all(claims.iter().map(|(_, t)| self.inner.renew_one(t))).await
    }

    async fn shutdown(&self) {
        self.inner.parents.flush().await;
        self.inner.zk.close().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bad_settings_are_config_errors_before_any_io() {
        let cases = [
            ZkBackend::builder(""),
            ZkBackend::builder("127.0.0.1:1").session_timeout(Duration::ZERO),
            ZkBackend::builder("127.0.0.1:1").acl(ZkAcl::CreatorAll),
            ZkBackend::builder("127.0.0.1:1").digest("no-colon"),
        ];
        for builder in cases {
            let err = builder.build().await.unwrap_err();
            assert!(err.is_invalid_config(), "{err:?}");
        }
    }
}
