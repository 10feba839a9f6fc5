//! What a Redis mutex costs the server, and the guarantees the lean layout must keep:
//! commands per uncontended acquisition counted by the server itself (`INFO commandstats`,
//! script-internal calls included), fencing tokens that increase across a lease that ran out,
//! across release and re-acquire and across a counter that expired, a waiter that a newcomer
//! cannot barge past once the holder's lease ran out, the family checks between a mutex and a
//! read-write lock on one key, and coalescing: the calls one client has in flight at once go
//! as one, each claim with its own reply, and a claim cancelled mid-batch leaves nothing
//! behind. Each test that reads the server's statistics has its own `redis-server`.
#![cfg(feature = "redis")]

use std::time::Duration;

use crate::support::redis::{commandstats, connection as raw, libraries, until_only_fences};
use crate::support::server::redis::{shared_redis, RedisServer};
use distlock::backend::RedisBackend;
use distlock::LockClient;
use futures::FutureExt;
use tokio::time::sleep;

async fn client_at(url: &str, ns: &str, ttl: Duration, renew: bool) -> LockClient {
    let backend = RedisBackend::connect(url).await.unwrap();
    LockClient::builder(backend)
        .namespace(ns)
        .ttl(ttl)
        .auto_renew(renew)
        .build()
        .unwrap()
}

/// The library's acquire function called by hand for `owner` on the mutex `lock` (a 60 s TTL;
/// `wait` 1 queues it), as a client would call it.
fn fcall_acquire(library: &str, lock: &str, owner: &str, wait: u8) -> redis::Cmd {
    // A single server's fencing counter is its namespace's (`<ns>:fence`).
    let ns = lock.split_once(":{").map_or(lock, |(ns, _)| ns);
    let mut call = redis::cmd("FCALL");
    call.arg(format!("{library}_acquire"))
        .arg(4)
        .arg(lock)
        .arg(format!("{lock}:q"))
        .arg(format!("{lock}:w"))
        .arg(format!("{ns}:fence"))
        .arg(owner)
        .arg(60_000)
        .arg(wait)
        .arg(3_600_000)
        .arg(5_000)
        .arg(format!("{lock}:c:"))
        .arg(0);
    call
}

