//! One independent Redis node of a Redlock set: a command connection made on first use (a node
//! that is down when the backend starts does not stop it), the node's pub/sub hub, and a
//! deadline on every call, so a node that is slow or silent costs at most that deadline. A
//! call that cannot reach the node marks it down: until a background task reaches it again,
//! calls to it fail at once (a no vote), so a node known down costs nothing.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ::redis::aio::ConnectionManagerConfig;
use ::redis::FromRedisValue;
use tokio::sync::OnceCell;
use tokio::time::Instant;

use super::library::{self, LIBRARY};
use crate::backend::redis::call::Call;
use crate::backend::redis::commands::{redis_error, Commands, CALL_TIMEOUT};
use crate::backend::redis::notify::PubSubHub;
use crate::backend::redis::own::OwnConnection;
use crate::backend::redis::script::Functions;
use crate::backend::redis::scripts::Ping;
use crate::backend::retry::Backoff;
use crate::error::{Error, ErrorKind, Result};

/// One node of a Redlock set, as given to [`RedlockBackend::builder`](super::RedlockBackend::builder):
/// its URL, and optionally a pool of the application's that sends its commands.
///
/// A `&str` or `String` converts into a node that opens its own connection. The URL is always
/// needed: the node's pub/sub connection (which a pool cannot lend) is opened from it.
///
/// # Examples
///
/// ```
/// use distlock::backend::RedlockNode;
///
/// let nodes: Vec<RedlockNode> = vec![
///     "redis://10.0.0.1:6379/".into(),
///     "redis://10.0.0.2:6379/".into(),
///     RedlockNode::new("redis://10.0.0.3:6379/"),
/// ];
/// # let _ = nodes;
/// ```
#[derive(Clone)]
pub struct RedlockNode {
    url: String,
    commands: Option<Commands>,
}

impl std::fmt::Debug for RedlockNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL may carry a password: not shown.
        f.debug_struct("RedlockNode")
            .field("pooled", &self.commands.is_some())
            .finish_non_exhaustive()
    }
}

impl RedlockNode {
    /// The node at `url` (`redis://[user:password@]host:port/db`), with a connection of its own.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            commands: None,
        }
    }

    /// The node at `url`, whose commands go through the `deadpool-redis` pool `pool` (which
    /// must point at the same node); `url` is used for its pub/sub connection.
    ///
    /// # Examples
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use distlock::backend::RedlockNode;
    ///
    /// let url = "redis://10.0.0.1:6379/";
    /// let pool = deadpool_redis::Config::from_url(url)
    ///     .create_pool(Some(deadpool_redis::Runtime::Tokio1))?;
    /// let node = RedlockNode::deadpool(url, pool);
    /// # let _ = node;
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "redis-deadpool")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis-deadpool")))]
    pub fn deadpool(url: impl Into<String>, pool: deadpool_redis::Pool) -> Self {
        Self {
            url: url.into(),
            commands: Some(Commands::Deadpool(pool)),
        }
    }

    /// The node at `url`, whose commands go through the `bb8-redis` pool `pool` (which must
    /// point at the same node); `url` is used for its pub/sub connection.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use distlock::backend::RedlockNode;
    ///
    /// let url = "redis://10.0.0.1:6379/";
    /// let manager = bb8_redis::RedisConnectionManager::new(url)?;
    /// let pool = bb8::Pool::builder().build_unchecked(manager);
    /// let node = RedlockNode::bb8(url, pool);
    /// # let _ = node;
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "redis-bb8")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis-bb8")))]
    pub fn bb8(url: impl Into<String>, pool: bb8::Pool<bb8_redis::RedisConnectionManager>) -> Self {
        Self {
            url: url.into(),
            commands: Some(Commands::Bb8(pool)),
        }
    }
}

impl From<&str> for RedlockNode {
    fn from(url: &str) -> Self {
        Self::new(url)
    }
}

impl From<String> for RedlockNode {
    fn from(url: String) -> Self {
        Self::new(url)
    }
}

impl From<&String> for RedlockNode {
    fn from(url: &String) -> Self {
        Self::new(url.as_str())
    }
}

pub(super) struct Node {
    /// `host:port` as the URL gave it, for error messages (never the credentials).
    pub(super) name: String,
    pub(super) hub: PubSubHub,
    link: Arc<Link>,
}

