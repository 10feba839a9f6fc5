//! What `#[distributed_lock]` expands to at run time: the process default client, and the
//! one function every annotated `async fn` calls. Not a public API: the macro's expansion is
//! its only caller.

use std::borrow::Borrow;
use std::future::Future;
use std::sync::RwLock;
use std::time::Duration;

use crate::error::{Error, ErrorKind, Result};
use crate::LockClient;

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
    /// The (client, key) pairs the current task holds through `#[distributed_lock]`.
    static HELD: Vec<(usize, String)>;
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
    let reentered = HELD
        .try_with(|held| held.iter().any(|(c, k)| *c == id && *k == key))
        .unwrap_or(false);
    if reentered {
        return body.await;
    }
    let mut mutex = client.mutex(key.clone());
    if let Some(ttl) = options.ttl {
        mutex = mutex.with_ttl(ttl);
    }
    let guard = match (options.wait, options.timeout) {
        (false, _) => mutex.try_lock().await,
        (true, Some(limit)) => mutex.lock_timeout(limit).await,
        (true, None) => mutex.lock().await,
    }?;
    let mut held = HELD.try_with(Clone::clone).unwrap_or_default();
    held.push((id, key.clone()));
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