/// An uncontended lock and release of a key locked before (its fencing counter exists: the
/// web-service shape, where every key comes back) costs at most seven commands on the server,
/// the two function calls included (rslock's `SET NX PX` plus its unlock script is four): the
/// acquire's `SET NX PX`, `INCR`, `EXISTS` and `TIME` (the token is floored at server time, so
/// a counter restored from an older snapshot does not send tokens back), the release's
/// `FCALL`, `GET` and `DEL`.
#[tokio::test]
async fn an_uncontended_acquisition_costs_at_most_seven_commands() {
    let server = RedisServer::start();
    let ns = test_namespace!();
    let client = client_at(&server.url(), &ns, Duration::from_secs(10), true).await;
    let keys: Vec<String> = (0..200).map(|i| format!("order:{i}")).collect();
    for key in &keys {
        client
            .mutex(key)
            .lock()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    let mut con = raw(&server.url()).await;
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut con)
        .await
        .unwrap();
    for key in &keys {
        client
            .mutex(key)
            .lock()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    let stats = commandstats(&mut con).await;
    let total: u64 = stats.iter().map(|(_, calls)| calls).sum();
    let per_acquisition = total as f64 / keys.len() as f64;
    println!("commands per acquisition {per_acquisition:.2}: {stats:?}");
    assert!(
        per_acquisition <= 7.0,
        "{per_acquisition:.2} commands per uncontended acquisition (at most 7): {stats:?}"
    );
    client.shutdown().await;
}

/// Tokens keep increasing on one key: across release and re-acquire, across a holder's lease
/// that ran out unreleased (the holder's value expired with its token in it), across a fencing
/// counter that expired (it restarts at server time in µs), and between a mutex and a
/// read-write lock taking turns on the key.
#[tokio::test]
async fn tokens_increase_across_release_lease_expiry_and_a_lost_counter() {
    let ns = test_namespace!();
    let url = shared_redis().url();
    let a = client_at(&url, &ns, Duration::from_millis(300), false).await;
    let b = client_at(&url, &ns, Duration::from_secs(10), true).await;
    let mut last = 0;
    let mut next = |token: u64, what: &str| {
        assert!(token > last, "{what}: token {token} not above {last}");
        last = token;
    };
    for _ in 0..20 {
        let g = b.mutex("k").lock().await.unwrap();
        next(g.fencing_token(), "re-acquired after a release");
        g.release().await.unwrap();
    }
    // A's hold runs out unreleased (no renewal): the next holder still gets a larger token.
    let expired = a.mutex("k").lock().await.unwrap();
    next(expired.fencing_token(), "granted");
    sleep(Duration::from_millis(500)).await;
    let g = b.mutex("k").lock().await.unwrap();
    next(g.fencing_token(), "granted after a lease ran out");
    g.release().await.unwrap();
    drop(expired);
    // A read-write lock and a mutex taking turns draw on one counter.
    for _ in 0..3 {
        let w = b.rw_lock("k").write().await.unwrap();
        next(w.fencing_token(), "write after a mutex");
        w.release().await.unwrap();
        let g = b.mutex("k").lock().await.unwrap();
        next(g.fencing_token(), "mutex after a write");
        g.release().await.unwrap();
    }
    // The counter is gone (it expired): it restarts at server time, above every token so far.
    let mut con = raw(&url).await;
    let _: () = redis::cmd("DEL")
        .arg(format!("{ns}:fence"))
        .query_async(&mut con)
        .await
        .unwrap();
    let g = b.mutex("k").lock().await.unwrap();
    next(g.fencing_token(), "granted on a new counter");
    g.release().await.unwrap();
    a.shutdown().await;
    b.shutdown().await;
}

/// A holder's lease runs out while a waiter is queued (one that re-checks only much later): a
/// newcomer must not take the free lock past it, though nothing holds the key.
#[tokio::test]
async fn a_newcomer_does_not_barge_past_a_waiter_once_the_lease_ran_out() {
    let server = RedisServer::start();
    let url = server.url();
    let ns = test_namespace!();
    let a = client_at(&url, &ns, Duration::from_millis(300), false).await;
    let held = a.mutex("k").lock().await.unwrap();
    // A waiter queued by hand: it is alive for 60 s and never re-checks.
    let [library] = libraries(&url).await.try_into().unwrap();
    let lock = format!("{ns}:{{k}}");
    let mut con = raw(&url).await;
    let reply: Vec<redis::Value> = fcall_acquire(&library, &lock, "patient.1", 1)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(redis::from_redis_value_ref::<i64>(&reply[0]).unwrap(), 0);
    sleep(Duration::from_millis(500)).await;
    let newcomer = client_at(&url, &ns, Duration::from_secs(10), true).await;
    let err = newcomer.mutex("k").try_lock().await.unwrap_err();
    assert!(
        err.is_would_block(),
        "the newcomer took the lock past a live waiter: {err:?}"
    );
    drop(held);
    a.shutdown().await;
    newcomer.shutdown().await;
}

/// A mutex held refuses a read-write lock or semaphore claim on its key, and a read-write lock
/// held refuses a mutex claim; once each is released the other kind may take the key.
#[tokio::test]
async fn a_mutex_and_a_read_write_lock_refuse_each_other() {
    let ns = test_namespace!();
    let url = shared_redis().url();
    let a = client_at(&url, &ns, Duration::from_secs(10), true).await;
    let b = client_at(&url, &ns, Duration::from_secs(10), true).await;
    let g = a.mutex("k").lock().await.unwrap();
    let err = b.rw_lock("k").try_read().await.unwrap_err();
    assert!(err.is_kind_mismatch(), "{err:?}");
    let err = b.semaphore("k", 2).try_acquire().await.unwrap_err();
    assert!(err.is_kind_mismatch(), "{err:?}");
    g.release().await.unwrap();
    let r = b.rw_lock("k").read().await.unwrap();
    let err = a.mutex("k").try_lock().await.unwrap_err();
    assert!(err.is_kind_mismatch(), "{err:?}");
    r.release().await.unwrap();
    a.mutex("k").lock().await.unwrap().release().await.unwrap();
    a.shutdown().await;
    b.shutdown().await;
}

/// Many tasks sharing one client lock distinct keys at once: their acquire calls (and then
/// their releases) go to the server coalesced, fewer function calls than claims, and each
/// claim gets its own answer: a grant with its own token, or, for a key in use as a read-write
/// lock, and for a key holding a foreign value, its own error while the others are granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_claims_are_coalesced_with_a_reply_each() {
    let server = RedisServer::start();
    let url = server.url();
    let ns = test_namespace!();
    let client = client_at(&url, &ns, Duration::from_secs(10), true).await;
    let other = client_at(&url, &ns, Duration::from_secs(10), true).await;
    let reader = other.rw_lock("k7").read().await.unwrap();
    let mut con = raw(&url).await;
    let _: () = redis::cmd("SET")
        .arg(format!("{ns}:{{k9}}"))
        .arg("not a lock")
        .query_async(&mut con)
        .await
        .unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut con)
        .await
        .unwrap();
    let n = 200;
    let attempts = futures::future::join_all((0..n).map(|i| {
        let mutex = client.mutex(format!("k{i}"));
        async move { mutex.lock().await }
    }))
    .await;
    let mut guards = Vec::new();
    for (i, attempt) in attempts.into_iter().enumerate() {
        match (i, attempt) {
            (7, Err(err)) => assert!(err.is_kind_mismatch(), "k7: {err:?}"),
            (9, Err(err)) => assert!(err.to_string().contains("WRONGTYPE"), "k9: {err}"),
            (7 | 9, Ok(_)) => panic!("k{i} was granted"),
            (_, Ok(guard)) => guards.push(guard),
            (_, Err(err)) => panic!("k{i}: {err:?}"),
        }
    }
    let mut tokens: Vec<u64> = guards.iter().map(|g| g.fencing_token()).collect();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), n - 2, "tokens shared between claims");
    for result in futures::future::join_all(guards.into_iter().map(|g| g.release())).await {
        result.unwrap();
    }
    // Each release deleted its hold (the coalesced form's quick path for plain holds).
    let held: Vec<String> = (0..n)
        .filter(|i| *i != 7 && *i != 9)
        .map(|i| format!("{ns}:{{k{i}}}"))
        .collect();
    let left: i64 = redis::cmd("EXISTS")
        .arg(&held)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(left, 0, "holds left after their releases");
    let stats = commandstats(&mut con).await;
    let fcalls = stats
        .iter()
        .find(|(name, _)| name == "fcall")
        .map_or(0, |(_, calls)| *calls);
    println!("{n} claims, then their releases: {fcalls} function calls");
    assert!(
        fcalls < 2 * n as u64,
        "{fcalls} function calls for {n} acquisitions and releases: nothing was coalesced"
    );
    reader.release().await.unwrap();
    client.shutdown().await;
    other.shutdown().await;
}

