//! `RwLock`: many readers or one writer across processes, and its guards.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::TryFutureExt;

use crate::backend::LockKind;
use crate::core::acquire::{Mode, Target};
use crate::core::guard::guard_methods;
use crate::core::held::Held;
use crate::core::Core;
use crate::error::Result;

/// A read-write lock named by a key: any number of readers at a time, or one writer.
///
/// It behaves like [`tokio::sync::RwLock`] across machines: fair and write-preferring. Requests
/// are served in the order they arrive; a writer that waits blocks every reader that comes after
/// it (so writers are never starved), and readers queued one after another are granted
/// together. Waits are woken by the service, never by a polling loop, and every guard keeps its
/// lease alive in the background, reports when it is lost and releases itself when dropped.
///
/// A key holds one kind of lock: asking for a key as a read-write lock while it is in use as a
/// mutex or a semaphore fails with [`ErrorKind::KindMismatch`](crate::ErrorKind::KindMismatch).
///
/// # Fencing tokens
///
/// Every grant gets a token from one counter per key. A write grant's token is greater than
/// every grant's before it; every grant after a write grant has a greater token than it. Readers
/// granted together get distinct tokens in no particular order. Storage that is written under
/// this lock should keep the highest write token and the highest read token it has seen, refuse
/// a write whose token is below either, and refuse a read whose token is below the highest write
/// token: a stale writer and a reader whose lease ran out before a writer ran are both turned
/// away.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), distlock::Error> {
/// let client = distlock::LockClient::memory();
/// let config = client.rw_lock("config");
/// let r1 = config.read().await?;
/// let r2 = config.read().await?;               // readers share the lock
/// assert!(config.try_write().await.unwrap_err().is_would_block());
/// drop((r1, r2));
/// let w = config.write().await?;               // one writer, alone
/// let r = w.downgrade().await?;                // keep reading, let other readers in
/// # drop(r);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RwLock {
    target: Target,
}

impl RwLock {
    pub(crate) fn new(core: Arc<Core>, key: String) -> Self {
        Self {
            target: Target::new(core, key),
        }
    }

    /// The key, without the client's namespace.
    pub fn key(&self) -> &str {
        &self.target.key
    }

