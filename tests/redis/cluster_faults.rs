//! Redis Cluster under faults, each test on its own cluster (three primaries, three replicas):
//! the primary serving a held lock fails over (`CLUSTER FAILOVER`, then SIGKILL), and a busy
//! key's slot migrates to another shard. Waiters are served, no holder still believes it holds
//! once another is granted, and tokens keep increasing.
#![cfg(feature = "redis-cluster")]

use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use crate::support::contract::contend;
use crate::support::failover::{client_for, held_across_a_failover};
use crate::support::server::cluster::RedisCluster;
use distlock::LockClient;
use tokio::time::{sleep, timeout};

const TTL: Duration = Duration::from_secs(3);

async fn client(cluster: &RedisCluster, ns: &str) -> LockClient {
    client_with(cluster, ns, TTL).await
}

async fn client_with(cluster: &RedisCluster, ns: &str, ttl: Duration) -> LockClient {
    client_for(&cluster.url(), ns, ttl).await
}

#[derive(Clone, Copy)]
enum Fault {
    /// `CLUSTER FAILOVER` on the replica: no write is lost.
    Failover,
    /// SIGKILL of the primary; its replica takes over after the node timeout.
    Kill,
}

/// The shared failover scenario (tests/support/failover.rs) on a cluster of its own, `fault`
/// hitting the primary that serves `k`.
async fn failover_scenario(fault: Fault, ttl: Duration) {
    let ns = test_namespace!();
    let cluster = StdMutex::new(RedisCluster::start());
    let (primary, replica) = {
        let c = cluster.lock().unwrap();
        let primary = c.primary_for("k", 0);
        (primary, c.replica_of(primary))
    };
    let url = cluster.lock().unwrap().url();
    let connect = || {
        let (url, ns) = (url.clone(), ns.clone());
        async move { client_for(&url, &ns, ttl).await }
    };
    held_across_a_failover(
        &ns,
        connect,
        ttl / 2,
        || {
            let mut c = cluster.lock().unwrap();
            match fault {
                Fault::Failover => c.failover(replica),
                Fault::Kill => c.kill_primary(primary, replica),
            }
        },
        || async {},
        || {
            let c = cluster.lock().unwrap();
            c.nodes[c.primary_for("k", replica)].url()
        },
    )
    .await;
    cluster.lock().unwrap().until_clean(&ns);
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

/// the primary serving a busy key is SIGKILLed and stays down; its replica
/// takes over. The holder keeps its lock and releases it; the waiters queued before the kill
/// must hear their grants from the new primary (their shard-channel subscriptions move there),
/// not wait for their own re-checks, which come a lease later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_hear_their_grants_after_a_primary_dies_for_good() {
    let ns = test_namespace!();
    let cluster = Arc::new(StdMutex::new(RedisCluster::start()));
    let (url, primary, replica) = {
        let c = cluster.lock().unwrap();
        let primary = c.primary_for("k", 0);
        (c.url(), primary, c.replica_of(primary))
    };
    let queue_node = cluster.lock().unwrap().nodes[primary].url();
    let ttl = Duration::from_secs(12);
    let holder = client_for(&url, &ns, ttl).await;
    let held = holder.mutex("k").lock().await.unwrap();
    let mut waiters = Vec::new();
    for i in 0..3 {
        let c = client_for(&url, &ns, ttl).await;
        waiters.push(tokio::spawn(async move {
            let guard = c.mutex("k").lock().await.unwrap();
            let at = tokio::time::Instant::now();
            let token = guard.fencing_token();
            guard.release().await.unwrap();
            c.shutdown().await;
            (at, token)
        }));
        let mut conn = redis::Client::open(queue_node.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        timeout(Duration::from_secs(10), async {
            loop {
                let n: usize = redis::cmd("LLEN")
                    .arg(format!("{ns}:{{k}}:q"))
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                if n == i + 1 {
                    break;
                }
                sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("a waiter never queued");
    }
    {
        let cluster = cluster.clone();
        tokio::task::spawn_blocking(move || {
            cluster
                .lock()
                .unwrap()
                .kill_primary_for_good(primary, replica)
        })
        .await
        .unwrap();
    }
    let promoted = tokio::time::Instant::now();
    // Long enough for the waiters' re-checks after the drop to be over (they queued again on
    // the new primary, told to re-check at the holder's deadline), and for a renewal of the
    // holder on the new primary.
    sleep(Duration::from_secs(3)).await;
    assert!(!held.is_lost(), "the holder lost its lock in the takeover");
    let first = held.fencing_token();
    let released = tokio::time::Instant::now();
    held.release().await.unwrap();
    let mut last = first;
    for w in waiters {
        let (at, token) = timeout(ttl, w)
            .await
            .expect("a waiter was never granted")
            .unwrap();
        let after = at.saturating_duration_since(released);
        println!(
            "granted {after:?} after the release ({:?} after the promotion)",
            at.saturating_duration_since(promoted)
        );
        assert!(token > last, "tokens went backwards: {token} after {last}");
        last = token;
        assert!(
            after < Duration::from_secs(1),
            "a waiter was granted {after:?} after the release: it never heard its grant"
        );
    }
    holder.shutdown().await;
}

/// Three primaries (no replicas) announcing the ports of a proxy each, so every client
/// connection to them goes through a proxy (the cluster bus does not); returned with the
/// cluster's `redis+cluster://` URL over the proxies.
async fn proxied_cluster() -> (
    Vec<crate::support::server::redis::RedisServer>,
    Vec<crate::support::proxy::Proxy>,
    String,
) {
    use crate::support::server::redis::RedisServer;
    let mut nodes = Vec::new();
    let mut proxies = Vec::new();
    for _ in 0..3 {
        let (node, bus) = RedisServer::start_cluster_node(&["--cluster-node-timeout", "1000"]);
        let bus = bus.to_string();
        let proxy = crate::support::proxy::Proxy::start(node.port());
        let port = proxy.port().to_string();
        crate::support::redis::config_set(
            &node.url(),
            &[
                ("cluster-announce-ip", "127.0.0.1"),
                ("cluster-announce-port", &port),
                ("cluster-announce-bus-port", &bus),
            ],
        )
        .await;
        nodes.push(node);
        proxies.push(proxy);
    }
    let addrs: Vec<String> = proxies
        .iter()
        .map(|p| format!("127.0.0.1:{}", p.port()))
        .collect();
    let out = std::process::Command::new(crate::support::require_binary("redis-cli"))
        .arg("--cluster")
        .arg("create")
        .args(&addrs)
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    timeout(Duration::from_secs(30), async {
        'settle: loop {
            for node in &nodes {
                let info: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query_async(&mut crate::support::redis::connection(&node.url()).await)
                    .await
                    .unwrap();
                if !info.contains("cluster_state:ok") {
                    sleep(Duration::from_millis(100)).await;
                    continue 'settle;
                }
            }
            return;
        }
    })
    .await
    .expect("the cluster settles");
    let url = format!("redis+cluster://{}", addrs.join(","));
    (nodes, proxies, url)
}

/// Every primary's command connection goes silent for good (the path drops every byte; new
/// connections pass): a call left unanswered for the call timeout has a new cluster connection
/// made, and the client gets back to work. Before, redis-rs kept the silent connections, and
/// no lock was granted for as long as they stayed silent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_node_connections_are_replaced() {
    use crate::support::proxy::Which;
    let ns = test_namespace!();
    let (_nodes, proxies, url) = proxied_cluster().await;
    let c = client_for(&url, &ns, Duration::from_millis(800)).await;
    crate::support::faults::open_connections(&c, 20).await;
    let token = crate::support::faults::granted_within(&c, "k", Duration::from_secs(5)).await;
    for p in &proxies {
        p.blackhole_only(Which::Commands);
    }
    let again = crate::support::faults::granted_within(&c, "k", Duration::from_secs(25)).await;
    assert!(again > token, "{again} after {token}");
    timeout(Duration::from_secs(15), c.shutdown())
        .await
        .expect("shutdown ends");
    for p in &proxies {
        p.heal();
    }
}
