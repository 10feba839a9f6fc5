//! Where commands go: our own auto-reconnecting connection, a Cluster connection, or a pool the
//! application already has. Every call has a deadline. A call that failed on the connection is
//! sent again at once, which is safe because every script is idempotent: the retry waits on the
//! connection manager's reconnect (or the pool's checkout), not on a timer of ours. A call the
//! server refused for now (a Cluster slot moving or without a primary) is sent again after a
//! short back-off. A longer outage is reported as a transient error to the layer above.

use std::future::Future;
use std::time::Duration;

use ::redis::{FromRedisValue, RedisError, RedisResult};
use tokio::time::Instant;

use super::call::Call;
use super::own::OwnConnection;
use crate::backend::retry::{self, until_answered, Backoff, Retry};
use crate::error::{Error, ErrorKind, Result};

/// The deadline of one command, including getting a connection from a pool.
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// How many times a call that failed on the connection is sent again.
const RETRIES: usize = 2;
/// A call the server answered with "not now" (see [`passing`]) is sent again after this pause,
/// doubling up to [`PASSING_PAUSE_MAX`] (about 0.8 s in all: a slot migration's moment); then
/// the error goes up, marked transient, for the layer above to ride out a longer failover.
const PASSING_PAUSE_MIN: Duration = Duration::from_millis(25);
const PASSING_PAUSE_MAX: Duration = Duration::from_millis(400);

#[derive(Clone)]
pub(crate) enum Commands {
    OwnConnection(std::sync::Arc<OwnConnection>),
    /// A Redis Cluster: each script goes to the primary of its keys' slot, following `MOVED`.
    #[cfg(feature = "redis-cluster")]
    Cluster(std::sync::Arc<super::cluster::OwnCluster>),
    /// A Cluster through a `deadpool-redis` cluster pool.
    #[cfg(all(feature = "redis-deadpool", feature = "redis-cluster"))]
    DeadpoolCluster(deadpool_redis::cluster::Pool),
    /// The primary the sentinels name, followed across failovers.
    #[cfg(feature = "redis-sentinel")]
    Sentinel(std::sync::Arc<super::sentinel::Sentinel>),
    #[cfg(feature = "redis-deadpool")]
    Deadpool(deadpool_redis::Pool),
    #[cfg(feature = "redis-bb8")]
    Bb8(bb8::Pool<bb8_redis::RedisConnectionManager>),
}

type Failure = retry::Failure<RedisError>;

/// What goes over a connection as one request: a script call, or a pipeline of plain commands
/// (the uncontended mutex acquire, `fast.rs`). Either may be sent again after a connection
/// failure: both are safe to repeat.
pub(crate) trait Request: Sync {
    /// Sends the request over `con` and reads its reply.
    fn send<C, T>(&self, con: &mut C) -> impl Future<Output = RedisResult<T>> + Send
    where
        C: ::redis::aio::ConnectionLike + Send,
        T: FromRedisValue + Send;
}

impl Request for Call<'_> {
    fn send<C, T>(&self, con: &mut C) -> impl Future<Output = RedisResult<T>> + Send
    where
        C: ::redis::aio::ConnectionLike + Send,
        T: FromRedisValue + Send,
    {
        self.invoke_async(con)
    }
}

impl Request for ::redis::Pipeline {
    fn send<C, T>(&self, con: &mut C) -> impl Future<Output = RedisResult<T>> + Send
    where
        C: ::redis::aio::ConnectionLike + Send,
        T: FromRedisValue + Send,
    {
        self.query_async(con)
    }
}

impl Commands {
    /// Runs a script, retrying connection failures.
    pub(crate) async fn invoke<T: FromRedisValue + Send>(
        &self,
        what: &str,
        inv: &Call<'_>,
    ) -> Result<T> {
        self.invoke_noting_doubt(what, inv).await.map(|(v, ..)| v)
    }

    /// Runs a script, retrying connection failures; also says when the attempt that was
    /// answered was sent (a lease the reply grants runs from then, not from a first attempt
    /// that timed out).
    pub(crate) async fn invoke_timed<T: FromRedisValue + Send>(
        &self,
        what: &str,
        inv: &Call<'_>,
    ) -> Result<(T, Instant)> {
        self.invoke_noting_doubt(what, inv)
            .await
            .map(|(v, _, sent)| (v, sent))
    }

