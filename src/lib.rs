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
//! # Backends
//!
//! One API over several services, behind the [`Backend`](backend::Backend) trait:
//!
//! - [`MemoryBackend`](backend::MemoryBackend) (feature `memory`, default): in-process, the same
//!   semantics; for single replicas, tests and the quickstart.
//! - [`RedisBackend`](backend::RedisBackend) (feature `redis`; `redis-deadpool` and `redis-bb8`
//!   take a connection pool): a FIFO queue per key in Redis with direct handoff announced over
//!   one shared pub/sub connection per client. Open it with `LockClient::redis(url)`.
//! - [`ZkBackend`](backend::ZkBackend) (feature `zookeeper`): Curator `InterProcessMutex`
//!   compatible locks (`_c_<uuid>-lock-<seq>` nodes, predecessor watches) on one session per
//!   client; a Java service using Curator on the same path excludes ours. Open it with
//!   `LockClient::zookeeper(connect)`.
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

mod acquire;
pub mod backend;
mod client;
mod error;
mod key;
mod lease;
mod mutex;

pub use client::{LockClient, LockClientBuilder, DEFAULT_NAMESPACE, DEFAULT_TTL, MIN_TTL};
pub use error::{Error, ErrorKind, Result};
pub use key::{MAX_KEY_LEN, MAX_NAMESPACE_LEN};
pub use mutex::{Mutex, MutexGuard};

// The README shows every backend, so its examples compile with all of them.
#[cfg(all(doctest, feature = "redis", feature = "zookeeper"))]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

#[cfg(test)]
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
        guard_is_send_sync::<Error>();
    }
}
