//! A Sentinel-managed primary (one primary, one replica, three sentinels, all real
//! `redis-server`s, a setup per test): a SIGKILLed or paused primary whose replica the
//! sentinels promote while a lock is held and waiters are queued, and fencing tokens across a
//! lossy failover. The behaviour suite every backend runs through `redis+sentinel://` is in
//! `tests/contract/matrix.rs` (`matrix::redis_sentinel::`), on a setup of its own.
#![cfg(feature = "redis-sentinel")]

use std::time::Duration;

use crate::support::failover::{client_for, held_across_a_failover};
use crate::support::server::sentinel::SentinelSetup;
use distlock::LockClient;
use tokio::time::{sleep, timeout, Instant};

async fn client(setup: &SentinelSetup, ns: &str, ttl: Duration) -> LockClient {
    client_for(&setup.url(), ns, ttl).await
}

/// The primary SIGKILLed under a held lock with three waiters queued: once the replica is
/// promoted new locks work, no waiter is granted while the holder still believes it holds, the
/// waiters are served after the holder, and every token is above every earlier one, also after
/// the promoted primary's counter is set back. (The contract through the sentinels is the
/// suite's, in `tests/contract/matrix.rs`: `redis_sentinel::`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_primary_is_followed() {
    let ns = test_namespace!();
    let mut setup = SentinelSetup::start();
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
    let dead = format!(
        "redis+sentinel://127.0.0.1:{}/m",
        crate::support::free_port()
    );
    let err = LockClient::connect(&dead).await.unwrap_err();
    assert!(err.is_backend(), "{err}");
}

/// the primary is paused (SIGSTOP), not killed; the sentinels promote the
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
    crate::support::server::redis::RedisServer::signal(pid, "CONT");
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

/// a failover that loses the last grant, to a replica whose clock is 30 s
/// behind. A gets T1 (replicated); the replica is paused and cut off from the primary; A gets
/// T2 on the primary alone; the primary is killed for good, the replica resumed and promoted;
/// B then gets T3 from it. T3 must be above T2, though the promoted node never saw T2 and its
/// clock (the old floor) reads below it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_increase_across_a_lossy_failover_to_a_replica_whose_clock_is_behind() {
    let ns = test_namespace!();
    let behind = Duration::from_secs(30);
    let mut setup =
        tokio::task::block_in_place(|| SentinelSetup::start_with_replica_clock_behind(behind));
    let ttl = Duration::from_secs(10);
    let a = client(&setup, &ns, ttl).await;

    // T1, released, and both on the replica.
    let first = a.mutex("k").lock().await.unwrap();
    let t1 = first.fencing_token();
    first.release().await.unwrap();
    let mut replica = crate::support::redis::connection(&setup.replica.url()).await;
    let fence = format!("{ns}:{{k}}:fence");
    let lock = format!("{ns}:{{k}}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (counter, held): (Option<u64>, bool) = redis::pipe()
            .get(&fence)
            .exists(&lock)
            .query_async(&mut replica)
            .await
            .unwrap();
        if counter == Some(t1) && !held {
            break;
        }
        assert!(Instant::now() < deadline, "T1 never reached the replica");
        sleep(Duration::from_millis(20)).await;
    }
    drop(replica);

    // Cut the replica off: paused, and its link dropped on the primary's side, so nothing
    // written from now on reaches it (a paused replica's socket would still buffer it).
    let replica_pid = tokio::task::block_in_place(|| setup.replica.pid());
    crate::support::server::redis::RedisServer::signal(replica_pid, "STOP");
    let dropped: i64 = tokio::task::block_in_place(|| {
        crate::support::query_port(
            setup.primary.port(),
            redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("replica"),
        )
    })
    .unwrap();
    assert_eq!(
        dropped, 1,
        "the replica's link to the primary was not dropped"
    );

    // T2 on the primary alone.
    let second = a.mutex("k").lock().await.unwrap();
    let t2 = second.fencing_token();
    assert!(t2 > t1, "T2 {t2} not above T1 {t1}");

    // The primary dies for good; the replica, resumed, is promoted.
    let started = Instant::now();
    tokio::task::block_in_place(|| {
        setup.primary.kill();
        crate::support::server::redis::RedisServer::signal(replica_pid, "CONT");
        setup.until_replica_promoted();
    });
    let failover = started.elapsed();
    let promoted_behind = tokio::task::block_in_place(|| setup.replica_clock_behind());

    // B's grant on the promoted replica, which never saw T2.
    let b = client(&setup, &ns, ttl).await;
    let third = timeout(Duration::from_secs(20), b.mutex("k").lock())
        .await
        .expect("no grant from the promoted replica")
        .unwrap();
    let t3 = third.fencing_token();
    let gap_us = i128::from(t3) - i128::from(t2);
    println!(
        "T1 {t1}, T2 {t2} (T1 + {} µs), T3 {t3}: T3 - T2 = {gap_us} µs; promoted {failover:?} \
         after the primary was killed, its clock {promoted_behind:?} behind",
        t2 - t1
    );
    assert!(
        t3 > t2,
        "the fencing token went backwards across the failover: T3 {t3} is {} µs below T2 {t2} \
         (the promoted replica's clock reads {promoted_behind:?} behind; failover took {failover:?})",
        -gap_us
    );
    drop(third);
    drop(second);
    a.shutdown().await;
    b.shutdown().await;
}

