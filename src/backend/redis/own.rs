//! The backend's own connection: redis-rs's `ConnectionManager`, replaced when a call through
//! it panics.
//!
//! The manager reconnects through one future its callers share, and that future keeps the
//! timers of the runtime that first polled it. If that runtime shuts down while a reconnect is
//! under way (a client kept in a static across `#[tokio::test]`s, each test its own runtime),
//! the next call polls the timer of a runtime that is gone and panics; so does every later
//! call, since the shared future stays poisoned. Here such a panic is caught, the call fails
//! as a dropped connection (sent again at once, in doubt), and the manager is replaced by a
//! new one, which connects at its first call.

use std::panic::AssertUnwindSafe;
use std::sync::Mutex as StdMutex;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::{FromRedisValue, RedisError, RedisResult};
use futures::FutureExt;

use super::commands::Request;
use crate::sync::LockExt;

/// An auto-reconnecting connection of our own.
pub(crate) struct Own {
    /// The manager in use, with its number (a panic replaces only the manager it came from).
    manager: StdMutex<(u64, ConnectionManager)>,
    client: ::redis::Client,
    config: ConnectionManagerConfig,
}

impl Own {
    /// Connects to `client`'s server.
    pub(crate) async fn connect(
        client: ::redis::Client,
        config: ConnectionManagerConfig,
    ) -> RedisResult<Self> {
        let manager = ConnectionManager::new_with_config(client.clone(), config.clone()).await?;
        Ok(Self {
            manager: StdMutex::new((0, manager)),
            client,
            config,
        })
    }

    /// Sends `inv` and reads its reply.
    pub(crate) async fn send<T: FromRedisValue + Send>(
        &self,
        inv: &impl Request,
    ) -> RedisResult<T> {
        let (n, mut conn) = self.manager.locked().clone();
        match AssertUnwindSafe(inv.send(&mut conn)).catch_unwind().await {
            Ok(reply) => reply,
            Err(_) => Err(self.replace(n)),
        }
    }

    /// Runs `cmd` and reads its reply.
    pub(crate) async fn query<T: FromRedisValue + Send>(
        &self,
        cmd: &::redis::Cmd,
    ) -> RedisResult<T> {
        let (n, mut conn) = self.manager.locked().clone();
        match AssertUnwindSafe(cmd.query_async(&mut conn))
            .catch_unwind()
            .await
        {
            Ok(reply) => reply,
            Err(_) => Err(self.replace(n)),
        }
    }

    /// Replaces manager `n`, whose call panicked, unless that was done already; returns the
    /// error the call fails with.
    fn replace(&self, n: u64) -> RedisError {
        tracing::warn!("a redis call panicked in the connection's reconnect (its runtime shut down); replacing the connection");
        match ConnectionManager::new_lazy_with_config(self.client.clone(), self.config.clone()) {
            Ok(fresh) => {
                let mut manager = self.manager.locked();
                if manager.0 == n {
                    let old = std::mem::replace(&mut *manager, (n.wrapping_add(1), fresh));
                    drop(manager);
                    drop(old);
                }
            }
            Err(e) => tracing::warn!(error = %e, "a new redis connection could not be made"),
        }
        std::io::Error::new(
            std::io::ErrorKind::BrokenPipe,
            "the redis connection's reconnect panicked (its runtime shut down)",
        )
        .into()
    }
}
