//! The Redis backend: FIFO locks with direct handoff announced over pub/sub.
//!
//! Per lock key, under one hash tag so every script is Cluster-safe:
//!
//! | key | type | holds |
//! |---|---|---|
//! | `<ns>:{<key>}` | hash | a mutex: `o` owner token, `f` fencing token; PX = lease. A read-write lock or semaphore: `t` = `rw`/`sem`, `m` permits, `u` in use, `wr` writer, `f:<owner>`, `n:<owner>` per holder |
//! | `<ns>:{<key>}:h` | zset | read-write lock or semaphore holder → lease deadline (server time, ms) |
//! | `<ns>:{<key>}:q` | list | waiting owner tokens (`r:`/`w:`/`<n>:` before them for the shared kinds), in arrival order |
//! | `<ns>:{<key>}:w` | zset | waiting owner → liveness deadline (server time, ms) |
//! | `<ns>:{<key>}:fence` | string | fencing counter, expires after an hour unused |
//! | `<ns>:{<key>}:c:<client>` | channel | messages for one client's waiters on this lock |
//!
//! Owner tokens are `<client>.<claim>`: the backend's random id, then the claim's. A release
//! hands the lock straight to the live head of the queue (owner set, fence incremented, a short
//! unconfirmed lease) and publishes it on that owner's client channel, so the message reaches
//! the one connection that waits for it and no other (a handoff costs the same with 2 waiting
//! clients or 200). The new owner learns of its grant from the message and confirms it with its
//! first renewal. A waiter that misses the message re-checks at the holder's PTTL deadline, or
//! when the pub/sub connection comes back. Every name is under the key's hash tag, so each
//! channel lives in the key's Cluster slot.
//!
//! The scripts are a Redis 7 function library where the server allows it, else sent by
//! `EVALSHA` (see [`script`]).

#[cfg(feature = "redis-cluster")]
mod cluster;
pub(crate) mod commands;
pub(crate) mod notify;
pub(crate) mod script;
#[cfg(feature = "redis-sentinel")]
mod sentinel;

use std::sync::{Arc, LazyLock, Mutex as StdMutex, OnceLock};
use std::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::time::Instant;

use self::commands::{redis_error, Commands, CALL_TIMEOUT};
use self::notify::{Hub, Subscription};
use self::script::{Call, Functions, Library, Part, Script};
use super::handoff::{
    self, check_handoff_ttl, wait_for_handoff, Mailbox, ServerClock, DEFAULT_HANDOFF_TTL,
};
use super::{Attempt, Backend, Claim, Family, Grant, LockKind, Renewal};
use crate::error::{Error, ErrorKind, Result};
use crate::inspect::{Holder as InspectedHolder, Inspection, Waiter as InspectedWaiter};

/// How long the fencing counter of an unused key lives. After it expires, the next grant starts
/// from server time in microseconds, which is larger than any token handed out before.
pub(crate) const FENCE_TTL: Duration = Duration::from_secs(3600);

/// The scripts the backend runs, as one server runs them or (with `sharded.lua` after the
/// shared helpers) as a Cluster does, and the function library that holds them all.
struct Scripts {
    library: Library,
    acquire: Script,
    release: Script,
    renew: Script,
    inspect: Script,
    acquire_shared: Script,
    release_shared: Script,
    downgrade: Script,
    /// Answers 1: proves the server answers (and, as a function, holds the library).
    ping: Script,
}

/// The helpers of the read-write lock and semaphore scripts, and of the renewal script. Run by
/// `EVALSHA`, a script carries only the helpers it uses: Redis runs the whole text at every
/// call, so each helper defined is paid for by every call.
pub(crate) const SHARED_LUA: &str = include_str!("scripts/shared.lua");
pub(crate) const RENEWAL_LUA: &str = include_str!("scripts/renewal.lua");

impl Scripts {
    fn with(variant: &str) -> Self {
        let writing = |name, helpers, body| Part {
            name,
            read_only: false,
            helpers,
            body,
        };
        let reading = |name, body| Part {
            name,
            read_only: true,
            helpers: &[],
            body,
        };
        let (library, scripts) = Library::build(
            &format!("{}\n{variant}", include_str!("scripts/common.lua")),
            [
                writing("acquire", &[], include_str!("scripts/acquire.lua")),
                writing("release", &[], include_str!("scripts/release.lua")),
                writing("renew", &[RENEWAL_LUA], include_str!("scripts/renew.lua")),
                reading("inspect", include_str!("scripts/inspect.lua")),
                writing(
                    "acquire_shared",
                    &[SHARED_LUA],
                    include_str!("scripts/acquire_shared.lua"),
                ),
                writing(
                    "release_shared",
                    &[SHARED_LUA],
                    include_str!("scripts/release_shared.lua"),
                ),
                writing(
                    "downgrade",
                    &[SHARED_LUA],
                    include_str!("scripts/downgrade.lua"),
                ),
                reading("ping", "return 1"),
            ],
        );
        let [acquire, release, renew, inspect, acquire_shared, release_shared, downgrade, ping] =
            scripts;
        Self {
            library,
            acquire,
            release,
            renew,
            inspect,
            acquire_shared,
            release_shared,
            downgrade,
            ping,
        }
    }
}

