//! `LockClient`: the handle users keep, its builder and configuration.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::backend::{Backend, DynBackend};
use crate::core::lease::default_drift;
use crate::core::rules::{validate_namespace, validate_ttl};
use crate::core::{Config, Core};
use crate::error::{Error, Result};
use crate::multi::MultiLock;
use crate::mutex::Mutex;
use crate::rw_lock::RwLock;
use crate::semaphore::Semaphore;

/// The lease length used when none is configured: 30 seconds, renewed every 10.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

/// The namespace used when none is configured.
pub const DEFAULT_NAMESPACE: &str = "distlock";

/// The entry point: a connection to one coordination service, and the factory for locks on it.
///
/// A `LockClient` is cheap to clone and every clone shares the same connections and the same
/// background renewal task, so there is no need to wrap it in an `Arc`. It holds a namespace
/// (every key it touches lives under it) and a default lease TTL.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use distlock::{backend::MemoryBackend, LockClient};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), distlock::Error> {
/// let client = LockClient::builder(MemoryBackend::new())
///     .namespace("payments")
///     .ttl(Duration::from_secs(10))
///     .build()?;
/// let guard = client.mutex("orders:42").lock().await?;
/// println!("settling with fencing token {}", guard.fencing_token());
/// guard.release().await?;
/// client.shutdown().await;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct LockClient {
    pub(crate) inner: Arc<Core>,
}