    /// Runs a script, retrying connection failures, and says whether an earlier attempt may
    /// have run on the server (it failed after the request could have been sent), so the
    /// reply describes the state that attempt left, and when the answered attempt was sent.
    pub(crate) async fn invoke_noting_doubt<T: FromRedisValue + Send>(
        &self,
        what: &str,
        inv: &impl Request,
    ) -> Result<(T, bool, Instant)> {
        // Made only once an attempt failed (see `until_answered`).
        let policy = || {
            let mut retries = RETRIES;
            let mut not_now = Backoff::new(PASSING_PAUSE_MIN, PASSING_PAUSE_MAX);
            move |failure: Failure| {
                let (retry, in_doubt) = match &failure {
                    Failure::Call(e) if e.is_connection_refusal() => (true, false),
                    Failure::Call(e) if e.is_io_error() || e.is_connection_dropped() => {
                        (true, true)
                    }
                    Failure::Call(_) => (false, false),
                    Failure::Timeout => (true, true),
                    Failure::Pool(_) => (true, false),
                };
                if !retry && passing(&failure) {
                    // A script stopped at a key that migrated may have written before it.
                    let in_doubt = matches!(&failure, Failure::Call(e) if e.to_string().contains("non local key"));
                    if not_now.exhausted() {
                        return Retry::Fail(describe(what, failure).transient());
                    }
                    let pause = not_now.current();
                    not_now.grow();
                    return Retry::Again {
                        pause: Some(pause),
                        in_doubt,
                    };
                }
                match retries.checked_sub(1) {
                    Some(left) if retry => {
                        retries = left;
                        Retry::Again {
                            pause: None,
                            in_doubt,
                        }
                    }
                    _ if retry => Retry::Fail(describe(what, failure).transient()),
                    _ => Retry::Fail(describe(what, failure)),
                }
            }
        };
        let answered = until_answered(|| self.attempt(inv), policy).await?;
        Ok((answered.value, answered.in_doubt, answered.sent))
    }

    /// One attempt at `inv`, within [`CALL_TIMEOUT`].
    async fn attempt<T: FromRedisValue + Send>(
        &self,
        inv: &impl Request,
    ) -> std::result::Result<T, Failure> {
        // Boxed: every layer above would carry it, and the futures of a lock's calls, boxed
        // whole where the backend's type is erased, would pass the 1 KiB that glibc serves from
        // its per-thread cache; a larger block takes the allocator's shared lock.
        Box::pin(self.attempt_within(inv)).await
    }

    /// [`attempt`](Self::attempt), unboxed.
    async fn attempt_within<T: FromRedisValue + Send>(
        &self,
        inv: &impl Request,
    ) -> std::result::Result<T, Failure> {
        let timed_out = |e: RedisError| {
            if e.is_timeout() {
                Failure::Timeout
            } else {
                Failure::Call(e)
            }
        };
        match self {
            // Our own connections keep the deadline themselves: one that leaves a call
            // unanswered for the whole of it is replaced (see `own.rs`, `cluster.rs`).
            Self::OwnConnection(own) => own.send_within(inv, CALL_TIMEOUT).await.map_err(timed_out),
            #[cfg(feature = "redis-cluster")]
            Self::Cluster(_) => {
                Box::pin(self.invoke_there(inv))
                    .await
                    .map_err(|failure| match failure {
                        Failure::Call(e) => timed_out(e),
                        other => other,
                    })
            }
            // Boxed: a pool's checkout or the sentinels' lookup would make the future of every
            // call larger, on every topology.
            #[allow(unreachable_patterns)]
            _ => match tokio::time::timeout(CALL_TIMEOUT, Box::pin(self.invoke_there(inv))).await {
                Ok(reply) => reply,
                Err(_) => {
                    // A primary that stopped answering (paused, cut off) may have been
                    // replaced: ask the sentinels again at the next call.
                    #[cfg(feature = "redis-sentinel")]
                    if let Self::Sentinel(sentinel) = self {
                        sentinel.forget();
                    }
                    Err(Failure::Timeout)
                }
            },
        }
    }

