//! `Mutex`: an exclusive lock across processes, and its guard.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::acquire::{acquire, Mode};
use crate::backend::LockKind;
use crate::client::LockClient;
use crate::error::{Error, Result};
use crate::lease::Held;

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
    client: LockClient,
    key: Arc<str>,
    ttl: Option<Duration>,
}

impl Mutex {
    pub(crate) fn new(client: LockClient, key: String) -> Self {
        Self {
            client,
            key: key.into(),
            ttl: None,
        }
    }

    /// The key, without the client's namespace.
    pub fn key(&self) -> &str {
        &self.key
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
        self.ttl = Some(ttl);
        self
    }

    fn acquire(&self, mode: Mode) -> impl Future<Output = Result<MutexGuard>> + Send + 'static {
        let client = self.client.inner.clone();
        let key = self.key.clone();
        let ttl = self.ttl.unwrap_or(client.config.ttl);
        async move {
            let held = acquire(client, key, ttl, LockKind::Exclusive, mode).await?;
            Ok(MutexGuard { held })
        }
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

    /// Takes the lock only if it is free and nobody is queued for it, without waiting.
    ///
    /// # Errors
    ///
    /// An error with [`is_would_block`](Error::is_would_block) if the lock is held or has
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
    /// An error with [`is_timeout`](Error::is_timeout) if the lock was not granted in time;
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
        let key = self.key.clone();
        let lock = self.lock();
        async move {
            match tokio::time::timeout(timeout, lock).await {
                Ok(result) => result,
                Err(_) => Err(Error::timeout(&key)),
            }
        }
    }
}

impl fmt::Debug for Mutex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mutex")
            .field("namespace", &self.client.namespace())
            .field("key", &self.key)
            .field("ttl", &self.ttl.unwrap_or(self.client.ttl()))
            .finish()
    }
}

/// Proof of holding a [`Mutex`]: the lease stays alive while the guard lives.
///
/// The guard is `Send + 'static`, so it can move into a spawned task. Dropping it stops renewal
/// and releases the lock in a task spawned on the runtime it was acquired on; nothing blocks.
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
///     () = work => {}
///     () = guard.lost() => eprintln!("lost partition 3, stopping"),
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

impl MutexGuard {
    /// The key that is locked, without the namespace.
    pub fn key(&self) -> &str {
        self.held.key()
    }

    /// The fencing token of this grant: strictly greater than the token of every earlier grant
    /// of the same key. Storage that remembers the largest token it has seen can reject writes
    /// from a holder whose lock has since passed to someone else.
    pub fn fencing_token(&self) -> u64 {
        self.held.fencing_token()
    }

    /// Whether ownership is known to be lost: the service refused a renewal, the session ended,
    /// or the lease deadline (less a clock-drift margin) passed without a successful renewal.
    pub fn is_lost(&self) -> bool {
        self.held.is_lost()
    }

    /// Resolves once ownership is known to be lost; never resolves while the lock is held.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only watches a flag.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use distlock::{backend::MemoryBackend, LockClient};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// // Without renewal the lease ends after one TTL.
    /// let client = LockClient::builder(MemoryBackend::new())
    ///     .ttl(Duration::from_millis(50))
    ///     .auto_renew(false)
    ///     .build()?;
    /// let guard = client.mutex("k").lock().await?;
    /// guard.lost().await;
    /// assert!(guard.is_lost());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn lost(&self) {
        self.held.lost().await;
    }

    /// Releases the lock now and reports the outcome, handing it to the next waiter.
    ///
    /// # Errors
    ///
    /// - [`Lost`](crate::ErrorKind::Lost) if the lock had already been lost, so the critical
    ///   section may not have been exclusive to the end,
    /// - [`Backend`](crate::ErrorKind::Backend) if the service could not be told; the lease then
    ///   runs out after its TTL.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the release runs in a spawned task and completes even if this future is
    /// dropped; only its result is lost.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let client = distlock::LockClient::memory();
    /// let guard = client.mutex("k").lock().await?;
    /// guard.release().await?;
    /// assert!(client.mutex("k").try_lock().await.is_ok());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn release(self) -> Result<()> {
        self.held.release().await
    }
}

impl fmt::Debug for MutexGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.held, f)
    }
}
