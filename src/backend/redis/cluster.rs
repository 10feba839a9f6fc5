//! Redis Cluster: the seed nodes of a `redis+cluster://` URL and the command connection, which
//! routes each script to the primary serving its keys' slot and follows `MOVED` and failovers.
//!
//! redis-rs runs a Cluster connection in a task of the runtime that made it. If that runtime
//! shuts down (a client kept in a static across `#[tokio::test]`s, each test its own runtime),
//! the task goes with it and every call through the connection fails at once, for good. Here a
//! call that finds the task gone has a new connection made, in a task on its own runtime, and
//! fails as a dropped connection once it is made (the call is sent again at once).
//!
//! A call left unanswered for the call timeout has a new connection made too, in the same way
//! (the call fails as timed out, and is sent again): redis-rs keeps a connection to a node that
//! went silent (every byte dropped: a NAT entry lost, a peer gone without a reset), and every
//! call for that node's slots would wait on it for minutes.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use ::redis::cluster::{ClusterClient, ClusterClientBuilder};
use ::redis::cluster_async::ClusterConnection;
use ::redis::{RedisError, RedisResult};
use tokio::sync::watch;

use super::commands::{redis_error, CALL_TIMEOUT};
use crate::error::Result;
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
    /// The number of the connection in use, sent again whenever an attempt to make a new
    /// one ends (made or not): calls waiting for it go on.
    made: watch::Sender<u64>,
    /// Set while a task makes a new connection: one at a time.
    replacing: AtomicBool,
}

impl OwnCluster {
    /// Connects to the cluster seeded by `seeds` (`redis://host:port`).
    pub(crate) async fn connect(seeds: &[String]) -> Result<Self> {
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
            made: watch::Sender::new(0),
            replacing: AtomicBool::new(false),
        })
    }

    /// Runs `call` on the connection in use; if the call finds the connection's task gone,
    /// waits for a new connection (or the end of an attempt to make one) before returning the
    /// call's error. A call with no answer within `limit` (or ended by redis-rs's response
    /// timeout) fails as timed out, and has a new connection made in the background.
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
        if let Err(e) = &reply {
            if task_gone(e) {
                self.replaced(n, "the redis cluster connection's task is gone (its runtime shut down); connecting again").await;
            } else if e.is_timeout() {
                self.replace(
                    n,
                    "a redis cluster call had no answer within its timeout; connecting again",
                );
            }
        }
        reply
    }

    /// Waits until connection `n` is replaced or an attempt to replace it ends, starting one
    /// unless one runs.
    async fn replaced(self: &Arc<Self>, n: u64, why: &'static str) {
        let mut made = self.made.subscribe();
        if *made.borrow_and_update() != n {
            return;
        }
        self.replace(n, why);
        // Err only if the sender is gone, which `self` prevents.
        let _ = made.changed().await;
    }

    /// Makes a new connection in a task of its own, which a call that gave up waiting does not
    /// cancel (with a seed node that accepts but never answers, making one takes longer than a
    /// call may wait).
    fn replace(self: &Arc<Self>, n: u64, why: &'static str) {
        if self.conn.locked().0 != n || self.replacing.swap(true, Ordering::AcqRel) {
            return;
        }
        tracing::warn!("{why}");
        let this = Arc::clone(self);
        tokio::spawn(async move {
            // However the attempt ends (its runtime shut down too), the next call may start
            // another, and the calls waiting go on.
            let ended = scopeguard::guard(Arc::clone(&this), |this| {
                this.replacing.store(false, Ordering::Release);
                let now = this.conn.locked().0;
                this.made.send_replace(now);
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

/// Whether `e` says the connection's task is gone: its request channel closed (redis-rs
/// reports it as a broken pipe, "Unable to send command" or "Unable to receive command").
fn task_gone(e: &RedisError) -> bool {
    e.is_io_error() && e.to_string().contains("redis_cluster: Unable to")
}
