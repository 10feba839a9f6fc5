//! The ZooKeeper backend: Curator 5 compatible locks.
//!
//! A lock on key `k` in namespace `ns` is the znode `/ns/k`, laid out exactly as Curator lays
//! out the same path (see [`recipe`]): a `Mutex` is an `InterProcessMutex`, an `RwLock` an
//! `InterProcessReadWriteLock`, a `Semaphore` an `InterProcessSemaphoreV2` (with one permit,
//! an `InterProcessSemaphoreMutex`), an `Election` a `LeaderLatch` ([`election`]). So a Java service using Curator on `/ns/k` and a Rust
//! service using distlock on `k` share one queue. A waiter watches one node, a mutex waiter
//! further back also the node ahead of its predecessor ([`recipe::ahead_of`]): a node is
//! watched by at most two waiters (no herd); only a semaphore's admission head watches the
//! lease list. The fencing token is the czxid of the
//! node that carries the grant (a downgraded read keeps its write grant's token).
//!
//! A lease here is the session: it is valid for the session timeout the server *granted*,
//! counted from an instant the **leader** is sure to have heard from the session, since only
//! the leader expires sessions. A write acknowledged through a follower does not prove that
//! (the follower tells the leader of a session's activity only in its replies to the leader's
//! pings, every `tickTime / 2`); a quorum write sent over a tick later proves the requests
//! acknowledged before it (see [`proof`], and [`ZkBackendBuilder::server_tick`]). See
//! [`session`] for how session loss, reconnects and guaranteed deletes work, [`queue`] for why
//! no listing grants early, and [`client`] for the one module that talks to `zookeeper-client`.

mod client;
mod election;
mod hold;
mod inspect;
mod leases;
mod parents;
mod proof;
mod queue;
mod recipe;
mod session;
mod ticket;
mod wait;

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use self::client::Settings;
use self::parents::Parents;
use self::session::SessionHub;
pub use self::ticket::ZkTicket;
use super::{Attempt, Backend, Claim, Grant, Leader, LeaderWatch, LockKind, Renewal};
use crate::error::{Error, Result};

/// Default session timeout: how long the ensemble keeps our session (and locks) without
/// hearing from us. Our guards report lost once a session timeout has passed since the last
/// request the leader is known to have heard, which can come before a disconnect has lasted a
/// whole session timeout (see [`ZkBackendBuilder::server_tick`]).
pub const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(10);

/// The shortest session timeout accepted. A shorter session is lost to a garbage-collection
/// pause or a leader election alone, and ZooKeeper servers raise anything shorter to their
/// `minSessionTimeout` (two ticks, 4 s with the default `tickTime`) anyway.
pub const MIN_SESSION_TIMEOUT: Duration = Duration::from_secs(1);

/// Default [`ZkBackendBuilder::server_tick`]: ZooKeeper's default `tickTime`.
pub const DEFAULT_SERVER_TICK: Duration = Duration::from_secs(2);

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

