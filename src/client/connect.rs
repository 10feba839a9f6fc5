//! Clients on the service a URL names: the per-service constructors and [`LockClient::connect`].

use super::{LockClient, LockClientBuilder};
use crate::error::{Error, Result};

impl LockClient {
    /// A client on the Redis server at `url` (`redis://[user:password@]host:port/db`), with
    /// the default namespace and TTL. For pools or other settings use
    /// [`RedisBackend::builder`](crate::backend::RedisBackend::builder) and
    /// [`LockClient::builder`].
    ///
    /// # Errors
    ///
    /// See [`RedisBackendBuilder::build`](crate::backend::RedisBackendBuilder::build).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let client = distlock::LockClient::redis("redis://127.0.0.1:6379/").await?;
    /// let guard = client.mutex("orders:42").lock().await?;
    /// # drop(guard);
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    pub async fn redis(url: &str) -> Result<Self> {
        let backend = crate::backend::RedisBackend::connect(url).await?;
        Self::builder(backend).build()
    }

    /// Connects to independent Redis nodes as one Redlock (`redis://host:port/` URLs or
    /// [`RedlockNode`](crate::backend::RedlockNode)s, at least three) with the defaults of [`RedlockBackend`](crate::backend::RedlockBackend): a lock is
    /// held while a majority of the nodes hold it, and its fencing token increases across them.
    ///
    /// # Errors
    ///
    /// See [`RedlockBackendBuilder::build`](crate::backend::RedlockBackendBuilder::build).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let client = distlock::LockClient::redlock([
    ///     "redis://10.0.0.1:6379/",
    ///     "redis://10.0.0.2:6379/",
    ///     "redis://10.0.0.3:6379/",
    /// ])
    /// .await?;
    /// let guard = client.mutex("orders:42").lock().await?;
    /// # drop(guard);
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "redlock")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redlock")))]
    pub async fn redlock<I, N>(nodes: I) -> Result<Self>
    where
        I: IntoIterator<Item = N>,
        N: Into<crate::backend::RedlockNode>,
    {
        let backend = crate::backend::RedlockBackend::connect(nodes).await?;
        Self::builder(backend).build()
    }

    /// Connects to a PostgreSQL database (`postgres://user:password@host:port/database`) with
    /// the defaults of [`PgBackend`](crate::backend::PgBackend), creating its `distlock` schema
    /// on first use.
    ///
    /// # Errors
    ///
    /// See [`PgBackendBuilder::build`](crate::backend::PgBackendBuilder::build).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let client = distlock::LockClient::postgres("postgres://app@127.0.0.1:5432/app").await?;
    /// let guard = client.mutex("orders:42").lock().await?;
    /// # drop(guard);
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub async fn postgres(url: &str) -> Result<Self> {
        let backend = crate::backend::PgBackend::connect(url).await?;
        Self::builder(backend).build()
    }

    /// Connects to a ZooKeeper ensemble (`host:port[,host:port...][/chroot]`) with the
    /// defaults of [`ZkBackend`](crate::backend::ZkBackend), under the default namespace: key
    /// `k` is the znode `/distlock/k`, shared with Curator's `InterProcessMutex` on that path.
    /// The lease TTL is the session timeout the server granted: a guard reports lost once the
    /// session is gone or cannot be confirmed for that long.
    ///
    /// # Errors
    ///
    /// See [`ZkBackendBuilder::build`](crate::backend::ZkBackendBuilder::build).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped connect closes its half-open session.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let client = distlock::LockClient::zookeeper("127.0.0.1:2181").await?;
    /// let guard = client.mutex("orders/42").lock().await?;
    /// # drop(guard);
    /// client.shutdown().await;
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "zookeeper")]
    #[cfg_attr(docsrs, doc(cfg(feature = "zookeeper")))]
    pub async fn zookeeper(connect: &str) -> Result<Self> {
        Self::builder_for(&format!("zk://{connect}")).await?.build()
    }

    /// A client for a URL naming the service: `memory:` for the in-process backend (asked for
    /// by name: an empty URL is an error, so an unset `DISTLOCK_URL` never quietly gives locks
    /// that exclude nothing across processes), `redis://…` / `rediss://…` for Redis,
    /// `redis+cluster://[user:password@]host:port,host:port` for a Redis Cluster (seed nodes),
    /// `redis+sentinel://[user:password@]host:port,host:port/<master>[/<db>]` for the primary
    /// the sentinels at those addresses name,
    /// `redlock://[user:password@]host:port,host:port,host:port[/db]` for a Redlock over
    /// independent Redis nodes, `zk://host:port[,host:port][/chroot]` for
    /// ZooKeeper, `postgres://…` for PostgreSQL. Handy for a `DISTLOCK_URL` setting; each scheme needs its backend's feature.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidConfig`](crate::ErrorKind::InvalidConfig) for an empty URL, an unknown
    /// scheme or one whose feature is off; otherwise as the backend's own constructor.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped connect leaves no connection or session behind.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// // e.g. std::env::var("DISTLOCK_URL"): `memory:` here, `redis://…` in production
    /// let client = distlock::LockClient::connect("memory:").await?;
    /// # drop(client);
    /// assert!(distlock::LockClient::connect("etcd://x").await.unwrap_err().is_invalid_config());
    /// // An unset variable read as "" is an error, not in-process locks.
    /// assert!(distlock::LockClient::connect("").await.unwrap_err().is_invalid_config());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect(url: &str) -> Result<Self> {
        Self::builder_for(url).await?.build()
    }

    /// Connects to the service a URL names (as [`connect`](Self::connect) does) and returns a
    /// builder on it, to set a namespace or TTL before building the client. On ZooKeeper the
    /// TTL starts at the session timeout the server granted.
    ///
    /// # Errors
    ///
    /// As [`connect`](Self::connect).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped connect leaves no connection or session behind.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let client = distlock::LockClient::builder_for("memory:").await?.namespace("jobs").build()?;
    /// assert_eq!(client.namespace(), "jobs");
    /// # Ok(())
    /// # }
    /// ```
    pub async fn builder_for(url: &str) -> Result<LockClientBuilder> {
        // Each backend's connect is boxed: their futures are large and deep, and one frame
        // holding them all side by side is more than the compiler lays out by default.
        if url.trim().is_empty() {
            return Err(Error::invalid_config(
                "empty lock service URL: name the service (redis://…, zk://…, postgres://…), or `memory:` for locks inside this process only",
            ));
        }
        let scheme = url
            .split_once("://")
            .map_or(url.trim_end_matches(':'), |(s, _)| s);
        match scheme {
            #[cfg(feature = "memory")]
            "memory" => Ok(Self::builder(crate::backend::MemoryBackend::new())),
            #[cfg(feature = "redis")]
            "redis" | "redis+unix" | "unix" => Ok(Self::builder(
                Box::pin(crate::backend::RedisBackend::connect(url)).await?,
            )),
            #[cfg(feature = "redis-tls")]
            "rediss" => Ok(Self::builder(
                Box::pin(crate::backend::RedisBackend::connect(url)).await?,
            )),
            #[cfg(feature = "redis-cluster")]
            "redis+cluster" => Ok(Self::builder(
                Box::pin(crate::backend::RedisBackend::connect(url)).await?,
            )),
            #[cfg(feature = "redis-sentinel")]
            "redis+sentinel" => Ok(Self::builder(
                Box::pin(crate::backend::RedisBackend::connect(url)).await?,
            )),
            #[cfg(feature = "redlock")]
            "redlock" => Ok(Self::builder(
                Box::pin(crate::backend::RedlockBackend::connect(
                    crate::backend::RedlockBackend::urls_of(url)?,
                ))
                .await?,
            )),
            #[cfg(feature = "postgres")]
            "postgres" | "postgresql" => Ok(Self::builder(
                Box::pin(crate::backend::PgBackend::connect(url)).await?,
            )),
            #[cfg(feature = "zookeeper")]
            "zk" | "zookeeper" => {
                let rest = url.split_once("://").map_or("", |(_, r)| r);
                let backend = Box::pin(crate::backend::ZkBackend::connect(rest)).await?;
                Ok(Self::builder(backend))
            }
            other => Err(unbuilt(other)),
        }
    }
}