    /// Uses `ttl` as this lock's lease length instead of the client's. A zero or too short TTL
    /// is reported by the next acquisition.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let client = distlock::LockClient::memory();
    /// let rw = client.rw_lock("reports").with_ttl(Duration::from_secs(120));
    /// # let _ = rw;
    /// ```
    #[must_use]
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.target.ttl = Some(ttl);
        self
    }

    fn read_as(
        &self,
        mode: Mode,
    ) -> impl Future<Output = Result<RwLockReadGuard>> + Send + 'static {
        self.target
            .acquire(LockKind::Read, mode)
            .map_ok(|held| RwLockReadGuard { held })
    }

    fn write_as(
        &self,
        mode: Mode,
    ) -> impl Future<Output = Result<RwLockWriteGuard>> + Send + 'static {
        self.target
            .acquire(LockKind::Write, mode)
            .map_ok(|held| RwLockWriteGuard { held })
    }

    /// Waits for shared read access: granted while no writer holds the lock and none is queued
    /// ahead of this request.
    ///
    /// # Errors
    ///
    /// - [`InvalidKey`](crate::ErrorKind::InvalidKey) or
    ///   [`InvalidConfig`](crate::ErrorKind::InvalidConfig) before any I/O,
    /// - [`KindMismatch`](crate::ErrorKind::KindMismatch) if the key is in use as a mutex or a
    ///   semaphore,
    /// - [`Unsupported`](crate::ErrorKind::Unsupported) on a backend without read-write locks,
    /// - [`Backend`](crate::ErrorKind::Backend) if the service fails,
    /// - [`Closed`](crate::ErrorKind::Closed) if the client is shut down,
    /// - [`NoRuntime`](crate::ErrorKind::NoRuntime) outside a Tokio runtime.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future at any await point gives up the place in the queue and
    /// leaves nothing behind; a grant that raced with the drop is released in the background.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let client = distlock::LockClient::memory();
    /// let guard = client.rw_lock("config").read().await?;
    /// # drop(guard);
    /// # Ok(())
    /// # }
    /// ```
    pub fn read(&self) -> impl Future<Output = Result<RwLockReadGuard>> + Send + 'static {
        self.read_as(Mode::Wait)
    }

    /// Waits for exclusive write access: granted when nobody holds the lock and this request is
    /// first in line.
    ///
    /// # Errors
    ///
    /// As [`read`](Self::read).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`read`](Self::read). A cancelled writer that blocked readers queued
    /// behind it lets them in.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let client = distlock::LockClient::memory();
    /// let guard = client.rw_lock("config").write().await?;
    /// # drop(guard);
    /// # Ok(())
    /// # }
    /// ```
    pub fn write(&self) -> impl Future<Output = Result<RwLockWriteGuard>> + Send + 'static {
        self.write_as(Mode::Wait)
    }

    /// Waits for read access, blocking this thread: [`read`](Self::read) for synchronous
    /// code (see [`Mutex::blocking_lock`](crate::Mutex::blocking_lock) for where it runs).
    ///
    /// # Errors
    ///
    /// - [`InAsyncContext`](crate::ErrorKind::InAsyncContext) inside a current-thread tokio
    ///   runtime (use the async form there); on a multi-thread runtime's thread it blocks in
    ///   place (`tokio::task::block_in_place`),
    /// - [`NoRuntime`](crate::ErrorKind::NoRuntime) for a client built in a current-thread
    ///   runtime (nothing may be driving it while this thread blocks) or whose runtime has
    ///   shut down,
    /// - otherwise the errors of [`read`](Self::read).
    ///
    /// # Cancel safety
    ///
    /// Not a future: it returns once the call is over. The guard it returns releases on drop
    /// as any other, renewed meanwhile by the runtime the client was built in (or its own).
    ///
    /// # Examples
    ///
    /// ```
    /// let client = distlock::LockClient::memory();
    /// let a = client.rw_lock("config").blocking_read()?;
    /// let b = client.rw_lock("config").blocking_read()?; // readers share
    /// # drop((a, b));
    /// # Ok::<(), distlock::Error>(())
    /// ```
    pub fn blocking_read(&self) -> Result<RwLockReadGuard> {
        self.target.core.home.block_on("blocking_read", self.read())
    }

    /// Waits for write access, blocking this thread: [`write`](Self::write) for synchronous
    /// code (see [`Mutex::blocking_lock`](crate::Mutex::blocking_lock) for where it runs).
    ///
    /// # Errors
    ///
    /// - [`InAsyncContext`](crate::ErrorKind::InAsyncContext) inside a current-thread tokio
    ///   runtime (use the async form there); on a multi-thread runtime's thread it blocks in
    ///   place (`tokio::task::block_in_place`),
    /// - [`NoRuntime`](crate::ErrorKind::NoRuntime) for a client built in a current-thread
    ///   runtime (nothing may be driving it while this thread blocks) or whose runtime has
    ///   shut down,
    /// - otherwise the errors of [`write`](Self::write).
    ///
    /// # Cancel safety
    ///
    /// Not a future: it returns once the call is over. The guard it returns releases on drop
    /// as any other, renewed meanwhile by the runtime the client was built in (or its own).
    ///
    /// # Examples
    ///
    /// ```
    /// let client = distlock::LockClient::memory();
    /// let guard = client.rw_lock("config").blocking_write()?;
    /// # drop(guard);
    /// # Ok::<(), distlock::Error>(())
    /// ```
    pub fn blocking_write(&self) -> Result<RwLockWriteGuard> {
        self.target
            .core
            .home
            .block_on("blocking_write", self.write())
    }

    /// Takes read access only if it can be granted now, without waiting.
    ///
    /// # Errors
    ///
    /// An error with [`is_would_block`](crate::Error::is_would_block) if a writer holds the lock
    /// or anyone is queued; otherwise the errors of [`read`](Self::read).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a grant that raced with the drop is released in the background.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let client = distlock::LockClient::memory();
    /// let w = client.rw_lock("config").write().await?;
    /// assert!(client.rw_lock("config").try_read().await.unwrap_err().is_would_block());
    /// # drop(w);
    /// # Ok(())
    /// # }
    /// ```
    pub fn try_read(&self) -> impl Future<Output = Result<RwLockReadGuard>> + Send + 'static {
        self.read_as(Mode::Try)
    }

    /// Takes write access only if it can be granted now, without waiting.
    ///
    /// # Errors
    ///
    /// An error with [`is_would_block`](crate::Error::is_would_block) if anyone holds the lock
    /// or is queued; otherwise the errors of [`read`](Self::read).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a grant that raced with the drop is released in the background.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let client = distlock::LockClient::memory();
    /// let r = client.rw_lock("config").read().await?;
    /// assert!(client.rw_lock("config").try_write().await.unwrap_err().is_would_block());
    /// # drop(r);
    /// # Ok(())
    /// # }
    /// ```
    pub fn try_write(&self) -> impl Future<Output = Result<RwLockWriteGuard>> + Send + 'static {
        self.write_as(Mode::Try)
    }

    /// Waits for read access at most `timeout`.
    ///
    /// # Errors
    ///
    /// An error with [`is_timeout`](crate::Error::is_timeout) if it was not granted in time;
    /// otherwise the errors of [`read`](Self::read).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`read`](Self::read); the timeout itself is such a cancellation.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let client = distlock::LockClient::memory();
    /// let _w = client.rw_lock("config").write().await?;
    /// let err = client.rw_lock("config").read_timeout(Duration::from_millis(20)).await.unwrap_err();
    /// assert!(err.is_timeout());
    /// # Ok(())
    /// # }
    /// ```
    pub fn read_timeout(
        &self,
        timeout: Duration,
    ) -> impl Future<Output = Result<RwLockReadGuard>> + Send + 'static {
        self.target
            .acquire_timeout(LockKind::Read, timeout)
            .map_ok(|held| RwLockReadGuard { held })
    }

    /// Waits for write access at most `timeout`.
    ///
    /// # Errors
    ///
    /// An error with [`is_timeout`](crate::Error::is_timeout) if it was not granted in time;
    /// otherwise the errors of [`read`](Self::read).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`write`](Self::write); the timeout itself is such a cancellation.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let client = distlock::LockClient::memory();
    /// let _r = client.rw_lock("config").read().await?;
    /// let err = client.rw_lock("config").write_timeout(Duration::from_millis(20)).await.unwrap_err();
    /// assert!(err.is_timeout());
    /// # Ok(())
    /// # }
    /// ```
    pub fn write_timeout(
        &self,
        timeout: Duration,
    ) -> impl Future<Output = Result<RwLockWriteGuard>> + Send + 'static {
        self.target
            .acquire_timeout(LockKind::Write, timeout)
            .map_ok(|held| RwLockWriteGuard { held })
    }
}

