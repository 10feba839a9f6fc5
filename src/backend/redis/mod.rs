//! The Redis backend: FIFO locks with direct handoff announced over pub/sub.
//!
//! Per lock key, under one hash tag so every script is Cluster-safe (but a single server's
//! fencing counter, which serves a whole namespace):
//!
//! | key | type | holds |
//! |---|---|---|
//! | `<ns>:{<key>}` | string | a mutex hold: `m <fencing token> <q> <owner>[ <w> <wq>]` (`q` = 1 once anyone may queue behind it), or, taken by the plain commands on a single server (`fast.rs`), the bare owner token (no token recorded, nobody queued); PX = lease. An election's: the same, then `\n?` (a provisional lead) or `\n=<value>` (its leader) |
//! | `<ns>:{<key>}` | hash | a read-write lock or semaphore: `t` = `rw`/`sem`, `m` permits, `u` in use, `wr` writer, `f:<owner>`, `n:<owner>` per holder |
//! | `<ns>:{<key>}:h` | zset | read-write lock or semaphore holder → lease deadline (server time, ms) |
//! | `<ns>:{<key>}:q` | list | waiting owner tokens (`r:`/`w:`/`<n>:` before them for the shared kinds), in arrival order |
//! | `<ns>:{<key>}:w` | zset | waiting owner → liveness deadline (server time, ms) |
//! | `<ns>:fence` | string | a single server's fencing counter, one per namespace (see `scripts/plain.lua`); expires an hour after it (re)started |
//! | `<ns>:{<key>}:fence` | string | a Cluster's or Sentinel-managed primary's fencing counter, one per lock; expires an hour after its last grant or mark; `<n>q` while a mutex waiter may be queued |
//! | `<ns>:{<key>}:c:<client>` | channel | messages for one client's waiters on this lock |
//! | `<ns>:{<key>}:e` | channel | an election's changes of leader, for its observers (see `election.rs`) |
//!
//! An uncontended mutex acquire on a single server is `SET NX PX`, `INCR` on the namespace's
//! counter and `EXISTS` on the queue (see `fast.rs`); its release `GET` and `DEL`. A mutex's
//! acquire and release calls one backend has in flight at once go as one function call, except
//! on a Cluster, by `EVALSHA` and for elections (see `coalesce.rs`).
//!
//! Owner tokens are `<client>.<claim>`: the backend's random id, then the claim's. A release
//! hands the lock straight to the live head of the queue (owner set, fence incremented, a short
//! unconfirmed lease) and publishes it on that owner's client channel, so the message reaches
//! the one connection that waits for it and no other (a handoff costs the same with 2 waiting
//! clients or 200). The new owner learns of its grant from the message and confirms it with its
//! first renewal. A waiter that misses the message re-checks at the holder's PTTL deadline, or
//! when the pub/sub connection comes back. Every name but a single server's namespace counter is
//! under the key's hash tag, so each channel lives in the key's Cluster slot.
//!
//! The scripts are a Redis 7 function library where the server allows it, else sent by
//! `EVALSHA` (see [`script`]).

mod builder;
pub(crate) mod call;
#[cfg(feature = "redis-cluster")]
mod cluster;
mod coalesce;
pub(crate) mod commands;
pub(crate) mod election;
mod fast;
mod inspect;
mod keys;
mod library;
mod lock;
pub(crate) mod notify;
pub(crate) mod own;
mod pubsub;
mod renewal;
mod replicas;
mod restart;
pub(crate) mod script;
pub(crate) mod scripts;
#[cfg(feature = "redis-sentinel")]
mod sentinel;
mod strings;
mod ticket;
mod url;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use self::commands::Commands;
use self::notify::PubSubHub;
use self::replicas::Ack;
use self::script::{Functions, Library};
use super::{Attempt, Backend, Claim, Grant, Leader, LeaderWatch, LockKind, Renewal};
use crate::error::Result;
use crate::inspect::{ForceReleased, Inspection};

pub use self::builder::RedisBackendBuilder;
#[cfg(feature = "redlock")]
pub(crate) use self::keys::{claim_token, millis};
pub(crate) use self::keys::{kind_code, kind_of_code, lock_name, Counter, Keys};
#[cfg(feature = "redlock")]
pub(crate) use self::lock::FENCE_TTL;
pub use self::ticket::RedisTicket;
#[cfg(any(feature = "redis-cluster", feature = "redlock"))]
pub(crate) use self::url::hosts_of;
pub(crate) use self::url::malformed_url;

