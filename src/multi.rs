//! `MultiLock`: several keys taken together, in one canonical order, under one deadline.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::LockKind;
use crate::core::acquire::{Mode, Target};
use crate::core::held::Held;
use crate::core::Core;
use crate::error::{Error, Result};

/// Several locks taken as one: all of them, or none.
///
/// The keys are put in one canonical order (sorted byte-wise, each key once) and taken one after
/// the other, so two multi-locks over overlapping sets of keys, or a multi-lock and a plain
/// lock, can never deadlock each other. One deadline bounds the whole acquisition. If anything
/// fails (an error, the timeout, a key that is busy for [`try_lock`](Self::try_lock), or the
/// future being dropped), every key taken so far is released: a partial set is never returned.
///
/// Keys are mutexes ([`LockClient::multi_lock`](crate::LockClient::multi_lock)); read or write
/// holds of read-write locks can be mixed in with [`read`](Self::read) and
/// [`write`](Self::write). The same key asked for twice is taken once, in the stronger mode
/// (write over read).
///
/// Canonical ordering cannot help against a task that already holds one of the keys through
/// another guard and then takes a multi-lock including it: that task waits for itself.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), distlock::Error> {
/// let client = distlock::LockClient::memory();
/// // Move stock between two warehouses: both rows, in a deadlock-free order.
/// let both = client.multi_lock(["stock:berlin", "stock:oslo"]).lock().await?;
/// for (key, token) in both.fencing_tokens() {
///     println!("{key}: write with token {token}");
/// }
/// both.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct MultiLock {
    core: Arc<Core>,
    parts: Vec<(String, LockKind)>,
    ttl: Option<Duration>,
}

impl MultiLock {
    pub(crate) fn new(core: Arc<Core>, keys: Vec<String>) -> Self {
        Self {
            core,
            parts: keys.into_iter().map(|k| (k, LockKind::Exclusive)).collect(),
            ttl: None,
        }
    }

    fn with(mut self, key: impl Into<String>, part: LockKind) -> Self {
        self.parts.push((key.into(), part));
        self
    }

    /// Adds a mutex on `key`.
    ///
    /// # Examples
    ///
    /// ```
    /// let client = distlock::LockClient::memory();
    /// let m = client.multi_lock(["a"]).mutex("b");
    /// assert_eq!(m.keys(), ["a", "b"]);
    /// ```
    #[must_use]
    pub fn mutex(self, key: impl Into<String>) -> Self {
        self.with(key, LockKind::Exclusive)
    }

    /// Adds a read hold of the read-write lock `key`.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let client = distlock::LockClient::memory();
    /// // Read the configuration, write the order.
    /// let g = client.multi_lock(["orders:42"]).read("config").lock().await?;
    /// let _also_reading = client.rw_lock("config").read().await?;
    /// # drop(g);
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn read(self, key: impl Into<String>) -> Self {
        self.with(key, LockKind::Read)
    }

    /// Adds a write hold of the read-write lock `key`.
    ///
    /// # Examples
    ///
    /// ```
    /// let client = distlock::LockClient::memory();
    /// let m = client.multi_lock(["a"]).write("c").read("b");
    /// assert_eq!(m.keys(), ["a", "b", "c"]);
    /// ```
    #[must_use]
    pub fn write(self, key: impl Into<String>) -> Self {
        self.with(key, LockKind::Write)
    }

    /// Uses `ttl` as the lease length of every key instead of the client's.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let client = distlock::LockClient::memory();
    /// let m = client.multi_lock(["a", "b"]).with_ttl(Duration::from_secs(60));
    /// # let _ = m;
    /// ```
    #[must_use]
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// The keys in the order they are taken: sorted, each once.
    pub fn keys(&self) -> Vec<&str> {
        let mut keys: Vec<&str> = self.parts.iter().map(|(k, _)| k.as_str()).collect();
        keys.sort_unstable();
        keys.dedup();
        keys
    }

    /// The keys in canonical order with how each is taken.
    fn plan(&self) -> Result<Vec<(Arc<str>, LockKind)>> {
        let mut parts = self.parts.clone();
        parts.sort_by(|a, b| a.0.cmp(&b.0));
        let mut plan: Vec<(Arc<str>, LockKind)> = Vec::with_capacity(parts.len());
        for (key, part) in parts {
            match plan.last_mut() {
                Some((last, seen)) if **last == *key => {
                    *seen = seen.merged(part).ok_or_else(|| {
                        Error::kind_mismatch(format_args!(
                            "`{key}` is asked for both as a mutex and as a read-write lock"
                        ))
                    })?;
                }
                _ => plan.push((key.into(), part)),
            }
        }
        if plan.is_empty() {
            return Err(Error::invalid_config("a multi-lock needs at least one key"));
        }
        Ok(plan)
    }

