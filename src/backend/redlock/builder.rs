//! Building a [`RedlockBackend`]: the nodes, the per-node timeout, the handoff lease and the
//! rejoin delay; then a probe of every node, and a quorum of them must answer.

use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use tokio::sync::watch;

use super::library;
use super::node::{Downs, Node};
use super::quorum::quorum;
use super::{Inner, RedlockBackend, RedlockNode};
use crate::backend::handoff::{check_handoff_ttl, DEFAULT_HANDOFF_TTL};
use crate::backend::redis::scripts::Ping;
use crate::backend::require_runtime;
use crate::backend::wire::client_id;
use crate::error::{Error, ErrorKind, Result};

/// How long one node may take to answer before it counts as not granting.
const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(200);
/// How long after its server started a node sits out.
const DEFAULT_REJOIN_DELAY: Duration = crate::DEFAULT_TTL;

/// Builds a [`RedlockBackend`]. Created by [`RedlockBackend::builder`].
#[must_use = "builder does nothing itself, use `.build()` to build it"]
#[derive(Debug)]
pub struct RedlockBackendBuilder {
    nodes: Vec<RedlockNode>,
    node_timeout: Duration,
    handoff_ttl: Duration,
    rejoin_delay: Duration,
}

impl RedlockBackend {
    /// Starts building a backend over independent nodes: URLs
    /// (`redis://[user:password@]host:port/db` each) or [`RedlockNode`]s, which may send
    /// their commands through a pool; at least three, an odd number is best.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let err = distlock::backend::RedlockBackend::builder(["redis://127.0.0.1:1/"])
    ///     .build()
    ///     .await
    ///     .unwrap_err();
    /// assert!(err.is_invalid_config()); // one node is not a Redlock
    /// # }
    /// ```
    pub fn builder<I, N>(nodes: I) -> RedlockBackendBuilder
    where
        I: IntoIterator<Item = N>,
        N: Into<RedlockNode>,
    {
        RedlockBackendBuilder {
            nodes: nodes.into_iter().map(Into::into).collect(),
            node_timeout: DEFAULT_NODE_TIMEOUT,
            handoff_ttl: DEFAULT_HANDOFF_TTL,
            rejoin_delay: DEFAULT_REJOIN_DELAY,
        }
    }

    /// Connects to `nodes` (URLs or [`RedlockNode`]s) with the defaults.
    ///
    /// # Errors
    ///
    /// See [`RedlockBackendBuilder::build`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: nothing is left behind but background pub/sub tasks that stop when the
    /// backend is dropped.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let backend = distlock::backend::RedlockBackend::connect([
    ///     "redis://10.0.0.1:6379/",
    ///     "redis://10.0.0.2:6379/",
    ///     "redis://10.0.0.3:6379/",
    /// ])
    /// .await?;
    /// # let _ = backend;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect<I, N>(nodes: I) -> Result<Self>
    where
        I: IntoIterator<Item = N>,
        N: Into<RedlockNode>,
    {
        Self::builder(nodes).build().await
    }

    /// The nodes of a `redlock://[user:password@]host:port,host:port,host:port[/db]` URL, as
    /// `redis://` URLs.
    pub(crate) fn urls_of(url: &str) -> Result<Vec<String>> {
        crate::backend::redis::hosts_of(url, "redlock://")
    }
}