/// A claim whose future is dropped right after its call joined a batch (polled once, among
/// 50 others, on a key another client holds, so the batch queues it) leaves nothing behind
/// once its client shut down: no hold, no queue entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_cancelled_mid_batch_leaves_nothing_behind() {
    let ns = test_namespace!();
    let url = shared_redis().url();
    let holder = client_at(&url, &ns, Duration::from_secs(10), true).await;
    let client = client_at(&url, &ns, Duration::from_secs(10), true).await;
    for round in 0..20 {
        let busy = format!("busy{round}");
        let held = holder.mutex(&busy).lock().await.unwrap();
        let others: Vec<_> = (0..50)
            .map(|i| {
                let mutex = client.mutex(format!("free{round}.{i}"));
                tokio::spawn(async move { mutex.lock().await })
            })
            .collect();
        // Polled once (its call queued for the batch being formed), then dropped.
        let cancelled = client.mutex(&busy).lock().now_or_never();
        assert!(cancelled.is_none(), "a busy key was granted");
        let free = client.mutex(format!("free{round}.x")).lock().now_or_never();
        drop(free);
        for task in others {
            task.await.unwrap().unwrap().release().await.unwrap();
        }
        held.release().await.unwrap();
    }
    client.shutdown().await;
    holder.shutdown().await;
    until_only_fences(&url, &ns).await;
}