    fn take(
        &self,
        mode: Mode,
        deadline: Option<Instant>,
    ) -> impl Future<Output = Result<MultiGuard>> + Send + 'static {
        let (core, ttl, plan) = (self.core.clone(), self.ttl, self.plan());
        async move {
            // If this future is dropped, dropping `taken` releases every key taken so far (in
            // spawned tasks); the key being taken releases itself.
            let mut taken = MultiGuard {
                held: Vec::with_capacity(plan.as_ref().map_or(0, Vec::len)),
            };
            let plan = plan?;
            for (key, kind) in plan {
                let target = Target {
                    core: core.clone(),
                    key,
                    ttl,
                    value: None,
                };
                match target.acquire_until(kind, mode, deadline).await {
                    Ok(h) => taken.held.push(h),
                    Err(e) => {
                        // Returned errors leave nothing held: release before reporting.
                        let _ = taken.release().await;
                        return Err(e);
                    }
                }
            }
            Ok(taken)
        }
    }

    /// Waits for every key, in canonical order.
    ///
    /// # Errors
    ///
    /// The first error of any key, after releasing those already taken:
    /// [`InvalidKey`](crate::ErrorKind::InvalidKey), [`KindMismatch`](crate::ErrorKind::KindMismatch)
    /// (also before any I/O for a key asked for both as a mutex and as a read-write lock),
    /// [`InvalidConfig`](crate::ErrorKind::InvalidConfig) for no keys at all,
    /// [`Backend`](crate::ErrorKind::Backend), [`Closed`](crate::ErrorKind::Closed).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future at any await point releases every key taken so far and
    /// gives up the place in the queue of the key being waited for.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let client = distlock::LockClient::memory();
    /// let guard = client.multi_lock(["b", "a"]).lock().await?;
    /// assert_eq!(guard.keys(), ["a", "b"]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn lock(&self) -> impl Future<Output = Result<MultiGuard>> + Send + 'static {
        self.take(Mode::Wait, None)
    }

    /// Takes every key, blocking this thread: [`lock`](Self::lock) for synchronous code (see
    /// [`Mutex::blocking_lock`](crate::Mutex::blocking_lock) for where it runs).
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
    /// let client = distlock::LockClient::memory();
    /// let both = client.multi_lock(["a", "b"]).blocking_lock()?;
    /// # drop(both);
    /// # Ok::<(), distlock::Error>(())
    /// ```
    pub fn blocking_lock(&self) -> Result<MultiGuard> {
        self.core.home.block_on("blocking_lock", self.lock())
    }

    /// Takes every key only if each is free now, without waiting.
    ///
    /// # Errors
    ///
    /// An error with [`is_would_block`](crate::Error::is_would_block) if any key is busy (those
    /// taken before it are released); otherwise the errors of [`lock`](Self::lock).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`lock`](Self::lock).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let client = distlock::LockClient::memory();
    /// let _b = client.mutex("b").lock().await?;
    /// let err = client.multi_lock(["a", "b"]).try_lock().await.unwrap_err();
    /// assert!(err.is_would_block());
    /// assert!(client.mutex("a").try_lock().await.is_ok(), "`a` was released");
    /// # Ok(())
    /// # }
    /// ```
    pub fn try_lock(&self) -> impl Future<Output = Result<MultiGuard>> + Send + 'static {
        self.take(Mode::Try, None)
    }

    /// Waits for every key, `timeout` at most for the whole set.
    ///
    /// # Errors
    ///
    /// An error with [`is_timeout`](crate::Error::is_timeout) if the set was not complete in
    /// time (what was taken is released); otherwise the errors of [`lock`](Self::lock).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`lock`](Self::lock).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let client = distlock::LockClient::memory();
    /// let _b = client.mutex("b").lock().await?;
    /// let err = client
    ///     .multi_lock(["a", "b"])
    ///     .lock_timeout(Duration::from_millis(20))
    ///     .await
    ///     .unwrap_err();
    /// assert!(err.is_timeout());
    /// # Ok(())
    /// # }
    /// ```
    pub fn lock_timeout(
        &self,
        timeout: Duration,
    ) -> impl Future<Output = Result<MultiGuard>> + Send + 'static {
        self.take(Mode::Wait, crate::core::rules::deadline_after(timeout))
    }
}

impl fmt::Debug for MultiLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiLock")
            .field("namespace", &self.core.config.namespace)
            .field("keys", &self.keys())
            .finish_non_exhaustive()
    }
}