static PLAIN: LazyLock<Scripts> = LazyLock::new(|| Scripts::with(""));
#[cfg(feature = "redis-cluster")]
static SHARDED: LazyLock<Scripts> = LazyLock::new(|| {
    Scripts::with(concat!(
        include_str!("scripts/failover.lua"),
        include_str!("scripts/sharded.lua")
    ))
});
#[cfg(feature = "redis-sentinel")]
static FAILOVER: LazyLock<Scripts> =
    LazyLock::new(|| Scripts::with(include_str!("scripts/failover.lua")));

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
/// in µs, so they keep increasing across a failover that lost the counter's last increments;
/// [`replicas_ack`](RedisBackendBuilder::replicas_ack) makes grants wait for replicas.
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

/// How many replicas must acknowledge a grant or a renewal, and how long to wait for them.
#[derive(Debug, Clone, Copy)]
struct Ack {
    replicas: u32,
    within: Duration,
}

struct Inner {
    replicas_ack: Option<Ack>,
    commands: Commands,
    scripts: &'static Scripts,
    /// The scripts' function library, if the server keeps functions: scripts are called in it.
    functions: Option<Functions>,
    /// A Redis Cluster: renewals go one script call per slot.
    #[cfg_attr(not(feature = "redis-cluster"), allow(dead_code))]
    cluster: bool,
    hub: Hub,
    handoff_ttl: Duration,
    /// This backend's part of every owner token, and of its channel names.
    client_id: String,
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

enum Source {
    Own,
    #[cfg(feature = "redis-deadpool")]
    Deadpool(deadpool_redis::Pool),
    #[cfg(feature = "redis-bb8")]
    Bb8(bb8::Pool<bb8_redis::RedisConnectionManager>),
    #[cfg(all(feature = "redis-deadpool", feature = "redis-cluster"))]
    DeadpoolCluster(deadpool_redis::cluster::Pool),
}

/// Builds a [`RedisBackend`]. Created by [`RedisBackend::builder`].
#[must_use = "builder does nothing itself, use `.build()` to build it"]
pub struct RedisBackendBuilder {
    url: String,
    source: Source,
    handoff_ttl: Duration,
    replicas_ack: Option<Ack>,
    #[cfg(feature = "redis-tls")]
    root_certificate: Option<Vec<u8>>,
}

impl std::fmt::Debug for RedisBackendBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackendBuilder")
            .field("handoff_ttl", &self.handoff_ttl)
            .finish_non_exhaustive()
    }
}

impl RedisBackend {
    /// Starts building a backend for the server at `url` (`redis://[user:password@]host:port/db`,
    /// or `rediss://` with the `redis-tls` feature). The URL is used for the pub/sub connection,
    /// and for commands unless a pool is given. With the `redis-cluster` feature,
    /// `redis+cluster://[user:password@]host:port,host:port` names a Cluster by seed nodes;
    /// with `redis-sentinel`, `redis+sentinel://[user:password@]host:port,host:port/<master>[/db]`
    /// names the primary those sentinels monitor.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let backend = distlock::backend::RedisBackend::builder("redis://app:secret@10.0.0.5:6379/")
    ///     .build()
    ///     .await?;
    /// # let _ = backend;
    /// # Ok(())
    /// # }
    /// ```
    pub fn builder(url: impl Into<String>) -> RedisBackendBuilder {
        RedisBackendBuilder {
            url: url.into(),
            source: Source::Own,
            replicas_ack: None,
            #[cfg(feature = "redis-tls")]
            root_certificate: None,
            handoff_ttl: DEFAULT_HANDOFF_TTL,
        }
    }

    /// Starts building a backend for the Redis Cluster that the seed nodes `seeds` belong to
    /// (`host:port` each; a few are enough, the rest of the cluster is learned from them).
    /// The same as [`builder`](Self::builder) with `redis+cluster://host:port,host:port`; use
    /// that form for credentials.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let backend = distlock::backend::RedisBackend::cluster(["10.0.0.1:7000", "10.0.0.2:7000"])
    ///     .build()
    ///     .await?;
    /// # let _ = backend;
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "redis-cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis-cluster")))]
    pub fn cluster<I, S>(seeds: I) -> RedisBackendBuilder
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let hosts: Vec<String> = seeds
            .into_iter()
            .map(|s| {
                s.as_ref()
                    .trim_start_matches("redis://")
                    .trim_end_matches('/')
                    .to_owned()
            })
            .collect();
        Self::builder(format!("{}{}", cluster::SCHEME, hosts.join(",")))
    }

    /// Connects to the server at `url` with its own connections.
    ///
    /// # Errors
    ///
    /// See [`RedisBackendBuilder::build`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: nothing is left behind but a background pub/sub task that stops when the
    /// backend is dropped.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let backend = distlock::backend::RedisBackend::connect("redis://127.0.0.1:6379/").await?;
    /// # let _ = backend;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect(url: &str) -> Result<Self> {
        Self::builder(url).build().await
    }
}

impl RedisBackendBuilder {
    /// Sends commands through a `deadpool-redis` pool instead of an own connection.
    #[cfg(feature = "redis-deadpool")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis-deadpool")))]
    pub fn deadpool(mut self, pool: deadpool_redis::Pool) -> Self {
        self.source = Source::Deadpool(pool);
        self
    }

