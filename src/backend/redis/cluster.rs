//! Redis Cluster: the seed nodes of a `redis+cluster://` URL and the command connection, which
//! routes each script to the primary serving its keys' slot and follows `MOVED` and failovers.
//!
//! A call left unanswered for the call timeout has a new connection made, in the background on
//! the runtime the backend was built in, whose end ends the client too (redis-rs runs a Cluster
//! connection in a task of the runtime that made it; the call fails as timed out, and is sent
//! again): redis-rs keeps a connection to a node that
//! went silent (every byte dropped: a NAT entry lost, a peer gone without a reset), and every
//! call for that node's slots would wait on it for minutes.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use ::redis::cluster::{ClusterClient, ClusterClientBuilder};
use ::redis::cluster_async::ClusterConnection;
use ::redis::RedisResult;

use super::commands::{redis_error, CALL_TIMEOUT};
use crate::error::Result;
use crate::sync::LockExt;

/// The scheme of a Cluster URL.
pub(crate) const SCHEME: &str = "redis+cluster://";

/// Whether `url` names a Redis Cluster.
pub(crate) fn is_cluster_url(url: &str) -> bool {
    url.starts_with(SCHEME)
}

/// The backend's own Cluster connection, made again when a call through it goes unanswered.
pub(crate) struct OwnCluster {
    /// The connection in use, with its number (a call replaces only the one it went through).
    conn: StdMutex<(u64, ClusterConnection)>,
    client: ClusterClient,
    /// The runtime the backend was built in: new connections are made, and run, there.
    home: tokio::runtime::Handle,
    /// Set while a task makes a new connection: one at a time.
    replacing: AtomicBool,
}

impl OwnCluster {
    /// Connects to the cluster seeded by `seeds` (`redis://host:port`).
    pub(crate) async fn connect(seeds: &[String]) -> Result<Self> {
        let home =
            tokio::runtime::Handle::try_current().map_err(|_| crate::error::Error::no_runtime())?;
        let client = ClusterClientBuilder::new(seeds.to_vec())
            .connection_timeout(CALL_TIMEOUT)
            .response_timeout(CALL_TIMEOUT)
            .retries(3)
            .build()
            .map_err(|e| super::malformed_url("redis cluster url", &e))?;
        let conn = client
            .get_async_connection()
            .await
            .map_err(|e| redis_error("cluster connect", e))?;
        Ok(Self {
            conn: StdMutex::new((0, conn)),
            client,
            home,
            replacing: AtomicBool::new(false),
        })
    }

    /// Runs `call` on the connection in use. A call with no answer within `limit` (or ended by
    /// redis-rs's response timeout) fails as timed out, and has a new connection made in the
    /// background.
    pub(crate) async fn run<T, F>(
        self: &Arc<Self>,
        limit: Option<Duration>,
        call: impl FnOnce(ClusterConnection) -> F,
    ) -> RedisResult<T>
    where
        F: Future<Output = RedisResult<T>>,
    {
        let (n, conn) = self.conn.locked().clone();
        let reply = match limit {
            Some(limit) => match tokio::time::timeout(limit, call(conn)).await {
                Ok(reply) => reply,
                Err(_) => Err(super::own::no_answer()),
            },
            None => call(conn).await,
        };
        if reply.as_ref().is_err_and(|e| e.is_timeout()) {
            self.replace(n);
        }
        reply
    }

    /// Makes a new connection in a task of its own, which a call that gave up waiting does not
    /// cancel (with a seed node that accepts but never answers, making one takes longer than a
    /// call may wait).
    fn replace(self: &Arc<Self>, n: u64) {
        if self.conn.locked().0 != n || self.replacing.swap(true, Ordering::AcqRel) {
            return;
        }
        tracing::warn!("a redis cluster call had no answer within its timeout; connecting again");
        let this = Arc::clone(self);
        self.home.spawn(async move {
            // However the attempt ends, the next call may start another.
            let ended = scopeguard::guard(Arc::clone(&this), |this| {
                this.replacing.store(false, Ordering::Release);
            });
            match this.client.get_async_connection().await {
                Ok(fresh) => {
                    let mut conn = this.conn.locked();
                    if conn.0 == n {
                        let old = std::mem::replace(&mut *conn, (n.wrapping_add(1), fresh));
                        drop(conn);
                        drop(old);
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "a new redis cluster connection could not be made");
                }
            }
            drop(ended);
        });
    }
}