/// the client's clock is a floor for fencing tokens, so one
/// far ahead must not push them out of reach. Called directly with the largest clock a client
/// can send, the acquire script lifts the token exactly half the fence counter's TTL (30 min)
/// above the server's clock, no further, and the counter then lives its full TTL (an hour), so
/// it expires only once the server's clock has passed the token and restarts above it. A clock
/// argument that is no number is ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_clock_far_ahead_lifts_tokens_at_most_half_the_fence_ttl() {
    let ns = test_namespace!();
    let setup = tokio::task::block_in_place(SentinelSetup::start);
    // A first grant loads the library on the primary.
    let a = client(&setup, &ns, Duration::from_secs(10)).await;
    a.mutex("k").lock().await.unwrap().release().await.unwrap();
    let primary = setup.primary.url();
    let libraries = crate::support::redis::libraries(&primary).await;
    let [library] = libraries.as_slice() else {
        panic!("expected one function library, found {libraries:?}");
    };
    let mut con = crate::support::redis::connection(&primary).await;
    let lock = format!("{ns}:{{raw}}");
    let fence = format!("{lock}:fence");
    let fence_ttl_ms: i64 = 3_600_000;
    let server_us = async |con: &mut redis::aio::MultiplexedConnection| -> i64 {
        let (s, us): (i64, i64) = redis::cmd("TIME").query_async(con).await.unwrap();
        s * 1_000_000 + us
    };
    let acquire = async |con: &mut redis::aio::MultiplexedConnection, clock: &str| -> i64 {
        let reply: Vec<i64> = redis::cmd("FCALL")
            .arg(format!("{library}_acquire"))
            .arg(4)
            .arg(&lock)
            .arg(format!("{lock}:q"))
            .arg(format!("{lock}:w"))
            .arg(&fence)
            .arg("raw.1")
            .arg(1000)
            .arg(0)
            .arg(fence_ttl_ms)
            .arg(1000)
            .arg(format!("{lock}:c:"))
            .arg(clock)
            .query_async(con)
            .await
            .unwrap();
        assert_eq!(reply.first(), Some(&1), "not granted: {reply:?}");
        let _: () = redis::cmd("DEL").arg(&lock).query_async(con).await.unwrap();
        reply[1]
    };

    let before = server_us(&mut con).await;
    let ignored = acquire(&mut con, "not-a-clock").await;
    let after = server_us(&mut con).await;
    assert!(
        (before..=after).contains(&ignored),
        "a clock argument that is no number moved the token: {ignored} outside server time \
         {before}..={after}"
    );

    let half_ttl_us = fence_ttl_ms * 1000 / 2;
    let before = server_us(&mut con).await;
    let lifted = acquire(&mut con, &u64::MAX.to_string()).await;
    let after = server_us(&mut con).await;
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&fence)
        .query_async(&mut con)
        .await
        .unwrap();
    println!(
        "a clock of u64::MAX µs: token {} s above the server's clock, counter TTL {pttl} ms",
        (lifted - before) as f64 / 1e6
    );
    assert!(
        (before + half_ttl_us..=after + half_ttl_us).contains(&lifted),
        "a far-ahead client clock lifted the token to {lifted}, not half the fence TTL above \
         server time {before}..={after}"
    );
    assert!(
        pttl > fence_ttl_ms - 10_000,
        "the lifted counter lives {pttl} ms, less than the fence TTL: it could expire and \
         restart below the token"
    );
    // The next grant, with a clock that is right, counts on from there.
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros();
    let next = acquire(&mut con, &now_us.to_string()).await;
    assert_eq!(next, lifted + 1);
    a.shutdown().await;
}