    /// Sends commands through a `bb8-redis` pool instead of an own connection.
    #[cfg(feature = "redis-bb8")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis-bb8")))]
    pub fn bb8(mut self, pool: bb8::Pool<bb8_redis::RedisConnectionManager>) -> Self {
        self.source = Source::Bb8(pool);
        self
    }

    /// Sends a Cluster's commands through a `deadpool-redis` cluster pool instead of an own
    /// cluster connection. The builder's `redis+cluster://` URL still names the seeds for
    /// pub/sub.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let pool = deadpool_redis::cluster::Config::from_urls(vec!["redis://10.0.0.1:7000".into()])
    ///     .create_pool(Some(deadpool_redis::Runtime::Tokio1))?;
    /// let backend = distlock::backend::RedisBackend::builder("redis+cluster://10.0.0.1:7000")
    ///     .deadpool_cluster(pool)
    ///     .build()
    ///     .await?;
    /// # let _ = backend;
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(all(feature = "redis-deadpool", feature = "redis-cluster"))]
    #[cfg_attr(
        docsrs,
        doc(cfg(all(feature = "redis-deadpool", feature = "redis-cluster")))
    )]
    pub fn deadpool_cluster(mut self, pool: deadpool_redis::cluster::Pool) -> Self {
        self.source = Source::DeadpoolCluster(pool);
        self
    }

    /// Makes every grant and every lease renewal wait (`WAIT`) until `replicas` replicas of the
    /// primary have it, for at most `within`. A grant not acknowledged in time is released at
    /// once and reported as a [`Backend`](crate::ErrorKind::Backend) error; a renewal not
    /// acknowledged counts as failed (retried until the lease runs out, then the lock is lost).
    ///
    /// What it buys: Redis replicates asynchronously, so without it a primary that dies right
    /// after a grant may be replaced by a replica that never saw the grant, and a second client
    /// is granted the same lock at once. With it, a grant (or a lease extension) you were given
    /// is on `replicas` replicas, and a failover that promotes one of those keeps it.
    ///
    /// What it does not buy: the promoted replica must be one that acknowledged (Sentinel and
    /// Cluster pick the most up-to-date replica, but with more replicas than `replicas` it may
    /// be another); replicas acknowledge receipt, not an fsync; and a grant is still visible
    /// on the primary before it is acknowledged (a reader of the lock's keys sees it). Fencing
    /// tokens are what protect your storage across a failover: on Cluster and Sentinel they
    /// never fall below the server's clock in µs, so they keep increasing even when the
    /// counter's last increments were lost. Not available through a pool (`WAIT` must go over
    /// the connection that wrote), nor on a single server without replicas (every grant would
    /// fail).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// use std::time::Duration;
    /// let backend = distlock::backend::RedisBackend::builder("redis+sentinel://10.0.0.5:26379,10.0.0.6:26379/locks")
    ///     .replicas_ack(1, Duration::from_millis(100))
    ///     .build()
    ///     .await?;
    /// # let _ = backend;
    /// # Ok(())
    /// # }
    /// ```
    pub fn replicas_ack(mut self, replicas: u32, within: Duration) -> Self {
        self.replicas_ack = Some(Ack { replicas, within });
        self
    }

    /// The lease a lock handed to a waiter gets until the waiter confirms it (at its first
    /// renewal, a third of the way in). Bounds how long a lock handed to a waiter that died
    /// just before stays stuck. Defaults to 2 seconds.
    pub fn handoff_ttl(mut self, ttl: Duration) -> Self {
        self.handoff_ttl = ttl;
        self
    }

    #[cfg(not(feature = "redis-tls"))]
    fn client(&self) -> ::redis::RedisResult<::redis::Client> {
        ::redis::Client::open(self.url.as_str())
    }

    #[cfg(feature = "redis-tls")]
    fn client(&self) -> ::redis::RedisResult<::redis::Client> {
        match &self.root_certificate {
            Some(pem) => ::redis::Client::build_with_tls(
                self.url.as_str(),
                ::redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(pem.clone()),
                },
            ),
            None => ::redis::Client::open(self.url.as_str()),
        }
    }

    /// Trusts the CA certificate `pem` (PEM) for `rediss://` instead of the system roots, for
    /// servers with a private CA. Used by the pub/sub connection, and for commands unless a
    /// pool is given (configure the pool's TLS yourself).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let ca = std::fs::read("/etc/redis/ca.crt")?;
    /// let backend = distlock::backend::RedisBackend::builder("rediss://redis.internal:6380/")
    ///     .tls_root_certificate(ca)
    ///     .build()
    ///     .await?;
    /// # drop(backend);
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "redis-tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis-tls")))]
    pub fn tls_root_certificate(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.root_certificate = Some(pem.into());
        self
    }

    /// Connects and checks the server answers (authenticating if the URL says so).
    ///
    /// # Errors
    ///
    /// - [`InvalidConfig`](crate::ErrorKind::InvalidConfig) for a malformed URL or a handoff
    ///   TTL under 10 ms,
    /// - [`Backend`](crate::ErrorKind::Backend) if the server cannot be reached or refuses the
    ///   credentials,
    /// - [`NoRuntime`](crate::ErrorKind::NoRuntime) outside a Tokio runtime.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let err = distlock::backend::RedisBackend::builder("not a url").build().await.unwrap_err();
    /// assert!(err.is_invalid_config());
    /// # }
    /// ```
    pub async fn build(mut self) -> Result<RedisBackend> {
        check_handoff_ttl(self.handoff_ttl)?;
        if let Some(ack) = self.replicas_ack {
            if ack.replicas == 0 || ack.within.is_zero() {
                return Err(Error::invalid_config(
                    "replicas_ack needs at least one replica and a non-zero wait",
                ));
            }
            if !matches!(self.source, Source::Own) {
                return Err(Error::invalid_config(
                    "replicas_ack needs the backend's own connection, not a pool (WAIT must go over the connection that wrote)",
                ));
            }
        }
        // Boxed: each way of connecting is a large future of its own.
        #[cfg(feature = "redis-cluster")]
        if cluster::is_cluster_url(&self.url) {
            return Box::pin(self.build_cluster()).await;
        }
        #[cfg(feature = "redis-sentinel")]
        if sentinel::is_sentinel_url(&self.url) {
            return Box::pin(self.build_sentinel()).await;
        }
        let client = self
            .client()
            .map_err(|e| Error::invalid_config("malformed redis url").with_source(e))?;
        tokio::runtime::Handle::try_current().map_err(|_| Error::no_runtime())?;
        let commands = match std::mem::replace(&mut self.source, Source::Own) {
            Source::Own => {
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(CALL_TIMEOUT))
                    .set_response_timeout(Some(CALL_TIMEOUT))
                    .set_number_of_retries(2);
                let conn = ConnectionManager::new_with_config(client.clone(), config)
                    .await
                    .map_err(|e| redis_error("connect", e))?;
                Commands::Own(conn)
            }
            #[cfg(feature = "redis-deadpool")]
            Source::Deadpool(pool) => Commands::Deadpool(pool),
            #[cfg(feature = "redis-bb8")]
            Source::Bb8(pool) => Commands::Bb8(pool),
            #[cfg(all(feature = "redis-deadpool", feature = "redis-cluster"))]
            Source::DeadpoolCluster(_) => return Err(Error::invalid_config(
                "a deadpool cluster pool needs a redis+cluster:// url (its seeds serve pub/sub)",
            )),
        };
        self.finish(commands, &PLAIN, false, Hub::start(client))
            .await
    }

    /// Proves the server answers with these credentials (one round trip) and makes the
    /// backend.
    async fn finish(
        self,
        commands: Commands,
        scripts: &'static Scripts,
        cluster: bool,
        hub: Hub,
    ) -> Result<RedisBackend> {
        let functions = Functions::new(&scripts.library);
        let answer = commands
            .invoke::<i64>("connect", &scripts.ping.call(Some(&functions)).strict())
            .await;
        let functions = match answer {
            Ok(_) => Some(functions),
            // No functions here (before Redis 7, or not allowed to this user): the scripts
            // go by EVALSHA, if the server answers that.
            Err(err) if !err.is_transient() => {
                commands
                    .invoke::<i64>("connect", &scripts.ping.prepare_invoke())
                    .await?;
                tracing::debug!(error = %err, "redis: no function library; scripts go by EVALSHA");
                None
            }
            Err(err) => return Err(err),
        };
        Ok(RedisBackend {
            inner: Arc::new(Inner {
                replicas_ack: self.replicas_ack,
                commands,
                scripts,
                functions,
                cluster,
                hub,
                handoff_ttl: self.handoff_ttl,
                client_id: handoff::client_id(),
            }),
        })
    }

    /// [`build`](Self::build) for a `redis+sentinel://` URL.
    #[cfg(feature = "redis-sentinel")]
    async fn build_sentinel(mut self) -> Result<RedisBackend> {
        let sentinel = Arc::new(sentinel::Sentinel::from_url(&self.url)?);
        tokio::runtime::Handle::try_current().map_err(|_| Error::no_runtime())?;
        let commands = match std::mem::replace(&mut self.source, Source::Own) {
            Source::Own => Commands::Sentinel(sentinel.clone()),
            #[cfg(any(feature = "redis-deadpool", feature = "redis-bb8"))]
            _ => {
                return Err(Error::invalid_config(
                    "a sentinel-managed primary is followed by the backend's own connection; a pool cannot follow it",
                ))
            }
        };
        let hub = Hub::start_on(notify::Source::Sentinel(sentinel));
        self.finish(commands, &FAILOVER, false, hub).await
    }

    /// [`build`](Self::build) for a `redis+cluster://` URL.
    #[cfg(feature = "redis-cluster")]
    async fn build_cluster(mut self) -> Result<RedisBackend> {
        let seeds = hosts_of(&self.url, cluster::SCHEME)?;
        if seeds.is_empty() {
            return Err(Error::invalid_config(
                "a redis cluster url names at least one seed node",
            ));
        }
        tokio::runtime::Handle::try_current().map_err(|_| Error::no_runtime())?;
        let commands =
            match std::mem::replace(&mut self.source, Source::Own) {
                Source::Own => Commands::Cluster(cluster::connect(&seeds).await?),
                #[cfg(feature = "redis-deadpool")]
                Source::DeadpoolCluster(pool) => Commands::DeadpoolCluster(pool),
                #[cfg(any(feature = "redis-deadpool", feature = "redis-bb8"))]
                _ => return Err(Error::invalid_config(
                    "a redis cluster opens its own connections; a single-node pool cannot serve it",
                )),
            };
        let hub = Hub::start_on(notify::Source::Cluster(seeds));
        self.finish(commands, &SHARDED, true, hub).await
    }
}

