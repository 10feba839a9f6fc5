//! What a Redis mutex costs the server (issue 29), and the guarantees the lean layout must keep:
//! commands per uncontended acquisition counted by the server itself (`INFO commandstats`,
//! script-internal calls included), fencing tokens that increase across a lease that ran out,
//! across release and re-acquire and across a counter that expired, a waiter that a newcomer
//! cannot barge past once the holder's lease ran out, and the family checks between a mutex
//! and a read-write lock on one key. Each test has its own `redis-server` where it reads the
//! server's statistics or its keys.
#![cfg(feature = "redis")]

mod support;

use std::time::Duration;

use distlock::backend::RedisBackend;
use distlock::LockClient;
use support::redis::{connection as raw, libraries};
use support::server::redis::{shared_redis, RedisServer};
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

/// The server's command counts by name (`INFO commandstats`), the statistics commands left out.
async fn commandstats(con: &mut redis::aio::MultiplexedConnection) -> Vec<(String, u64)> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(con)
        .await
        .unwrap();
    info.lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest.strip_prefix("calls=")?.split(',').next()?.parse().ok()?;
            (!name.starts_with("info") && !name.starts_with("config")).then(|| (name.to_owned(), calls))
        })
        .collect()
}

/// An uncontended lock and release of a key locked before (its fencing counter exists: the
/// web-service shape, where every key comes back) costs at most six commands on the server, the
/// two function calls included: the bound (rslock's `SET NX PX` plus its unlock script
/// is four).
#[tokio::test]
async fn an_uncontended_acquisition_costs_at_most_six_commands() {
    let server = RedisServer::start();
    let ns = test_namespace!();
    let client = client_at(&server.url(), &ns, Duration::from_secs(10), true).await;
    let keys: Vec<String> = (0..200).map(|i| format!("order:{i}")).collect();
    for key in &keys {
        client.mutex(key).lock().await.unwrap().release().await.unwrap();
    }
    let mut con = raw(&server.url()).await;
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut con)
        .await
        .unwrap();
    for key in &keys {
        client.mutex(key).lock().await.unwrap().release().await.unwrap();
    }
    let stats = commandstats(&mut con).await;
    let total: u64 = stats.iter().map(|(_, calls)| calls).sum();
    let per_acquisition = total as f64 / keys.len() as f64;
    println!("commands per acquisition {per_acquisition:.2}: {stats:?}");
    assert!(
        per_acquisition <= 6.0,
        "{per_acquisition:.2} commands per uncontended acquisition (at most 6): {stats:?}"
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
        .arg(format!("{ns}:{{k}}:fence"))
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
    let reply: Vec<redis::Value> = redis::cmd("FCALL")
        .arg(format!("{library}_acquire"))
        .arg(4)
        .arg(&lock)
        .arg(format!("{lock}:q"))
        .arg(format!("{lock}:w"))
        .arg(format!("{lock}:fence"))
        .arg("patient.1")
        .arg(60_000)
        .arg(1)
        .arg(3_600_000)
        .arg(5_000)
        .arg(format!("{lock}:c:"))
        .arg(0)
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

/// A mutex held, or only waited for, refuses a read-write lock claim on its key, and a
/// read-write lock held refuses a mutex claim; once each is released the other kind may take
/// the key.
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
