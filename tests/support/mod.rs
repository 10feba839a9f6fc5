//! What the integration tests share: one fixture per real test server (`server/`), the
//! processes they run in (`process.rs`), the behaviour suite every backend runs (`suite.rs`,
//! over the checks in `contract.rs`, `family.rs` and `cancellation.rs`), and probes and fault
//! tools for one backend at a time.
#![allow(dead_code)]

pub mod cancellation;
pub mod cli;
#[cfg(feature = "redis")]
pub mod clock;
pub mod contract;
pub mod counting;
pub mod curator;
pub mod election;
#[cfg(any(feature = "redis-cluster", feature = "redis-sentinel"))]
pub mod failover;
pub mod family;
pub mod faults;
pub mod holder;
pub mod observed;
#[cfg(feature = "postgres")]
pub mod pg;
pub mod process;
pub mod proxy;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "redis")]
pub mod release;
pub mod server;
pub mod suite;
pub mod tls;
#[cfg(feature = "zookeeper")]
pub mod zk;

pub use process::{free_port, require_binary, require_binary_in, require_file};
// The servers by the paths they had before `server/` (the fault suite in examples/chaos and
// the benchmarks in benches/, which include this module, name them so).
#[cfg(feature = "redis-cluster")]
#[allow(unused_imports)]
pub use server::cluster;
#[allow(unused_imports)]
pub use server::ensemble;
#[cfg(feature = "redlock")]
#[allow(unused_imports)]
pub use server::redlock;
#[cfg(feature = "redis-sentinel")]
#[allow(unused_imports)]
pub use server::sentinel;
#[allow(unused_imports)]
pub use server::{
    pgbouncer::PgBouncer,
    postgres::{shared_postgres, PgServer},
    redis::{shared_redis, RedisServer},
    zookeeper::{shared_zookeeper, ZkServer},
};

pub const INSTALL_HINT: &str = "run `sudo scripts/install-test-deps.sh` (installs redis-server, zookeeper, curator, a JDK, postgresql and pgbouncer from Debian's packages)";

/// Runs one command on the Redis server (or sentinel) at `port`, with a short timeout.
#[cfg(feature = "redis")]
pub fn query_port<T: ::redis::FromRedisValue>(
    port: u16,
    cmd: &mut ::redis::Cmd,
) -> ::redis::RedisResult<T> {
    let client = ::redis::Client::open(format!("redis://127.0.0.1:{port}/"))?;
    let mut conn = client.get_connection_with_timeout(std::time::Duration::from_secs(2))?;
    cmd.query(&mut conn)
}

/// Polls `left` (what is left of something that should be gone: keys, rows, nodes) every 20 ms
/// until it is empty; fails naming `what` and what is left once `limit` has passed.
pub async fn until_none_left<T, Fut>(
    limit: std::time::Duration,
    what: &str,
    mut left: impl FnMut() -> Fut,
) where
    T: std::fmt::Debug,
    Fut: std::future::Future<Output = Vec<T>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let left = left().await;
        if left.is_empty() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} left behind: {left:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Shuts every client down, in order.
pub async fn shut_down(clients: impl IntoIterator<Item = distlock::LockClient>) {
    for c in clients {
        c.shutdown().await;
    }
}

/// A namespace unique to one test (and one run), so tests can share a server.
#[macro_export]
macro_rules! test_namespace {
    () => {{
        fn f() {}
        let name = std::any::type_name_of_val(&f);
        let name: String = name
            .trim_end_matches("::f")
            .split("::")
            .filter(|part| !part.starts_with('{'))
            .collect::<Vec<_>>()
            .join(".");
        format!("t.{}.{}", name, std::process::id())
    }};
}
