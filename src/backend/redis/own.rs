//! The backend's own connection: redis-rs's `ConnectionManager`, replaced when a call through
//! it panics or it leaves a call unanswered for a whole call timeout.
//!
//! A connection that goes silent (the path drops every byte: a NAT or conntrack entry gone, a
//! load balancer failed over, a peer gone without a reset) is not closed by the kernel for
//! minutes, and redis-rs sends the next calls over it again: a call it times out counts as one
//! to retry, not as a reason to reconnect. Every lock of the client would wait on it. So a call
//! with no answer within its limit replaces the manager it went through; the calls still in
//! flight on it fail as dropped and are sent again at once over the new one (every request is
//! safe to repeat). A server that is only slow (paused, busy) costs a reconnect, no more.
//!
//! The manager reconnects through one future its callers share, and that future keeps the
//! timers of the runtime that first polled it: any runtime the client is used from, not only
//! its own. If that runtime shuts down while a reconnect is under way (a short-lived runtime of
//! a blocking caller, say), the next call polls the timer of a runtime that is gone and panics;
//! so does every later call, since the shared future stays poisoned. Here such a panic is caught, the call fails
//! as a dropped connection (sent again at once, in doubt), and the manager is replaced by a
//! new one, which connects at its first call.
//!
//! A shared future that panics wakes none of the other callers waiting on it: they would sleep
//! until their own call timeout. So every call also listens for its manager's replacement,
//! and fails the same way when it comes.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Mutex as StdMutex;
use std::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::{FromRedisValue, RedisError, RedisResult};
use futures::FutureExt;
use tokio::sync::Notify;

use super::commands::Request;
use crate::sync::LockExt;

/// An auto-reconnecting connection of our own.
pub(crate) struct OwnConnection {
    /// The manager in use, with its number (a panic replaces only the manager it came from).
    manager: StdMutex<(u64, ConnectionManager)>,
    /// Told when a manager is replaced, so the calls still waiting on it end.
    replaced: Notify,
    client: ::redis::Client,
    config: ConnectionManagerConfig,
}

impl OwnConnection {
    /// Connects to `client`'s server.
    pub(crate) async fn connect(
        client: ::redis::Client,
        config: ConnectionManagerConfig,
    ) -> RedisResult<Self> {
        let manager = ConnectionManager::new_with_config(client.clone(), config.clone()).await?;
        Ok(Self {
            manager: StdMutex::new((0, manager)),
            replaced: Notify::new(),
            client,
            config,
        })
    }

    /// Sends `inv` and reads its reply, within `limit`: past it, the call fails as timed out
    /// (`is_timeout`) and the connection is replaced (see the module's docs).
    pub(crate) async fn send_within<T: FromRedisValue + Send>(
        &self,
        inv: &impl Request,
        limit: Duration,
    ) -> RedisResult<T> {
        self.through(
            Some(limit),
            |mut conn| async move { inv.send(&mut conn).await },
        )
        .await
    }

    /// Runs `cmd` and reads its reply (the caller bounds the wait).
    pub(crate) async fn query<T: FromRedisValue + Send>(
        &self,
        cmd: &::redis::Cmd,
    ) -> RedisResult<T> {
        self.through(
            None,
            |mut conn| async move { cmd.query_async(&mut conn).await },
        )
        .await
    }

    /// Runs `call` on the manager in use. The call fails as a dropped connection if it panics,
    /// and as timed out if it has no answer within `limit` (or redis-rs's own response timeout
    /// ends it): either way the manager is replaced. It fails as dropped too if the manager is
    /// replaced while it waits.
    async fn through<T, F>(
        &self,
        limit: Option<Duration>,
        call: impl FnOnce(ConnectionManager) -> F,
    ) -> RedisResult<T>
    where
        F: Future<Output = RedisResult<T>>,
    {
        // Made before the manager is read: a replacement after the read is heard.
        let replaced = self.replaced.notified();
        let (n, conn) = self.manager.locked().clone();
        let call = AssertUnwindSafe(call(conn)).catch_unwind();
        let silent = async {
            match limit {
                Some(limit) => tokio::time::sleep(limit).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(call, replaced, silent);
        loop {
            tokio::select! {
                biased;
                reply = &mut call => {
                    return match reply {
                        Err(_) => Err(self.replace(n, Why::Panicked)),
                        Ok(Err(e)) if e.is_timeout() => {
                            self.replace(n, Why::Silent);
                            Err(e)
                        }
                        Ok(reply) => reply,
                    };
                }
                () = &mut silent => return Err(self.replace(n, Why::Silent)),
                () = &mut replaced => {
                    // Listening again first: a replacement after the check is heard.
                    replaced.set(self.replaced.notified());
                    if self.manager.locked().0 != n {
                        return Err(dropped("the redis connection was replaced while the call waited"));
                    }
                }
            }
        }
    }

    /// Replaces manager `n`, whose call panicked or went unanswered, unless that was done
    /// already; returns the error the call fails with.
    fn replace(&self, n: u64, why: Why) -> RedisError {
        if self.manager.locked().0 != n {
            // Another call replaced it already.
            return why.error();
        }
        match why {
            Why::Panicked => tracing::warn!("a redis call panicked in the connection's reconnect (the runtime that started it shut down); replacing the connection"),
            Why::Silent => tracing::warn!("a redis call had no answer within its timeout; replacing the connection"),
        }
        match ConnectionManager::new_lazy_with_config(self.client.clone(), self.config.clone()) {
            Ok(fresh) => {
                let mut manager = self.manager.locked();
                if manager.0 == n {
                    let old = std::mem::replace(&mut *manager, (n.wrapping_add(1), fresh));
                    drop(manager);
                    drop(old);
                    self.replaced.notify_waiters();
                }
            }
            Err(e) => tracing::warn!(error = %e, "a new redis connection could not be made"),
        }
        why.error()
    }
}

/// Why a manager is replaced.
#[derive(Clone, Copy)]
enum Why {
    /// A call through it panicked (its reconnect's runtime shut down).
    Panicked,
    /// A call through it had no answer in time.
    Silent,
}

impl Why {
    /// The error of the call that saw it.
    fn error(self) -> RedisError {
        match self {
            Self::Panicked => dropped(
                "the redis connection's reconnect panicked (the runtime that started it shut down)",
            ),
            Self::Silent => no_answer(),
        }
    }
}

/// The error of a call left unanswered for its deadline (`is_timeout`), on our own connection
/// or a Cluster's: the connection it went through is made again.
pub(super) fn no_answer() -> RedisError {
    std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "no answer from redis within the call timeout",
    )
    .into()
}

/// The error of a call whose connection went away under it: retried at once, in doubt.
fn dropped(why: &'static str) -> RedisError {
    std::io::Error::new(std::io::ErrorKind::BrokenPipe, why).into()
}
