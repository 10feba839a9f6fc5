//! The in-process backend: no server, a `MemoryBackend` of the test's own, so its statistics
//! speak for the test alone.

use std::time::Duration;

use distlock::backend::MemoryBackend;
use distlock::LockClient;
use futures::future::BoxFuture;
use tokio::time::timeout;

use super::{Env, Server, Supports};

struct Memory(MemoryBackend);

impl Server for Memory {
    fn client(&self, ns: String, ttl: Option<Duration>) -> BoxFuture<'static, LockClient> {
        let builder = LockClient::builder(self.0.clone()).namespace(ns);
        let client = match ttl {
            Some(ttl) => builder.ttl(ttl),
            None => builder,
        };
        Box::pin(std::future::ready(client.build().unwrap()))
    }

    /// Every waiter of the backend counts (it is the test's own).
    fn until_queued(&self, _: String, _: String, n: usize) -> BoxFuture<'static, ()> {
        let backend = self.0.clone();
        Box::pin(async move {
            timeout(Duration::from_secs(10), async {
                while backend.stats().waiters != n {
                    tokio::task::yield_now().await;
                }
            })
            .await
            .unwrap_or_else(|_| panic!("expected {n} waiters, have {:?}", backend.stats()));
        })
    }

    /// Nothing held, nothing queued, no key: at once (releases are not sent anywhere).
    fn assert_clean(&self, _: String) -> BoxFuture<'static, ()> {
        let stats = self.0.stats();
        assert_eq!(
            (stats.keys, stats.held, stats.waiters),
            (0, 0, 0),
            "state left behind: {stats:?}"
        );
        Box::pin(std::future::ready(()))
    }
}

/// A fresh backend for one test.
pub async fn env(ns: String) -> Env {
    env_and_backend(ns).await.0
}

/// [`env`], and the backend itself (for its statistics).
pub async fn env_and_backend(ns: String) -> (Env, MemoryBackend) {
    let backend = MemoryBackend::new();
    let env = Env::new(
        "memory",
        ns,
        Supports::of(&backend),
        Memory(backend.clone()),
    );
    (env, backend)
}
