//! `Mutex`: an exclusive lock across processes, and its guard.

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

/// A mutual-exclusion lock named by a key, shared by every process that uses the same
/// coordination service and namespace.
///
/// It behaves like [`tokio::sync::Mutex`] across machines: [`lock`](Self::lock) waits in FIFO
/// order, woken by a notification rather than a polling loop, and returns a [`MutexGuard`] that
/// keeps the lease alive in the background and releases it when dropped.
///
/// A `Mutex` is a cheap handle (no I/O, no state on the server until it is locked); clone it or
/// make a new one from the client whenever convenient.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), distlock::Error> {
/// let client = distlock::LockClient::memory();
/// let mutex = client.mutex("orders:42");
/// {
///     let guard = mutex.lock().await?;
///     // ... only one holder in the whole fleet runs this ...
///     # let _ = &guard;
/// } // released here, in the background
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Mutex {
    target: Target,
}

impl Mutex {
    pub(crate) fn new(core: Arc<Core>, key: String) -> Self {
        Self {
            target: Target::new(core, key),
        }
    }

    /// The key, without the client's namespace.
    pub fn key(&self) -> &str {
        &self.target.key
    }

    /// Uses `ttl` as this mutex's lease length instead of the client's. A zero or too short TTL
    /// is reported by the next `lock` call.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let client = distlock::LockClient::memory();
    /// let mutex = client.mutex("reports").with_ttl(Duration::from_secs(120));
    /// # let _ = mutex;
    /// ```
    #[must_use]
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.target.ttl = Some(ttl);
        self
    }

    fn acquire(&self, mode: Mode) -> impl Future<Output = Result<MutexGuard>> + Send + 'static {
        self.target
            .acquire(LockKind::Exclusive, mode)
            .map_ok(|held| MutexGuard { held })
    }

    /// Waits for the lock and returns its guard.
    ///
    /// Waiters are served in the order they asked, and a holder that releases and asks again
    /// goes to the back of the queue. The wait is woken by the service (or by the holder's
    /// lease deadline), never by a polling loop. The returned future is `Send + 'static`.
    ///
    /// # Errors
    ///
    /// - [`InvalidKey`](crate::ErrorKind::InvalidKey) or
    ///   [`InvalidConfig`](crate::ErrorKind::InvalidConfig) before any I/O,
    /// - [`KindMismatch`](crate::ErrorKind::KindMismatch) if the key is in use as a read-write
    ///   lock, a semaphore or an election,
    /// - [`Backend`](crate::ErrorKind::Backend) if the service fails,
    /// - [`Closed`](crate::ErrorKind::Closed) if the client is shut down,
    /// - [`NoRuntime`](crate::ErrorKind::NoRuntime) outside a Tokio runtime.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future at any await point gives up the place in the queue and
    /// leaves nothing behind. Its queue entry is removed and, if the lock was granted just as
    /// the future was dropped, that grant is released in the background.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let client = distlock::LockClient::memory();
    /// let guard = client.mutex("migrations").lock().await?;
    /// assert!(guard.fencing_token() > 0);
    /// # Ok(())
    /// # }
    /// ```
    pub fn lock(&self) -> impl Future<Output = Result<MutexGuard>> + Send + 'static {
        self.acquire(Mode::Wait)
    }

    /// Waits for the lock, blocking this thread: [`lock`](Self::lock) for synchronous code.
    /// It runs on the runtime the client was built in or, for a client built outside any, on
    /// a small runtime of the client's own.
    ///
    /// # Errors
    ///
    /// - [`InAsyncContext`](crate::ErrorKind::InAsyncContext) inside a current-thread tokio
    ///   runtime (use the async form there); on a multi-thread runtime's thread it blocks in
    ///   place (`tokio::task::block_in_place`),
    /// - [`NoRuntime`](crate::ErrorKind::NoRuntime) for a client built in a current-thread
    ///   runtime (nothing may be driving it while this thread blocks) or whose runtime has
    ///   shut down,
    /// - otherwise the errors of [`lock`](Self::lock).
    ///
    /// # Cancel safety
    ///
    /// Not a future: it returns once the call is over. The guard it returns releases on drop
    /// as any other, renewed meanwhile by the runtime the client was built in (or its own).
    ///
    /// # Examples
    ///
    /// ```
    /// let client = distlock::LockClient::memory(); // no runtime needed
    /// let guard = client.mutex("migrations").blocking_lock()?;
    /// assert!(guard.fencing_token() > 0);
    /// # Ok::<(), distlock::Error>(())
    /// ```
    pub fn blocking_lock(&self) -> Result<MutexGuard> {
        self.target.core.home.block_on("blocking_lock", self.lock())
    }

    /// Waits at most `timeout` for the lock, blocking this thread:
    /// [`lock_timeout`](Self::lock_timeout) for synchronous code.
    ///
    /// # Errors
    ///
    /// - [`InAsyncContext`](crate::ErrorKind::InAsyncContext) inside a current-thread tokio
    ///   runtime (use the async form there); on a multi-thread runtime's thread it blocks in
    ///   place (`tokio::task::block_in_place`),
    /// - [`NoRuntime`](crate::ErrorKind::NoRuntime) for a client built in a current-thread
    ///   runtime (nothing may be driving it while this thread blocks) or whose runtime has
    ///   shut down,
    /// - otherwise the errors of [`lock_timeout`](Self::lock_timeout).
    ///
    /// # Cancel safety
    ///
    /// Not a future: it returns once the call is over. The guard it returns releases on drop
    /// as any other, renewed meanwhile by the runtime the client was built in (or its own).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let client = distlock::LockClient::memory();
    /// let held = client.mutex("k").blocking_lock()?;
    /// let err = client.mutex("k").blocking_lock_timeout(Duration::from_millis(20)).unwrap_err();
    /// assert!(err.is_timeout());
    /// # drop(held);
    /// # Ok::<(), distlock::Error>(())
    /// ```
    pub fn blocking_lock_timeout(&self, timeout: Duration) -> Result<MutexGuard> {
        let call = self.lock_timeout(timeout);
        self.target
            .core
            .home
            .block_on("blocking_lock_timeout", call)
    }

    /// Takes the lock only if it is free and nobody is queued for it, without waiting.
    ///
    /// # Errors
    ///
    /// An error with [`is_would_block`](crate::Error::is_would_block) if the lock is held or has
    /// waiters; otherwise the errors of [`lock`](Self::lock).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the future is dropped after the lock was granted, the grant is released
    /// in the background.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let client = distlock::LockClient::memory();
    /// let first = client.mutex("k").try_lock().await?;
    /// let second = client.mutex("k").try_lock().await;
    /// assert!(second.unwrap_err().is_would_block());
    /// # drop(first);
    /// # Ok(())
    /// # }
    /// ```
    pub fn try_lock(&self) -> impl Future<Output = Result<MutexGuard>> + Send + 'static {
        self.acquire(Mode::Try)
    }

    /// Waits for the lock at most `timeout`.
    ///
    /// # Errors
    ///
    /// An error with [`is_timeout`](crate::Error::is_timeout) if the lock was not granted in time;
    /// otherwise the errors of [`lock`](Self::lock).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, like [`lock`](Self::lock); the timeout itself is such a cancellation.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let client = distlock::LockClient::memory();
    /// let _held = client.mutex("k").lock().await?;
    /// let err = client.mutex("k").lock_timeout(Duration::from_millis(20)).await.unwrap_err();
    /// assert!(err.is_timeout());
    /// # Ok(())
    /// # }
    /// ```
    pub fn lock_timeout(
        &self,
        timeout: Duration,
    ) -> impl Future<Output = Result<MutexGuard>> + Send + 'static {
        self.target
            .acquire_timeout(LockKind::Exclusive, timeout)
            .map_ok(|held| MutexGuard { held })
    }
}

