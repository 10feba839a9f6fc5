//! One fixture per test server: each module starts its real server (one shared by every test
//! of a binary, or a test's own) and hands out [`Env`]s, a fresh key namespace per test, with
//! clients on their own connections as separate processes would have them. The behaviour suite
//! (`support/suite.rs`) runs on an `Env` alone; a backend's own tests use the servers directly.
//!
//! | module | server | topology |
//! |---|---|---|
//! | `memory` | none: a `MemoryBackend` per test | in-process |
//! | `redis` | one `redis-server` | single node |
//! | `cluster` | six `redis-server`s | Redis Cluster, three primaries with a replica each |
//! | `sentinel` | a primary, a replica, three sentinels | Redis Sentinel |
//! | `redlock` | five independent `redis-server`s, each behind a fault proxy | Redlock |
//! | `zookeeper` | one ZooKeeper | standalone |
//! | `ensemble` | three ZooKeepers | ensemble |
//! | `postgres` | one PostgreSQL | direct |
//! | `pgbouncer` | PgBouncer (transaction mode) before the PostgreSQL | pooled |

#[cfg(feature = "redis-cluster")]
pub mod cluster;
pub mod ensemble;
#[cfg(feature = "memory")]
pub mod memory;
pub mod pgbouncer;
pub mod postgres;
pub mod redis;
#[cfg(feature = "redlock")]
pub mod redlock;
#[cfg(feature = "redis-sentinel")]
pub mod sentinel;
pub mod zookeeper;

use std::sync::Arc;
use std::time::Duration;

use distlock::backend::{Backend, LockKind};
use distlock::LockClient;
use futures::future::BoxFuture;

/// What the behaviour suite needs of one backend on one topology.
pub trait Server: Send + Sync + 'static {
    /// A client of namespace `ns` with its own connections; `ttl`, if given, is the lease its
    /// locks get (on ZooKeeper: the session it asks for), else the fixture's own.
    fn client(&self, ns: String, ttl: Option<Duration>) -> BoxFuture<'static, LockClient>;

    /// A client like [`client`](Self::client), and a switch that makes it hang the way a
    /// stopped process does, for a backend whose lease is a session the client keeps alive on
    /// its own (ZooKeeper): its connection goes silent, so the server ends the session. The
    /// default switch does nothing: a guard that stops renewing is hung enough.
    fn client_to_hang(
        &self,
        ns: String,
        ttl: Option<Duration>,
    ) -> BoxFuture<'static, (LockClient, Hang)> {
        let client = self.client(ns, ttl);
        Box::pin(async move { (client.await, Hang::none()) })
    }

    /// Waits until `n` claims wait (hold nothing) on `key` of `ns`.
    fn until_queued(&self, ns: String, key: String, n: usize) -> BoxFuture<'static, ()>;

    /// Fails the test if anything of `ns` is left on the server (fencing counters, which carry
    /// a TTL, aside), once the releases the clients sent in the background have landed.
    fn assert_clean(&self, ns: String) -> BoxFuture<'static, ()>;
}

/// Makes a client from [`Server::client_to_hang`] hang; what it needs (a proxy) lives as long
/// as the switch does.
pub struct Hang(Box<dyn Fn() + Send + Sync>);

impl Hang {
    /// A switch that does nothing.
    pub fn none() -> Self {
        Self(Box::new(|| {}))
    }

    pub fn new(hang: impl Fn() + Send + Sync + 'static) -> Self {
        Self(Box::new(hang))
    }

    pub fn hang(&self) {
        (self.0)();
    }
}

/// Which kinds of claim a backend holds, as its own [`Backend::supports`] says: the rule by
/// which the library refuses a primitive (`Unsupported`, before any I/O), and by which the
/// suite runs or skips a case.
#[derive(Clone, Copy, Debug)]
pub struct Supports {
    pub rw: bool,
    pub semaphore: bool,
    pub election: bool,
}

impl Supports {
    pub fn of(backend: &impl Backend) -> Self {
        Self {
            rw: backend.supports(LockKind::Read) && backend.supports(LockKind::Write),
            semaphore: backend.supports(LockKind::Permits { count: 1, max: 1 }),
            election: backend.supports(LockKind::Leader),
        }
    }
}

/// One test's view of a backend: its server, a namespace no other test uses, what the backend
/// supports.
pub struct Env {
    /// The backend and topology, as the test names say (`redis_cluster`, ...).
    pub name: &'static str,
    pub ns: String,
    pub supports: Supports,
    /// Whether the server records a semaphore's number of permits (ZooKeeper, like Curator,
    /// does not).
    pub records_max: bool,
    server: Arc<dyn Server>,
}

impl Env {
    pub fn new(name: &'static str, ns: String, supports: Supports, server: impl Server) -> Self {
        Self {
            name,
            ns,
            supports,
            records_max: true,
            server: Arc::new(server),
        }
    }

    /// The same backend, recording no semaphore sizes.
    pub fn without_recorded_max(mut self) -> Self {
        self.records_max = false;
        self
    }

    pub async fn client(&self) -> LockClient {
        self.server.client(self.ns.clone(), None).await
    }

    /// A client whose locks get `ttl` (the fixture's lease if `None`).
    pub async fn client_with_ttl(&self, ttl: Option<Duration>) -> LockClient {
        self.server.client(self.ns.clone(), ttl).await
    }

    pub async fn clients(&self, n: usize) -> Vec<LockClient> {
        self.clients_with_ttl(n, None).await
    }

    pub async fn clients_with_ttl(&self, n: usize, ttl: Option<Duration>) -> Vec<LockClient> {
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(self.client_with_ttl(ttl).await);
        }
        out
    }

    /// `N` clients, as an array.
    pub async fn client_array<const N: usize>(&self) -> [LockClient; N] {
        match self.clients(N).await.try_into() {
            Ok(clients) => clients,
            Err(_) => unreachable!("asked for {N} clients"),
        }
    }

    /// A client of another namespace (`<ns>.<suffix>`) on the same server.
    pub async fn client_elsewhere(&self, suffix: &str, ttl: Option<Duration>) -> LockClient {
        let ns = format!("{}.{suffix}", self.ns);
        self.server.client(ns, ttl).await
    }

    /// A client with `ttl`, and the switch that makes it hang ([`Server::client_to_hang`]).
    pub async fn client_to_hang(&self, ttl: Option<Duration>) -> (LockClient, Hang) {
        self.server.client_to_hang(self.ns.clone(), ttl).await
    }

    /// Waits until `n` claims wait on `key`.
    pub async fn until_queued(&self, key: &str, n: usize) {
        self.server
            .until_queued(self.ns.clone(), key.to_owned(), n)
            .await;
    }

    /// The family checks' probe on `key`.
    pub fn queued(&self, key: &str) -> impl Fn(usize) -> BoxFuture<'static, ()> + Sync {
        let (server, ns, key) = (self.server.clone(), self.ns.clone(), key.to_owned());
        move |n| server.until_queued(ns.clone(), key.clone(), n)
    }

    pub async fn assert_clean(&self) {
        self.server.assert_clean(self.ns.clone()).await;
    }
}
