//! `Semaphore`: a counted lock across processes, and its permits.

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

/// A counting semaphore named by a key: at most `max_permits` permits are held at a time,
/// across every process that uses it.
///
/// It behaves like [`tokio::sync::Semaphore`] across machines: requests are served in arrival
/// order, and a request for several permits at the head of the queue is not overtaken by smaller
/// ones behind it (it waits until enough permits are free). Every permit is a lease: it is
/// renewed in the background while held, and the permits of a holder that died come back when
/// its lease runs out (the next waiter learns it from the lease deadline, without polling).
///
/// `max_permits` is a property of the key that every client must agree on: asking for a key
/// with another number of permits, or as a mutex or read-write lock, while it is in use fails
/// with [`ErrorKind::KindMismatch`](crate::ErrorKind::KindMismatch). On ZooKeeper, which
/// shares Curator's `InterProcessSemaphoreV2` layout, the number of permits is stored nowhere
/// (as in Curator): only the kind of lock is checked, and agreeing on `max_permits` is up to
/// the clients.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), distlock::Error> {
/// let client = distlock::LockClient::memory();
/// let exports = client.semaphore("exports", 2);
/// let a = exports.acquire().await?;
/// let b = exports.acquire().await?;
/// assert!(exports.try_acquire().await.unwrap_err().is_would_block());
/// drop(a); // its permit goes to the next in line
/// # drop(b);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Semaphore {
    target: Target,
    max: u32,
}

impl Semaphore {
    pub(crate) fn new(core: Arc<Core>, key: String, max: u32) -> Self {
        Self {
            target: Target::new(core, key),
            max,
        }
    }

    /// The key, without the client's namespace.
    pub fn key(&self) -> &str {
        &self.target.key
    }

    /// How many permits the semaphore has.
    pub fn max_permits(&self) -> u32 {
        self.max
    }

