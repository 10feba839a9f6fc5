//! The lock contract against a real `redis-server` (one per test binary, a namespace per test).
//! Contenders use separate `LockClient`s, with their own connections, as separate processes
//! would.
#![cfg(feature = "redis")]

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use distlock::backend::RedisBackend;
use distlock::LockClient;
use support::{shared_redis, RedisServer};
use tokio::time::{sleep, timeout, Instant};

async fn client_at(url: &str, ns: &str) -> LockClient {
    let backend = RedisBackend::connect(url).await.unwrap();
    LockClient::builder(backend).namespace(ns).build().unwrap()
}

async fn client(ns: &str) -> LockClient {
    client_at(&shared_redis().url(), ns).await
}

async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// Every key in the namespace.
async fn keys_in(url: &str, ns: &str) -> Vec<String> {
    let mut conn = raw(url).await;
    let mut cursor: u64 = 0;
    let mut out = Vec::new();
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{ns}:*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await
            .unwrap();
        out.extend(batch);
        if next == 0 {
            return out;
        }
        cursor = next;
    }
}

async fn queue_len(url: &str, ns: &str, key: &str) -> usize {
    let mut conn = raw(url).await;
    redis::cmd("LLEN")
        .arg(format!("{ns}:{{{key}}}:q"))
        .query_async(&mut conn)
        .await
        .unwrap()
}

async fn until_queued(url: &str, ns: &str, key: &str, n: usize) {
    timeout(Duration::from_secs(10), async {
        while queue_len(url, ns, key).await != n {
            sleep(Duration::from_millis(2)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("expected {n} queued waiters"));
}

#[derive(Default)]
struct Overlap {
    inside: AtomicUsize,
    violations: AtomicUsize,
}

impl Overlap {
    fn enter(&self) {
        if self.inside.fetch_add(1, Ordering::SeqCst) != 0 {
            self.violations.fetch_add(1, Ordering::SeqCst);
        }
    }
    fn exit(&self) {
        self.inside.fetch_sub(1, Ordering::SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_exclusion_and_increasing_fences() {
    let ns = test_namespace!();
    let overlap = Arc::new(Overlap::default());
    let fences = Arc::new(StdMutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let client = client(&ns).await;
        let (overlap, fences) = (overlap.clone(), fences.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..25 {
                let guard = client.mutex("hot").lock().await.unwrap();
                overlap.enter();
                fences.lock().unwrap().push(guard.fencing_token());
                sleep(Duration::from_micros(300)).await;
                overlap.exit();
                if i % 2 == 0 {
                    guard.release().await.unwrap();
                } else {
                    drop(guard);
                }
            }
            client.shutdown().await;
        }));
    }
    for t in tasks {
        timeout(Duration::from_secs(60), t).await.unwrap().unwrap();
    }
    assert_eq!(overlap.violations.load(Ordering::SeqCst), 0, "two holders at once");
    let fences = fences.lock().unwrap().clone();
    assert_eq!(fences.len(), 200);
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "fences not increasing: {fences:?}");
    let left = keys_in(&shared_redis().url(), &ns).await;
    assert!(left.iter().all(|k| k.ends_with(":fence")), "keys left: {left:?}");
}