/// The command side of a node, shared with the task that reconnects it while it is down.
struct Link {
    name: String,
    client: ::redis::Client,
    commands: OnceCell<Commands>,
    /// The node's use of the scripts' function library (off for good once it refuses
    /// functions: its calls then go by `EVALSHA`).
    functions: Functions,
    timeout: Duration,
    /// Set while the node is known down (its last call failed to reach it): calls fail at once,
    /// as a no vote, and one background task tries to reach it with a growing pause.
    down: AtomicBool,
    /// Set while that task runs. It runs on the runtime of the call that marked the node down,
    /// and ends with it; calls then try the node again (see [`Node::skipped`]).
    probing: AtomicBool,
    set: Arc<Downs>,
}

/// How many nodes of the set are known down, and how many the set tolerates (those beyond a
/// quorum). While more are down than that, a call to a node known down is tried anyway: the
/// quorum needs it, so a node that is back counts again at once.
pub(super) struct Downs {
    down: AtomicUsize,
    tolerated: usize,
}

impl Downs {
    pub(super) fn new(nodes: usize, quorum: usize) -> Arc<Self> {
        Arc::new(Self {
            down: AtomicUsize::new(0),
            tolerated: nodes.saturating_sub(quorum),
        })
    }
}

/// The first and the longest pause between two attempts to reach a node known down.
const PROBE_MIN: Duration = Duration::from_millis(25);
const PROBE_MAX: Duration = Duration::from_secs(1);

impl Node {
    /// A node for `node`; no I/O until the first call (the hub connects in the background).
    pub(super) fn new(node: RedlockNode, timeout: Duration, set: Arc<Downs>) -> Result<Self> {
        let client = ::redis::Client::open(node.url.as_str())
            .map_err(|e| crate::backend::redis::malformed_url("redis url in redlock", &e))?;
        let info = client.get_connection_info();
        let name = match info.addr() {
            ::redis::ConnectionAddr::Tcp(host, port)
            | ::redis::ConnectionAddr::TcpTls { host, port, .. } => format!("{host}:{port}"),
            other => other.to_string(),
        };
        Ok(Self {
            hub: PubSubHub::start(client.clone()),
            link: Arc::new(Link {
                name: name.clone(),
                client,
                commands: OnceCell::new_with(node.commands),
                functions: Functions::new(&LIBRARY),
                timeout,
                down: AtomicBool::new(false),
                probing: AtomicBool::new(false),
                set,
            }),
            name,
        })
    }

    /// Whether calls skip the node: it is known down, a background task is reconnecting it,
    /// and no more nodes are down than the set tolerates. A node marked down whose task ended
    /// with its runtime is not known down any more: the next call tries it (and marks it down
    /// again, with a task of its own runtime, if it fails to reach it).
    pub(super) fn skipped(&self) -> bool {
        self.link.down.load(Ordering::Acquire)
            && self.link.probing.load(Ordering::Acquire)
            && self.link.set.down.load(Ordering::Acquire) <= self.link.set.tolerated
    }

    /// Runs a script on this node within the node's deadline, as a function of the node's
    /// library while it keeps functions, else by `EVALSHA`; returns the reply and when the
    /// answered attempt was sent.
    pub(super) async fn call<T: FromRedisValue + Send>(
        &self,
        what: &str,
        inv: &Call<'_>,
    ) -> Result<(T, Instant)> {
        self.call_within(self.link.timeout, what, inv).await
    }

    /// As [`call`](Self::call), with a deadline of `limit` (renewing thousands of leases in one
    /// script may take longer than an acquisition should wait).
    ///
    /// A node known down fails at once, without I/O, unless more nodes are down than the set
    /// tolerates. A call that cannot reach the node (a connection refused or dropped, no reply
    /// in time, a server not ready) marks it down until a call reaches it again.
    pub(super) async fn call_within<T: FromRedisValue + Send>(
        &self,
        limit: Duration,
        what: &str,
        inv: &Call<'_>,
    ) -> Result<(T, Instant)> {
        if self.skipped() {
            return Err(Error::new(
                ErrorKind::Backend,
                format!(
                    "redlock node {}: down, reconnecting in the background",
                    self.name
                ),
            )
            .transient());
        }
        match self.link.call_within(limit, what, inv).await {
            Ok(reply) => {
                self.link.mark_up();
                Ok(reply)
            }
            Err((err, unreachable)) => {
                if unreachable {
                    self.mark_down();
                }
                Err(err)
            }
        }
    }

