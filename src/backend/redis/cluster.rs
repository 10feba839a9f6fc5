//! Redis Cluster: the seed nodes of a `redis+cluster://` URL and the command connection, which
//! routes each script to the primary serving its keys' slot and follows `MOVED` and failovers.
//!
//! redis-rs runs a Cluster connection in a task of the runtime that made it. If that runtime
//! shuts down (a client kept in a static across `#[tokio::test]`s, each test its own runtime),
//! the task goes with it and every call through the connection fails at once, for good. Here a
//! call that finds the task gone makes a new connection, on the caller's runtime, and fails as
//! a dropped connection (sent again at once).

use std::future::Future;
use std::sync::Mutex as StdMutex;

use ::redis::cluster::{ClusterClient, ClusterClientBuilder};
use ::redis::cluster_async::ClusterConnection;
use ::redis::{RedisError, RedisResult};

use super::commands::{redis_error, CALL_TIMEOUT};
use crate::error::{Error, Result};
use crate::sync::LockExt;

/// The scheme of a Cluster URL.
pub(crate) const SCHEME: &str = "redis+cluster://";

/// Whether `url` names a Redis Cluster.
pub(crate) fn is_cluster_url(url: &str) -> bool {
    url.starts_with(SCHEME)
}

/// The backend's own Cluster connection, made again when the task running it is gone.
pub(crate) struct OwnCluster {
    /// The connection in use, with its number (a call replaces only the one it went through).
    conn: StdMutex<(u64, ClusterConnection)>,
    client: ClusterClient,
    /// Held while a new connection is made: one at a time.
    replacing: tokio::sync::Mutex<()>,
}

impl OwnCluster {
    /// Connects to the cluster seeded by `seeds` (`redis://host:port`).
    pub(crate) async fn connect(seeds: &[String]) -> Result<Self> {
        let client = ClusterClientBuilder::new(seeds.to_vec())
            .connection_timeout(CALL_TIMEOUT)
            .response_timeout(CALL_TIMEOUT)
            .retries(3)
            .build()
            .map_err(|e| Error::invalid_config("malformed redis cluster url").with_source(e))?;
        let conn = client
            .get_async_connection()
            .await
            .map_err(|e| redis_error("cluster connect", e))?;
        Ok(Self {
            conn: StdMutex::new((0, conn)),
            client,
            replacing: tokio::sync::Mutex::new(()),
        })
    }

    /// Runs `call` on the connection in use; if the call finds the connection's task gone,
    /// makes a new connection before returning the call's error.
    pub(crate) async fn run<T, F>(
        &self,
        call: impl FnOnce(ClusterConnection) -> F,
    ) -> RedisResult<T>
    where
        F: Future<Output = RedisResult<T>>,
    {
        let (n, conn) = self.conn.locked().clone();
        let reply = call(conn).await;
        if let Err(e) = &reply {
            if task_gone(e) {
                self.replace(n).await;
            }
        }
        reply
    }

    /// Replaces connection `n`, unless that was done already.
    async fn replace(&self, n: u64) {
        let _one = self.replacing.lock().await;
        if self.conn.locked().0 != n {
            return;
        }
        tracing::warn!(
            "the redis cluster connection's task is gone (its runtime shut down); connecting again"
        );
        match self.client.get_async_connection().await {
            Ok(fresh) => {
                let old = std::mem::replace(&mut *self.conn.locked(), (n.wrapping_add(1), fresh));
                drop(old);
            }
            Err(e) => {
                tracing::warn!(error = %e, "a new redis cluster connection could not be made")
            }
        }
    }
}

/// Whether `e` says the connection's task is gone: its request channel closed (redis-rs
/// reports it as a broken pipe, "Unable to send command" or "Unable to receive command").
fn task_gone(e: &RedisError) -> bool {
    e.is_io_error() && e.to_string().contains("redis_cluster: Unable to")
}
