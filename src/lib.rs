//! Distributed locks for async Rust that behave like [`tokio::sync::Mutex`].
//!
//! [`Mutex::lock`] waits in FIFO order, woken by the coordination service rather than a sleep
//! loop, and returns a [`MutexGuard`] that
//!
//! - keeps its lease alive from one shared background task per client (renewing at a third of
//!   the TTL, many locks per round trip),
//! - tells you when the lock was lost ([`MutexGuard::is_lost`], [`MutexGuard::lost`]),
//! - carries a [`fencing token`](MutexGuard::fencing_token) that strictly increases per key,
//! - releases itself on `Drop` in a spawned task, never blocking.
//!
//! Every future is cancellation-safe: dropping a `lock()` future at any await point removes its
//! queue entry and releases a grant that raced with the drop.
//!
//! The rest of the family keeps the same guard contract: [`RwLock`] (many readers or one
//! writer, fair and write-preferring, with [`RwLockWriteGuard::downgrade`]), [`Semaphore`]
//! (counted permits that are leases) and [`MultiLock`] (several keys in one deadlock-free order,
//! all or nothing).
//!
//! # Backends
//!
//! One API over several services, behind the [`Backend`](backend::Backend) trait:
//!
//! - [`MemoryBackend`](backend::MemoryBackend) (feature `memory`, default): in-process, the same
//!   semantics; for single replicas, tests and the quickstart.
//! - [`RedisBackend`](backend::RedisBackend) (feature `redis`; `redis-deadpool` and `redis-bb8`
//!   take a connection pool): a FIFO queue per key in Redis with direct handoff announced over
//!   one shared pub/sub connection per client. Open it with `LockClient::redis(url)`.
//!   A Redis Cluster (`redis+cluster://`, feature `redis-cluster`: sharded pub/sub, renewal per
//!   slot) and a Sentinel-managed primary (`redis+sentinel://`, feature `redis-sentinel`) use
//!   the same backend.
//! - [`RedlockBackend`](backend::RedlockBackend) (feature `redlock`): mutexes, read-write
//!   locks and elections over a majority of independent Redis nodes, with fencing tokens that increase across
//!   the quorum and FIFO handoff over each node's pub/sub. Open it with
//!   `LockClient::redlock(urls)`.
//! - [`ZkBackend`](backend::ZkBackend) (feature `zookeeper`): Curator 5 compatible locks
//!   (`InterProcessMutex`, `InterProcessReadWriteLock`, `InterProcessSemaphoreV2` layouts, one
//!   watched node per waiter) on one session per client; a Java service using Curator on the
//!   same path shares our queue. Open it with `LockClient::zookeeper(connect)`.
//! - [`PgBackend`](backend::PgBackend) (feature `postgres`; `postgres-deadpool` takes a pool): a
//!   lease table in PostgreSQL, one function call per operation (works through PgBouncer in
//!   transaction mode), handoff announced over one LISTEN connection per client. Open it with
//!   `LockClient::postgres(url)`.
//!
//! With feature `macros`, [`#[distributed_lock("orders:{id}")]`](distributed_lock) runs an
//! `async fn` under a lock named by its arguments.
//!
//! # Operating
//!
//! - [`LockClient::inspect`] reads who holds a key and who waits ([`Inspection`]);
//!   [`LockClient::force_release`] is the operator's unlock for a stuck holder ([`ForceReleased`]).
//! - Feature `metrics` records acquisitions by outcome, wait and hold times, lost locks and
//!   renewal round trips through the [`metrics`](https://docs.rs/metrics) facade, labelled by
//!   backend and kind of lock (never by key). Every acquisition runs in a `distlock.acquire`
//!   tracing span with the key; grants and releases are `debug` events, a lost lock a `warn`
//!   event.
//! - Feature `cli` builds the `distlock` command: `distlock run KEY -- CMD` holds a lock while a
//!   command runs (cron jobs, migrations), `distlock inspect KEY` shows a key, `distlock unlock KEY --force` drops its holders.
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), distlock::Error> {
//! let client = distlock::LockClient::memory();
//! let mutex = client.mutex("orders:42");
//!
//! let guard = mutex.lock().await?;
//! let token = guard.fencing_token(); // hand this to the storage you write to
//! assert!(mutex.try_lock().await.unwrap_err().is_would_block());
//! guard.release().await?;
//!
//! let again = mutex.lock_timeout(Duration::from_secs(5)).await?;
//! assert!(again.fencing_token() > token);
//! # Ok(())
//! # }
//! ```
#![warn(
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub
)]
#![deny(unused_must_use, rustdoc::broken_intra_doc_links)]
#![forbid(unsafe_code)]
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![doc(test(attr(deny(warnings))))]