/// Every key of a [`MultiLock`], held together.
///
/// Each key has its own lease, renewed by the client's one renewal task. The guard is lost as
/// soon as any of its keys is lost. Dropping it releases every key in a spawned task, in reverse
/// order.
#[must_use = "if unused the locks will immediately be released"]
#[clippy::has_significant_drop]
pub struct MultiGuard {
    held: Vec<Held>,
}

impl MultiGuard {
    /// The keys held, in the order they were taken.
    pub fn keys(&self) -> Vec<&str> {
        self.held.iter().map(Held::key).collect()
    }

    /// Each key with the fencing token of its grant, in the order they were taken. Hand each
    /// storage the token of the key that guards it.
    pub fn fencing_tokens(&self) -> Vec<(&str, u64)> {
        self.held
            .iter()
            .map(|h| (h.key(), h.fencing_token()))
            .collect()
    }

    /// Whether any key is known to be lost.
    pub fn is_lost(&self) -> bool {
        self.held.iter().any(Held::is_lost)
    }

    /// Resolves as soon as any key is known to be lost.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only watches flags and deadlines.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let client = distlock::LockClient::builder(distlock::backend::MemoryBackend::new())
    ///     .ttl(Duration::from_millis(50))
    ///     .auto_renew(false)
    ///     .build()?;
    /// let guard = client.multi_lock(["a", "b"]).lock().await?;
    /// guard.lost().await;
    /// assert!(guard.is_lost());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn lost(&self) {
        let each = self.held.iter().map(|h| Box::pin(h.lost()));
        futures::future::select_all(each).await;
    }

    /// How long every key's lease certainly lasts from now (the shortest of them, drift
    /// margin included): zero once any is lost.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let client = distlock::LockClient::memory();
    /// let guard = client.multi_lock(["a", "b"]).lock().await?;
    /// assert!(!guard.lease_left().is_zero());
    /// # Ok(())
    /// # }
    /// ```
    pub fn lease_left(&self) -> std::time::Duration {
        self.held
            .iter()
            .map(Held::lease_left)
            .min()
            .unwrap_or_default()
    }

    /// Renews every key's lease once, now, asking for `ttl` from this moment (later renewals
    /// ask for it too), as [`MutexGuard::extend`](crate::MutexGuard::extend) does for one.
    ///
    /// # Errors
    ///
    /// The first error of any key (see [`MutexGuard::extend`](crate::MutexGuard::extend));
    /// every key is asked regardless.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`MutexGuard::extend`](crate::MutexGuard::extend): each lease is taken
    /// to end at the earlier of its old end and `ttl` from the call until a renewal says
    /// otherwise.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let client = distlock::LockClient::memory();
    /// let guard = client.multi_lock(["a", "b"]).lock().await?;
    /// guard.extend(Duration::from_secs(90)).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn extend(&self, ttl: std::time::Duration) -> Result<()> {
        let each = self.held.iter().map(|h| h.extend(ttl));
        let results = futures::future::join_all(each).await;
        results.into_iter().find(Result::is_err).unwrap_or(Ok(()))
    }

    /// Turns background renewal of every key's lease off or on (see
    /// [`MutexGuard::set_auto_renew`](crate::MutexGuard::set_auto_renew)).
    ///
    /// # Errors
    ///
    /// [`Unsupported`](crate::ErrorKind::Unsupported) for `false` on a backend whose lease is
    /// its session's (ZooKeeper); no key's renewal is changed then.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let client = distlock::LockClient::memory();
    /// let guard = client.multi_lock(["a", "b"]).lock().await?;
    /// guard.set_auto_renew(false)?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn set_auto_renew(&self, on: bool) -> Result<()> {
        // Refused for one key, refused for all (the backend is the same).
        self.held.iter().try_for_each(|h| h.set_auto_renew(on))
    }

    /// Releases every key now, in reverse order, and reports the outcome.
    ///
    /// # Errors
    ///
    /// The first error of any key ([`Lost`](crate::ErrorKind::Lost) if it had been lost,
    /// [`Backend`](crate::ErrorKind::Backend) if the service could not be told); every key is
    /// released regardless.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: releases not yet done complete in spawned tasks.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let client = distlock::LockClient::memory();
    /// let guard = client.multi_lock(["a", "b"]).lock().await?;
    /// guard.release().await?;
    /// assert!(client.mutex("a").try_lock().await.is_ok());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn release(mut self) -> Result<()> {
        let mut first = None;
        while let Some(h) = self.held.pop() {
            if let Err(e) = h.release().await {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }
}

impl Drop for MultiGuard {
    fn drop(&mut self) {
        // Each `Held` releases itself in a spawned task; go in reverse order.
        while let Some(h) = self.held.pop() {
            drop(h);
        }
    }
}

impl fmt::Debug for MultiGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(&self.held).finish()
    }
}