/// Each URL scheme [`LockClient::builder_for`] knows, and the cargo feature that builds its
/// backend.
const SCHEMES: [(&str, &str); 12] = [
    ("memory", "memory"),
    ("redis", "redis"),
    ("redis+unix", "redis"),
    ("unix", "redis"),
    ("rediss", "redis-tls"),
    ("redis+cluster", "redis-cluster"),
    ("redis+sentinel", "redis-sentinel"),
    ("redlock", "redlock"),
    ("zk", "zookeeper"),
    ("zookeeper", "zookeeper"),
    ("postgres", "postgres"),
    ("postgresql", "postgres"),
];

/// The error for a URL whose scheme this build has no backend for: the feature that would
/// build one, or, for a scheme distlock does not know, the ones it does.
fn unbuilt(scheme: &str) -> Error {
    let url = if scheme == "memory" {
        "memory:".to_owned()
    } else {
        format!("{scheme}://")
    };
    match SCHEMES.iter().find(|(s, _)| *s == scheme) {
        Some((_, feature)) => Error::invalid_config(format_args!(
            "`{url}` URLs need distlock's `{feature}` feature, which this build lacks: build distlock with the `{feature}` feature (`features = [\"{feature}\"]` in Cargo.toml, or `--features {feature}`)"
        )),
        None => Error::invalid_config(format_args!(
            "no lock service has `{url}` URLs: distlock takes memory:, redis://, rediss://, redis+cluster://, redis+sentinel://, redlock://, zk:// and postgres:// URLs"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A user who built without a backend's feature is told which feature to turn on.
    #[test]
    fn a_scheme_without_its_feature_names_the_feature() {
        for (scheme, feature) in SCHEMES {
            let text = unbuilt(scheme).to_string();
            assert!(
                text.contains(&format!("with the `{feature}` feature")),
                "{scheme}: {text}"
            );
        }
        let text = unbuilt("etcd").to_string();
        assert!(
            text.contains("no lock service has `etcd://` URLs"),
            "{text}"
        );
        assert!(unbuilt("etcd").is_invalid_config());
    }

    /// What a build with only the in-process backend says of a Redis URL.
    #[cfg(not(feature = "redis"))]
    #[tokio::test]
    async fn connecting_without_the_feature_says_which_to_enable() {
        let err = LockClient::connect("redis://127.0.0.1:6379")
            .await
            .unwrap_err();
        assert!(err.to_string().contains("the `redis` feature"), "{err}");
    }
}