impl LockClient {
    /// A client on a fresh in-process [`MemoryBackend`](crate::backend::MemoryBackend) with the
    /// default namespace and TTL. Locks are shared by the clones of this client only.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let client = distlock::LockClient::memory();
    /// let guard = client.mutex("migrations").lock().await?;
    /// assert!(!guard.is_lost());
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "memory")]
    #[cfg_attr(docsrs, doc(cfg(feature = "memory")))]
    pub fn memory() -> Self {
        let config = Config {
            namespace: DEFAULT_NAMESPACE.into(),
            ttl: DEFAULT_TTL,
            auto_renew: true,
            drift: default_drift,
        };
        Self::from_parts(Arc::new(crate::backend::MemoryBackend::new()), config)
    }

    /// A client on the Redis server at `url` (`redis://[user:password@]host:port/db`), with
    /// the default namespace and TTL. For pools or other settings use
    /// [`RedisBackend::builder`](crate::backend::RedisBackend::builder) and
    /// [`LockClient::builder`].
    ///
    /// # Errors
    ///
    /// See [`RedisBackendBuilder::build`](crate::backend::RedisBackendBuilder::build).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let client = distlock::LockClient::redis("redis://127.0.0.1:6379/").await?;
    /// let guard = client.mutex("orders:42").lock().await?;
    /// # drop(guard);
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    pub async fn redis(url: &str) -> Result<Self> {
        let backend = crate::backend::RedisBackend::connect(url).await?;
        Self::builder(backend).build()
    }

    /// Connects to independent Redis nodes as one Redlock (`redis://host:port/` URLs or
    /// [`RedlockNode`](crate::backend::RedlockNode)s, at least three) with the defaults of [`RedlockBackend`](crate::backend::RedlockBackend): a lock is
    /// held while a majority of the nodes hold it, and its fencing token increases across them.
    ///
    /// # Errors
    ///
    /// See [`RedlockBackendBuilder::build`](crate::backend::RedlockBackendBuilder::build).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let client = distlock::LockClient::redlock([
    ///     "redis://10.0.0.1:6379/",
    ///     "redis://10.0.0.2:6379/",
    ///     "redis://10.0.0.3:6379/",
    /// ])
    /// .await?;
    /// let guard = client.mutex("orders:42").lock().await?;
    /// # drop(guard);
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "redlock")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redlock")))]
    pub async fn redlock<I, N>(nodes: I) -> Result<Self>
    where
        I: IntoIterator<Item = N>,
        N: Into<crate::backend::RedlockNode>,
    {
        let backend = crate::backend::RedlockBackend::connect(nodes).await?;
        Self::builder(backend).build()
    }

    /// Connects to a PostgreSQL database (`postgres://user:password@host:port/database`) with
    /// the defaults of [`PgBackend`](crate::backend::PgBackend), creating its `distlock` schema
    /// on first use.
    ///
    /// # Errors
    ///
    /// See [`PgBackendBuilder::build`](crate::backend::PgBackendBuilder::build).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let client = distlock::LockClient::postgres("postgres://app@127.0.0.1:5432/app").await?;
    /// let guard = client.mutex("orders:42").lock().await?;
    /// # drop(guard);
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub async fn postgres(url: &str) -> Result<Self> {
        let backend = crate::backend::PgBackend::connect(url).await?;
        Self::builder(backend).build()
    }

    /// Connects to a ZooKeeper ensemble (`host:port[,host:port...][/chroot]`) with the
    /// defaults of [`ZkBackend`](crate::backend::ZkBackend), under the default namespace: key
    /// `k` is the znode `/distlock/k`, shared with Curator's `InterProcessMutex` on that path.
    /// The lease TTL is the session timeout the server granted: a guard reports lost once the
    /// session is gone or cannot be confirmed for that long.
    ///
    /// # Errors
    ///
    /// See [`ZkBackendBuilder::build`](crate::backend::ZkBackendBuilder::build).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped connect closes its half-open session.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let client = distlock::LockClient::zookeeper("127.0.0.1:2181").await?;
    /// let guard = client.mutex("orders/42").lock().await?;
    /// # drop(guard);
    /// client.shutdown().await;
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "zookeeper")]
    #[cfg_attr(docsrs, doc(cfg(feature = "zookeeper")))]
    pub async fn zookeeper(connect: &str) -> Result<Self> {
        Self::builder_for(&format!("zk://{connect}")).await?.build()
    }

    /// A client for a URL naming the service: `memory:` for the in-process backend (asked for
    /// by name: an empty URL is an error, so an unset `DISTLOCK_URL` never quietly gives locks
    /// that exclude nothing across processes), `redis://…` / `rediss://…` for Redis,
    /// `redis+cluster://[user:password@]host:port,host:port` for a Redis Cluster (seed nodes),
    /// `redis+sentinel://[user:password@]host:port,host:port/<master>[/<db>]` for the primary
    /// the sentinels at those addresses name,
    /// `redlock://[user:password@]host:port,host:port,host:port[/db]` for a Redlock over
    /// independent Redis nodes, `zk://host:port[,host:port][/chroot]` for
    /// ZooKeeper, `postgres://…` for PostgreSQL. Handy for a `DISTLOCK_URL` setting; each scheme needs its backend's feature.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidConfig`](crate::ErrorKind::InvalidConfig) for an empty URL, an unknown
    /// scheme or one whose feature is off; otherwise as the backend's own constructor.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped connect leaves no connection or session behind.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// // e.g. std::env::var("DISTLOCK_URL"): `memory:` here, `redis://…` in production
    /// let client = distlock::LockClient::connect("memory:").await?;
    /// # drop(client);
    /// assert!(distlock::LockClient::connect("etcd://x").await.unwrap_err().is_invalid_config());
    /// // An unset variable read as "" is an error, not in-process locks.
    /// assert!(distlock::LockClient::connect("").await.unwrap_err().is_invalid_config());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect(url: &str) -> Result<Self> {
        Self::builder_for(url).await?.build()
    }

    /// Connects to the service a URL names (as [`connect`](Self::connect) does) and returns a
    /// builder on it, to set a namespace or TTL before building the client. On ZooKeeper the
    /// TTL starts at the session timeout the server granted.
    ///
    /// # Errors
    ///
    /// As [`connect`](Self::connect).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped connect leaves no connection or session behind.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let client = distlock::LockClient::builder_for("memory:").await?.namespace("jobs").build()?;
    /// assert_eq!(client.namespace(), "jobs");
    /// # Ok(())
    /// # }
    /// ```
    pub async fn builder_for(url: &str) -> Result<LockClientBuilder> {
        // Each backend's connect is boxed: their futures are large and deep, and one frame
        // holding them all side by side is more than the compiler lays out by default.
        if url.trim().is_empty() {
            return Err(Error::invalid_config(
                "empty lock service URL: name the service (redis://…, zk://…, postgres://…), or `memory:` for locks inside this process only",
            ));
        }
        let scheme = url
            .split_once("://")
            .map_or(url.trim_end_matches(':'), |(s, _)| s);
        match scheme {
            #[cfg(feature = "memory")]
            "memory" => Ok(Self::builder(crate::backend::MemoryBackend::new())),
            #[cfg(feature = "redis")]
            "redis" | "rediss" | "redis+unix" | "unix" => Ok(Self::builder(
                Box::pin(crate::backend::RedisBackend::connect(url)).await?,
            )),
            #[cfg(feature = "redis-cluster")]
            "redis+cluster" => Ok(Self::builder(
                Box::pin(crate::backend::RedisBackend::connect(url)).await?,
            )),
            #[cfg(feature = "redis-sentinel")]
            "redis+sentinel" => Ok(Self::builder(
                Box::pin(crate::backend::RedisBackend::connect(url)).await?,
            )),
            #[cfg(feature = "redlock")]
            "redlock" => Ok(Self::builder(
                Box::pin(crate::backend::RedlockBackend::connect(
                    crate::backend::RedlockBackend::urls_of(url)?,
                ))
                .await?,
            )),
            #[cfg(feature = "postgres")]
            "postgres" | "postgresql" => Ok(Self::builder(
                Box::pin(crate::backend::PgBackend::connect(url)).await?,
            )),
            #[cfg(feature = "zookeeper")]
            "zk" | "zookeeper" => {
                let rest = url.split_once("://").map_or("", |(_, r)| r);
                let backend = Box::pin(crate::backend::ZkBackend::connect(rest)).await?;
                Ok(Self::builder(backend))
            }
            other => Err(Error::invalid_config(format_args!(
                "no backend for `{other}` URLs in this build (memory:, redis://, rediss://, redis+cluster://, redis+sentinel://, redlock://, zk://, postgres:// with features memory, redis, redis-tls, redis-cluster, redis-sentinel, redlock, zookeeper, postgres)"
            ))),
        }
    }

    /// Starts building a client on `backend`. The TTL starts at [`DEFAULT_TTL`], or at the
    /// lease the backend's service sets for every claim (a ZooKeeper session's timeout, see
    /// [`Backend::lease`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use distlock::{backend::MemoryBackend, LockClient};
    /// let client = LockClient::builder(MemoryBackend::new()).namespace("app").build()?;
    /// assert_eq!(client.namespace(), "app");
    /// # Ok::<(), distlock::Error>(())
    /// ```
    pub fn builder<B: Backend>(backend: B) -> LockClientBuilder {
        // A backend whose service sets the lease (a ZooKeeper session) states it.
        let ttl = backend.lease().unwrap_or(DEFAULT_TTL);
        LockClientBuilder {
            backend: Arc::new(backend),
            namespace: DEFAULT_NAMESPACE.into(),
            ttl,
            auto_renew: true,
        }
    }

    fn from_parts(backend: Arc<dyn DynBackend>, config: Config) -> Self {
        crate::core::metrics::describe_once();
        Self {
            inner: Arc::new(Core::new(backend, config)),
        }
    }

    /// A handle to the mutex named `key` in this client's namespace. No I/O happens here; the
    /// key is checked when the mutex is first locked.
    ///
    /// # Examples
    ///
    /// ```
    /// let client = distlock::LockClient::memory();
    /// let mutex = client.mutex("orders:42");
    /// assert_eq!(mutex.key(), "orders:42");
    /// ```
    pub fn mutex(&self, key: impl Into<String>) -> Mutex {
        Mutex::new(self.inner.clone(), key.into())
    }

    /// A handle to the read-write lock named `key` in this client's namespace. No I/O happens
    /// here.
    ///
    /// # Examples
    ///
    /// ```
    /// let client = distlock::LockClient::memory();
    /// let rw = client.rw_lock("config");
    /// assert_eq!(rw.key(), "config");
    /// ```
    pub fn rw_lock(&self, key: impl Into<String>) -> RwLock {
        RwLock::new(self.inner.clone(), key.into())
    }

    /// A handle to the semaphore named `key` with `max_permits` permits in this client's
    /// namespace. Every client must use the same number of permits for a key; zero permits is
    /// an error at the first acquisition. No I/O happens here.
    ///
    /// # Examples
    ///
    /// ```
    /// let client = distlock::LockClient::memory();
    /// let exports = client.semaphore("exports", 8);
    /// assert_eq!(exports.max_permits(), 8);
    /// ```
    pub fn semaphore(&self, key: impl Into<String>, max_permits: u32) -> Semaphore {
        Semaphore::new(self.inner.clone(), key.into(), max_permits)
    }

    /// A handle to a lock on all of `keys` at once (mutexes; add read-write holds with
    /// [`MultiLock::read`] and [`MultiLock::write`]). No I/O happens here.
    ///
    /// # Examples
    ///
    /// ```
    /// let client = distlock::LockClient::memory();
    /// let both = client.multi_lock(["stock:oslo", "stock:berlin"]);
    /// assert_eq!(both.keys(), ["stock:berlin", "stock:oslo"]);
    /// ```
    pub fn multi_lock<I>(&self, keys: I) -> MultiLock
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        MultiLock::new(
            self.inner.clone(),
            keys.into_iter().map(Into::into).collect(),
        )
    }

    /// What `key` looks like on the server now: who holds it (as what, with which fencing
    /// token and how much lease left) and who waits, first in line first. A snapshot for
    /// operators and dashboards; never decide who holds a lock from it.
    ///
    /// # Errors
    ///
    /// [`InvalidKey`](crate::ErrorKind::InvalidKey) before any I/O,
    /// [`Unsupported`](crate::ErrorKind::Unsupported) on a backend that cannot inspect,
    /// [`Backend`](crate::ErrorKind::Backend) if the service fails,
    /// [`Closed`](crate::ErrorKind::Closed) after [`shutdown`](Self::shutdown).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let client = distlock::LockClient::memory();
    /// let guard = client.mutex("orders:42").lock().await?;
    /// let seen = client.inspect("orders:42").await?;
    /// assert_eq!(seen.holders.len(), 1);
    /// assert_eq!(seen.holders[0].fencing_token, Some(guard.fencing_token()));
    /// assert!(seen.waiters.is_empty());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn inspect(&self, key: &str) -> Result<crate::Inspection> {
        self.inner.check_open()?;
        crate::core::rules::validate_key(key)?;
        self.inner.backend.validate_key(key)?;
        self.inner
            .backend
            .inspect(&self.inner.config.namespace, key)
            .await
    }

    /// The operator's unlock: drops whoever holds `key` now (every reader of a read-write
    /// lock, every permit holder of a semaphore), whichever client or process they are in,
    /// and grants the lock to the waiters in line as a release would. Every later grant of
    /// the key gets a fencing token above the dropped holders' tokens, so a fenced write of
    /// theirs is refused, and their guards report [lost](crate::MutexGuard::is_lost) at their
    /// next renewal (within a third of their TTL). Returns what was removed; nothing if the
    /// key was free. [`inspect`](Self::inspect) shows what it would remove.
    ///
    /// For stuck holders (a process paused or cut off with a long lease), not for ordinary
    /// releases: the dropped holder may still be running, and only fencing keeps its writes
    /// out.
    ///
    /// # Errors
    ///
    /// [`InvalidKey`](crate::ErrorKind::InvalidKey) before any I/O,
    /// [`Unsupported`](crate::ErrorKind::Unsupported) on a backend that cannot force-release,
    /// [`Backend`](crate::ErrorKind::Backend) if the service fails (the holders may or may
    /// not have been dropped: [`inspect`](Self::inspect) tells, and calling again is safe),
    /// [`Closed`](crate::ErrorKind::Closed) after [`shutdown`](Self::shutdown).
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe in the sense that dropping the future may leave the unlock done or
    /// not done (it is one server-side step on most backends, several on ZooKeeper and
    /// Redlock); either way nothing else is left behind, and it may be called again.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// use std::time::Duration;
    ///
    /// let client = distlock::LockClient::memory();
    /// let stuck = client
    ///     .mutex("orders:42")
    ///     .with_ttl(Duration::from_millis(300))
    ///     .lock()
    ///     .await?;
    /// let removed = client.force_release("orders:42").await?;
    /// assert_eq!(removed.removed.len(), 1);
    /// assert_eq!(removed.removed[0].fencing_token, Some(stuck.fencing_token()));
    /// // The next holder's token is above the dropped one's...
    /// let next = client.mutex("orders:42").lock().await?;
    /// assert!(next.fencing_token() > stuck.fencing_token());
    /// // ...and the dropped guard learns it at its next renewal.
    /// tokio::time::timeout(Duration::from_secs(5), stuck.lost()).await.unwrap();
    /// assert!(stuck.is_lost());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn force_release(&self, key: &str) -> Result<crate::ForceReleased> {
        self.inner.check_open()?;
        crate::core::rules::validate_key(key)?;
        self.inner.backend.validate_key(key)?;
        self.inner
            .backend
            .force_release(&self.inner.config.namespace, key)
            .await
    }

    /// Identifies the client (and its clones) within the process.
    #[cfg_attr(not(feature = "macros"), allow(dead_code))]
    pub(crate) fn id(&self) -> usize {
        Arc::as_ptr(&self.inner) as *const () as usize
    }

    /// The namespace every key of this client lives under.
    pub fn namespace(&self) -> &str {
        &self.inner.config.namespace
    }

    /// The lease TTL locks get unless they set their own.
    pub fn ttl(&self) -> Duration {
        self.inner.config.ttl
    }

    /// Shuts the client down: waiting `lock()` calls return a [`Closed`](crate::ErrorKind::Closed)
    /// error, new ones fail at once, locks still held are released (their guards report lost),
    /// pending releases from dropped guards are flushed, then the backend closes its
    /// connections and sessions. Idempotent.
    ///
    /// # Cancel safety
    ///
    /// Cancelling it leaves the client closed; releases already started still run.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let client = distlock::LockClient::memory();
    /// let guard = client.mutex("k").lock().await?;
    /// drop(guard); // released in the background ...
    /// client.shutdown().await; // ... and certainly done here
    /// assert!(client.mutex("k").lock().await.unwrap_err().is_closed());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn shutdown(&self) {
        self.inner.shutdown().await;
    }

    /// [`shutdown`](Self::shutdown) for synchronous code: blocks this thread until the
    /// client is shut down (see [`Mutex::blocking_lock`](crate::Mutex::blocking_lock) for
    /// where it runs).
    ///
    /// # Errors
    ///
    /// [`InAsyncContext`](crate::ErrorKind::InAsyncContext) inside a current-thread tokio
    /// runtime (use `shutdown().await` there), [`NoRuntime`](crate::ErrorKind::NoRuntime) for
    /// a client built in a current-thread runtime or whose runtime has shut down; nothing is
    /// shut down then.
    ///
    /// # Cancel safety
    ///
    /// Not a future: it returns once the client is shut down.
    ///
    /// # Examples
    ///
    /// ```
    /// let client = distlock::LockClient::memory();
    /// drop(client.mutex("k").blocking_lock()?);
    /// client.blocking_shutdown()?; // the release above is certainly done
    /// # Ok::<(), distlock::Error>(())
    /// ```
    pub fn blocking_shutdown(&self) -> Result<()> {
        self.inner.blocking.block_on("blocking_shutdown", async {
            self.inner.shutdown().await;
            Ok(())
        })
    }
}

