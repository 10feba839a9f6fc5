//! Attack review of issue 29 (the Redis mutex as one string value, the `q` mark on the fencing
//! counter, coalesced calls), against a real `redis-server`.
#![cfg(feature = "redis")]

mod support;

use std::time::Duration;

use support::proxy::Proxy;
use support::redis::{client, connection, until_queued};
use support::server::redis::shared_redis;
use tokio::time::{sleep, timeout};

fn via(proxy: &Proxy) -> String {
    format!("redis://127.0.0.1:{}/", proxy.port())
}

/// A holder dies while a waiter is queued; the waiter's own re-check at the dead holder's lease
/// end is late (its host is briefly unreachable). A newcomer's `try_lock` in that window must
/// not take the lock past the queued waiter: the lock goes to the head of the queue.
/// With `counter_expired`, the fencing counter reached the end of its life (`FENCE_TTL`, an
/// hour after it (re)started; simulated with `PEXPIRE`) while the waiter was queued, which must
/// change nothing.
async fn newcomer_after_a_dead_holder(counter_expired: bool) {
    let ns = format!("{}.{counter_expired}", test_namespace!());
    let url = shared_redis().url();
    let pa = Proxy::start(shared_redis().port());
    let pb = Proxy::start(shared_redis().port());
    let (ttl, handoff) = (Duration::from_millis(900), Duration::from_millis(300));
    let a = client(&via(&pa), &ns, ttl, handoff, true).await;
    let b = client(&via(&pb), &ns, Duration::from_secs(10), handoff, true).await;
    let c = client(&url, &ns, ttl, handoff, true).await;

    let held = a.mutex("k").lock().await.unwrap();
    let waiter = tokio::spawn(b.mutex("k").lock());
    until_queued(&url, &ns, "k", 1).await;
    if counter_expired {
        let _: i64 = redis::cmd("PEXPIRE")
            .arg(format!("{ns}:{{k}}:fence"))
            .arg(1)
            .query_async(&mut connection(&url).await)
            .await
            .unwrap();
        sleep(Duration::from_millis(20)).await;
    }
    // A's host dies (its renewals stop); B's is unreachable for a moment.
    pa.blackhole();
    pb.blackhole();
    sleep(ttl + Duration::from_millis(400)).await;
    let newcomer = c.mutex("k").try_lock().await;
    let barged = newcomer.is_ok();
    drop(newcomer);
    // The partitions heal as TCP sees it: the old connections are dead, new ones work.
    pb.heal();
    pa.heal();
    let b_guard = timeout(Duration::from_secs(10), waiter).await;
    assert!(
        !barged,
        "a newcomer took the lock past a live queued waiter (counter expired: {counter_expired})"
    );
    let b_guard = b_guard
        .expect("the waiter was never granted")
        .unwrap()
        .unwrap();
    drop(b_guard);
    drop(held);
    for cl in [a, b, c] {
        cl.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomer_does_not_barge_past_a_queued_waiter_when_the_holder_dies() {
    newcomer_after_a_dead_holder(false).await;
}

/// Fails on h29: the `q` mark lives on the fencing counter, which expires an hour after it
/// (re)started whatever the traffic; once it has, nothing marks the waiter still queued, and
/// the uncontended path (`INCR` + `SET NX`) takes the free key past it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomer_does_not_barge_past_a_queued_waiter_after_the_counter_expired() {
    newcomer_after_a_dead_holder(true).await;
}
