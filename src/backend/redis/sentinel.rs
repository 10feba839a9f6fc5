//! Redis Sentinel: the primary of a `redis+sentinel://` URL's master name, asked of the
//! sentinels, and a command connection that follows it. The connection is dropped on any sign
//! that it no longer reaches the primary (an I/O error, a timeout, `READONLY` from a primary
//! turned replica) and made again from the sentinels' answer at the next call.
//!
//! It is also dropped the moment the sentinels announce a new primary (`+switch-master`,
//! heard on a subscription to one of them): an old primary that was paused, not killed,
//! answers as a primary again when it resumes, until the sentinels demote it, and a holder
//! renewing there would believe a lock the new primary may grant to another. The hub then
//! moves its pub/sub connection and every holder renews at once, on the new primary.

use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::watch;

use ::redis::aio::{MultiplexedConnection, PubSub};
use ::redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use ::redis::{AsyncConnectionConfig, IntoConnectionInfo, RedisResult};

use super::commands::CALL_TIMEOUT;
use super::url::{multi_node, MultiNode};
use crate::backend::retry::Backoff;
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
    /// The sentinels' addresses and the master name, to hear of switches.
    sentinels: Vec<::redis::ConnectionInfo>,
    master: String,
    /// Moves at every switch of primary the sentinels announce.
    switched: watch::Sender<u64>,
}

/// The first and longest pause between attempts to listen to a sentinel.
const LISTEN_RETRY_MIN: Duration = Duration::from_millis(50);
const LISTEN_RETRY_MAX: Duration = Duration::from_secs(2);

impl Sentinel {
    /// `redis+sentinel://[user:password@]host:port,host:port/<master name>[/<db>]`: the
    /// sentinels' addresses, the master name they monitor; the credentials and database are the
    /// primary's.
    pub(crate) fn from_url(url: &str) -> Result<Self> {
        let bad = |why: &str| Error::invalid_config(format_args!("redis sentinel url: {why}"));
        let MultiNode { auth, hosts, path } =
            multi_node(url, SCHEME).ok_or_else(|| bad("must start with `redis+sentinel://`"))?;
        let path = path.ok_or_else(|| bad("names no master"))?;
        let (master, db) = match path.split_once('/') {
            Some((master, db)) => (master, Some(db)),
            None => (path, None),
        };
        if master.is_empty() {
            return Err(bad("names no master"));
        }
        let sentinels: Vec<::redis::ConnectionInfo> = hosts
            .iter()
            .map(|h| format!("redis://{h}/").into_connection_info())
            .collect::<RedisResult<_>>()
            .map_err(|e| super::malformed_url("sentinel address in the redis sentinel url", &e))?;
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
        let client = SentinelClient::build(
            sentinels.clone(),
            master.clone(),
            Some(info),
            SentinelServerType::Master,
        )
        .map_err(|e| bad("refused by the client").with_source(e))?;
        Ok(Self {
            client: tokio::sync::Mutex::new(client),
            conn: StdMutex::new(None),
            sentinels,
            master,
            switched: watch::Sender::new(0),
        })
    }

    /// Starts listening to the sentinels for switches of primary, on the current runtime,
    /// until the last handle to `self` is dropped.
    pub(crate) fn listen(self: &Arc<Self>) {
        tokio::spawn(listen_for_switches(Arc::downgrade(self)));
    }

    /// A receiver that changes at every switch of primary the sentinels announce.
    pub(crate) fn switches(&self) -> watch::Receiver<u64> {
        self.switched.subscribe()
    }

    /// Whether `message` (a `+switch-master` payload: `<master> <old ip> <old port> <new ip>
    /// <new port>`) is about our master.
    fn is_ours(&self, message: &str) -> bool {
        message.split(' ').next() == Some(self.master.as_str())
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

/// Listens on one sentinel after another for `+switch-master`; on one for our master, drops
/// the command connection and tells the hub. A subscription made again after a break may
/// have missed a switch, so it drops the command connection then too (the next call asks the
/// sentinels: one round trip).
async fn listen_for_switches(sentinel: Weak<Sentinel>) {
    let mut pause = Backoff::new(LISTEN_RETRY_MIN, LISTEN_RETRY_MAX);
    let mut next = 0usize;
    loop {
        let Some(info) = sentinel.upgrade().and_then(|s| {
            let n = s.sentinels.len().max(1);
            s.sentinels.get(next % n).cloned()
        }) else {
            return;
        };
        next += 1;
        let subscribed = async {
            let mut pubsub = ::redis::Client::open(info)?.get_async_pubsub().await?;
            pubsub.subscribe("+switch-master").await?;
            RedisResult::Ok(pubsub)
        };
        let pubsub = match tokio::time::timeout(CALL_TIMEOUT, subscribed).await {
            Ok(Ok(pubsub)) => pubsub,
            _ => {
                tokio::time::sleep(pause.current()).await;
                pause.grow();
                continue;
            }
        };
        pause.reset();
        match sentinel.upgrade() {
            Some(s) => s.forget(),
            None => return,
        }
        let mut messages = pubsub.into_on_message();
        while let Some(msg) = messages.next().await {
            let Some(s) = sentinel.upgrade() else { return };
            let payload: String = msg.get_payload().unwrap_or_default();
            if s.is_ours(&payload) {
                tracing::debug!(switch = %payload, "redis sentinel: the primary changed");
                s.forget();
                s.switched.send_modify(|n| *n += 1);
            }
        }
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