    /// `WAIT replicas timeout` on the connection that ran the last script for `key` (the
    /// primary serving it): how many replicas acknowledged every write made over it so far.
    /// Only the backend's own connections can say (a pool's next connection is another).
    pub(crate) async fn acked_by(&self, key: &str, replicas: u32, within: Duration) -> Result<i64> {
        let mut wait = ::redis::cmd("WAIT");
        wait.arg(replicas)
            .arg(u64::try_from(within.as_millis()).unwrap_or(u64::MAX));
        let _ = key;
        let asked = async {
            match self {
                Self::OwnConnection(own) => own.query::<i64>(&wait).await,
                #[cfg(feature = "redis-cluster")]
                Self::Cluster(conn) => {
                    use ::redis::cluster_routing::{
                        Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr,
                    };
                    let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(
                        Route::with_key(key, SlotAddr::Master),
                    ));
                    let value = conn
                        .run(
                            None,
                            |mut c| async move { c.route_command(wait, route).await },
                        )
                        .await?;
                    ::redis::from_redis_value(value).map_err(Into::into)
                }
                #[cfg(feature = "redis-sentinel")]
                Self::Sentinel(sentinel) => {
                    let mut conn = sentinel.connection().await?;
                    wait.query_async::<i64>(&mut conn).await
                }
                #[cfg(feature = "redis-deadpool")]
                Self::Deadpool(_) => Err(not_own()),
                #[cfg(feature = "redis-bb8")]
                Self::Bb8(_) => Err(not_own()),
                #[cfg(all(feature = "redis-deadpool", feature = "redis-cluster"))]
                Self::DeadpoolCluster(_) => Err(not_own()),
            }
        };
        match tokio::time::timeout(within + CALL_TIMEOUT, asked).await {
            Ok(Ok(acks)) => Ok(acks),
            Ok(Err(e)) => Err(redis_error("wait", e).transient()),
            Err(_) => Err(Error::new(ErrorKind::Backend, "redis wait timed out").transient()),
        }
    }

    /// One attempt at `inv` on any topology. Only our own connections (single server, Cluster)
    /// keep the call timeout here; the caller bounds the others.
    async fn invoke_there<T: FromRedisValue + Send>(
        &self,
        inv: &impl Request,
    ) -> std::result::Result<T, Failure> {
        match self {
            Self::OwnConnection(own) => own
                .send_within(inv, CALL_TIMEOUT)
                .await
                .map_err(Failure::Call),
            #[cfg(feature = "redis-cluster")]
            Self::Cluster(conn) => conn
                .run(
                    Some(CALL_TIMEOUT),
                    |mut c| async move { inv.send(&mut c).await },
                )
                .await
                .map_err(Failure::Call),
            #[cfg(feature = "redis-sentinel")]
            Self::Sentinel(sentinel) => {
                let mut conn = sentinel.connection().await.map_err(Failure::Call)?;
                let reply = inv.send(&mut conn).await;
                if let Err(e) = &reply {
                    if super::sentinel::stale(e) {
                        sentinel.forget();
                    }
                }
                reply.map_err(Failure::Call)
            }
            #[cfg(feature = "redis-deadpool")]
            Self::Deadpool(pool) => {
                let mut conn = pool.get().await.map_err(|e| Failure::pool("deadpool", e))?;
                inv.send(&mut conn).await.map_err(Failure::Call)
            }
            #[cfg(all(feature = "redis-deadpool", feature = "redis-cluster"))]
            Self::DeadpoolCluster(pool) => {
                let mut conn = pool
                    .get()
                    .await
                    .map_err(|e| Failure::pool("deadpool cluster", e))?;
                inv.send(&mut conn).await.map_err(Failure::Call)
            }
            #[cfg(feature = "redis-bb8")]
            Self::Bb8(pool) => {
                let mut conn = pool.get().await.map_err(|e| Failure::pool("bb8", e))?;
                inv.send(&mut *conn).await.map_err(Failure::Call)
            }
        }
    }
}

/// A server's answer that says "not now" rather than "no": a cluster without a primary for the
/// slot (a failover in progress), a slot in migration or moved more often than the cluster
/// connection follows in one call (or a script that met a key already migrated), a replica
/// that lost its primary, a server loading its data, or a primary just turned replica. Waiters and renewals ride it out.
fn passing(failure: &Failure) -> bool {
    matches!(failure, Failure::Call(e) if not_now(e))
}