impl RedlockBackendBuilder {
    /// How long one node may take to answer a call (including connecting) before it counts as
    /// not granting. Keep it far below the TTL: an acquisition waits at most this long for the
    /// slowest node, and the time spent is taken off the lease. A node that did not answer in
    /// time, or could not be reached, is then known down: skipped at once until a background
    /// attempt reaches it again. Defaults to 200 ms.
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.node_timeout = timeout;
        self
    }

    /// The lease a node gives a lock it handed to a waiter, until the waiter has a quorum and
    /// confirms it. Bounds how long a lock handed to a waiter that just died, or to a waiter
    /// that cannot reach a quorum, stays stuck. Defaults to 2 seconds.
    pub fn handoff_ttl(mut self, ttl: Duration) -> Self {
        self.handoff_ttl = ttl;
        self
    }

    /// How long after its `redis-server` started a node grants nothing: at least the longest
    /// TTL your locks use, so that every lease a restarted node may have forgotten has run out
    /// before it counts again. Defaults to [`DEFAULT_TTL`](crate::DEFAULT_TTL) (30 s).
    ///
    /// A node restarted less than this ago sits out the rest of it; a node up longer votes at
    /// once, for any namespace, new ones included. The node's scripts read its uptime
    /// (`INFO server`) the first time it serves a namespace and remember the start in
    /// `<namespace>:born`, which goes only with the node's data. So this assumes a node
    /// forgets grants only by restarting: no `FLUSHALL`/`FLUSHDB`, no eviction of lock keys
    /// (`maxmemory-policy noeviction`), no replica promoted in its place. A node that restarts
    /// *with* its data (RDB, or AOF other than `appendfsync always`) keeps its mark and votes
    /// at once, although it may have lost the last writes: run nodes without persistence, or
    /// with `appendfsync always` and a delay of zero (then a restart forgets nothing, and no
    /// node ever sits out). A server that refuses `INFO` to scripts (an ACL without `+info`)
    /// counts as just started when it first serves a namespace.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// use std::time::Duration;
    ///
    /// // Nodes with `appendfsync always`: a restart forgets nothing.
    /// let backend = distlock::backend::RedlockBackend::builder([
    ///     "redis://10.0.0.1:6379/",
    ///     "redis://10.0.0.2:6379/",
    ///     "redis://10.0.0.3:6379/",
    /// ])
    /// .rejoin_delay(Duration::ZERO)
    /// .build()
    /// .await?;
    /// # let _ = backend;
    /// # Ok(())
    /// # }
    /// ```
    pub fn rejoin_delay(mut self, delay: Duration) -> Self {
        self.rejoin_delay = delay;
        self
    }

    /// Checks the settings and that a quorum of the nodes answers. Nodes that do not answer
    /// are connected to in the background; they count again once they do.
    ///
    /// # Errors
    ///
    /// - [`InvalidConfig`](crate::ErrorKind::InvalidConfig) for fewer than three nodes, a
    ///   node named twice, a malformed URL, a zero node timeout or a handoff TTL under 10 ms,
    /// - [`Backend`](crate::ErrorKind::Backend) if fewer than a quorum of nodes answer,
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
    /// let same = "redis://127.0.0.1:1/";
    /// let err = distlock::backend::RedlockBackend::builder([same, same, same])
    ///     .build()
    ///     .await
    ///     .unwrap_err();
    /// assert!(err.is_invalid_config()); // a node counted twice would fake a quorum
    /// # }
    /// ```
    pub async fn build(self) -> Result<RedlockBackend> {
        if self.nodes.len() < 3 {
            return Err(Error::invalid_config(format_args!(
                "redlock needs at least 3 independent nodes, got {}",
                self.nodes.len()
            )));
        }
        if self.node_timeout.is_zero() {
            return Err(Error::invalid_config(
                "redlock node timeout must not be zero",
            ));
        }
        check_handoff_ttl(self.handoff_ttl)?;
        require_runtime()?;
        let q = quorum(self.nodes.len());
        let downs = Downs::new(self.nodes.len(), q);
        let mut nodes: Vec<Node> = Vec::with_capacity(self.nodes.len());
        for node in self.nodes {
            let node = Node::new(node, self.node_timeout, downs.clone())?;
            if nodes.iter().any(|n| n.name == node.name) {
                return Err(Error::invalid_config(format_args!(
                    "redlock node {} is named twice",
                    node.name
                )));
            }
            nodes.push(node);
        }
        // Each node that answers has the scripts' library from here on.
        let probe = library::call(&Ping);
        let probes = join_all(nodes.iter().map(|n| n.call::<i64>("connect", &probe))).await;
        let answered = probes.iter().filter(|p| p.is_ok()).count();
        if answered < q {
            let mut err = Error::new(
                ErrorKind::Backend,
                format!(
                    "redlock: only {answered} of {} nodes answered, a quorum needs {q}",
                    nodes.len()
                ),
            );
            // Passing only if every node that failed was unreachable: a refusal (credentials,
            // permissions) stays.
            if probes
                .iter()
                .all(|p| p.as_ref().map_or_else(Error::is_transient, |_| true))
            {
                err = err.transient();
            }
            if let Some(Err(cause)) = probes.into_iter().find(Result::is_err) {
                err = err.with_source(cause);
            }
            return Err(err);
        }
        let reconnects = Arc::new(watch::Sender::new(0));
        for node in &nodes {
            let mut rx = node.hub.reconnects();
            let tx = Arc::downgrade(&reconnects);
            tokio::spawn(async move {
                while rx.changed().await.is_ok() {
                    let Some(tx) = tx.upgrade() else { return };
                    tx.send_modify(|n| *n += 1);
                }
            });
        }
        Ok(RedlockBackend {
            inner: Arc::new(Inner {
                nodes,
                quorum: q,
                handoff_ttl: self.handoff_ttl,
                rejoin_delay: self.rejoin_delay,
                node_timeout: self.node_timeout,
                client_id: client_id(),
                reconnects,
            }),
        })
    }
}