/// The `redis://` URLs of the nodes of `<scheme>[user:password@]host:port,host:port[/db]`,
/// each with the credentials and database.
#[cfg(any(feature = "redis-cluster", feature = "redlock"))]
pub(crate) fn hosts_of(url: &str, scheme: &str) -> Result<Vec<String>> {
    let rest = url
        .strip_prefix(scheme)
        .ok_or_else(|| Error::invalid_config(format_args!("the url must start with `{scheme}`")))?;
    let (auth, rest) = match rest.rsplit_once('@') {
        Some((auth, hosts)) => (format!("{auth}@"), hosts),
        None => (String::new(), rest),
    };
    let (hosts, db) = match rest.split_once('/') {
        Some((hosts, db)) => (hosts, format!("/{db}")),
        None => (rest, "/".to_owned()),
    };
    Ok(hosts
        .split(',')
        .filter(|h| !h.is_empty())
        .map(|h| format!("redis://{auth}{h}{db}"))
        .collect())
}

/// The names of one lock's keys and channels, and a claim's owner token, as one client sees
/// them (on one server, a Cluster, and each Redlock node alike).
pub(crate) struct Keys {
    pub(crate) lock: String,
    /// Read-write locks and semaphores: holder -> lease deadline.
    pub(crate) holders: String,
    pub(crate) queue: String,
    pub(crate) waiters: String,
    pub(crate) fence: String,
    /// Every client's channel for this lock starts with this; the client id follows.
    pub(crate) channels: String,
    /// This client's channel for this lock.
    pub(crate) channel: String,
    /// The claim's owner token: `<client id>.<claim owner>`.
    pub(crate) owner: String,
}