/// The uncontended acquire goes by plain commands and leaves a hold without its token; the
/// scripts read it as a hold all the same. Here a holder's hold is gone while a waiter sleeps
/// until that holder's deadline (taken away by hand, as a lease that ran out with nobody told),
/// so the key is free with a waiter queued and the counter marked: a newcomer's `SET NX` takes
/// the key, its `INCR` is refused, and its settling must hand the lock to the waiter at once and
/// queue the newcomer behind it: served in arrival order, tokens increasing, and no key left
/// without an expiry once all is released.
#[tokio::test]
async fn a_newcomer_whose_plain_set_found_a_waiter_queued_hands_the_lock_on() {
    let ns = test_namespace!();
    let url = shared_redis().url();
    let holder = client_at(&url, &ns, Duration::from_secs(20), false).await;
    let waiter = client_at(&url, &ns, Duration::from_secs(10), true).await;
    let newcomer = client_at(&url, &ns, Duration::from_secs(10), true).await;
    let held = holder.mutex("k").lock().await.unwrap();
    let first = held.fencing_token();
    let waiting = crate::support::contract::spawn_timed_lock(waiter.mutex("k"));
    crate::support::redis::until_queued(&url, &ns, "k", 1).await;
    let mut con = raw(&url).await;
    let _: () = redis::cmd("DEL")
        .arg(format!("{ns}:{{k}}"))
        .query_async(&mut con)
        .await
        .unwrap();
    let asked = tokio::time::Instant::now();
    let late = crate::support::contract::spawn_timed_lock(newcomer.mutex("k"));
    let (granted_at, next) = tokio::time::timeout(Duration::from_secs(3), waiting)
        .await
        .expect("the queued waiter was not handed the lock")
        .unwrap();
    let next = next.unwrap();
    assert!(
        granted_at - asked < Duration::from_secs(2),
        "the waiter waited {:?} after the newcomer came",
        granted_at - asked
    );
    assert!(next.fencing_token() > first);
    sleep(Duration::from_millis(200)).await;
    assert!(
        !late.is_finished(),
        "the newcomer got the lock past the waiter"
    );
    let waiter_token = next.fencing_token();
    next.release().await.unwrap();
    let (_, last) = tokio::time::timeout(Duration::from_secs(3), late)
        .await
        .expect("the newcomer was not served after the waiter")
        .unwrap();
    let last = last.unwrap();
    assert!(last.fencing_token() > waiter_token);
    last.release().await.unwrap();
    std::mem::forget(held);
    until_only_fences(&url, &ns).await;
    holder.shutdown().await;
    waiter.shutdown().await;
    newcomer.shutdown().await;
}

/// Keys locked for the first time (no fencing counter yet: the plain `INCR` makes one) and again
/// (the counter there): the one key left behind is the namespace's counter, and it expires; an
/// inspection shows the holder (its token is not recorded on a plain hold), and an unlock of a
/// plain hold moves the next token above the old holder's.
#[tokio::test]
async fn plain_holds_leave_only_expiring_keys_and_are_inspected_and_unlocked() {
    let ns = test_namespace!();
    let url = shared_redis().url();
    let client = client_at(&url, &ns, Duration::from_secs(10), true).await;
    let keys: Vec<String> = (0..20).map(|i| format!("order:{i}")).collect();
    let mut tokens = std::collections::HashMap::new();
    for _ in 0..2 {
        for key in &keys {
            let g = client.mutex(key).lock().await.unwrap();
            let last = tokens.insert(key.clone(), g.fencing_token()).unwrap_or(0);
            assert!(g.fencing_token() > last, "{key}: tokens must increase");
            g.release().await.unwrap();
        }
    }
    let mut con = raw(&url).await;
    let left = crate::support::redis::keys_in(&url, &ns).await;
    assert_eq!(left, [format!("{ns}:fence")], "one counter per namespace");
    for key in left {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query_async(&mut con)
            .await
            .unwrap();
        assert!(ttl > 0, "{key} has no expiry ({ttl})");
    }

    let held = client.mutex("order:0").lock().await.unwrap();
    let old = held.fencing_token();
    let seen = client.inspect("order:0").await.unwrap();
    assert_eq!(seen.holders.len(), 1, "{seen:?}");
    assert!(
        seen.holders[0].fencing_token.is_none_or(|t| t == old),
        "{seen:?}"
    );
    let removed = client.force_release("order:0").await.unwrap();
    assert_eq!(removed.removed.len(), 1, "{removed:?}");
    tokio::time::timeout(Duration::from_secs(15), held.lost())
        .await
        .expect("the unlocked holder never learned it lost the lock");
    let next = client.mutex("order:0").lock().await.unwrap();
    assert!(next.fencing_token() > old);
    next.release().await.unwrap();
    client.shutdown().await;
}

