//! Redis Cluster under faults, each test on its own cluster (three primaries, three replicas):
//! the primary serving a held lock fails over (`CLUSTER FAILOVER`, then SIGKILL), and a busy
//! key's slot migrates to another shard. Waiters are served, no holder still believes it holds
//! once another is granted, and tokens keep increasing.
#![cfg(feature = "redis-cluster")]

mod support;

use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use distlock::{LockClient, MutexGuard};
use support::cluster::RedisCluster;
use support::contract::contend;
use tokio::time::{sleep, timeout, Instant};

const TTL: Duration = Duration::from_secs(3);

async fn client(cluster: &RedisCluster, ns: &str) -> LockClient {
    client_with(cluster, ns, TTL).await
}

async fn client_with(cluster: &RedisCluster, ns: &str, ttl: Duration) -> LockClient {
    LockClient::builder_for(&cluster.url())
        .await
        .unwrap()
        .namespace(ns)
        .ttl(ttl)
        .build()
        .unwrap()
}

#[derive(Clone, Copy)]
enum Fault {
    /// `CLUSTER FAILOVER` on the replica: no write is lost.
    Failover,
    /// SIGKILL of the primary; its replica takes over after the node timeout.
    Kill,
}

/// A holder holds `k` (lease `ttl`, longer than the takeover) and three waiters queue behind
/// it; then `fault` hits the primary serving `k`. No waiter is granted while the holder still
/// believes it holds; the holder keeps its lock through the takeover; on release the waiters
/// are served in order within moments (grant messages reach them on the new primary); every
/// token is above every earlier one, also after the counter is set back.
async fn failover_scenario(fault: Fault, ttl: Duration) {
    let ns = test_namespace!();
    let mut cluster = RedisCluster::start();
    let primary = cluster.primary_for("k", 0);
    let replica = cluster.replica_of(primary);
    let holder = client_with(&cluster, &ns, ttl).await;
    let first = holder.mutex("k").lock().await.unwrap();
    let first_token = first.fencing_token();
    // The holder's guard, where every waiter can look at it when it is granted.
    let held: Arc<StdMutex<Option<MutexGuard>>> = Arc::new(StdMutex::new(Some(first)));
    let grants = Arc::new(StdMutex::new(vec![(usize::MAX, first_token)]));
    let mut tasks = Vec::new();
    for i in 0..3 {
        let c = client_with(&cluster, &ns, ttl).await;
        let (held, grants) = (held.clone(), grants.clone());
        tasks.push(tokio::spawn(async move {
            let g = c.mutex("k").lock().await.unwrap();
            let stale = held.lock().unwrap().as_ref().is_some_and(|h| !h.is_lost());
            assert!(
                !stale,
                "waiter {i} granted while the holder still believed it held"
            );
            grants.lock().unwrap().push((i, g.fencing_token()));
            sleep(Duration::from_millis(50)).await;
            drop(g);
            c.shutdown().await;
        }));
        sleep(Duration::from_millis(100)).await;
    }
    sleep(Duration::from_millis(300)).await;
    tokio::task::block_in_place(|| match fault {
        Fault::Failover => cluster.failover(replica),
        Fault::Kill => cluster.kill_primary(primary, replica),
    });
    // A few renewal rounds against the new primary.
    sleep(ttl).await;
    let first = held.lock().unwrap().take().unwrap();
    let kept = !first.is_lost();
    let released = Instant::now();
    let _ = first.release().await;
    for t in tasks {
        timeout(Duration::from_secs(20), t)
            .await
            .expect("a waiter was never served")
            .unwrap();
    }
    let served_in = released.elapsed();
    let grants = grants.lock().unwrap().clone();
    assert_eq!(grants.len(), 4, "{grants:?}");
    assert!(
        grants.windows(2).all(|w| w[0].1 < w[1].1),
        "tokens do not increase: {grants:?}"
    );
    // The lease outlived the takeover and no write was lost: the holder kept its lock, and the
    // waiters were served in order after it.
    assert!(kept, "the holder lost its lock across the failover");
    let order: Vec<usize> = grants.iter().skip(1).map(|g| g.0).collect();
    assert_eq!(order, vec![0, 1, 2], "waiters served out of order");
    // Three handoffs (50 ms holds) over pub/sub that followed the failover, not a lease each.
    assert!(served_in < TTL, "waiters took {served_in:?}");

    // The counter set back, as a failover that lost its last increments would leave it: the
    // next token is still above every earlier one.
    let now_primary = cluster.primary_for("k", replica);
    let port = cluster.nodes[now_primary].port();
    let mut conn = support::redis::connection(&format!("redis://127.0.0.1:{port}/")).await;
    let _: () = redis::cmd("SET")
        .arg(format!("{ns}:{{k}}:fence"))
        .arg(5)
        .query_async(&mut conn)
        .await
        .unwrap();
    let again = holder.mutex("k").lock().await.unwrap();
    let last = grants.iter().map(|g| g.1).max().unwrap();
    assert!(
        again.fencing_token() > last,
        "{} after {last}",
        again.fencing_token()
    );
    drop(again);
    holder.shutdown().await;
    cluster.until_clean(&ns);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_failover_keeps_holders_and_serves_waiters() {
    failover_scenario(Fault::Failover, TTL).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_primary_is_replaced_and_waiters_are_served() {
    // A lease longer than the takeover (node timeout 1 s, then an election): the holder should
    // keep its lock, its renewals following the slot to the promoted replica.
    failover_scenario(Fault::Kill, TTL * 4).await;
}

/// The slot of a busy key moves to another shard mid-run: nobody hangs, nobody overlaps, and
/// tokens increase.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_key_whose_slot_migrates_keeps_serving() {
    let ns = test_namespace!();
    let cluster = Arc::new(RedisCluster::start());
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(client(&cluster, &ns).await);
    }
    let run =
        tokio::spawn(async move { contend(clients, "busy", 60, Duration::from_millis(2)).await });
    sleep(Duration::from_millis(200)).await;
    let moved = {
        let cluster = cluster.clone();
        tokio::task::spawn_blocking(move || cluster.migrate_slot_of("busy"))
            .await
            .unwrap()
    };
    let tokens = timeout(Duration::from_secs(60), run)
        .await
        .expect("contention hung across the migration")
        .unwrap();
    assert_eq!(tokens.len(), 240);
    assert_eq!(cluster.primary_for("busy", 0), moved);
    cluster.until_clean(&ns);
}