/// Locks on a ZooKeeper ensemble, interoperable with Curator's `InterProcessMutex`,
/// `InterProcessReadWriteLock` and `InterProcessSemaphoreV2`, and elections interoperable with
/// its `LeaderLatch`.
///
/// A semaphore's number of permits is not stored anywhere, as in Curator: every client of a
/// key must pass the same `max` (a Java `InterProcessSemaphoreV2(client, path, n)` included).
/// Different values do not fail; each client counts against its own. Mixing families on one
/// key (a mutex where a read-write lock is in use, ...) fails with
/// [`ErrorKind::KindMismatch`](crate::ErrorKind::KindMismatch).
///
/// One session per backend. Locks live as long as it does: if the session expires, or a session
/// timeout passes since the last request the leader is known to have heard (a disconnect of
/// about two thirds of the timeout can be enough), every guard reports
/// [`lost`](crate::MutexGuard::lost). A shorter blip keeps the locks, and waiters re-check as
/// soon as the link is back.
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
    hub: Arc<SessionHub>,
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
                server_tick: DEFAULT_SERVER_TICK,
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

    /// The largest `tickTime` among the ensemble's servers (default 2 s, ZooKeeper's default;
    /// at most half the granted session timeout is used, since a server grants no less than two
    /// ticks unless its `minSessionTimeout` says otherwise).
    ///
    /// Only the leader expires sessions, and a follower tells it of our requests only in its
    /// replies to the leader's pings, sent every half tick. So a lease counts from the last
    /// request followed, over three quarters of a tick later, by an acknowledged write; a grant
    /// after a quiet spell of most of a session timeout waits that long once to prove a fresh
    /// request. A value *below* the servers' `tickTime` lets a holder connected to a follower
    /// cut off from the leader believe in its lock after the leader has expired its session
    /// and granted the lock to someone else; a larger value only costs that wait.
    ///
    /// [`build`](Self::build) refuses zero.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use distlock::backend::ZkBackend;
    ///
    /// // Servers with `tickTime=500` in zoo.cfg.
    /// let builder = ZkBackend::builder("zk1:2181,zk2:2181,zk3:2181")
    ///     .server_tick(Duration::from_millis(500));
    /// # drop(builder);
    /// ```
    pub fn server_tick(mut self, tick: Duration) -> Self {
        self.settings.server_tick = tick;
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
    /// [`ErrorKind::InvalidConfig`](crate::ErrorKind::InvalidConfig) for a bad connect string,
    /// zero timeouts or server tick, a session timeout below [`MIN_SESSION_TIMEOUT`], a digest
    /// without `:`, a creator ACL without digest auth, or a chroot inside `/zookeeper` or one it
    /// may not create; [`ErrorKind::Backend`](crate::ErrorKind::Backend) if no server answers within the connect
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
            ("server tick", s.server_tick),
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
        let hub = SessionHub::start(s).await?;
        Ok(ZkBackend {
            inner: Arc::new(Inner {
                parents: Parents::new(hub.clone()),
                hub,
            }),
        })
    }
}

impl Backend for ZkBackend {
    type Ticket = ZkTicket;

    /// Every kind: mutexes, read-write locks, semaphores and elections (a `LeaderLatch`),
    /// each in Curator's layout.
    fn supports(&self, kind: LockKind) -> bool {
        let _ = kind;
        true
    }

    fn validate_key(&self, key: &str) -> Result<()> {
        recipe::validate_key(key)
    }

    fn name(&self) -> &'static str {
        "zookeeper"
    }

    /// The session timeout the ensemble granted: a lock lasts as long as the session does.
    fn lease(&self) -> Option<Duration> {
        Some(self.session_timeout())
    }

    fn reconnects(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(self.inner.hub.reconnects())
    }

    async fn inspect(&self, namespace: &str, key: &str) -> Result<crate::Inspection> {
        self.inner.inspect(namespace, key).await
    }

    async fn force_release(&self, namespace: &str, key: &str) -> Result<crate::ForceReleased> {
        self.inner.force_release(namespace, key).await
    }

    fn has_queued(&self, ticket: &ZkTicket) -> bool {
        ticket.has_queued()
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

    async fn downgrade(&self, claim: &Claim, ticket: &ZkTicket) -> Result<Grant> {
        self.inner.downgrade(claim, ticket).await
    }

    async fn renew(&self, claims: &[(&Claim, &ZkTicket)]) -> Vec<Renewal> {
        let tickets: Vec<&ZkTicket> = claims.iter().map(|(_, t)| *t).collect();
        self.inner.renew(&tickets).await
    }

    async fn proclaim(&self, claim: &Claim, ticket: &ZkTicket) -> Result<()> {
        self.inner.proclaim(claim, ticket).await
    }

    async fn leader(&self, namespace: &str, key: &str) -> Result<Option<Leader>> {
        self.inner.leader(namespace, key).await
    }

    async fn watch_leader(&self, namespace: &str, key: &str) -> Result<LeaderWatch> {
        self.inner.watch_leader(namespace, key).await
    }

    async fn shutdown(&self) {
        // Our own nodes first, so that the parents' deletes do not fail on them.
        self.inner.hub.delete_own_now().await;
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
            ZkBackend::builder("127.0.0.1:1").server_tick(Duration::ZERO),
        ];
        for builder in cases {
            let err = builder.build().await.unwrap_err();
            assert!(err.is_invalid_config(), "{err:?}");
        }
    }
}
