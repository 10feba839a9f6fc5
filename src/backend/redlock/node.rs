//! One independent Redis node of a Redlock set: a command connection made on first use (a node
//! that is down when the backend starts does not stop it), the node's pub/sub hub, and a
//! deadline on every call, so a node that is down, slow or silent costs at most that deadline.

use std::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::FromRedisValue;
use tokio::sync::OnceCell;
use tokio::time::Instant;

use crate::backend::redis::commands::{redis_error, Commands, CALL_TIMEOUT};
use crate::backend::redis::notify::Hub;
use crate::backend::redis::script::Call;
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
    client: ::redis::Client,
    commands: OnceCell<Commands>,
    pub(super) hub: Hub,
    timeout: Duration,
}

impl Node {
    /// A node for `node`; no I/O until the first call (the hub connects in the background).
    pub(super) fn new(node: RedlockNode, timeout: Duration) -> Result<Self> {
        let client = ::redis::Client::open(node.url.as_str())
            .map_err(|e| Error::invalid_config("malformed redis url in redlock").with_source(e))?;
        let info = client.get_connection_info();
        let name = match info.addr() {
            ::redis::ConnectionAddr::Tcp(host, port)
            | ::redis::ConnectionAddr::TcpTls { host, port, .. } => format!("{host}:{port}"),
            other => other.to_string(),
        };
        Ok(Self {
            name,
            hub: Hub::start(client.clone()),
            client,
            commands: OnceCell::new_with(node.commands),
            timeout,
        })
    }

    /// Runs a script on this node within the node's deadline; returns the reply and when the
    /// answered attempt was sent.
    pub(super) async fn call<T: FromRedisValue>(
        &self,
        what: &str,
        inv: &Call<'_>,
    ) -> Result<(T, Instant)> {
        self.call_within(self.timeout, what, inv).await
    }

    /// As [`call`](Self::call), with a deadline of `limit` (renewing thousands of leases in one
    /// script may take longer than an acquisition should wait).
    pub(super) async fn call_within<T: FromRedisValue>(
        &self,
        limit: Duration,
        what: &str,
        inv: &Call<'_>,
    ) -> Result<(T, Instant)> {
        let call = async {
            let commands = self
                .commands
                .get_or_try_init(|| async {
                    let config = ConnectionManagerConfig::new()
                        .set_connection_timeout(Some(self.timeout))
                        .set_response_timeout(Some(CALL_TIMEOUT))
                        .set_number_of_retries(1);
                    ConnectionManager::new_with_config(self.client.clone(), config)
                        .await
                        .map(Commands::Own)
                        .map_err(|e| redis_error("connect", e).transient())
                })
                .await?;
            commands.invoke_timed(what, inv).await
        };
        match tokio::time::timeout(limit, call).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(e)) => Err(Error::new(
                ErrorKind::Backend,
                format!("redlock node {}: {e}", self.name),
            )
            .with_source(e)
            .transient()),
            Err(_) => Err(Error::new(
                ErrorKind::Backend,
                format!(
                    "redlock node {}: no reply to {what} within {limit:?}",
                    self.name
                ),
            )
            .transient()),
        }
    }
}
