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
//! queue entry and releases a grant that raced with the drop. Errors say what went wrong through
//! [`Error`]'s predicates ([`is_would_block`](Error::is_would_block),
//! [`is_timeout`](Error::is_timeout), [`is_transient`](Error::is_transient), ...); each method's
//! own `# Errors` and `# Cancel safety` sections give the details.
//!
//! # The primitives
//!
//! Every primitive is a cheap handle made by a [`LockClient`] (no I/O until used), and every
//! guard keeps the contract above. The examples run on the in-process memory backend; the same
//! code runs on every backend.
//!
//! [`Mutex`]: one holder at a time.
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
//!
//! [`RwLock`]: many readers or one writer, fair and write-preferring, with
//! [`RwLockWriteGuard::downgrade`].
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), distlock::Error> {
//! let client = distlock::LockClient::memory();
//! let config = client.rw_lock("config");
//! let (a, b) = (config.read().await?, config.read().await?); // readers share
//! assert!(config.try_write().await.unwrap_err().is_would_block());
//! drop((a, b));
//! let write = config.write().await?;
//! let read = write.downgrade().await?; // no queued writer gets in between
//! # drop(read);
//! # Ok(())
//! # }
//! ```
//!
//! [`Semaphore`]: counted permits that are leases; every client of a key agrees on the count.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), distlock::Error> {
//! let client = distlock::LockClient::memory();
//! let exports = client.semaphore("exports", 4);
//! let three = exports.acquire_many(3).await?; // all or none
//! assert_eq!(three.count(), 3);
//! assert!(exports.try_acquire_many(2).await.unwrap_err().is_would_block());
//! let one = exports.acquire().await?;
//! # drop((three, one));
//! # Ok(())
//! # }
//! ```
//!
//! [`MultiLock`]: several keys in one deadlock-free order, all or nothing.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), distlock::Error> {
//! let client = distlock::LockClient::memory();
//! let both = client.multi_lock(["stock:oslo", "stock:berlin"]).read("prices").lock().await?;
//! assert_eq!(both.fencing_tokens().len(), 3);
//! both.release().await?; // in reverse order
//! # Ok(())
//! # }
//! ```
//!
//! [`Election`]: candidates lead in turn; the leader holds a [`Leadership`] guard whose
//! [`term`](Leadership::term) increases from one leader to the next (its fencing token).
//! [`Election::leader`] reads who leads and [`Election::observe`] follows every change.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), distlock::Error> {
//! let client = distlock::LockClient::memory();
//! let election = client.election("scheduler");
//! let leading = election.campaign("10.0.0.7:8080").await?;
//! assert_eq!(election.leader().await?.unwrap().term(), leading.term());
//! leading.resign().await?;
//! assert!(election.leader().await?.is_none());
//! # Ok(())
//! # }
//! ```
//!
//! [`Election::lead`] is the background-worker shape: it runs the work only while leading,
//! drops it when leadership is lost and campaigns again. It calls its closure once a term, so
//! the closure is an `FnMut`: an `async move` block cannot move a captured value out of it
//! (error E0507). Clone the value into each future, or share it in an [`Arc`](std::sync::Arc):
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), distlock::Error> {
//! let client = distlock::LockClient::memory();
//! let db_url = String::from("postgres://app@db/app"); // state the work needs
//! let term = client
//!     .election("scheduler")
//!     .lead("worker-7", |term| {
//!         let db_url = db_url.clone(); // a copy for this term's future
//!         async move { run_scheduler(&db_url, term).await }
//!     })
//!     .await?;
//! assert!(term > 0);
//! # Ok(())
//! # }
//! async fn run_scheduler(db_url: &str, term: u64) -> u64 {
//!     // ... only the leader gets here; writes carry `term` ...
//!     # let _ = db_url;
//!     term
//! }
//! ```
//!
//! # Backends
//!
//! One API over several services, behind the [`Backend`](backend::Backend) trait. Every
//! backend has every primitive, except Redlock's semaphores.
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
//!   locks, multi-locks and elections over a majority of independent Redis nodes, with fencing
//!   tokens that increase across the quorum and FIFO handoff over each node's pub/sub. Open it
//!   with `LockClient::redlock(urls)`.
//! - [`ZkBackend`](backend::ZkBackend) (feature `zookeeper`): Curator 5 compatible locks
//!   (`InterProcessMutex`, `InterProcessReadWriteLock`, `InterProcessSemaphoreV2` and
//!   `LeaderLatch` layouts, one watched node per waiter) on one session per client; a Java
//!   service using Curator on the same path shares our queue. Open it with
//!   `LockClient::zookeeper(connect)`.
//! - [`PgBackend`](backend::PgBackend) (feature `postgres`; `postgres-deadpool` takes a pool): a
//!   lease table in PostgreSQL, one function call per operation (works through PgBouncer in
//!   transaction mode), handoff announced over one LISTEN connection per client. Open it with
//!   `LockClient::postgres(url)`.
//!
//! [`LockClient::connect`] opens the service a URL names (`redis://…`, `zk://…`,
//! `postgres://…`, `memory:`, ...); [`LockClient::builder_for`] does the same and returns a
//! builder, to set a namespace or TTL first. A lease lasts [`DEFAULT_TTL`] (30 s) unless set
//! ([`LockClientBuilder::ttl`]); on ZooKeeper it is the session timeout (10 s by default).
//!
//! The crate's README compares the backends' guarantees, failure modes and costs, and lists
//! the safety caveats of each (a single Redis server restarted without persistence can briefly
//! give two holders; replication behind Redis Sentinel and Cluster is asynchronous).
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
pub use core::rules::{MAX_KEY_LEN, MAX_NAMESPACE_LEN, MAX_TTL, MIN_TTL};
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
