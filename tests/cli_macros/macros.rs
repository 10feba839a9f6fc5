//! `#[distributed_lock]` end to end: in-process, and across separate clients on a real Redis
//! and a real ZooKeeper.
#![cfg(all(feature = "macros", feature = "memory"))]

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::support::contract::Overlap;
use distlock::{distributed_lock, LockClient};
use tokio::time::{sleep, timeout};

#[derive(Debug)]
enum AppError {
    Lock(distlock::Error),
    Failed,
}

impl From<distlock::Error> for AppError {
    fn from(e: distlock::Error) -> Self {
        AppError::Lock(e)
    }
}

impl AppError {
    fn lock(self) -> distlock::Error {
        match self {
            AppError::Lock(e) => e,
            AppError::Failed => panic!("expected a lock error"),
        }
    }
}

#[distributed_lock("counter:{name}", client = client)]
async fn critical(client: &LockClient, name: &str, overlap: &Overlap) -> Result<(), AppError> {
    overlap.enter();
    sleep(Duration::from_micros(300)).await;
    overlap.exit();
    Ok(())
}

async fn serialize(clients: Vec<LockClient>, rounds: usize) {
    let overlap = Arc::new(Overlap::default());
    let calls = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for c in clients.clone() {
        let (overlap, calls) = (overlap.clone(), calls.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..rounds {
                critical(&c, "shared", &overlap).await.unwrap();
                calls.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    let n = tasks.len();
    for t in tasks {
        timeout(Duration::from_secs(60), t).await.unwrap().unwrap();
    }
    for c in &clients {
        c.shutdown().await;
    }
    assert_eq!(overlap.violations(), 0, "two annotated calls ran at once");
    assert_eq!(calls.load(Ordering::SeqCst), n * rounds);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn annotated_calls_serialize_across_tasks() {
    let client = LockClient::memory();
    serialize(vec![client.clone(); 8], 20).await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn annotated_calls_serialize_across_redis_clients() {
    let ns = test_namespace!();
    let url = crate::support::server::redis::shared_redis().url();
    let mut clients = Vec::new();
    for _ in 0..4 {
        let backend = distlock::backend::RedisBackend::connect(&url)
            .await
            .unwrap();
        clients.push(LockClient::builder(backend).namespace(&ns).build().unwrap());
    }
    serialize(clients, 15).await;
}

#[cfg(feature = "zookeeper")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn annotated_calls_serialize_across_zookeeper_clients() {
    let ns = test_namespace!();
    let connect = crate::support::server::zookeeper::shared_zookeeper().connect_string();
    let mut clients = Vec::new();
    for _ in 0..4 {
        let backend = distlock::backend::ZkBackend::connect(&connect)
            .await
            .unwrap();
        clients.push(LockClient::builder(backend).namespace(&ns).build().unwrap());
    }
    serialize(clients, 10).await;
}

#[distributed_lock("accounts:{id}", client = client, timeout = "2s")]
async fn outer(client: &LockClient, id: u32, entered: &AtomicBool) -> Result<u32, AppError> {
    // The same key, the same client, the same task: re-entered, not deadlocked.
    inner(client, id, entered).await
}

#[distributed_lock("accounts:{id}", client = client, timeout = "2s")]
async fn inner(client: &LockClient, id: u32, entered: &AtomicBool) -> Result<u32, AppError> {
    entered.store(true, Ordering::SeqCst);
    // Another task still has to wait for the lock.
    let other = tokio::spawn(busy(client.clone(), id)).await.unwrap();
    assert!(other.unwrap_err().lock().is_would_block());
    Ok(id)
}

#[distributed_lock("accounts:{id}", client = client, wait = false)]
async fn busy(client: LockClient, id: u32) -> Result<(), AppError> {
    let _ = (client, id);
    Err(AppError::Failed)
}

#[tokio::test]
async fn nested_calls_with_the_same_key_reenter_and_other_tasks_wait() {
    let client = LockClient::memory();
    let entered = AtomicBool::new(false);
    let got = timeout(Duration::from_secs(5), outer(&client, 7, &entered))
        .await
        .expect("a nested call with the same key deadlocked")
        .unwrap();
    assert_eq!(got, 7);
    assert!(entered.load(Ordering::SeqCst));
    // Released afterwards.
    let after = client.mutex("accounts:7").try_lock().await.unwrap();
    drop(after);
}

#[tokio::test]
async fn wait_false_returns_would_block_and_timeout_returns_timeout() {
    let client = LockClient::memory();
    let held = client.mutex("accounts:1").lock().await.unwrap();
    let err = busy(client.clone(), 1).await.unwrap_err().lock();
    assert!(err.is_would_block(), "{err:?}");
    let flag = AtomicBool::new(false);
    let err = inner(&client, 1, &flag).await.unwrap_err().lock();
    assert!(err.is_timeout(), "{err:?}");
    assert!(
        !flag.load(Ordering::SeqCst),
        "the body ran without the lock"
    );
    held.release().await.unwrap();
}

#[distributed_lock("jobs:{n}", client = client)]
async fn ends(client: &LockClient, n: u32) -> Result<(), AppError> {
    match n {
        0 => Ok(()),
        1 => Err(AppError::Failed),
        _ => panic!("the body panicked"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_is_released_when_the_body_returns_fails_or_panics() {
    let client = LockClient::memory();
    ends(&client, 0).await.unwrap();
    assert!(client.mutex("jobs:0").try_lock().await.is_ok());
    assert!(matches!(ends(&client, 1).await, Err(AppError::Failed)));
    assert!(client.mutex("jobs:1").try_lock().await.is_ok());
    let c = client.clone();
    let panicked = tokio::spawn(async move { ends(&c, 2).await }).await;
    assert!(panicked.unwrap_err().is_panic());
    // Released by the guard's Drop, in a spawned task.
    timeout(Duration::from_secs(5), async {
        while client.mutex("jobs:2").try_lock().await.is_err() {
            sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("a panicking body left its lock held");
}

#[cfg(feature = "redis")]
#[distributed_lock("long:{n}", client = client, on_lost = "abort")]
async fn long_job(client: &LockClient, n: u32, finished: &AtomicBool) -> Result<(), AppError> {
    let _ = n;
    sleep(Duration::from_secs(30)).await;
    finished.store(true, Ordering::SeqCst);
    Ok(())
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn on_lost_abort_cancels_the_body_when_the_lease_is_deleted() {
    let ns = test_namespace!();
    let url = crate::support::server::redis::shared_redis().url();
    let backend = distlock::backend::RedisBackend::connect(&url)
        .await
        .unwrap();
    let client = LockClient::builder(backend)
        .namespace(&ns)
        .ttl(Duration::from_millis(600))
        .build()
        .unwrap();
    let finished = Arc::new(AtomicBool::new(false));
    let job = tokio::spawn({
        let (client, finished) = (client.clone(), finished.clone());
        async move { long_job(&client, 1, &finished).await }
    });
    let mut conn = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let key = format!("{ns}:{{long:1}}");
    timeout(Duration::from_secs(5), async {
        loop {
            let exists: bool = redis::cmd("EXISTS")
                .arg(&key)
                .query_async(&mut conn)
                .await
                .unwrap();
            if exists {
                break;
            }
            sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap();
    let _: () = redis::cmd("DEL")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    let err = timeout(Duration::from_secs(3), job)
        .await
        .expect("the body was not cancelled after the lock was lost")
        .unwrap()
        .unwrap_err()
        .lock();
    assert!(err.is_lost(), "{err:?}");
    assert!(!finished.load(Ordering::SeqCst));
}

struct Ledger {
    locks: LockClient,
}

#[async_trait::async_trait]
trait Settle {
    async fn settle(&self, order_id: u64) -> Result<u64, AppError>;
}

#[async_trait::async_trait]
impl Settle for Ledger {
    #[distributed_lock("orders:{order_id}", client = &self.locks, wait = false)]
    async fn settle(&self, order_id: u64) -> Result<u64, AppError> {
        let held = self
            .locks
            .mutex(format!("orders:{order_id}"))
            .try_lock()
            .await;
        assert!(
            held.unwrap_err().is_would_block(),
            "the body ran without the lock"
        );
        Ok(order_id)
    }
}

#[tokio::test]
async fn methods_under_async_trait_lock_too() {
    let ledger = Ledger {
        locks: LockClient::memory(),
    };
    assert_eq!(ledger.settle(5).await.unwrap(), 5);
    let held = ledger.locks.mutex("orders:5").lock().await.unwrap();
    assert!(ledger.settle(5).await.unwrap_err().lock().is_would_block());
    held.release().await.unwrap();
}

#[distributed_lock("doc:{id}", read, client = client)]
async fn read_doc(client: &LockClient, id: u32, inside: &AtomicUsize) -> Result<usize, AppError> {
    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
    sleep(Duration::from_millis(100)).await;
    inside.fetch_sub(1, Ordering::SeqCst);
    Ok(now)
}

#[distributed_lock("doc:{id}", write, client = client, wait = false)]
async fn try_write_doc(client: &LockClient, id: u32) -> Result<(), AppError> {
    Ok(())
}

#[distributed_lock("doc:{id}", write, client = client)]
async fn write_then_read(client: &LockClient, id: u32) -> Result<usize, AppError> {
    // A nested read of the key this task writes re-enters.
    read_doc(client, id, &AtomicUsize::new(0)).await
}

#[distributed_lock("doc:{id}", read, client = client)]
async fn read_then_write(client: &LockClient, id: u32) -> Result<(), AppError> {
    // A nested write under this task's own read would wait for itself.
    try_write_doc(client, id).await
}

#[distributed_lock("exports", permits = 2, client = client)]
async fn export(
    client: &LockClient,
    inside: &AtomicUsize,
    peak: &AtomicUsize,
) -> Result<(), AppError> {
    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
    peak.fetch_max(now, Ordering::SeqCst);
    sleep(Duration::from_millis(30)).await;
    inside.fetch_sub(1, Ordering::SeqCst);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_write_and_permit_modes() {
    let client = LockClient::memory();
    // Readers share the lock; a writer that will not wait is refused meanwhile.
    let inside = Arc::new(AtomicUsize::new(0));
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let (client, inside) = (client.clone(), inside.clone());
            tokio::spawn(async move { read_doc(&client, 1, &inside).await.unwrap() })
        })
        .collect();
    // All three inside at once (each stays 100 ms): they share it, and hold it now.
    tokio::time::timeout(Duration::from_secs(5), async {
        while inside.load(Ordering::SeqCst) < 3 {
            sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("three readers never held the lock together");
    assert!(try_write_doc(&client, 1)
        .await
        .unwrap_err()
        .lock()
        .is_would_block());
    let mut most = 0;
    for r in readers {
        most = most.max(r.await.unwrap());
    }
    assert!(most > 1, "readers never shared the lock");
    try_write_doc(&client, 1).await.unwrap();

    write_then_read(&client, 2).await.unwrap();
    let err = read_then_write(&client, 3).await.unwrap_err().lock();
    assert!(err.is_would_block(), "{err:?}");
    assert!(err.to_string().contains("upgrade"), "{err}");

    // A semaphore of two lets two bodies run at once, never three.
    let (inside, peak) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let tasks: Vec<_> = (0..6)
        .map(|_| {
            let (client, inside, peak) = (client.clone(), inside.clone(), peak.clone());
            tokio::spawn(async move { export(&client, &inside, &peak).await.unwrap() })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(peak.load(Ordering::SeqCst), 2);
}
