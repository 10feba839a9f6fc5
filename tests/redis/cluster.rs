//! Redis Cluster's own tests (three primaries with a replica each, shared by this binary, a
//! namespace per test): scripts routed by slot, grants announced on sharded pub/sub, renewals
//! batched per slot, keys spread over every shard. The behaviour suite every backend runs is in
//! `tests/contract/matrix.rs` (`matrix::redis_cluster::`), on a cluster of its own.
#![cfg(feature = "redis-cluster")]

use std::collections::BTreeSet;
use std::time::Duration;

use crate::support::contract::contend;
use crate::support::server::cluster::{client, shared_cluster, until_queued};
use distlock::LockClient;
use futures::future::join_all;
use tokio::time::{sleep, timeout};

async fn clients(ns: &str, n: usize) -> Vec<LockClient> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(client(ns).await);
    }
    out
}

/// `n` keys whose slots are served by `n` different primaries (n ≤ 3).
fn spread_keys(prefix: &str, n: usize) -> Vec<String> {
    let cluster = shared_cluster();
    let mut seen = BTreeSet::new();
    let mut keys = Vec::new();
    for i in 0.. {
        let key = format!("{prefix}{i}");
        if seen.insert(cluster.primary_for(&key, 0)) {
            keys.push(key);
            if keys.len() == n {
                break;
            }
        }
    }
    keys
}

/// The scripts are one function library on every primary (loaded through all of them when
/// the backend connects); a primary that lost it gets it again at the next call to one of its
/// slots, and its replica with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_primary_holds_the_function_library_and_gets_it_back() {
    let ns = test_namespace!();
    let cluster = shared_cluster();
    let url_of = |i: usize| format!("redis://127.0.0.1:{}/", cluster.nodes[i].port());
    let backend = distlock::backend::RedisBackend::connect(&cluster.url())
        .await
        .unwrap();
    let library = crate::support::redis::library_of(&backend).expect("the scripts are functions");
    for p in cluster.primaries() {
        assert!(
            crate::support::redis::libraries(&url_of(p))
                .await
                .contains(&library),
            "primary {p}"
        );
    }
    let c = LockClient::builder(backend).namespace(&ns).build().unwrap();
    let keys = spread_keys("fn", 3);
    let lost = cluster.primary_for(&keys[0], 0);
    let _: () = redis::cmd("FUNCTION")
        .arg("DELETE")
        .arg(&library)
        .query_async(&mut crate::support::redis::connection(&url_of(lost)).await)
        .await
        .unwrap();
    for key in &keys {
        let guard = c.mutex(key).lock().await.unwrap();
        guard.release().await.unwrap();
    }
    assert!(crate::support::redis::libraries(&url_of(lost))
        .await
        .contains(&library));
    cluster.until_clean(&ns);
}

/// Contention on three keys at once, one on each shard: exclusive, tokens increasing per key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_exclusion_on_every_shard() {
    let ns = test_namespace!();
    let keys = spread_keys("hot", 3);
    let mut runs = Vec::new();
    for key in &keys {
        let c = clients(&ns, 4).await;
        runs.push(async move { contend(c, key, 15, Duration::from_micros(300)).await });
    }
    join_all(runs).await;
    shared_cluster().until_clean(&ns);
}