    /// Marks the node down and, unless one runs already, starts the task that tries to reach
    /// it (see [`probe`](Self::probe)).
    fn mark_down(&self) {
        if !self.link.down.swap(true, Ordering::AcqRel) {
            self.link.set.down.fetch_add(1, Ordering::AcqRel);
            tracing::debug!(node = %self.name, "redlock node down; reconnecting in the background");
        }
        self.probe();
    }

    /// Unless one runs already, starts the task that tries to reach the node while it is
    /// down: after a pause growing from [`PROBE_MIN`] to [`PROBE_MAX`], or at once when the
    /// node's pub/sub connection comes back. It ends when the node answers (it counts again),
    /// when the backend is dropped, or with its runtime.
    fn probe(&self) {
        if self.link.probing.swap(true, Ordering::AcqRel) {
            return;
        }
        let link = Arc::downgrade(&self.link);
        let mut hub_back = Some(self.hub.reconnects());
        tokio::spawn(async move {
            // However the task ends (its runtime shut down too), calls stop skipping the
            // node: the next one tries it.
            let _ended = scopeguard::guard(link.clone(), |link| {
                if let Some(link) = link.upgrade() {
                    link.probing.store(false, Ordering::Release);
                }
            });
            let mut pause = Backoff::new(PROBE_MIN, PROBE_MAX);
            loop {
                let back = async {
                    match hub_back.as_mut() {
                        Some(rx) => {
                            if rx.changed().await.is_err() {
                                // The hub is gone: the pause alone paces the attempts.
                                hub_back = None;
                                std::future::pending::<()>().await;
                            }
                        }
                        None => std::future::pending::<()>().await,
                    }
                };
                tokio::select! {
                    () = tokio::time::sleep(pause.current()) => {}
                    () = back => {}
                }
                let Some(link) = link.upgrade() else { return };
                if !link.down.load(Ordering::Acquire) {
                    // A call the quorum needed reached it meanwhile.
                    return;
                }
                // What reaches a node that is down, to learn that it is back (and to load the
                // library there if it lost it). Given longer than the call timeout: a
                // connection that leaves it unanswered so long has gone silent and is replaced
                // (`redis/own.rs`), where the node's own deadline would only drop the call and
                // leave the node on that connection for good.
                let probe = library::call(&Ping);
                if link
                    .call_within::<i64>(CALL_TIMEOUT + link.timeout, "probe", &probe)
                    .await
                    .is_ok()
                {
                    link.mark_up();
                    return;
                }
                pause.grow();
            }
        });
    }
}

impl Link {
    /// The node answered: it counts again.
    fn mark_up(&self) {
        if self.down.swap(false, Ordering::AcqRel) {
            self.set.down.fetch_sub(1, Ordering::AcqRel);
            tracing::debug!(node = %self.name, "redlock node back");
        }
    }

    /// One call within `limit`; a failure says whether the node could not be reached (no
    /// reply in time, or a failure the command layer counts as transient: the connection, a
    /// server not ready), as opposed to a reply refusing the call.
    async fn call_within<T: FromRedisValue + Send>(
        &self,
        limit: Duration,
        what: &str,
        inv: &Call<'_>,
    ) -> std::result::Result<(T, Instant), (Error, bool)> {
        let call = async {
            let commands = self
                .commands
                .get_or_try_init(|| async {
                    let config = ConnectionManagerConfig::new()
                        .set_connection_timeout(Some(self.timeout))
                        .set_response_timeout(Some(CALL_TIMEOUT))
                        .set_number_of_retries(1);
                    OwnConnection::connect(self.client.clone(), config)
                        .await
                        .map(|own| Commands::OwnConnection(std::sync::Arc::new(own)))
                        .map_err(|e| redis_error("connect", e).transient())
                })
                .await?;
            commands
                .invoke_timed(what, &inv.on(Some(&self.functions)))
                .await
        };
        match tokio::time::timeout(limit, call).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(e)) => {
                let unreachable = e.is_transient();
                let err = Error::new(
                    ErrorKind::Backend,
                    format!("redlock node {}: {e}", self.name),
                )
                .with_source(e)
                .transient();
                Err((err, unreachable))
            }
            Err(_) => Err((
                Error::new(
                    ErrorKind::Backend,
                    format!(
                        "redlock node {}: no reply to {what} within {limit:?}",
                        self.name
                    ),
                )
                .transient(),
                true,
            )),
        }
    }
}