impl Keys {
    fn new(claim: &Claim, client_id: &str) -> Self {
        Self::named(claim.namespace(), claim.key(), client_id, claim.owner())
    }

    fn named(namespace: &str, key: &str, client_id: &str, claim_owner: &str) -> Self {
        Self::layout(namespace, key, client_id, claim_owner, "q", "w")
    }

    /// The names, with the queue and waiters keys ending in `queue` and `waiters` (Redlock
    /// keeps its queues, zsets by priority, under names of their own).
    pub(crate) fn layout(
        namespace: &str,
        key: &str,
        client_id: &str,
        claim_owner: &str,
        queue: &str,
        waiters: &str,
    ) -> Self {
        // Namespaces hold no braces or colons, so `<ns>:{` starts every name, and every name
        // of one key shares its hash tag. Suffixes end in distinct letters, and lock names end
        // in `}`, so no two keys' names can coincide.
        let lock = lock_name(namespace, key);
        let channels = format!("{lock}:c:");
        Self {
            holders: format!("{lock}:h"),
            queue: format!("{lock}:{queue}"),
            waiters: format!("{lock}:{waiters}"),
            fence: format!("{lock}:fence"),
            channel: format!("{channels}{client_id}"),
            channels,
            owner: handoff::owner_token(client_id, claim_owner),
            lock,
        }
    }

    /// Adds this claim to a renewal call: its four keys (base, holders, waiters, queue) and
    /// its owner and TTL, as `renew.lua` takes them.
    pub(crate) fn add_renewal(&self, inv: &mut Call<'_>, ttl: Duration) {
        inv.key(&self.lock)
            .key(&self.holders)
            .key(&self.waiters)
            .key(&self.queue)
            .arg(&self.owner)
            .arg(millis(ttl));
    }
}

/// The name of a lock's main key, `<ns>:{<key>}`: every other name of the lock starts with it.
fn lock_name(namespace: &str, key: &str) -> String {
    format!("{namespace}:{{{key}}}")
}

/// What one claim keeps between calls: its keys' names, its subscription while it waits, and
/// the pairing of local and server clocks from its last request, to place a handoff on the
/// local clock.
#[derive(Default)]
pub struct RedisTicket {
    keys: OnceLock<Keys>,
    sub: StdMutex<Option<Subscription>>,
    clock: ServerClock,
}

impl std::fmt::Debug for RedisTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTicket").finish_non_exhaustive()
    }
}

impl RedisTicket {
    /// The claim's keys and owner token, named at its first call (a ticket serves one claim).
    fn keys(&self, claim: &Claim, client_id: &str) -> &Keys {
        self.keys.get_or_init(|| Keys::new(claim, client_id))
    }

    fn subscribed(&self) -> bool {
        self.sub.lock().unwrap_or_else(|p| p.into_inner()).is_some()
    }

    fn set_sub(&self, sub: Option<Subscription>) {
        // Dropped outside the lock: dropping unregisters from the hub.
        let old = std::mem::replace(
            &mut *self.sub.lock().unwrap_or_else(|p| p.into_inner()),
            sub,
        );
        drop(old);
    }

    fn mailbox(&self) -> Option<Arc<Mailbox>> {
        self.sub
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|s| s.mailbox.clone())
    }
}

/// A duration in whole milliseconds for a script argument, at least 1.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

