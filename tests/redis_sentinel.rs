//! A Sentinel-managed primary (one primary, one replica, three sentinels, all real
//! `redis-server`s): the lock contract through `redis+sentinel://`, and a SIGKILLed primary
//! whose replica the sentinels promote while a lock is held and waiters are queued.
#![cfg(feature = "redis-sentinel")]

mod support;

use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use distlock::{LockClient, MutexGuard};
use support::contract::{contend, torture};
use support::sentinel::SentinelSetup;
use tokio::time::{sleep, timeout, Instant};

async fn client(setup: &SentinelSetup, ns: &str, ttl: Duration) -> LockClient {
    LockClient::builder_for(&setup.url())
        .await
        .unwrap()
        .namespace(ns)
        .ttl(ttl)
        .build()
        .unwrap()
}

/// Keys of `ns` on the server at `port`, except fencing counters.
async fn leftovers(port: u16, ns: &str) -> Vec<String> {
    support::redis::keys_in(&format!("redis://127.0.0.1:{port}/"), ns)
        .await
        .into_iter()
        .filter(|k| !k.ends_with(":fence"))
        .collect()
}

/// The contract through the sentinels, then the primary SIGKILLed under a held lock with three
/// waiters queued: once the replica is promoted new locks work, no waiter is granted while the
/// holder still believes it holds, the waiters are served after the holder, and every token is
/// above every earlier one, also after the promoted primary's counter is set back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_contract_holds_and_a_killed_primary_is_followed() {
    let ns = test_namespace!();
    let mut setup = SentinelSetup::start();
    let ttl = Duration::from_secs(2);
    let mut cs = Vec::new();
    for _ in 0..4 {
        cs.push(client(&setup, &ns, ttl).await);
    }
    contend(cs, "hot", 15, Duration::from_micros(300)).await;
    let mut holders = Vec::new();
    let mut cancellers = Vec::new();
    for _ in 0..3 {
        holders.push(client(&setup, &ns, ttl).await);
        cancellers.push(client(&setup, &ns, ttl).await);
    }
    torture(
        holders,
        cancellers,
        "torture",
        25,
        80,
        Duration::from_micros(50),
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !leftovers(setup.primary.port(), &ns).await.is_empty() {
        assert!(Instant::now() < deadline, "keys left behind");
        sleep(Duration::from_millis(20)).await;
    }

    // A lease longer than the takeover (1 s to notice, then a vote and the promotion).
    let ttl = Duration::from_secs(12);
    let holder = client(&setup, &ns, ttl).await;
    let first = holder.mutex("k").lock().await.unwrap();
    let first_token = first.fencing_token();
    let held: Arc<StdMutex<Option<MutexGuard>>> = Arc::new(StdMutex::new(Some(first)));
    let grants = Arc::new(StdMutex::new(vec![(usize::MAX, first_token)]));
    let mut tasks = Vec::new();
    for i in 0..3 {
        let c = client(&setup, &ns, ttl).await;
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
    tokio::task::block_in_place(|| setup.kill_primary());
    // New locks work against the promoted replica.
    let other = client(&setup, &ns, Duration::from_secs(2)).await;
    let fresh = timeout(Duration::from_secs(10), other.mutex("fresh").lock())
        .await
        .expect("no new lock after the failover")
        .unwrap();
    drop(fresh);
    sleep(Duration::from_secs(2)).await;
    let first = held.lock().unwrap().take().unwrap();
    let kept = !first.is_lost();
    let released = Instant::now();
    let _ = first.release().await;
    for t in tasks {
        timeout(Duration::from_secs(30), t)
            .await
            .expect("a waiter was never served")
            .unwrap();
    }
    let grants = grants.lock().unwrap().clone();
    assert_eq!(grants.len(), 4, "{grants:?}");
    assert!(
        grants.windows(2).all(|w| w[0].1 < w[1].1),
        "tokens do not increase: {grants:?}"
    );
    // Replication had long caught up with the grant: the holder kept its lock through the
    // takeover, and the waiters were served in order, by messages from the new primary.
    assert!(kept, "the holder lost its lock across the failover");
    let order: Vec<usize> = grants.iter().skip(1).map(|g| g.0).collect();
    assert_eq!(order, vec![0, 1, 2]);
    assert!(
        released.elapsed() < Duration::from_secs(3),
        "waiters took {:?}",
        released.elapsed()
    );

    // The counter set back, as a failover that lost its last increments would leave it.
    let mut conn = support::redis::connection(&setup.replica.url()).await;
    let _: () = redis::cmd("SET")
        .arg(format!("{ns}:{{k}}:fence"))
        .arg(5)
        .query_async(&mut conn)
        .await
        .unwrap();
    let again = holder.mutex("k").lock().await.unwrap();
    let last = grants.iter().map(|g| g.1).max().unwrap();
    assert!(again.fencing_token() > last);
    drop(again);
    holder.shutdown().await;
    other.shutdown().await;
}

#[tokio::test]
async fn bad_sentinel_urls_are_clear_errors() {
    for url in [
        "redis+sentinel://127.0.0.1:1",
        "redis+sentinel://127.0.0.1:1/",
        "redis+sentinel:///mymaster",
        "redis+sentinel://127.0.0.1:1/m/notanumber",
    ] {
        let err = LockClient::connect(url).await.unwrap_err();
        assert!(err.is_invalid_config(), "{url}: {err}");
    }
    let dead = format!("redis+sentinel://127.0.0.1:{}/m", support::free_port());
    let err = LockClient::connect(&dead).await.unwrap_err();
    assert!(err.is_backend(), "{err}");
}
