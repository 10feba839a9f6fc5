//! The ZooKeeper backend: Curator `InterProcessMutex` compatible locks.
//!
//! A lock on key `k` in namespace `ns` is the znode `/ns/k`; each claim is an
//! EPHEMERAL_SEQUENTIAL child `_c_<uuid>-lock-<seq>`, the exact names and order Curator uses, so
//! a Java service locking `/ns/k` with Curator 5 and a Rust service locking `k` exclude each
//! other. A waiter watches only the child just before its own (no herd). The fencing token is
//! the czxid of the claim's node.
//!
//! A lease here is the session: it is valid for the session timeout the server *granted*,
//! counted from the last write that went through the quorum (a create, a delete, or the
//! renewal's `check`), never from a read a lagging follower could serve. See [`session`] for
//! how session loss, reconnects and guaranteed deletes work, and [`client`] for the one module
//! that talks to `zookeeper-client`.

mod client;
mod parents;
mod recipe;
mod session;

use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use tokio::time::{sleep_until, Instant};

use self::client::{Failure, Fired, NodeStat, Settings, Watch};
use self::parents::Parents;
use self::recipe::Place;
use self::session::{Hub, Up};
use super::{Attempt, Backend, Claim, Grant, Renewal};
use crate::error::{Error, ErrorKind, Result};

/// Default session timeout: how long the ensemble keeps our session (and locks) without
/// hearing from us, and how long a disconnect may last before our guards report lost.
pub const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(10);

/// The shortest session timeout accepted. A shorter session is lost to a garbage-collection
/// pause or a leader election alone, and ZooKeeper servers refuse less than two ticks (4 s with
/// the default `tickTime`) anyway.
pub const MIN_SESSION_TIMEOUT: Duration = Duration::from_secs(1);

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
    hub: Arc<Hub>,
    parents: Arc<Parents>,
}

impl std::fmt::Debug for ZkBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZkBackend")
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

    /// The session timeout the ensemble granted (it may cap what was asked at its
    /// `maxSessionTimeout`, or raise it to its `minSessionTimeout`). Leases last this long.
    pub fn session_timeout(&self) -> Duration {
        self.inner.hub.now().timeout
    }
}

