//! A Sentinel-managed primary (one primary, one replica, three sentinels, all real
//! `redis-server`s): the lock contract through `redis+sentinel://`, and a SIGKILLed primary
//! whose replica the sentinels promote while a lock is held and waiters are queued.
#![cfg(feature = "redis-sentinel")]

mod support;

use std::time::Duration;

use distlock::LockClient;
use support::contract::{contend, torture};
use support::failover::{client_for, held_across_a_failover};
use support::sentinel::SentinelSetup;
use tokio::time::{sleep, timeout, Instant};

async fn client(setup: &SentinelSetup, ns: &str, ttl: Duration) -> LockClient {
    client_for(&setup.url(), ns, ttl).await
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

    // The shared failover scenario (tests/support/failover.rs), with a lease longer than the
    // takeover (1 s to notice, then a vote and the promotion); once the replica is promoted,
    // new locks work at once.
    let ttl = Duration::from_secs(12);
    let url = setup.url();
    let replica_url = setup.replica.url();
    let connect = || {
        let (url, ns) = (url.clone(), ns.clone());
        async move { client_for(&url, &ns, ttl).await }
    };
    let new_locks_work = || async {
        let other = connect().await;
        let fresh = timeout(Duration::from_secs(10), other.mutex("fresh").lock())
            .await
            .expect("no new lock after the failover")
            .unwrap();
        drop(fresh);
        other.shutdown().await;
    };
    held_across_a_failover(
        &ns,
        connect,
        ttl / 2,
        || setup.kill_primary(),
        new_locks_work,
        || replica_url,
    )
    .await;
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

/// Issue 31, item 1: the primary is paused (SIGSTOP), not killed; the sentinels promote the
/// replica; the old primary is resumed and answers as a primary until they demote it. The
/// holder must follow the switch (renew on the new primary, which has its replicated lease)
/// or be told it lost the lock: at no moment may it and a new client both believe they hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_primary_leaves_no_two_holders() {
    let ns = test_namespace!();
    let mut setup = SentinelSetup::start();
    let ttl = Duration::from_secs(10);
    let a = client(&setup, &ns, ttl).await;
    let held = a.mutex("k").lock().await.unwrap();
    // Let the grant reach the replica.
    sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    let pid = tokio::task::block_in_place(|| setup.pause_primary());
    println!("promoted {:?} after the pause", started.elapsed());
    // A new client (a new replica of the service) finds the new primary.
    let b = client(&setup, &ns, ttl).await;
    let waiter = tokio::spawn({
        let m = b.mutex("k");
        async move {
            let guard = m.lock_timeout(Duration::from_secs(30)).await;
            (Instant::now(), guard)
        }
    });
    sleep(Duration::from_secs(1)).await;
    support::RedisServer::signal(pid, "CONT");
    // Past the holder's replicated lease on the new primary, and past the old primary's
    // demotion, unless the holder kept its lease on the new primary.
    let lost_at = timeout(Duration::from_secs(14), held.lost())
        .await
        .ok()
        .map(|()| Instant::now());
    let released_at = if lost_at.is_none() {
        // The holder stops believing when it asks to release.
        let asked = Instant::now();
        held.release().await.unwrap();
        Some(asked)
    } else {
        None
    };
    let (granted_at, guard) = timeout(Duration::from_secs(30), waiter)
        .await
        .expect("the waiter was never granted")
        .unwrap();
    let guard = guard.expect("the waiter's lock");
    let gave_up = lost_at.or(released_at).unwrap_or_else(Instant::now);
    let overlap = gave_up.saturating_duration_since(granted_at);
    println!(
        "holder {} {:?} after the pause; waiter granted {:?} after it; overlap {overlap:?}",
        if lost_at.is_some() {
            "lost"
        } else {
            "released"
        },
        gave_up.saturating_duration_since(started),
        granted_at.saturating_duration_since(started)
    );
    assert_eq!(
        overlap,
        Duration::ZERO,
        "two clients believed they held the lock for {overlap:?}"
    );
    drop(guard);
    a.shutdown().await;
    b.shutdown().await;
}