/// The acquire script's own uncontended path (what a client takes where the plain commands are
/// off, or on a key it waited on a moment ago) must not barge either once the counter that
/// carried the waiter's mark expired: a restarted counter has lost the mark, so it looks at the
/// queue.
#[tokio::test]
async fn the_acquire_script_does_not_barge_past_a_waiter_on_a_restarted_counter() {
    let server = RedisServer::start();
    let url = server.url();
    let ns = test_namespace!();
    let a = client_at(&url, &ns, Duration::from_millis(300), false).await;
    let held = a.mutex("k").lock().await.unwrap();
    let [library] = libraries(&url).await.try_into().unwrap();
    let lock = format!("{ns}:{{k}}");
    let mut con = raw(&url).await;
    let acquire = |owner: &str, wait: u8| fcall_acquire(&library, &lock, owner, wait);
    // A waiter queued by hand: alive for 60 s, it never re-checks.
    let reply: Vec<redis::Value> = acquire("patient.1", 1).query_async(&mut con).await.unwrap();
    assert_eq!(redis::from_redis_value_ref::<i64>(&reply[0]).unwrap(), 0);
    sleep(Duration::from_millis(500)).await;
    let _: () = redis::cmd("DEL")
        .arg(format!("{ns}:fence"))
        .query_async(&mut con)
        .await
        .unwrap();
    let reply: Vec<redis::Value> = acquire("newcomer.1", 0)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(
        redis::from_redis_value_ref::<i64>(&reply[0]).unwrap(),
        0,
        "the script took the lock past a live waiter on a restarted counter: {reply:?}"
    );
    drop(held);
    a.shutdown().await;
}

/// Releases coalesced into one call, some of plain holds and some of holds with a waiter
/// queued behind them: the plain ones are deleted by the coalesced form's quick path, and each
/// of the others is handed to its waiter at once (not at the holder's lease end, 30 s away),
/// with a larger token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coalesced_release_hands_on_the_holds_waiters_queued_behind() {
    let server = RedisServer::start();
    let url = server.url();
    let ns = test_namespace!();
    let holder = client_at(&url, &ns, Duration::from_secs(30), true).await;
    let waiter = client_at(&url, &ns, Duration::from_secs(30), true).await;
    let n = 60;
    let guards: Vec<_> = futures::future::join_all((0..n).map(|i| {
        let mutex = holder.mutex(format!("k{i}"));
        async move { mutex.lock().await.unwrap() }
    }))
    .await;
    // Every third key gets a waiter, queued before the releases go.
    let waited: Vec<usize> = (0..n).filter(|i| i % 3 == 0).collect();
    let waits: Vec<_> = waited
        .iter()
        .map(|i| {
            let mutex = waiter.mutex(format!("k{i}"));
            tokio::spawn(async move { mutex.lock().await })
        })
        .collect();
    let mut con = raw(&url).await;
    let queued = |con: &mut redis::aio::MultiplexedConnection| {
        let keys: Vec<String> = waited.iter().map(|i| format!("{ns}:{{k{i}}}:q")).collect();
        let mut con = con.clone();
        async move {
            let mut total = 0;
            for key in keys {
                let len: i64 = redis::cmd("LLEN")
                    .arg(key)
                    .query_async(&mut con)
                    .await
                    .unwrap();
                total += len;
            }
            total
        }
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while queued(&mut con).await < waited.len() as i64 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the waiters did not queue"
        );
        sleep(Duration::from_millis(10)).await;
    }
    let tokens: Vec<u64> = guards.iter().map(|g| g.fencing_token()).collect();
    let released = tokio::time::Instant::now();
    for result in futures::future::join_all(guards.into_iter().map(|g| g.release())).await {
        result.unwrap();
    }
    for (i, wait) in waited.iter().zip(waits) {
        let guard = tokio::time::timeout(Duration::from_secs(5), wait)
            .await
            .unwrap_or_else(|_| panic!("k{i}: not handed on within 5 s of its release"))
            .unwrap()
            .unwrap();
        assert!(guard.fencing_token() > tokens[*i], "k{i}: token went back");
        guard.release().await.unwrap();
    }
    println!(
        "{} waiters granted {:?} after the coalesced releases",
        waited.len(),
        released.elapsed()
    );
    let plain: Vec<String> = (0..n)
        .filter(|i| i % 3 != 0)
        .map(|i| format!("{ns}:{{k{i}}}"))
        .collect();
    let left: i64 = redis::cmd("EXISTS")
        .arg(&plain)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(left, 0, "plain holds left after their releases");
    holder.shutdown().await;
    waiter.shutdown().await;
}