impl fmt::Debug for RwLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RwLock")
            .field("namespace", &self.target.core.config.namespace)
            .field("key", &self.target.key)
            .field("ttl", &self.target.ttl())
            .finish()
    }
}

/// Shared read access to an [`RwLock`]: other readers may hold it too, no writer does.
///
/// The guard is `Send + 'static`; dropping it releases the read hold in a spawned task (never
/// blocking), letting a queued writer in once the last reader is gone.
#[must_use = "if unused the lock will immediately be released"]
#[clippy::has_significant_drop]
pub struct RwLockReadGuard {
    held: Held,
}

guard_methods!(
    RwLockReadGuard,
    "let guard = client.rw_lock(\"k\").read().await?;",
    "The fencing token of this grant: greater than the token of every write grant before it \
     and smaller than that of every write grant after it. Readers granted together have \
     distinct tokens in no particular order, except on Redlock, where two of them may share \
     one (see [`RwLock`] for the storage rule). A downgraded write guard keeps its write \
     grant's token."
);

/// Exclusive write access to an [`RwLock`]: nobody else holds it, reader or writer.
///
/// The guard is `Send + 'static`; dropping it releases the lock in a spawned task (never
/// blocking), handing it to the requests next in line.
#[must_use = "if unused the lock will immediately be released"]
#[clippy::has_significant_drop]
pub struct RwLockWriteGuard {
    held: Held,
}

guard_methods!(
    RwLockWriteGuard,
    "let guard = client.rw_lock(\"k\").write().await?;",
    "The fencing token of this grant: strictly greater than the token of every earlier grant \
     of the key, read or write. Storage that keeps the highest token it has seen can refuse \
     writes from a holder whose lock has since passed on (see [`RwLock`] for the rule with \
     readers)."
);

impl RwLockWriteGuard {
    /// Turns this write hold into a read hold in one step on the server: no writer queued
    /// behind can take the lock in between, and readers queued behind this one are let in. The
    /// lease and its fencing token carry over. There is no upgrade back.
    ///
    /// # Errors
    ///
    /// - [`Lost`](crate::ErrorKind::Lost) if the lock had already been lost,
    /// - [`Unsupported`](crate::ErrorKind::Unsupported) on a backend that cannot downgrade,
    /// - [`Backend`](crate::ErrorKind::Backend) if the service fails.
    ///
    /// On an error the lock is released, as if the guard had been dropped.
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped, the lock (write or already read) is released in the
    /// background.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let client = distlock::LockClient::memory();
    /// let rw = client.rw_lock("config");
    /// let w = rw.write().await?;
    /// let token = w.fencing_token();
    /// // ... write the new configuration ...
    /// let r = w.downgrade().await?;
    /// assert_eq!(r.fencing_token(), token);
    /// let other = rw.read().await?; // other readers get in now
    /// # drop((r, other));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn downgrade(self) -> Result<RwLockReadGuard> {
        Ok(RwLockReadGuard {
            held: self.held.downgrade().await?,
        })
    }
}
