//! A Sentinel-managed primary on loopback: one primary, one replica, three sentinels
//! (`redis-server <conf> --sentinel`) that promote the replica when the primary goes down; one
//! shared by every test of a binary that fails nothing over, and the behaviour suite's fixture
//! on it.

use std::time::{Duration, Instant};

use distlock::LockClient;
use futures::future::BoxFuture;

use super::redis::RedisServer;
use crate::support::clock::ClockShim;
use crate::support::failover::client_for;
use crate::support::process::{launch, Supervised};
use crate::support::redis as redis_keys;
use crate::support::{query_port, require_binary, until_none_left};

/// The master name the sentinels monitor.
pub const MASTER: &str = "distlock";

pub struct SentinelSetup {
    pub primary: RedisServer,
    pub replica: RedisServer,
    sentinels: Vec<(Supervised, u16, tempfile::TempDir)>,
    /// The clock shim the replica runs with, if any (kept while the replica may restart).
    clock: Option<ClockShim>,
}

impl SentinelSetup {
    pub fn start() -> Self {
        Self::start_with_replica_clock(None)
    }

    /// Like [`start`](Self::start), with the replica's wall clock (so its `TIME`) `behind` the
    /// real one by an `LD_PRELOAD` shim (see [`ClockShim`]); checked before this returns.
    pub fn start_with_replica_clock_behind(behind: Duration) -> Self {
        let shim = ClockShim::behind(behind);
        let setup = Self::start_with_replica_clock(Some(shim));
        setup.replica_clock_behind();
        setup
    }

    /// How far behind the replica's `TIME` reads; fails the test unless it is the shift it was
    /// started with (within 1 s), or if it was started with none.
    pub fn replica_clock_behind(&self) -> Duration {
        let shim = self
            .clock
            .as_ref()
            .expect("a setup started with a shifted replica clock");
        shim.check(self.replica.port(), Duration::from_secs(1))
    }

    fn start_with_replica_clock(clock: Option<ClockShim>) -> Self {
        let primary = RedisServer::start();
        let env = clock.as_ref().map(ClockShim::env).unwrap_or_default();
        let replica = RedisServer::start_with_env(
            &["--replicaof", "127.0.0.1", &primary.port().to_string()],
            &env,
        );
        let bin = require_binary("redis-server");
        let sentinels = (0..3)
            .map(|_| {
                launch(
                    "redis sentinel",
                    &["sentinel.log", "stdout.log"],
                    |port, dir| {
                        let conf = dir.join("sentinel.conf");
                        let text = format!(
                            "port {port}\nbind 127.0.0.1\ndaemonize no\ndir {dir}\nlogfile {log}\n\
                             sentinel monitor {MASTER} 127.0.0.1 {primary} 2\n\
                             sentinel down-after-milliseconds {MASTER} 1000\n\
                             sentinel failover-timeout {MASTER} 5000\n\
                             sentinel parallel-syncs {MASTER} 1\n",
                            dir = dir.display(),
                            log = dir.join("sentinel.log").display(),
                            primary = primary.port(),
                        );
                        std::fs::write(&conf, text).expect("write sentinel.conf");
                        (
                            bin.clone(),
                            vec![conf.display().to_string(), "--sentinel".into()],
                        )
                    },
                    |port| query_port::<String>(port, &mut redis::cmd("PING")).is_ok(),
                )
            })
            .collect();
        let setup = Self {
            primary,
            replica,
            sentinels,
            clock,
        };
        setup.until_ready(Duration::from_secs(60));
        setup
    }

