//! Redis Sentinel: the primary of a `redis+sentinel://` URL's master name, asked of the
//! sentinels, and a command connection that follows it. The connection is dropped on any sign
//! that it no longer reaches the primary (an I/O error, a timeout, `READONLY` from a primary
//! turned replica) and made again from the sentinels' answer at the next call.

use std::sync::Mutex as StdMutex;

use ::redis::aio::{MultiplexedConnection, PubSub};
use ::redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use ::redis::{AsyncConnectionConfig, IntoConnectionInfo, RedisResult};

use super::commands::CALL_TIMEOUT;
use crate::error::{Error, Result};
use crate::sync::LockExt;

/// The scheme of a Sentinel URL.
pub(crate) const SCHEME: &str = "redis+sentinel://";

/// Whether `url` names a Sentinel-managed primary.
pub(crate) fn is_sentinel_url(url: &str) -> bool {
    url.starts_with(SCHEME)
}

/// A primary found through the sentinels.
pub(crate) struct Sentinel {
    client: tokio::sync::Mutex<SentinelClient>,
    conn: StdMutex<Option<MultiplexedConnection>>,
}

impl Sentinel {
    /// `redis+sentinel://[user:password@]host:port,host:port/<master name>[/<db>]`: the
    /// sentinels' addresses, the master name they monitor; the credentials and database are the
    /// primary's.
    pub(crate) fn from_url(url: &str) -> Result<Self> {
        let bad = |why: &str| Error::invalid_config(format_args!("redis sentinel url: {why}"));
        let rest = url
            .strip_prefix(SCHEME)
            .ok_or_else(|| bad("must start with `redis+sentinel://`"))?;
        let (auth, rest) = match rest.rsplit_once('@') {
            Some((auth, rest)) => (Some(auth), rest),
            None => (None, rest),
        };
        let (hosts, path) = rest.split_once('/').ok_or_else(|| bad("names no master"))?;
        let (master, db) = match path.split_once('/') {
            Some((master, db)) => (master, Some(db)),
            None => (path, None),
        };
        if master.is_empty() {
            return Err(bad("names no master"));
        }
        let sentinels: Vec<::redis::ConnectionInfo> = hosts
            .split(',')
            .filter(|h| !h.is_empty())
            .map(|h| format!("redis://{h}/").into_connection_info())
            .collect::<RedisResult<_>>()
            .map_err(|e| bad("malformed sentinel address").with_source(e))?;
        if sentinels.is_empty() {
            return Err(bad("names no sentinel"));
        }
        let mut node = ::redis::RedisConnectionInfo::default();
        if let Some(auth) = auth {
            let (user, password) = auth.split_once(':').unwrap_or(("", auth));
            if !user.is_empty() {
                node = node.set_username(user);
            }
            node = node.set_password(password);
        }
        if let Some(db) = db.filter(|d| !d.is_empty()) {
            node = node.set_db(
                db.parse()
                    .map_err(|_| bad("the database is not a number"))?,
            );
        }
        let info = SentinelNodeConnectionInfo::default().set_redis_connection_info(node);
        // A `String`: what `build` takes without TLS (with TLS, anything `AsRef<str>`).
        let master: String = master.into();
        let client =
            SentinelClient::build(sentinels, master, Some(info), SentinelServerType::Master)
                .map_err(|e| bad("refused by the client").with_source(e))?;
        Ok(Self {
            client: tokio::sync::Mutex::new(client),
            conn: StdMutex::new(None),
        })
    }

    /// The current primary, as the sentinels say. Boxed: the sentinel client's future is
    /// large and deep, and every command's future would otherwise carry it inline.
    fn primary(&self) -> futures::future::BoxFuture<'_, RedisResult<::redis::Client>> {
        Box::pin(async move { self.client.lock().await.async_get_client().await })
    }

    /// The command connection to the current primary, made if there is none.
    pub(crate) async fn connection(&self) -> RedisResult<MultiplexedConnection> {
        let cached = self.conn.locked().clone();
        if let Some(conn) = cached {
            return Ok(conn);
        }
        Box::pin(async move {
            let config = AsyncConnectionConfig::new()
                .set_connection_timeout(Some(CALL_TIMEOUT))
                .set_response_timeout(Some(CALL_TIMEOUT));
            let conn = self
                .primary()
                .await?
                .get_multiplexed_async_connection_with_config(&config)
                .await?;
            *self.conn.locked() = Some(conn.clone());
            Ok(conn)
        })
        .await
    }

    /// Drops the command connection: the next call asks the sentinels again.
    pub(crate) fn forget(&self) {
        self.conn.locked().take();
    }

    /// A pub/sub connection to the current primary.
    pub(crate) async fn pubsub(&self) -> RedisResult<PubSub> {
        self.primary().await?.get_async_pubsub().await
    }
}

/// Whether `e` says the connection no longer reaches the primary.
pub(crate) fn stale(e: &::redis::RedisError) -> bool {
    super::commands::unreachable(e)
        || matches!(
            e.kind(),
            ::redis::ErrorKind::Server(::redis::ServerErrorKind::ReadOnly)
        )
}