impl ZkBackendBuilder {
    /// How long the ensemble should keep the session without hearing from us (default 10 s, at
    /// least [`MIN_SESSION_TIMEOUT`]). The server may grant another value within its
    /// `minSessionTimeout`..`maxSessionTimeout`; leases use the one it granted
    /// ([`ZkBackend::session_timeout`]).
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
        if s.session_timeout < MIN_SESSION_TIMEOUT {
            return Err(Error::invalid_config(format!(
                "zookeeper session timeout of {:?} is below the minimum of {MIN_SESSION_TIMEOUT:?}",
                s.session_timeout
            )));
        }
        if s.acl != ZkAcl::Open && s.digest.is_none() {
            return Err(Error::invalid_config(
                "a creator ACL needs digest auth: call .digest(\"user:password\")",
            ));
        }
        if s.digest.as_deref().is_some_and(|d| !d.contains(':')) {
            return Err(Error::invalid_config("digest auth must be `user:password`"));
        }
        let hub = Hub::start(s).await?;
        Ok(ZkBackend {
            inner: Arc::new(Inner {
                parents: Parents::new(hub.clone()),
                hub,
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
/// reply was lost, its predecessor watch while it waits, and the watch on its own node while
/// it holds the lock.
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
    fired: Watch,
    /// The predecessor was the holder: its deletion makes us the head.
    behind_head: bool,
    /// The hub's change count before the call that set the watch.
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
    async fn create_parents(&self, up: &Up, lock_path: &str) -> Result<()> {
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

    /// A node (or a create in doubt) from an older session is gone or about to go: hand it to
    /// the guaranteed deletes (in case the session survived after all) and draw a new
    /// protection UUID. Nothing is forgotten before it is handed over.
    fn discard_stale(&self, ticket: &ZkTicket, lock_path: &str, epoch: u64) {
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
            self.hub.doom_doubt(lock_path, uuid);
        }
        if stale.is_some() || doubt.is_some() {
            t.unsure = None;
            t.uuid = Some(uuid::Uuid::new_v4().hyphenated().to_string());
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
                let prefix = format!("{lock_path}/{}", recipe::node_prefix(&uuid));
                let sent = Instant::now();
                let made = up.zk.create_lock_node(&prefix).await;
                if made.is_ok() {
                    self.hub.prove(epoch, sent);
                }
                made
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
                self.hub.made(epoch, &node.path);
                self.hub.settled(&uuid);
                {
                    let mut t = ticket.lock();
                    t.unsure = None;
                    t.node = Some(node.clone());
                }
                self.guard_node(claim, &node);
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

    /// When the session is proven alive from, for a grant on `up`: the last quorum write if it
    /// leaves a third of a session timeout of lease (the first renewal refreshes it soon),
    /// otherwise a `check` of our own node now.
    async fn proof(&self, up: &Up, node: &Node) -> std::result::Result<Instant, Failure> {
        let epoch = up.conn.epoch;
        if let Some(at) = self.hub.proven(epoch) {
            if at + up.conn.timeout * 2 / 3 > Instant::now() {
                return Ok(at);
            }
        }
        let sent = Instant::now();
        let checked = up.zk.check(std::slice::from_ref(&node.path)).await;
        match checked.into_iter().next() {
            Some(Ok(())) => {
                self.hub.prove(epoch, sent);
                Ok(sent)
            }
            Some(Err(f)) => Err(f),
            None => Err(Failure::Unknown("no check result".into())),
        }
    }

    /// Watches our own node from the moment it exists (the request goes out without delaying
    /// the acquisition): if it is deleted behind our back while we hold the lock, the lock is
    /// marked lost at once rather than at the next renewal. The watch ends when the node goes
    /// (our own delete included: the claim is no longer registered as held by then), or with
    /// the session; it is never removed early, which would cost a request.
    fn guard_node(&self, claim: &Claim, node: &Node) {
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
            // A waiter whose node vanished finds out when it lists again.
            if hub.upgrade().is_some_and(|h| h.holds(&claim)) {
                tracing::warn!(
                    key = claim.key(),
                    "lock lost: our zookeeper node was deleted"
                );
                claim.mark_lost();
            }
        });
    }

    /// Records the grant; false if the session was lost meanwhile.
    fn granted(&self, claim: &Claim, ticket: &ZkTicket, node: &Node) -> bool {
        if !self.hub.register(claim, node.epoch) {
            return false;
        }
        ticket.lock().granted = true;
        true
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
        let give_up = Instant::now() + self.hub.now().timeout;
        let mut last: Option<Failure> = None;
        loop {
            if Instant::now() >= give_up {
                let why = last.map_or("no progress".into(), |f| f.to_string());
                return Err(Failure::Unknown(why).into_error(&format!("lock {lock_path}")));
            }
            let up = self.hub.until_up(self.hub.now().timeout).await?;
            let conn = up.conn;

            self.discard_stale(ticket, &lock_path, conn.epoch);
            let node = match self.ensure_node(claim, ticket, &up, &lock_path).await? {
                Step::Ready(node) => node,
                Step::Again(failure) => {
                    last = failure.or(last);
                    continue;
                }
            };

            let mut kids = match up.zk.children(&lock_path).await {
                Ok(kids) => kids,
                Err(f) => {
                    self.again(ticket, &node, f, &mut last, || format!("list {lock_path}"))?;
                    continue;
                }
            };
            recipe::sort(&mut kids);
            match recipe::place(&kids, &node.name) {
                Place::Missing => {
                    // Deleted behind our back, or its session ended: queue again.
                    self.forget_node(ticket, &node);
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
                    if !self.granted(claim, ticket, &node) {
                        continue;
                    }
                    return Ok(Attempt::Granted(Grant {
                        fence: fence(&node.stat)?,
                        valid_until: since + conn.timeout,
                    }));
                }
                Place::Behind { .. } if !wait => {
                    // A try leaves nothing behind.
                    let deleted = up.zk.delete(&node.path).await;
                    let mut t = ticket.lock();
                    t.node = None;
                    match deleted {
                        Ok(()) | Err(Failure::NoNode) => self.hub.gone(&node.path),
                        Err(_) => self.hub.doom(&node.path),
                    }
                    if std::mem::take(&mut t.entered) {
                        self.parents.leave(&lock_path);
                    }
                    return Ok(Attempt::Queued { recheck_at: None });
                }
                Place::Behind {
                    predecessor,
                    predecessor_is_head,
                } => match up.zk.watch(&format!("{lock_path}/{predecessor}")).await {
                    Ok(fired) => {
                        ticket.lock().waiting = Some(Waiting {
                            fired,
                            behind_head: predecessor_is_head,
                            seen: conn.changes,
                        });
                        return Ok(Attempt::Queued { recheck_at: None });
                    }
                    // Gone between the listing and the watch: list again.
                    Err(Failure::NoNode) => {}
                    Err(f @ Failure::Unknown(_)) => last = Some(f),
                    Err(f) => return Err(f.into_error(&format!("watch in {lock_path}"))),
                },
            }
        }
    }

    /// Triage of a failed call on our node inside the acquire loop: `Ok` to go round again
    /// (the node is gone, so queue with a new one; or the outcome is unknown, so retry), `Err`
    /// for anything the server refused.
    fn again(
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

    /// Our node is gone: queue again with a new one.
    fn forget_node(&self, ticket: &ZkTicket, node: &Node) {
        ticket.lock().node = None;
        self.hub.gone(&node.path);
    }

    async fn wait(
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
        tokio::select! {
            fired = waiting.fired => {
                // The holder's node went, and only nodes created after ours can have appeared
                // since our listing: we are the head, no need to list again, if the session
                // is the one our node lives in and was proven alive recently.
                if fired != Fired::Deleted || !waiting.behind_head {
                    return Ok(None);
                }
                let Some(up) = self.hub.current().filter(|up| up.conn.epoch == node.epoch) else {
                    return Ok(None);
                };
                let Ok(since) = self.proof(&up, &node).await else {
                    return Ok(None);
                };
                if !self.granted(claim, ticket, &node) {
                    return Ok(None);
                }
                Ok(Some(Grant {
                    fence: fence(&node.stat)?,
                    valid_until: since + up.conn.timeout,
                }))
            }
            // A reconnect or a new session: list again.
            () = async { let _ = states.wait_for(|c| c.changes != waiting.seen).await; } => Ok(None),
        }
    }

    async fn release(&self, claim: &Claim, ticket: &ZkTicket) -> Result<bool> {
        self.hub.unregister(claim);
        let lock_path = lock_path(claim);
        let (node, doubt, granted, entered) = {
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
        if let Some(uuid) = &doubt {
            // Whatever that create made goes, found by its prefix, now or after a reconnect.
            self.hub.doom_doubt(&lock_path, uuid);
        }
        let outcome = match &node {
            Some(node) => self.delete_node(node, granted).await,
            None => Ok(false),
        };
        if entered {
            self.parents.leave(&lock_path);
        }
        outcome
    }

    /// Deletes our node, through a passing outage, up to a session timeout; after that it is
    /// left to the guaranteed deletes. Returns whether it still held the lock.
    async fn delete_node(&self, node: &Node, granted: bool) -> Result<bool> {
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
                    self.hub.prove(node.epoch, sent);
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
    /// `check`s): a renewal that succeeds proves the session alive at the leader when it was
    /// sent, which a read from a partitioned follower would not.
    async fn renew(&self, tickets: &[&ZkTicket]) -> Vec<Renewal> {
        let nodes: Vec<Option<Node>> = tickets.iter().map(|t| t.lock().node.clone()).collect();
        let Some(up) = self.hub.current() else {
            let conn = self.hub.now();
            let down = Error::new(ErrorKind::Backend, "zookeeper: disconnected").transient();
            return nodes
                .iter()
                .map(|n| match n {
                    Some(n) if n.epoch == conn.epoch => Renewal::Failed(down.clone()),
                    _ => Renewal::NotOwner,
                })
                .collect();
        };
        let epoch = up.conn.epoch;
        let paths: Vec<String> = nodes
            .iter()
            .flatten()
            .filter(|n| n.epoch == epoch)
            .map(|n| n.path.clone())
            .collect();
        let sent = Instant::now();
        let mut checked = up.zk.check(&paths).await.into_iter();
        let mut proven = false;
        let out = nodes
            .iter()
            .map(|n| match n {
                Some(n) if n.epoch == epoch => match checked.next() {
                    Some(Ok(())) => {
                        proven = true;
                        Renewal::Extended(sent + up.conn.timeout)
                    }
                    Some(Err(Failure::NoNode)) => Renewal::NotOwner,
                    Some(Err(f)) => Renewal::Failed(f.into_error(&format!("check {}", n.path))),
                    None => Renewal::Failed(Error::new(
                        ErrorKind::Backend,
                        "zookeeper: missing check result",
                    )),
                },
                _ => Renewal::NotOwner,
            })
            .collect();
        if proven {
            self.hub.prove(epoch, sent);
        }
        out
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
        recheck_at: Option<Instant>,
    ) -> Result<Option<Grant>> {
        self.inner.wait(claim, ticket, recheck_at).await
    }

    async fn release(&self, claim: &Claim, ticket: &ZkTicket) -> Result<bool> {
        self.inner.release(claim, ticket).await
    }

    async fn renew(&self, claims: &[(&Claim, &ZkTicket)]) -> Vec<Renewal> {
        let tickets: Vec<&ZkTicket> = claims.iter().map(|(_, t)| *t).collect();
        self.inner.renew(&tickets).await
    }

    async fn shutdown(&self) {
        self.inner.parents.flush().await;
        self.inner.hub.close().await;
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
            // Shorter than any session a client can keep through a GC pause.
            ZkBackend::builder("127.0.0.1:1").session_timeout(Duration::from_millis(500)),
            ZkBackend::builder("127.0.0.1:1").acl(ZkAcl::CreatorAll),
            ZkBackend::builder("127.0.0.1:1").digest("no-colon"),
        ];
        for builder in cases {
            let err = builder.build().await.unwrap_err();
            assert!(err.is_invalid_config(), "{err:?}");
        }
    }
}
