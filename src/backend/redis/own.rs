//! The backend's own connection: redis-rs's `ConnectionManager`, replaced when it leaves a call
//! unanswered for a whole call timeout.
//!
//! A connection that goes silent (the path drops every byte: a NAT or conntrack entry gone, a
//! load balancer failed over, a peer gone without a reset) is not closed by the kernel for
//! minutes, and redis-rs sends the next calls over it again: a call it times out counts as one
//! to retry, not as a reason to reconnect. Every lock of the client would wait on it. So a call
//! with no answer within its limit replaces the manager it went through; the calls still in
//! flight on it fail as dropped and are sent again at once over the new one (every request is
//! safe to repeat). A server that is only slow (paused, busy) costs a reconnect, no more.
//!
//! The calls waiting on a manager that is replaced fail at once as dropped (and are sent again
//! over the new one), not at their own call timeouts: every call listens for its manager's
//! replacement.

use std::future::Future;
use std::sync::Mutex as StdMutex;
use std::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::{FromRedisValue, RedisError, RedisResult};
use tokio::sync::Notify;

use super::commands::Request;
use crate::sync::LockExt;

/// An auto-reconnecting connection of our own.
pub(crate) struct OwnConnection {
    /// The manager in use, with its number (a silent call replaces only the manager it went
    /// through).
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

    /// Runs `call` on the manager in use. The call fails as timed out if it has no answer within
    /// `limit` (or redis-rs's own response timeout ends it), and the manager is replaced; it
    /// fails as dropped if the manager is replaced while it waits.
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
        let call = call(conn);
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
                    if let Err(e) = &reply {
                        if e.is_timeout() {
                            self.replace(n);
                        }
                    }
                    return reply;
                }
                () = &mut silent => return Err(self.replace(n)),
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

    /// Replaces manager `n`, whose call went unanswered, unless that was done already;
    /// returns the error the call fails with.
    fn replace(&self, n: u64) -> RedisError {
        if self.manager.locked().0 != n {
            // Another call replaced it already.
            return no_answer();
        }
        tracing::warn!("a redis call had no answer within its timeout; replacing the connection");
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
        no_answer()
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
