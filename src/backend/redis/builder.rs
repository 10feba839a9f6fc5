//! Building a [`RedisBackend`]: the URL, the connection or pool commands go through, the
//! handoff lease, replica acknowledgements and TLS; then one round trip proves the server
//! answers and says whether it keeps the function library.

use std::sync::Arc;
use std::time::Duration;

use ::redis::aio::ConnectionManagerConfig;

#[cfg(feature = "redis-cluster")]
use super::cluster;
use super::commands::{redis_error, Commands, CALL_TIMEOUT};
#[cfg(feature = "redis-cluster")]
use super::hosts_of;
#[cfg(feature = "redis-sentinel")]
use super::library::FAILOVER;
use super::library::PLAIN;
#[cfg(feature = "redis-cluster")]
use super::library::SHARDED;
use super::notify::PubSubHub;
use super::own::OwnConnection;
use super::pubsub;
use super::replicas::Ack;
use super::script::{Functions, Library};
use super::scripts::Ping;
#[cfg(feature = "redis-sentinel")]
use super::sentinel;
use super::{Inner, RedisBackend};
use crate::backend::handoff::{check_handoff_ttl, DEFAULT_HANDOFF_TTL};
use crate::backend::require_runtime;
use crate::backend::retry::Failure;
use crate::backend::wire;
use crate::error::{Error, Result};

enum Source {
    OwnConnection,
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
            source: Source::OwnConnection,
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
    /// tokens are what protect your storage across a failover: a token you were given is on the
    /// replicas that acknowledged, so a promoted one of those issues higher tokens whatever the
    /// clocks read; otherwise, on Cluster and Sentinel, tokens never fall below the server's
    /// clock in µs nor below the requesting client's, so they keep increasing even when the
    /// counter's last increments were lost, unless the promoted node's clock and the requesting
    /// client's clock are both behind the clocks that issued the lost tokens by more than the
    /// failover took (see [`RedisBackend`]). Not available through a pool (`WAIT` must go over
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
            if !matches!(self.source, Source::OwnConnection) {
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
            .map_err(|e| super::malformed_url("redis url", &e))?;
        require_runtime()?;
        let commands = match std::mem::replace(&mut self.source, Source::OwnConnection) {
            Source::OwnConnection => {
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(CALL_TIMEOUT))
                    .set_response_timeout(Some(CALL_TIMEOUT))
                    .set_number_of_retries(2);
                // redis-rs bounds each attempt by the connection timeout, and makes three: a
                // server that accepts and never answers is given one timeout in all.
                let own = tokio::time::timeout(
                    CALL_TIMEOUT,
                    OwnConnection::connect(client.clone(), config),
                )
                .await
                .map_err(|_| Failure::Timeout)
                .and_then(|connected| connected.map_err(Failure::Call))
                .map_err(|f| f.describe("redis", "connect", CALL_TIMEOUT, redis_error))?;
                Commands::OwnConnection(std::sync::Arc::new(own))
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
        self.finish(
            commands,
            &PLAIN,
            false,
            PubSubHub::start_on(pubsub::Source::Single(Box::new(client))),
        )
        .await
    }

    /// Proves the server answers with these credentials (one round trip) and makes the
    /// backend.
    async fn finish(
        self,
        commands: Commands,
        scripts: &'static Library,
        cluster: bool,
        hub: PubSubHub,
    ) -> Result<RedisBackend> {
        let functions = Functions::new(scripts);
        let answer = commands
            .invoke::<i64>("connect", &scripts.call(Some(&functions), &Ping).strict())
            .await;
        let functions = match answer {
            Ok(_) => Some(functions),
            // No functions here (before Redis 7, or not allowed to this user): the scripts
            // go by EVALSHA, if the server answers that.
            Err(err) if !err.is_transient() => {
                commands
                    .invoke::<i64>("connect", &scripts.call(None, &Ping))
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
                client_id: wire::client_id(),
                coalescer: super::coalesce::Coalescer::new(require_runtime()?),
                plain: std::ptr::eq(scripts, &*PLAIN) && !cluster,
            }),
        })
    }

    /// [`build`](Self::build) for a `redis+sentinel://` URL.
    #[cfg(feature = "redis-sentinel")]
    async fn build_sentinel(mut self) -> Result<RedisBackend> {
        let sentinel = Arc::new(sentinel::Sentinel::from_url(&self.url)?);
        require_runtime()?;
        sentinel.listen();
        let commands = match std::mem::replace(&mut self.source, Source::OwnConnection) {
            Source::OwnConnection => Commands::Sentinel(sentinel.clone()),
            #[cfg(any(feature = "redis-deadpool", feature = "redis-bb8"))]
            _ => {
                return Err(Error::invalid_config(
                    "a sentinel-managed primary is followed by the backend's own connection; a pool cannot follow it",
                ))
            }
        };
        let hub = PubSubHub::start_on(pubsub::Source::Sentinel(sentinel));
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
        require_runtime()?;
        let commands =
            match std::mem::replace(&mut self.source, Source::OwnConnection) {
                Source::OwnConnection => Commands::Cluster(std::sync::Arc::new(
                    cluster::OwnCluster::connect(&seeds).await?,
                )),
                #[cfg(feature = "redis-deadpool")]
                Source::DeadpoolCluster(pool) => Commands::DeadpoolCluster(pool),
                #[cfg(any(feature = "redis-deadpool", feature = "redis-bb8"))]
                _ => return Err(Error::invalid_config(
                    "a redis cluster opens its own connections; a single-node pool cannot serve it",
                )),
            };
        let hub = PubSubHub::start_on(pubsub::Source::Cluster(seeds));
        self.finish(commands, &SHARDED, true, hub).await
    }
}