fn fence_of(raw: i64) -> Result<u64> {
    handoff::fence_of("redis", raw)
}

impl RedisBackend {
    /// The claims to renew in one script call each, by index: all of them on one server; on a
    /// Cluster one group per slot (a script's keys must share a slot), sent together.
    fn renewal_groups(&self, claims: &[(&Claim, &RedisTicket)]) -> Vec<Vec<usize>> {
        #[cfg(feature = "redis-cluster")]
        if self.inner.cluster {
            let mut groups: std::collections::HashMap<_, Vec<usize>> =
                std::collections::HashMap::new();
            for (i, (claim, _)) in claims.iter().enumerate() {
                let lock = lock_name(claim.namespace(), claim.key());
                let slot = ::redis::cluster_routing::Slot::for_key(&lock);
                groups.entry(slot).or_default().push(i);
            }
            return groups.into_values().collect();
        }
        vec![(0..claims.len()).collect()]
    }

    /// Renews the claims at `group` (indices into `claims`) in one script call; a failed call
    /// fails those claims only.
    async fn renew_group(
        &self,
        claims: &[(&Claim, &RedisTicket)],
        group: &[usize],
    ) -> Vec<Renewal> {
        let mut inv = self.call(&self.inner.scripts.renew);
        let mut members: Vec<&Claim> = Vec::with_capacity(group.len());
        for (claim, ticket) in group.iter().filter_map(|&i| claims.get(i)) {
            ticket
                .keys(claim, &self.inner.client_id)
                .add_renewal(&mut inv, claim.ttl());
            members.push(claim);
        }
        match self
            .inner
            .commands
            .invoke_timed::<Vec<i64>>("renew", &inv)
            .await
        {
            Ok((results, sent)) if results.len() == members.len() => {
                if let Err(err) = self.renewal_acknowledged(&members).await {
                    return members
                        .iter()
                        .map(|_| Renewal::Failed(err.clone()))
                        .collect();
                }
                members
                    .iter()
                    .zip(results)
                    .map(|(claim, r)| match r {
                        1 => Renewal::Extended(sent + claim.ttl()),
                        2 => Renewal::Queued(sent + claim.ttl()),
                        // 0: neither holder nor queued; -1: the lock's keys hold another Redis
                        // type (overwritten behind our back), so this claim cannot own them.
                        _ => Renewal::NotOwner,
                    })
                    .collect()
            }
            Ok(_) => {
                let err = Error::new(ErrorKind::Backend, "redis renew returned a malformed reply");
                members
                    .iter()
                    .map(|_| Renewal::Failed(err.clone()))
                    .collect()
            }
            Err(err) => members
                .iter()
                .map(|_| Renewal::Failed(err.clone()))
                .collect(),
        }
    }

    /// With `replicas_ack`, waits until the replicas have a renewal round's extensions; a
    /// round they did not acknowledge in time counts as failed.
    async fn renewal_acknowledged(&self, members: &[&Claim]) -> Result<()> {
        let (Some(ack), Some(first)) = (self.inner.replicas_ack, members.first()) else {
            return Ok(());
        };
        let key = lock_name(first.namespace(), first.key());
        let n = self
            .inner
            .commands
            .acked_by(&key, ack.replicas, ack.within)
            .await?;
        if n >= i64::from(ack.replicas) {
            Ok(())
        } else {
            Err(Error::new(
                ErrorKind::Backend,
                format!(
                    "redis: a renewal reached {n} of {} replicas within {:?}",
                    ack.replicas, ack.within
                ),
            )
            .transient())
        }
    }

    /// Takes the lock, or joins or keeps the claim's place in its queue (see
    /// [`Backend::acquire`]), without the replicas' acknowledgement.
    async fn acquire_here(
        &self,
        claim: &Claim,
        ticket: &RedisTicket,
        wait: bool,
    ) -> Result<Attempt> {
        let keys = ticket.keys(claim, &self.inner.client_id);
        if wait && !ticket.subscribed() {
            // A claim subscribes before it queues, so no handoff to it is published unheard.
            // On a channel this client already listens to that costs nothing; otherwise look
            // first without queueing, so a free lock costs one round trip, and subscribe only
            // if we must wait.
            if let Some(sub) = self
                .inner
                .hub
                .subscribe_if_ready(&keys.channel, &keys.owner)
            {
                ticket.set_sub(Some(sub));
            } else {
                let first = self.run_acquire(claim, ticket, keys, false).await?;
                if matches!(first, Attempt::Granted(_)) {
                    return Ok(first);
                }
                let sub = self.inner.hub.subscribe(&keys.channel, &keys.owner).await?;
                ticket.set_sub(Some(sub));
            }
        }
        let attempt = self.run_acquire(claim, ticket, keys, wait).await?;
        if matches!(attempt, Attempt::Granted(_)) {
            ticket.set_sub(None);
        }
        Ok(attempt)
    }