/// Locks on a Redis server (or Valkey, KeyDB, Tair: the same scripts run there).
///
/// Commands go over its own auto-reconnecting connection, or through a `deadpool-redis` or
/// `bb8-redis` pool the application already has. Waiters share one dedicated pub/sub
/// connection per backend. `RedisBackend` is a cheap `Clone` handle.
///
/// On a Redis Cluster (feature `redis-cluster`) scripts go to the primary of their key's slot,
/// grants are announced on the lock's shard channel (`SPUBLISH`/`SSUBSCRIBE`) and renewals go one
/// script call per slot. With Sentinel (feature `redis-sentinel`) commands and pub/sub follow
/// the primary the sentinels name. On both, fencing tokens never fall below the server's clock
/// in µs nor below the clock in µs of the client whose request makes the grant, so they keep
/// increasing across a failover that lost the counter's last increments as long as, at the
/// promoted node's first grant, its clock or the requesting client's clock reads later than
/// the clocks that issued the lost tokens did (one of the two may be wrong; both behind by
/// more than the failover took can send tokens back; a client's clock counts up to 30 minutes
/// above the server's). [`replicas_ack`](RedisBackendBuilder::replicas_ack) makes
/// grants wait for replicas, which keeps tokens increasing whatever the clocks when the promoted
/// replica is one that acknowledged.
///
/// # Examples
///
/// ```no_run
/// use distlock::{backend::RedisBackend, LockClient};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), distlock::Error> {
/// let backend = RedisBackend::connect("redis://127.0.0.1:6379/").await?;
/// let client = LockClient::builder(backend).namespace("billing").build()?;
/// let guard = client.mutex("invoice:7").lock().await?;
/// guard.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
}

struct Inner {
    replicas_ack: Option<Ack>,
    commands: Commands,
    scripts: &'static Library,
    /// The scripts' function library, if the server keeps functions: scripts are called in it.
    functions: Option<Functions>,
    /// A Redis Cluster: renewals go one script call per slot.
    #[cfg_attr(not(feature = "redis-cluster"), allow(dead_code))]
    cluster: bool,
    hub: PubSubHub,
    handoff_ttl: Duration,
    /// This backend's part of every owner token, and of its channel names.
    client_id: String,
    /// Acquire and release calls in flight at once, sent as one (see `coalesce.rs`).
    coalescer: coalesce::Coalescer,
    /// A single server's library (not a Cluster's or Sentinel's): an uncontended mutex acquire
    /// goes by plain commands (see `fast.rs`).
    plain: bool,
}

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend")
            .field("handoff_ttl", &self.inner.handoff_ttl)
            .field(
                "library",
                &self.inner.functions.as_ref().and_then(Functions::name),
            )
            .finish_non_exhaustive()
    }
}

impl Backend for RedisBackend {
    type Ticket = RedisTicket;
    const RENEWS_WAITERS: bool = true;

    fn supports(&self, _kind: LockKind) -> bool {
        true
    }

    fn name(&self) -> &'static str {
        "redis"
    }

    fn reconnects(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(self.inner.hub.reconnects())
    }

    async fn inspect(&self, namespace: &str, key: &str) -> Result<Inspection> {
        self.inspect_key(namespace, key).await
    }

    async fn force_release(&self, namespace: &str, key: &str) -> Result<ForceReleased> {
        self.force_release_key(namespace, key).await
    }

    // The inner futures as they are (one layer less in every lock's boxed future).
    fn acquire(
        &self,
        claim: &Claim,
        ticket: &RedisTicket,
        wait: bool,
    ) -> impl Future<Output = Result<Attempt>> + Send {
        self.acquire_claim(claim, ticket, wait)
    }

    async fn wait(
        &self,
        claim: &Claim,
        ticket: &RedisTicket,
        recheck_at: Option<Instant>,
    ) -> Result<Option<Grant>> {
        self.wait_claim(claim, ticket, recheck_at).await
    }

    fn release(
        &self,
        claim: &Claim,
        ticket: &RedisTicket,
    ) -> impl Future<Output = Result<bool>> + Send {
        self.release_claim(claim, ticket)
    }

    async fn downgrade(&self, claim: &Claim, ticket: &RedisTicket) -> Result<Grant> {
        self.downgrade_claim(claim, ticket).await
    }

    async fn renew(&self, claims: &[(&Claim, &RedisTicket)]) -> Vec<Renewal> {
        self.renew_claims(claims).await
    }

    async fn proclaim(&self, claim: &Claim, ticket: &RedisTicket) -> Result<()> {
        self.proclaim_claim(claim, ticket).await
    }

    async fn leader(&self, namespace: &str, key: &str) -> Result<Option<Leader>> {
        self.leader_of(namespace, key).await
    }

    async fn watch_leader(&self, namespace: &str, key: &str) -> Result<LeaderWatch> {
        self.watch_leader_of(namespace, key).await
    }
}
