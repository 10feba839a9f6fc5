//! Behaviour checks every backend's tests share: an overlap counter and a contention run.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use distlock::LockClient;
use tokio::time::{sleep, timeout};

/// Counts holders inside the critical section; more than one at a time is a violation.
#[derive(Default)]
pub struct Overlap {
    inside: AtomicUsize,
    violations: AtomicUsize,
}

impl Overlap {
    pub fn enter(&self) {
        if self.inside.fetch_add(1, Ordering::SeqCst) != 0 {
            self.violations.fetch_add(1, Ordering::SeqCst);
        }
    }

    pub fn exit(&self) {
        self.inside.fetch_sub(1, Ordering::SeqCst);
    }

    pub fn violations(&self) -> usize {
        self.violations.load(Ordering::SeqCst)
    }
}

/// Every client takes `key` `rounds` times in its own task, holding it for `hold` every third
/// round (yielding otherwise), releasing explicitly every other round and by `Drop` in between.
/// Asserts that no two holders overlapped and that fencing tokens strictly increase in grant
/// order; shuts the clients down and returns the tokens.
pub async fn contend(
    clients: Vec<LockClient>,
    key: &str,
    rounds: usize,
    hold: Duration,
) -> Vec<u64> {
    let overlap = Arc::new(Overlap::default());
    let fences = Arc::new(StdMutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for client in clients {
        let (overlap, fences, key) = (overlap.clone(), fences.clone(), key.to_owned());
        tasks.push(tokio::spawn(async move {
            for i in 0..rounds {
                let guard = client.mutex(&key).lock().await.unwrap();
                overlap.enter();
                fences.lock().unwrap().push(guard.fencing_token());
                if i % 3 == 0 {
                    sleep(hold).await;
                } else {
                    tokio::task::yield_now().await;
                }
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
    let n = tasks.len();
    for t in tasks {
        timeout(Duration::from_secs(120), t)
            .await
            .expect("a contender never finished")
            .unwrap();
    }
    assert_eq!(overlap.violations(), 0, "two holders at once");
    let fences = fences.lock().unwrap().clone();
    assert_eq!(fences.len(), n * rounds);
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fencing tokens not strictly increasing in grant order: {fences:?}"
    );
    fences
}