    /// Waits until `ack.replicas` replicas have every write this backend made to the claim's
    /// key (its grant among them). If they do not in time, releases the grant: it could vanish
    /// in a failover, so nobody may rely on it.
    async fn acknowledged(&self, claim: &Claim, ticket: &RedisTicket, ack: Ack) -> Result<()> {
        let acked = self
            .inner
            .commands
            .acked_by(
                &lock_name(claim.namespace(), claim.key()),
                ack.replicas,
                ack.within,
            )
            .await;
        match acked {
            Ok(n) if n >= i64::from(ack.replicas) => Ok(()),
            answer => {
                let _ = Backend::release(self, claim, ticket).await;
                let seen = answer.as_ref().map_or(0, |n| *n);
                let err = Error::new(
                    ErrorKind::Backend,
                    format!(
                        "redis: the grant of `{}` reached {seen} of {} replicas within {:?}; released",
                        claim.key(),
                        ack.replicas,
                        ack.within
                    ),
                );
                Err(match answer {
                    Err(cause) => err.with_source(cause),
                    Ok(_) => err,
                })
            }
        }
    }

    async fn run_acquire(
        &self,
        claim: &Claim,
        ticket: &RedisTicket,
        keys: &Keys,
        wait: bool,
    ) -> Result<Attempt> {
        let shared = Shared::of(claim.kind());
        let script = if shared.is_some() {
            &self.inner.scripts.acquire_shared
        } else {
            &self.inner.scripts.acquire
        };
        let mut inv = self.call_on(script, keys, shared.is_some());
        inv.arg(&keys.owner)
            .arg(millis(claim.ttl()))
            .arg(u8::from(wait))
            .arg(millis(FENCE_TTL))
            .arg(millis(self.inner.handoff_ttl))
            .arg(&keys.channels);
        if let Some(shared) = &shared {
            inv.arg(&shared.kind).arg(shared.max);
        }
        let (reply, sent): (Vec<::redis::Value>, Instant) =
            self.inner.commands.invoke_timed("acquire", &inv).await?;
        let (code, value, server_ms) = parse_acquire(claim, &reply)?;
        if code == 1 {
            return Ok(Attempt::Granted(Grant {
                fence: fence_of(value)?,
                valid_until: sent + claim.ttl(),
            }));
        }
        // Queued: remember when the server's clock read `server_ms`, to place a handoff.
        ticket.clock.pair(sent, server_ms);
        // How long the blocking lease has left. 0 in its last millisecond (and -2 once it is
        // gone): look again at once. -1 (a key without expiry, not ours): after our own TTL.
        let wait_for = match value {
            -1 => claim.ttl(),
            ms => Duration::from_millis(u64::try_from(ms).unwrap_or(0).max(1)),
        };
        Ok(Attempt::Queued {
            recheck_at: Some(Instant::now() + wait_for),
        })
    }
}

impl Keys {
    /// Adds this lock's keys to a call in the order the scripts take them: the mutex scripts'
    /// (lock, queue, waiters, fence), or with `shared` the read-write lock and semaphore
    /// scripts' (base, holders, queue, waiters, fence).
    pub(crate) fn add_keys(&self, inv: &mut Call<'_>, shared: bool) {
        inv.key(&self.lock);
        if shared {
            inv.key(&self.holders);
        }
        inv.key(&self.queue).key(&self.waiters).key(&self.fence);
    }
}

