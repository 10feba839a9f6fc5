//! The scenario the Redis Cluster and Sentinel fault tests share: a held lock and queued
//! waiters across a failover of the primary that serves it.

use std::future::Future;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use distlock::{LockClient, MutexGuard};
use tokio::time::{sleep, timeout, Instant};

/// A client for `url` (any scheme `LockClient::connect` takes) in namespace `ns` with lease
/// `ttl`.
pub async fn client_for(url: &str, ns: &str, ttl: Duration) -> LockClient {
    LockClient::builder_for(url)
        .await
        .unwrap()
        .namespace(ns)
        .ttl(ttl)
        .build()
        .unwrap()
}

/// A holder (from `connect`, whose lease must outlast the takeover) holds `k` and three
/// waiters queue behind it; then `fault` makes a replica take over from the primary serving
/// `k`, and `after` runs (a check of the new primary). No waiter is granted while the holder
/// still believes it holds; the holder keeps its lock through the takeover (`settle` later,
/// past a renewal against the new primary); on release the waiters are served in order within
/// moments (grant messages reach them from the new primary); every token is above every earlier
/// one, also after the counter on `new_primary()` (a Redis URL) is set back, as a failover that
/// lost its last increments would leave it.
pub async fn held_across_a_failover<C, Fut, A, AFut>(
    ns: &str,
    connect: C,
    settle: Duration,
    fault: impl FnOnce(),
    after: A,
    new_primary: impl FnOnce() -> String,
) where
    C: Fn() -> Fut,
    Fut: Future<Output = LockClient>,
    A: FnOnce() -> AFut,
    AFut: Future<Output = ()>,
{
    let holder = connect().await;
    let first = holder.mutex("k").lock().await.unwrap();
    let first_token = first.fencing_token();
    // The holder's guard, where every waiter can look at it when it is granted.
    let held: Arc<StdMutex<Option<MutexGuard>>> = Arc::new(StdMutex::new(Some(first)));
    let grants = Arc::new(StdMutex::new(vec![(usize::MAX, first_token)]));
    let mut tasks = Vec::new();
    for i in 0..3 {
        let c = connect().await;
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
    tokio::task::block_in_place(fault);
    after().await;
    sleep(settle).await;
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
    assert!(
        served_in < Duration::from_secs(3),
        "waiters took {served_in:?}"
    );

    let mut conn = super::redis::connection(&new_primary()).await;
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
}