    /// Uses `ttl` as the lease length of this semaphore's permits instead of the client's. A
    /// zero or too short TTL is reported by the next acquisition.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let client = distlock::LockClient::memory();
    /// let sem = client.semaphore("exports", 4).with_ttl(Duration::from_secs(60));
    /// # let _ = sem;
    /// ```
    #[must_use]
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.target.ttl = Some(ttl);
        self
    }

    fn kind(&self, count: u32) -> LockKind {
        LockKind::Permits {
            count,
            max: self.max,
        }
    }

    fn take(
        &self,
        count: u32,
        mode: Mode,
    ) -> impl Future<Output = Result<SemaphorePermit>> + Send + 'static {
        self.target
            .acquire(self.kind(count), mode)
            .map_ok(move |held| SemaphorePermit { held, count })
    }

    /// Waits for one permit.
    ///
    /// # Errors
    ///
    /// - [`InvalidKey`](crate::ErrorKind::InvalidKey) before any I/O, or
    ///   [`InvalidConfig`](crate::ErrorKind::InvalidConfig) for a semaphore of zero permits,
    /// - [`KindMismatch`](crate::ErrorKind::KindMismatch) if the key is in use as another kind
    ///   of lock or with another number of permits,
    /// - [`Unsupported`](crate::ErrorKind::Unsupported) on a backend without semaphores,
    /// - [`Backend`](crate::ErrorKind::Backend) if the service fails,
    /// - [`Closed`](crate::ErrorKind::Closed) if the client is shut down,
    /// - [`NoRuntime`](crate::ErrorKind::NoRuntime) outside a Tokio runtime.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future at any await point gives up the place in the queue and
    /// leaves nothing behind; permits granted just as it was dropped are released in the
    /// background.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let client = distlock::LockClient::memory();
    /// let permit = client.semaphore("exports", 8).acquire().await?;
    /// assert_eq!(permit.count(), 1);
    /// # Ok(())
    /// # }
    /// ```
    pub fn acquire(&self) -> impl Future<Output = Result<SemaphorePermit>> + Send + 'static {
        self.take(1, Mode::Wait)
    }

    /// Waits for `n` permits, granted together (all or none).
    ///
    /// # Errors
    ///
    /// [`InvalidConfig`](crate::ErrorKind::InvalidConfig) before any I/O if `n` is zero or more
    /// than the semaphore has (it could never be granted); otherwise as
    /// [`acquire`](Self::acquire).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`acquire`](Self::acquire).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let client = distlock::LockClient::memory();
    /// let sem = client.semaphore("exports", 8);
    /// let permits = sem.acquire_many(3).await?;
    /// assert_eq!(permits.count(), 3);
    /// assert!(sem.acquire_many(9).await.unwrap_err().is_invalid_config());
    /// # Ok(())
    /// # }
    /// ```
    pub fn acquire_many(
        &self,
        n: u32,
    ) -> impl Future<Output = Result<SemaphorePermit>> + Send + 'static {
        self.take(n, Mode::Wait)
    }

    /// Waits for one permit, blocking this thread: [`acquire`](Self::acquire) for synchronous
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
    /// - otherwise the errors of [`acquire`](Self::acquire).
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
    /// let permit = client.semaphore("exports", 4).blocking_acquire()?;
    /// # drop(permit);
    /// # Ok::<(), distlock::Error>(())
    /// ```
    pub fn blocking_acquire(&self) -> Result<SemaphorePermit> {
        self.target
            .core
            .home
            .block_on("blocking_acquire", self.acquire())
    }

    /// Waits for `n` permits at once, blocking this thread:
    /// [`acquire_many`](Self::acquire_many) for synchronous code.
    ///
    /// # Errors
    ///
    /// - [`InAsyncContext`](crate::ErrorKind::InAsyncContext) inside a current-thread tokio
    ///   runtime (use the async form there); on a multi-thread runtime's thread it blocks in
    ///   place (`tokio::task::block_in_place`),
    /// - [`NoRuntime`](crate::ErrorKind::NoRuntime) for a client built in a current-thread
    ///   runtime (nothing may be driving it while this thread blocks) or whose runtime has
    ///   shut down,
    /// - otherwise the errors of [`acquire_many`](Self::acquire_many).
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
    /// let permits = client.semaphore("exports", 4).blocking_acquire_many(3)?;
    /// assert_eq!(permits.count(), 3);
    /// # Ok::<(), distlock::Error>(())
    /// ```
    pub fn blocking_acquire_many(&self, n: u32) -> Result<SemaphorePermit> {
        let call = self.acquire_many(n);
        self.target
            .core
            .home
            .block_on("blocking_acquire_many", call)
    }

    /// Takes one permit only if one is free and nobody is queued, without waiting.
    ///
    /// # Errors
    ///
    /// An error with [`is_would_block`](crate::Error::is_would_block) if no permit is free now
    /// (or others are queued); otherwise the errors of [`acquire`](Self::acquire).
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
    /// let sem = client.semaphore("exports", 1);
    /// let _p = sem.try_acquire().await?;
    /// assert!(sem.try_acquire().await.unwrap_err().is_would_block());
    /// # Ok(())
    /// # }
    /// ```
    pub fn try_acquire(&self) -> impl Future<Output = Result<SemaphorePermit>> + Send + 'static {
        self.take(1, Mode::Try)
    }

    /// Takes `n` permits only if they are free now and nobody is queued, without waiting.
    ///
    /// # Errors
    ///
    /// As [`try_acquire`](Self::try_acquire) and [`acquire_many`](Self::acquire_many).
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
    /// let sem = client.semaphore("exports", 4);
    /// let _three = sem.try_acquire_many(3).await?;
    /// assert!(sem.try_acquire_many(2).await.unwrap_err().is_would_block());
    /// # Ok(())
    /// # }
    /// ```
    pub fn try_acquire_many(
        &self,
        n: u32,
    ) -> impl Future<Output = Result<SemaphorePermit>> + Send + 'static {
        self.take(n, Mode::Try)
    }

    /// Waits for one permit at most `timeout`.
    ///
    /// # Errors
    ///
    /// An error with [`is_timeout`](crate::Error::is_timeout) if no permit was granted in time;
    /// otherwise the errors of [`acquire`](Self::acquire).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`acquire`](Self::acquire); the timeout itself is such a cancellation.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let client = distlock::LockClient::memory();
    /// let sem = client.semaphore("exports", 1);
    /// let _p = sem.acquire().await?;
    /// assert!(sem.acquire_timeout(Duration::from_millis(20)).await.unwrap_err().is_timeout());
    /// # Ok(())
    /// # }
    /// ```
    pub fn acquire_timeout(
        &self,
        timeout: Duration,
    ) -> impl Future<Output = Result<SemaphorePermit>> + Send + 'static {
        self.acquire_many_timeout(1, timeout)
    }

    /// Waits for `n` permits at most `timeout`.
    ///
    /// # Errors
    ///
    /// As [`acquire_timeout`](Self::acquire_timeout) and [`acquire_many`](Self::acquire_many).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`acquire`](Self::acquire).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let client = distlock::LockClient::memory();
    /// let sem = client.semaphore("exports", 4);
    /// let permits = sem.acquire_many_timeout(2, Duration::from_secs(1)).await?;
    /// assert_eq!(permits.count(), 2);
    /// # Ok(())
    /// # }
    /// ```
    pub fn acquire_many_timeout(
        &self,
        n: u32,
        timeout: Duration,
    ) -> impl Future<Output = Result<SemaphorePermit>> + Send + 'static {
        self.target
            .acquire_timeout(self.kind(n), timeout)
            .map_ok(move |held| SemaphorePermit { held, count: n })
    }
}

impl fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Semaphore")
            .field("namespace", &self.target.core.config.namespace)
            .field("key", &self.target.key)
            .field("max_permits", &self.max)
            .field("ttl", &self.target.ttl())
            .finish()
    }
}

/// Permits of a [`Semaphore`], held under one lease.
///
/// The permit is `Send + 'static`; dropping it releases its permits in a spawned task (never
/// blocking), granting them to the requests next in line.
#[must_use = "if unused the permits will immediately be released"]
#[clippy::has_significant_drop]
pub struct SemaphorePermit {
    held: Held,
    count: u32,
}

impl SemaphorePermit {
    /// How many permits this holds.
    pub fn count(&self) -> u32 {
        self.count
    }
}

guard_methods!(
    SemaphorePermit,
    "let guard = client.semaphore(\"k\", 4).acquire().await?;",
    "The token of this grant: distinct from every other grant of the key and increasing in \
     grant order. Up to the semaphore's number of permits are held at once, so unlike a lock's \
     token it is no mutual-exclusion fence: use it to tell grants apart (idempotence, logs)."
);