/// The server's "not now" answers: a failover, a migration or a load under way.
fn not_now(e: &RedisError) -> bool {
    use ::redis::{ErrorKind as K, ServerErrorKind as S};
    // A script that touched a key of a slot in migration that already left this node (the
    // call is idempotent: asked again, it runs where the slot now is).
    e.to_string().contains("non local key")
        || matches!(
            e.kind(),
            K::Server(
                S::ClusterDown
                    | S::TryAgain
                    | S::Moved
                    | S::Ask
                    | S::MasterDown
                    | S::BusyLoading
                    | S::ReadOnly
            )
        )
}

/// The connection failed: the server was not reached, or did not answer. A TLS handshake
/// that the certificate checks refused arrives as an I/O error too, but it is no outage.
pub(crate) fn unreachable(e: &RedisError) -> bool {
    (e.is_io_error() || e.is_connection_dropped() || e.is_timeout() || e.is_connection_refusal())
        && !tls_refused(e)
}

/// Whether a TLS handshake failed (a certificate refused, no common protocol): rustls' error,
/// wrapped in the I/O error redis-rs reports.
fn tls_refused(e: &RedisError) -> bool {
    #[cfg(feature = "redis-tls")]
    {
        type Shared = std::sync::Arc<dyn std::error::Error + Send + Sync>;
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
        while let Some(c) = cause {
            // redis-rs keeps its cause behind an `Arc`, and the I/O error keeps rustls' inside.
            let c: &(dyn std::error::Error + 'static) = match c.downcast_ref::<Shared>() {
                Some(shared) => &**shared,
                None => c,
            };
            let inner = c
                .downcast_ref::<std::io::Error>()
                .and_then(std::io::Error::get_ref);
            if c.is::<rustls::Error>() || inner.is_some_and(|i| i.is::<rustls::Error>()) {
                return true;
            }
            cause = c.source();
        }
    }
    #[cfg(not(feature = "redis-tls"))]
    let _ = e;
    false
}

#[cfg(any(feature = "redis-deadpool", feature = "redis-bb8"))]
fn not_own() -> RedisError {
    RedisError::from((
        ::redis::ErrorKind::InvalidClientConfig,
        "replica acknowledgements need the backend's own connection",
    ))
}

fn describe(what: &str, failure: Failure) -> Error {
    failure.describe("redis", what, CALL_TIMEOUT, redis_error)
}

/// Names the failures users must tell apart, and keeps the cause as the source, unless the
/// message already says all it says (redis-rs's text for those is its own wording of the same
/// thing, or a parser's multi-line dump).
pub(crate) fn redis_error(what: &str, e: RedisError) -> Error {
    let code = e.code().unwrap_or_default();
    let text = e.to_string();
    if matches!(e.kind(), ::redis::ErrorKind::AuthenticationFailed) {
        return Error::new(
            ErrorKind::Backend,
            format!("redis {what} failed: the server refused authentication (the user name or password)"),
        );
    }
    // The reply parser's complaint: what came back is not RESP (an HTTP server, a TLS port
    // spoken to in plain text, another protocol on the port). A reply of an unexpected type
    // is a `Parse` error too, but not the parser's.
    if matches!(e.kind(), ::redis::ErrorKind::Parse)
        && e.detail().is_some_and(|d| d.starts_with("Parse error at"))
    {
        return Error::new(
            ErrorKind::Backend,
            format!("redis {what} failed: the server did not speak the Redis protocol (is this a Redis server's port?)"),
        );
    }
    let message = if code == "WRONGTYPE" || text.contains("WRONGTYPE") {
        format!("redis {what} failed: a lock key holds a value of another Redis type (WRONGTYPE)")
    } else if matches!(code, "NOAUTH" | "WRONGPASS" | "NOPERM") {
        format!("redis {what} failed: authentication or permission refused")
    } else if tls_refused(&e) {
        format!("redis {what} failed: the TLS handshake failed (the server's certificate, or the CA given)")
    } else if e.is_connection_refusal() {
        format!("redis {what} failed: the server refused the connection")
    } else {
        format!("redis {what} failed")
    };
    let err = Error::new(ErrorKind::Backend, message);
    // The crate's one rule (`Error::is_transient`): unreachable or "not now" may pass.
    let err = if unreachable(&e) || not_now(&e) {
        err.transient()
    } else {
        err
    };
    err.with_source(e)
}
