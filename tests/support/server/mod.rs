//! The real test servers, one module each: each starts its server on free loopback ports (one
//! shared by every test of a binary, or a test's own).
//!
//! | module | server | topology |
//! |---|---|---|
//! | `redis` | one `redis-server` | single node |
//! | `cluster` | six `redis-server`s | Redis Cluster, three primaries with a replica each |
//! | `sentinel` | a primary, a replica, three sentinels | Redis Sentinel |
//! | `redlock` | five independent `redis-server`s, each behind a fault proxy | Redlock |
//! | `zookeeper` | one ZooKeeper | standalone |
//! | `ensemble` | three ZooKeepers | ensemble |
//! | `postgres` | one PostgreSQL | direct |
//! | `pgbouncer` | PgBouncer (transaction mode) before the PostgreSQL | pooled |

#[cfg(feature = "redis-cluster")]
pub mod cluster;
pub mod ensemble;
pub mod pgbouncer;
pub mod postgres;
pub mod redis;
#[cfg(feature = "redlock")]
pub mod redlock;
#[cfg(feature = "redis-sentinel")]
pub mod sentinel;
pub mod zookeeper;
