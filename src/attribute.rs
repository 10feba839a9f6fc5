//! What `#[distributed_lock]` expands to at run time: the process default client, and the
//! one function every annotated `async fn` calls. Not a public API: the macro's expansion is
//! its only caller.

use std::borrow::Borrow;
use std::future::Future;
use std::sync::RwLock;
use std::time::Duration;

use crate::backend::LockKind;
use crate::error::{Error, ErrorKind, Result};
use crate::{LockClient, MutexGuard, RwLockReadGuard, RwLockWriteGuard, SemaphorePermit};

static DEFAULT: RwLock<Option<LockClient>> = RwLock::new(None);

/// Sets the client `#[distributed_lock]` uses when it is not given `client = ...`. Replaces
/// any earlier default.
///
/// # Examples
///
/// ```
/// distlock::set_default(distlock::LockClient::memory());
/// ```
pub fn set_default(client: LockClient) {
    *DEFAULT.write().unwrap_or_else(|p| p.into_inner()) = Some(client);
}

tokio::task_local! {
    /// What the current task holds through `#[distributed_lock]`: client, key, mode.
    static HELD: Vec<(usize, String, Mode)>;
}

/// Which lock an annotated function takes: `read`, `write`, `permits = N`, or a mutex.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A mutex (the default).
    Mutex,
    /// The read side of a read-write lock.
    Read,
    /// The write side of a read-write lock.
    Write,
    /// One permit of a semaphore with this many.
    Permits(u32),
}

impl Mode {
    /// The kind of claim this mode takes (one permit, for a semaphore).
    fn kind(self) -> LockKind {
        match self {
            Mode::Mutex => LockKind::Exclusive,
            Mode::Read => LockKind::Read,
            Mode::Write => LockKind::Write,
            Mode::Permits(max) => LockKind::Permits { count: 1, max },
        }
    }

    /// Whether a task holding the key this way may run a nested call that asks for `inner`
    /// without taking anything: the same lock, held at least as strongly.
    fn covers(self, inner: Mode) -> bool {
        self.kind().covers(inner.kind())
    }
}

/// The guard of whichever lock was taken.
enum Guard {
    Mutex(MutexGuard),
    Read(RwLockReadGuard),
    Write(RwLockWriteGuard),
    Permit(SemaphorePermit),
}

impl Guard {
    async fn take(client: &LockClient, key: &str, options: &Options) -> Result<Self> {
        macro_rules! take {
            ($handle:expr, $wait:ident, $try:ident, $timeout:ident, $variant:ident) => {{
                let handle = match options.ttl {
                    Some(ttl) => $handle.with_ttl(ttl),
                    None => $handle,
                };
                match (options.wait, options.timeout) {
                    (false, _) => handle.$try().await,
                    (true, Some(limit)) => handle.$timeout(limit).await,
                    (true, None) => handle.$wait().await,
                }
                .map(Guard::$variant)
            }};
        }
        match options.mode {
            Mode::Mutex => take!(client.mutex(key), lock, try_lock, lock_timeout, Mutex),
            Mode::Read => take!(client.rw_lock(key), read, try_read, read_timeout, Read),
            Mode::Write => take!(client.rw_lock(key), write, try_write, write_timeout, Write),
            Mode::Permits(max) => take!(
                client.semaphore(key, max),
                acquire,
                try_acquire,
                acquire_timeout,
                Permit
            ),
        }
    }

    async fn lost(&self) {
        match self {
            Guard::Mutex(g) => g.lost().await,
            Guard::Read(g) => g.lost().await,
            Guard::Write(g) => g.lost().await,
            Guard::Permit(g) => g.lost().await,
        }
    }

    async fn release(self) -> Result<()> {
        match self {
            Guard::Mutex(g) => g.release().await,
            Guard::Read(g) => g.release().await,
            Guard::Write(g) => g.release().await,
            Guard::Permit(g) => g.release().await,
        }
    }
}

/// How one annotated function locks.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// `ttl = "..."`: the lease, instead of the client's TTL.
    pub ttl: Option<Duration>,
    /// `timeout = "..."`: give up waiting after this long.
    pub timeout: Option<Duration>,
    /// `wait = false`: try once.
    pub wait: bool,
    /// `on_lost = "abort"`: cancel the body once the lock is lost.
    pub abort_on_lost: bool,
    /// `read`, `write`, `permits = N`, or a mutex.
    pub mode: Mode,
}

/// The process default client, or an error saying how to set one.
pub fn default_client() -> Result<LockClient> {
    DEFAULT
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
        .ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidConfig,
                "#[distributed_lock] has no client: call distlock::set_default(client) at startup or pass `client = ...`",
            )
        })
}

/// The client named by `client = <expr>` (borrowed by the expansion, so an argument can name
/// its own client and still be used by the body): a `LockClient` or a reference to one.
pub fn client_of<C: Borrow<LockClient>>(client: &C) -> Result<LockClient> {
    Ok(client.borrow().clone())
}

/// Runs `body` holding `key` on `client`, or straight away if this task already holds it
/// through an enclosing annotated call. Releases the lock when the body returns, fails or
/// panics.
pub async fn locked<T, E, F>(
    client: Result<LockClient>,
    key: String,
    options: Options,
    body: F,
) -> std::result::Result<T, E>
where
    F: Future<Output = std::result::Result<T, E>>,
    E: From<Error>,
{
    let client = client?;
    let id = client.id();
    let held = HELD.try_with(Clone::clone).unwrap_or_default();
    let mut outer = held.iter().filter(|(c, k, _)| *c == id && *k == key);
    if let Some((_, _, mode)) = outer.next() {
        if mode.covers(options.mode) {
            return body.await;
        }
        if *mode == Mode::Read && options.mode == Mode::Write {
            // Taking it would wait for ourselves: read locks do not upgrade.
            return Err(E::from(Error::new(
                ErrorKind::WouldBlock,
                format!("`{key}` is held for reading by this task; a write under it would wait for itself (read locks do not upgrade)"),
            )));
        }
    }
    let guard = Guard::take(&client, &key, &options).await?;
    let mut held = held;
    held.push((id, key.clone(), options.mode));
    let body = std::pin::pin!(HELD.scope(held, body));
    let out = if options.abort_on_lost {
        tokio::select! {
            biased;
            () = guard.lost() => Err(E::from(Error::lost(&key))),
            out = body => out,
        }
    } else {
        body.await
    };
    if let Err(e) = guard.release().await {
        tracing::warn!(key = %key, error = %e, "#[distributed_lock]: release after the body failed");
    }
    out
}