/// Waiters queued one after another are served in that order, woken over sharded pub/sub
/// (the channel is a shard channel of the key's primary, not a classic one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_served_in_order_over_sharded_pub_sub() {
    let ns = test_namespace!();
    let key = "fifo";
    let holder = client(&ns).await;
    let first = holder.mutex(key).lock().await.unwrap();
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..6 {
        let c = client(&ns).await;
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            let g = c.mutex(key).lock().await.unwrap();
            order.lock().unwrap().push((i, g.fencing_token()));
            g.release().await.unwrap();
            c.shutdown().await;
        }));
        until_queued(&ns, key, i + 1).await;
    }
    let cluster = shared_cluster();
    let port = cluster.nodes[cluster.primary_for(key, 0)].port();
    let mut conn = crate::support::redis::connection(&format!("redis://127.0.0.1:{port}/")).await;
    let shard: Vec<String> = redis::cmd("PUBSUB")
        .arg("SHARDCHANNELS")
        .arg(format!("{ns}:*"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(!shard.is_empty(), "no shard channel on the key's primary");
    let classic: Vec<String> = redis::cmd("PUBSUB")
        .arg("CHANNELS")
        .arg(format!("{ns}:*"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(classic.is_empty(), "classic channels: {classic:?}");
    let token = first.fencing_token();
    first.release().await.unwrap();
    for t in tasks {
        timeout(Duration::from_secs(30), t).await.unwrap().unwrap();
    }
    let order = order.lock().unwrap().clone();
    let served: Vec<usize> = order.iter().map(|(i, _)| *i).collect();
    assert_eq!(served, (0..6).collect::<Vec<_>>());
    let mut last = token;
    for (_, f) in order {
        assert!(f > last);
        last = f;
    }
    holder.shutdown().await;
    cluster.until_clean(&ns);
}

/// Many locks over every slot range held through several TTLs: renewal, one script call per
/// slot, keeps every one of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_per_slot_keeps_locks_on_every_shard() {
    let ns = test_namespace!();
    let c = LockClient::builder_for(&shared_cluster().url())
        .await
        .unwrap()
        .namespace(ns.as_str())
        .ttl(Duration::from_millis(900))
        .build()
        .unwrap();
    let mut guards = Vec::new();
    for i in 0..60 {
        guards.push(c.mutex(format!("held{i}")).lock().await.unwrap());
    }
    sleep(Duration::from_millis(3000)).await;
    assert!(guards.iter().all(|g| !g.is_lost()), "a lock was lost");
    let other = client(&ns).await;
    for i in [0, 17, 59] {
        assert!(other
            .mutex(format!("held{i}"))
            .try_lock()
            .await
            .unwrap_err()
            .is_would_block());
    }
    drop(guards);
    c.shutdown().await;
    other.shutdown().await;
    shared_cluster().until_clean(&ns);
}

/// A multi-lock over keys on different shards takes them all, in order, and frees them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_locks_span_shards() {
    let ns = test_namespace!();
    let keys = spread_keys("multi", 3);
    // Built from seed nodes (`RedisBackend::cluster`) rather than the URL.
    let seeds: Vec<String> = shared_cluster()
        .nodes
        .iter()
        .skip(3)
        .map(|n| format!("127.0.0.1:{}", n.port()))
        .collect();
    let backend = distlock::backend::RedisBackend::cluster(&seeds)
        .build()
        .await
        .unwrap();
    let a = LockClient::builder(backend)
        .namespace(ns.as_str())
        .build()
        .unwrap();
    let b = client(&ns).await;
    let all = a.multi_lock(keys.clone()).lock().await.unwrap();
    for k in &keys {
        assert!(b.mutex(k).try_lock().await.unwrap_err().is_would_block());
    }
    drop(all);
    let again = timeout(Duration::from_secs(5), b.multi_lock(keys).lock())
        .await
        .unwrap()
        .unwrap();
    drop(again);
    a.shutdown().await;
    b.shutdown().await;
    shared_cluster().until_clean(&ns);
}

#[tokio::test]
async fn bad_cluster_urls_are_clear_errors() {
    let err = LockClient::connect("redis+cluster://").await.unwrap_err();
    assert!(err.is_invalid_config(), "{err}");
    let dead = format!("redis+cluster://127.0.0.1:{}", crate::support::free_port());
    let started = std::time::Instant::now();
    let err = LockClient::connect(&dead).await.unwrap_err();
    assert!(err.is_backend(), "{err}");
    assert!(started.elapsed() < Duration::from_secs(20));
}

/// Commands through a `deadpool-redis` cluster pool exclude clients on their own connections,
/// and the pool carried them.
#[cfg(feature = "redis-deadpool")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadpool_cluster_pool_carries_the_commands() {
    let ns = test_namespace!();
    let cluster = shared_cluster();
    let seeds: Vec<String> = cluster
        .nodes
        .iter()
        .take(3)
        .map(|n| format!("redis://127.0.0.1:{}", n.port()))
        .collect();
    let pool = deadpool_redis::cluster::Config::from_urls(seeds)
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        .unwrap();
    let backend = distlock::backend::RedisBackend::builder(cluster.url())
        .deadpool_cluster(pool.clone())
        .build()
        .await
        .unwrap();
    let pooled = LockClient::builder(backend)
        .namespace(ns.as_str())
        .build()
        .unwrap();
    let mut cs = clients(&ns, 2).await;
    cs.push(pooled);
    contend(cs, "pooled", 15, Duration::from_micros(300)).await;
    assert!(pool.status().size >= 1, "the pool was never used");
    cluster.until_clean(&ns);
}
