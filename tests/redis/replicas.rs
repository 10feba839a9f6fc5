//! `replicas_ack`: grants and renewals wait for the primary's replicas (real `redis-server`
//! primary and replica). A grant the replica did not acknowledge in time is undone and
//! reported; renewals it cannot acknowledge end in a lost lock.
#![cfg(feature = "redis")]

use std::time::Duration;

use crate::support::contract::contend;
use crate::support::query_port;
use crate::support::server::redis::RedisServer;
use distlock::backend::RedisBackend;
use distlock::LockClient;
use tokio::time::{sleep, timeout, Instant};

fn pair() -> (RedisServer, RedisServer) {
    let primary = RedisServer::start();
    let replica = RedisServer::start_with(&[
        "--replicaof",
        "127.0.0.1",
        &primary.port().to_string(),
        "--enable-debug-command",
        "yes",
    ]);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let info: String =
            query_port(replica.port(), redis::cmd("INFO").arg("replication")).unwrap_or_default();
        if info.contains("master_link_status:up") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the replica never synced"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    (primary, replica)
}

async fn client(url: &str, ns: &str, replicas: u32, ttl: Duration) -> LockClient {
    let backend = RedisBackend::builder(url)
        .replicas_ack(replicas, Duration::from_millis(300))
        .build()
        .await
        .unwrap();
    LockClient::builder(backend)
        .namespace(ns)
        .ttl(ttl)
        .build()
        .unwrap()
}

async fn leftovers(url: &str, ns: &str) -> Vec<String> {
    crate::support::redis::keys_in(url, ns)
        .await
        .into_iter()
        .filter(|k| !k.ends_with(":fence"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_and_renewals_wait_for_the_replicas() {
    let ns = test_namespace!();
    let (primary, replica) = pair();
    let url = primary.url();

    // Acknowledged: the contract holds, handoffs included.
    let mut cs = Vec::new();
    for _ in 0..3 {
        cs.push(client(&url, &ns, 1, Duration::from_secs(2)).await);
    }
    contend(cs, "k", 10, Duration::from_micros(300)).await;
    assert!(leftovers(&url, &ns).await.is_empty());

    // More replicas asked for than there are: every grant is undone and reported.
    let greedy = client(&url, &ns, 2, Duration::from_secs(2)).await;
    let started = Instant::now();
    let err = greedy.mutex("k").lock().await.unwrap_err();
    assert!(err.is_backend(), "{err}");
    assert!(err.to_string().contains("1 of 2 replicas"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(
        leftovers(&url, &ns).await.is_empty(),
        "an undone grant left keys"
    );

    // The replica stalls (DEBUG SLEEP): a grant it cannot acknowledge is undone; after, fine.
    let c = client(&url, &ns, 1, Duration::from_secs(2)).await;
    let port = replica.port();
    // Connected before the replica sleeps: a connection's handshake would wait out the stall.
    let mut probe = crate::support::redis::connection(&replica.url()).await;
    let stall = std::thread::spawn(move || {
        let _: redis::RedisResult<()> = query_port(port, redis::cmd("DEBUG").arg("SLEEP").arg(1.5));
    });
    // Until the replica is asleep: a PING it leaves unanswered for 50 ms.
    timeout(Duration::from_secs(5), async {
        loop {
            let ping = redis::cmd("PING");
            let answer = ping.query_async::<String>(&mut probe);
            if timeout(Duration::from_millis(50), answer).await.is_err() {
                return;
            }
            sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the replica never stalled");
    let err = c.mutex("k").lock().await.unwrap_err();
    assert!(err.to_string().contains("0 of 1 replicas"), "{err}");
    stall.join().unwrap();
    let g = timeout(Duration::from_secs(5), c.mutex("k").lock())
        .await
        .unwrap()
        .unwrap();

    // Held, then the replica goes away for good: renewals are no longer acknowledged and the
    // lock is reported lost within its lease.
    drop(replica);
    let lost_at = Instant::now();
    timeout(Duration::from_secs(5), g.lost())
        .await
        .expect("a lock whose renewals nobody acknowledged was never reported lost");
    assert!(lost_at.elapsed() <= Duration::from_secs(3));
    drop(g);
    greedy.shutdown().await;
    c.shutdown().await;
}

#[tokio::test]
async fn replicas_ack_settings_are_checked() {
    let err = RedisBackend::builder("redis://127.0.0.1:1/")
        .replicas_ack(0, Duration::from_millis(100))
        .build()
        .await
        .unwrap_err();
    assert!(err.is_invalid_config(), "{err}");
    let err = RedisBackend::builder("redis://127.0.0.1:1/")
        .replicas_ack(1, Duration::ZERO)
        .build()
        .await
        .unwrap_err();
    assert!(err.is_invalid_config(), "{err}");
}