#[cfg(feature = "macros")]
mod attribute;
pub mod backend;
mod client;
mod core;
mod election;
mod error;
mod inspect;
mod multi;
mod mutex;
mod rw_lock;
mod semaphore;
mod sync;

pub use backend::{Leader, LeaderWatch};
pub use client::{LockClient, LockClientBuilder, DEFAULT_NAMESPACE, DEFAULT_TTL};

/// Describes distlock's metrics (type, unit, help text) to the `metrics` recorder installed
/// now. The first [`LockClient`] of the process does this by itself; call it again if the
/// recorder (a Prometheus exporter, say) is installed after that.
///
/// # Examples
///
/// ```
/// // After installing the exporter:
/// distlock::describe_metrics();
/// ```
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub fn describe_metrics() {
    core::metrics::describe();
}
pub use core::rules::{MAX_KEY_LEN, MAX_NAMESPACE_LEN, MIN_TTL};
pub use election::{Election, Leadership};
pub use error::{Error, ErrorKind, Result};
pub use inspect::{ForceReleased, Holder, Inspection, Waiter};
pub use multi::{MultiGuard, MultiLock};
pub use mutex::{Mutex, MutexGuard};
pub use rw_lock::{RwLock, RwLockReadGuard, RwLockWriteGuard};
pub use semaphore::{Semaphore, SemaphorePermit};