impl fmt::Debug for Mutex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mutex")
            .field("namespace", &self.target.core.config.namespace)
            .field("key", &self.target.key)
            .field("ttl", &self.target.ttl())
            .finish()
    }
}

/// Proof of holding a [`Mutex`]: the lease stays alive while the guard lives.
///
/// The guard is `Send + 'static`, so it can move into a spawned task. Dropping it stops renewal
/// and releases the lock in a task spawned on the client's runtime; nothing blocks.
/// Use [`release`](Self::release) to release it and learn the outcome.
///
/// Ownership of a lease can be lost (the holder stalled past its TTL, the service expired the
/// session, someone deleted the key): check [`is_lost`](Self::is_lost) or await
/// [`lost`](Self::lost), and pass [`fencing_token`](Self::fencing_token) to the storage you
/// write to so it can reject writes from a holder that no longer owns the lock.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), distlock::Error> {
/// let client = distlock::LockClient::memory();
/// let guard = client.mutex("partition:3").lock().await?;
/// let work = async { /* own partition 3 */ };
/// tokio::select! {
///     biased; // loss first: after a pause past the lease, not one more step
///     () = guard.lost() => eprintln!("lost partition 3, stopping"),
///     () = work => {}
/// }
/// guard.release().await?;
/// # Ok(())
/// # }
/// ```
#[must_use = "if unused the lock will immediately be released"]
#[clippy::has_significant_drop]
pub struct MutexGuard {
    held: Held,
}

guard_methods!(
    MutexGuard,
    "let guard = client.mutex(\"k\").lock().await?;",
    "The fencing token of this grant: strictly greater than the token of every earlier grant \
     of the same key. Storage that remembers the largest token it has seen can reject writes \
     from a holder whose lock has since passed to someone else."
);