    /// `redis+sentinel://…/distlock` naming the three sentinels.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|(_, port, _)| format!("127.0.0.1:{port}"))
            .collect();
        format!("redis+sentinel://{}/{MASTER}", hosts.join(","))
    }

    /// The primary's port, as each sentinel answers (`None` where one does not).
    pub fn primary_port_seen(&self) -> Vec<Option<u16>> {
        self.sentinels
            .iter()
            .map(|(_, port, _)| {
                let addr: Vec<String> = query_port(
                    *port,
                    redis::cmd("SENTINEL")
                        .arg("GET-MASTER-ADDR-BY-NAME")
                        .arg(MASTER),
                )
                .ok()?;
                addr.get(1)?.parse().ok()
            })
            .collect()
    }

    /// Waits until the replica is in sync and every sentinel knows it and the two others.
    fn until_ready(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let repl: String =
                query_port(self.replica.port(), redis::cmd("INFO").arg("replication"))
                    .unwrap_or_default();
            let synced = repl.contains("master_link_status:up");
            let known = self.sentinels.iter().all(|(_, port, _)| {
                let replicas: Vec<redis::Value> =
                    query_port(*port, redis::cmd("SENTINEL").arg("REPLICAS").arg(MASTER))
                        .unwrap_or_default();
                let others: Vec<redis::Value> =
                    query_port(*port, redis::cmd("SENTINEL").arg("SENTINELS").arg(MASTER))
                        .unwrap_or_default();
                replicas.len() == 1 && others.len() == 2
            });
            if synced && known {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the sentinels did not settle (replica synced: {synced})"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGKILLs the primary and waits until every sentinel names the replica instead.
    pub fn kill_primary(&mut self) {
        self.primary.kill();
        self.until_replica_promoted();
    }

    /// SIGSTOPs the primary (it keeps its data and, once resumed, answers as a primary until
    /// the sentinels demote it) and waits until every sentinel names the replica instead.
    /// Returns the paused process's id, for [`RedisServer::signal`] `CONT`.
    pub fn pause_primary(&mut self) -> u32 {
        let pid = self.primary.pid();
        RedisServer::signal(pid, "STOP");
        self.until_replica_promoted();
        pid
    }

    /// Waits until every sentinel names the replica as the primary, and it says it is one.
    pub fn until_replica_promoted(&self) {
        let replica = self.replica.port();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let seen = self.primary_port_seen();
            let role: String =
                query_port(replica, redis::cmd("INFO").arg("replication")).unwrap_or_default();
            if seen.iter().all(|p| *p == Some(replica)) && role.contains("role:master") {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the sentinels did not promote the replica: {seen:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// One primary, replica and three sentinels for every test of a binary that does not fail the
/// primary over; tests keep apart by namespace.
pub fn shared_sentinel() -> &'static SentinelSetup {
    static SETUP: std::sync::OnceLock<SentinelSetup> = std::sync::OnceLock::new();
    SETUP.get_or_init(SentinelSetup::start)
}

/// The suite's fixture: the binary's shared setup, reached through the sentinels.
struct Sentinel;

impl super::Server for Sentinel {
    /// A lease of 2 s unless a test says otherwise.
    fn client(&self, ns: String, ttl: Option<Duration>) -> BoxFuture<'static, LockClient> {
        let ttl = ttl.unwrap_or(Duration::from_secs(2));
        Box::pin(async move { client_for(&shared_sentinel().url(), &ns, ttl).await })
    }

    /// The queue's length on the primary.
    fn until_queued(&self, ns: String, key: String, n: usize) -> BoxFuture<'static, ()> {
        let primary = shared_sentinel().primary.url();
        Box::pin(async move { redis_keys::until_queued(&primary, &ns, &key, n).await })
    }

    /// Only fencing counters on the primary, within 10 s.
    fn assert_clean(&self, ns: String) -> BoxFuture<'static, ()> {
        let primary = shared_sentinel().primary.url();
        Box::pin(async move {
            let left = || redis_keys::non_fence_keys(&primary, &ns);
            until_none_left(Duration::from_secs(10), "keys", left).await;
        })
    }
}

/// A test's namespace on the binary's shared Sentinel setup.
pub async fn env(ns: String) -> super::Env {
    let setup = tokio::task::block_in_place(shared_sentinel);
    let probe = distlock::backend::RedisBackend::connect(&setup.url())
        .await
        .unwrap();
    super::Env::new("redis_sentinel", ns, super::Supports::of(&probe), Sentinel)
}