#[cfg(feature = "macros")]
#[cfg_attr(docsrs, doc(cfg(feature = "macros")))]
pub use attribute::set_default;
/// Runs an `async fn` while holding the distributed lock its arguments name.
///
/// ```
/// use distlock::distributed_lock;
///
/// # #[allow(dead_code)]
/// #[derive(Debug)]
/// enum AppError {
///     Lock(distlock::Error),
/// }
///
/// impl From<distlock::Error> for AppError {
///     fn from(e: distlock::Error) -> Self {
///         AppError::Lock(e)
///     }
/// }
///
/// #[distributed_lock("orders:{order_id}", timeout = "5s", ttl = "30s")]
/// async fn settle(order_id: u64) -> Result<u64, AppError> {
///     // Only one replica at a time gets here for a given order.
///     Ok(order_id)
/// }
///
/// #[distributed_lock("orders:{order_id}", wait = false)]
/// async fn try_settle(order_id: u64) -> Result<(), AppError> {
///     Ok(())
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), AppError> {
/// distlock::set_default(distlock::LockClient::memory());
/// assert_eq!(settle(42).await?, 42);
/// try_settle(42).await?;
/// # Ok(())
/// # }
/// ```
///
/// - The template interpolates arguments by `Display` (`{name}`, `{name:?}` and format specs
///   work); a name that is not an argument is a compile error.
/// - `client = <expr>` picks the client (a `LockClient` or a reference to one; any expression
///   over the arguments, e.g. `client = &state.locks`); without it the process default from
///   [`set_default`] is used, and a missing default is a runtime error.
/// - `timeout = "5s"` bounds the wait (`is_timeout()`); `wait = false` tries once
///   (`is_would_block()`); `ttl = "30s"` sets the lease. Durations take `ms`, `s`, `m`, `h`
///   and are checked at compile time.
/// - `read` or `write` takes the key as a read-write lock ([`RwLock`]) for reading or writing;
///   `permits = 8` takes one permit of a semaphore of 8 ([`Semaphore`]). Without either, the
///   key is a [`Mutex`].
/// - `on_lost = "abort"` cancels the body at its next await once the lock is lost and returns
///   the lost error; by default the body runs on and the lost lock is only logged.
/// - `crate = "path"` names distlock when it is re-exported under another path.
///
/// The function keeps its signature. It must return `Result<T, E>` with
/// `E: From<distlock::Error>`: lock errors are returned through it. The lock is released when
/// the body returns, fails or panics. A nested call with the same key on the same client in
/// the same task runs without locking again (instead of deadlocking) when the outer call holds
/// it at least as strongly (a read under a write, or the same mode); a write under the task's
/// own read is refused with a would-block error, since read locks do not upgrade. Other tasks
/// wait as usual. Works on methods, including under `#[async_trait]`.
///
/// # Errors
///
/// The function returns `E::from(error)` when the lock cannot be taken (timeout, would block,
/// bad key, backend failure, no default client) or, with `on_lost = "abort"`, when it was lost.
///
/// # Cancel safety
///
/// Dropping the function's future at any await point releases the lock or its queue entry,
/// as [`Mutex::lock`] does.
#[cfg(feature = "macros")]
#[cfg_attr(docsrs, doc(cfg(feature = "macros")))]
pub use distlock_macros::distributed_lock;

/// What `#[distributed_lock]` expands to. Not a public API.
#[cfg(feature = "macros")]
#[doc(hidden)]
pub mod __private {
    pub use crate::attribute::{client_of, default_client, locked, Mode, Options};
    pub use std::time::Duration;
}

// The README shows every backend, so its examples compile with all of them.
#[cfg(all(
    doctest,
    feature = "redis",
    feature = "redis-cluster",
    feature = "redis-sentinel",
    feature = "redlock",
    feature = "zookeeper",
    feature = "postgres",
    feature = "macros"
))]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

#[cfg(all(test, feature = "memory"))]
mod bounds {
    use super::*;

    fn send_static<T: Send + 'static>(_: &T) {}
    fn send_sync_static<T: Send + Sync + 'static>(_: &T) {}

    #[test]
    fn auto_traits() {
        let client = LockClient::memory();
        send_sync_static(&client);
        let mutex = client.mutex("k");
        send_sync_static(&mutex);
        send_static(&mutex.lock());
        send_static(&mutex.try_lock());
        send_static(&mutex.lock_timeout(std::time::Duration::from_secs(1)));
        fn guard_is_send_sync<T: Send + Sync + 'static>() {}
        guard_is_send_sync::<MutexGuard>();
        guard_is_send_sync::<RwLockReadGuard>();
        guard_is_send_sync::<RwLockWriteGuard>();
        guard_is_send_sync::<SemaphorePermit>();
        guard_is_send_sync::<MultiGuard>();
        let (rw, sem, multi) = (
            client.rw_lock("k"),
            client.semaphore("s", 2),
            client.multi_lock(["a"]),
        );
        send_sync_static(&rw);
        send_sync_static(&sem);
        send_sync_static(&multi);
        send_static(&rw.read());
        send_static(&rw.write());
        send_static(&sem.acquire_many(2));
        send_static(&multi.lock());
        guard_is_send_sync::<Error>();
        let election = client.election("e");
        send_sync_static(&election);
        send_static(&election.campaign("me"));
        send_static(&election.observe());
        fn send<T: Send>(_: &T) {}
        send(&election.leader());
        send(&election.lead("me", |term| async move { term }));
        guard_is_send_sync::<Leadership>();
        guard_is_send_sync::<Leader>();
    }
}