impl RedisBackend {
    /// A call of one of the backend's scripts: a function of the library, if the server keeps
    /// it, else by `EVALSHA`.
    fn call(&self, script: &'static Script) -> Call<'_> {
        script.call(self.inner.functions.as_ref())
    }

    /// A call of one of the lock scripts with the lock's keys (see [`Keys::add_keys`]).
    fn call_on(&self, script: &'static Script, keys: &Keys, shared: bool) -> Call<'_> {
        let mut inv = self.call(script);
        keys.add_keys(&mut inv, shared);
        inv
    }
}

/// How a read-write lock or semaphore claim is written in the shared scripts; `None` for a
/// mutex.
struct Shared {
    /// `r`, `w`, or the permit count.
    kind: String,
    /// The semaphore's permits (0 for a read-write lock).
    max: u32,
}

impl Shared {
    fn of(kind: LockKind) -> Option<Self> {
        let (kind, max) = match kind {
            LockKind::Read => ("r".to_owned(), 0),
            LockKind::Write => ("w".to_owned(), 0),
            LockKind::Permits { count, max } => (count.to_string(), max),
            _ => return None,
        };
        Some(Self { kind, max })
    }
}

/// Reads an acquire script's reply: `{1, fence, 0}`, `{0, ms to wait, server ms}`, or
/// `{-1, family}` when the key is another kind of lock.
fn parse_acquire(claim: &Claim, reply: &[::redis::Value]) -> Result<(i64, i64, i64)> {
    let int = |i: usize| -> Option<i64> { ::redis::from_redis_value_ref(reply.get(i)?).ok() };
    match (int(0), reply.get(1)) {
        (Some(-1), Some(family)) => {
            let family: String = ::redis::from_redis_value_ref(family).unwrap_or_default();
            Err(handoff::kind_mismatch(claim.key(), &family, claim.kind()))
        }
        (Some(code), _) => match (int(1), int(2)) {
            (Some(value), Some(server_ms)) => Ok((code, value, server_ms)),
            _ => Err(Error::new(
                ErrorKind::Backend,
                "redis acquire returned a malformed reply",
            )),
        },
        _ => Err(Error::new(
            ErrorKind::Backend,
            "redis acquire returned a malformed reply",
        )),
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
        let keys = Keys::named(namespace, key, &self.inner.client_id, "");
        let mut inv = self.call(&self.inner.scripts.inspect);
        inv.key(&keys.lock)
            .key(&keys.holders)
            .key(&keys.queue)
            .key(&keys.waiters);
        let (family, held, waiting): (String, Vec<String>, Vec<String>) =
            self.inner.commands.invoke("inspect", &inv).await?;
        let bad = || {
            Error::new(
                ErrorKind::Backend,
                format!("redis: unexpected inspect reply for `{key}`"),
            )
        };
        let family = match family.as_str() {
            "" => None,
            other => Some(handoff::parse_family(other).ok_or_else(bad)?),
        };
        let max = match family {
            Some(Family::Semaphore { max }) => max,
            _ => 0,
        };
        let kind = |k: &str| -> Result<LockKind> {
            Ok(match k {
                "x" => LockKind::Exclusive,
                "r" => LockKind::Read,
                "w" => LockKind::Write,
                n => LockKind::Permits {
                    count: n.parse().map_err(|_| bad())?,
                    max,
                },
            })
        };
        let mut seen = Inspection::free(key);
        seen.family = family;
        for h in held.chunks(3) {
            let [k, f, left] = h else { return Err(bad()) };
            seen.holders.push(InspectedHolder {
                kind: kind(k)?,
                fencing_token: f.parse().ok(),
                lease_left: left.parse().ok().map(Duration::from_millis),
            });
        }
        for k in &waiting {
            seen.waiters.push(InspectedWaiter {
                kind: kind(k)?,
                waited: None,
            });
        }
        Ok(seen)
    }

    async fn acquire(&self, claim: &Claim, ticket: &RedisTicket, wait: bool) -> Result<Attempt> {
        let attempt = self.acquire_here(claim, ticket, wait).await?;
        match (&attempt, self.inner.replicas_ack) {
            (Attempt::Granted(_), Some(ack)) => {
                self.acknowledged(claim, ticket, ack).await?;
                Ok(attempt)
            }
            _ => Ok(attempt),
        }
    }

    async fn wait(
        &self,
        _claim: &Claim,
        ticket: &RedisTicket,
        recheck_at: Option<Instant>,
    ) -> Result<Option<Grant>> {
        let mailbox = ticket.mailbox();
        let heard = wait_for_handoff(mailbox.as_deref(), &ticket.clock, recheck_at, || {
            ticket.set_sub(None);
        })
        .await?;
        // A handoff must be acknowledged like any grant: `acquire` confirms it (a write of
        // ours, replicated after the handoff) and waits for the replicas.
        Ok(heard.filter(|_| self.inner.replicas_ack.is_none()))
    }

    async fn release(&self, claim: &Claim, ticket: &RedisTicket) -> Result<bool> {
        ticket.set_sub(None);
        let keys = ticket.keys(claim, &self.inner.client_id);
        let shared = Shared::of(claim.kind());
        let script = if shared.is_some() {
            &self.inner.scripts.release_shared
        } else {
            &self.inner.scripts.release
        };
        let mut inv = self.call_on(script, keys, shared.is_some());
        inv.arg(&keys.owner)
            .arg(millis(FENCE_TTL))
            .arg(millis(self.inner.handoff_ttl))
            .arg(&keys.channels);
        if let Some(shared) = &shared {
            inv.arg(format!("{}:{}", shared.kind, keys.owner));
        }
        let (held, in_doubt, _): (i64, bool, Instant) = self
            .inner
            .commands
            .invoke_noting_doubt("release", &inv)
            .await?;
        // An attempt whose reply was lost may have released the lock already, so a retry that
        // finds nothing is no sign of loss: the lease was valid when the release was asked for
        // (the layer above checks that locally).
        Ok(held == 1 || in_doubt)
    }

    async fn downgrade(&self, claim: &Claim, ticket: &RedisTicket) -> Result<Grant> {
        let keys = ticket.keys(claim, &self.inner.client_id);
        let mut inv = self.call_on(&self.inner.scripts.downgrade, keys, true);
        inv.arg(&keys.owner)
            .arg(millis(claim.ttl()))
            .arg(millis(FENCE_TTL))
            .arg(millis(self.inner.handoff_ttl))
            .arg(&keys.channels);
        let ((done, fence), sent): ((i64, i64), Instant) =
            self.inner.commands.invoke_timed("downgrade", &inv).await?;
        if done != 1 {
            return Err(Error::lost(claim.key()));
        }
        Ok(Grant {
            fence: fence_of(fence)?,
            valid_until: sent + claim.ttl(),
        })
    }

    async fn renew(&self, claims: &[(&Claim, &RedisTicket)]) -> Vec<Renewal> {
        let mut out: Vec<Option<Renewal>> = vec![None; claims.len()];
        let groups = self.renewal_groups(claims);
        let answers =
            futures::future::join_all(groups.iter().map(|group| self.renew_group(claims, group)))
                .await;
        for (group, answer) in groups.iter().zip(answers) {
            for (&i, renewal) in group.iter().zip(answer) {
                if let Some(slot) = out.get_mut(i) {
                    *slot = Some(renewal);
                }
            }
        }
        out.into_iter()
            .map(|r| {
                r.unwrap_or_else(|| {
                    Renewal::Failed(Error::new(ErrorKind::Backend, "redis renew lost a claim"))
                })
            })
            .collect()
    }
}