impl fmt::Debug for LockClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockClient")
            .field("namespace", &self.inner.config.namespace)
            .field("ttl", &self.inner.config.ttl)
            .field("auto_renew", &self.inner.config.auto_renew)
            .field("closed", &self.inner.is_closed())
            .finish_non_exhaustive()
    }
}

/// Builds a [`LockClient`] on any [`Backend`].
///
/// Created by [`LockClient::builder`].
#[must_use = "builder does nothing itself, use `.build()` to build it"]
pub struct LockClientBuilder {
    backend: Arc<dyn DynBackend>,
    namespace: String,
    ttl: Duration,
    auto_renew: bool,
}

impl LockClientBuilder {
    /// Sets the namespace every key lives under: 1 to
    /// [`MAX_NAMESPACE_LEN`](crate::MAX_NAMESPACE_LEN) bytes of letters, digits, `-`, `_` or
    /// `.`. Defaults to [`DEFAULT_NAMESPACE`].
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Sets the lease TTL: how long a lock outlives a holder that stopped renewing (crashed,
    /// partitioned). Leases are renewed every third of it. Defaults to [`DEFAULT_TTL`].
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Whether held leases are renewed in the background. Defaults to `true`. With `false` a
    /// lock is held for one TTL and its guard reports lost when the TTL runs out, like a lease
    /// time in other libraries. (A lock handed over by a releasing holder arrives with a short
    /// provisional lease on some backends; it is confirmed once, so it too lasts one TTL.)
    pub fn auto_renew(mut self, auto_renew: bool) -> Self {
        self.auto_renew = auto_renew;
        self
    }

    /// Builds the client. No I/O happens here.
    ///
    /// # Errors
    ///
    /// An [`InvalidConfig`](crate::ErrorKind::InvalidConfig) error if the namespace breaks its
    /// rules or the TTL is zero.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use distlock::{backend::MemoryBackend, LockClient};
    /// let err = LockClient::builder(MemoryBackend::new()).ttl(Duration::ZERO).build().unwrap_err();
    /// assert!(err.is_invalid_config());
    /// ```
    pub fn build(self) -> Result<LockClient> {
        validate_namespace(&self.namespace)?;
        validate_ttl(self.ttl)?;
        Ok(LockClient::from_parts(
            self.backend,
            Config {
                namespace: self.namespace.into(),
                ttl: self.ttl,
                auto_renew: self.auto_renew,
                drift: default_drift,
            },
        ))
    }
}

impl fmt::Debug for LockClientBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockClientBuilder")
            .field("namespace", &self.namespace)
            .field("ttl", &self.ttl)
            .field("auto_renew", &self.auto_renew)
            .finish_non_exhaustive()
    }
}
