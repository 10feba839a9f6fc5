//! `LockClient`: the handle users keep, its builder ([`builder`]) and configuration, and the
//! clients on the service a URL names ([`connect`]).

mod builder;
mod connect;

pub use self::builder::LockClientBuilder;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::backend::{Backend, DynBackend};
use crate::core::{Config, Core};
use crate::error::Result;
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
            drift: crate::core::lease::default_drift,
        };
        Self::from_parts(Arc::new(crate::backend::MemoryBackend::new()), config)
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

    pub(super) fn from_parts(backend: Arc<dyn DynBackend>, config: Config) -> Self {
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

    /// A handle to the election named `key` in this client's namespace: campaign to lead it,
    /// read or follow who leads. No I/O happens here.
    ///
    /// # Examples
    ///
    /// ```
    /// let client = distlock::LockClient::memory();
    /// let election = client.election("scheduler");
    /// assert_eq!(election.name(), "scheduler");
    /// ```
    pub fn election(&self, key: impl Into<String>) -> crate::Election {
        crate::Election::new(self.inner.clone(), key.into())
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
        self.inner.home.block_on("blocking_shutdown", async {
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
