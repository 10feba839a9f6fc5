//! Cancellation torture: thousands of `lock()` futures dropped at random points (tiny
//! timeouts, aborted tasks, futures polled a few times and dropped) among real holders.
//! Afterwards: no overlap was ever seen, fencing tokens only grew, and no holder or waiter
//! entry is left. Run on every backend by the suite, and on the memory backend on a paused
//! clock too.

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::task::Poll;
use std::time::Duration;

use tokio::time::{sleep, timeout};

use super::server::Env;

/// A small deterministic generator (xorshift64*), seeded per task.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

fn seed() -> u64 {
    std::env::var("DISTLOCK_TORTURE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed)
}

#[derive(Default)]
struct Record {
    inside: AtomicUsize,
    violations: AtomicUsize,
    grants: AtomicUsize,
    /// Grants to the cancellers' lock futures: the race under test.
    canceller_grants: AtomicUsize,
    cancelled: AtomicUsize,
    /// How long the last holder waited for its grant, in microseconds: the patience a
    /// canceller needs to be granted at all on a loaded machine.
    holder_wait_us: AtomicU64,
    fences: StdMutex<Vec<u64>>,
}

impl Record {
    /// Runs a critical section for `guard`'s fencing token.
    async fn critical(&self, fence: u64, hold: Duration) {
        if self.inside.fetch_add(1, Ordering::SeqCst) != 0 {
            self.violations.fetch_add(1, Ordering::SeqCst);
        }
        self.fences.lock().unwrap().push(fence);
        self.grants.fetch_add(1, Ordering::SeqCst);
        if hold.is_zero() {
            tokio::task::yield_now().await;
        } else {
            sleep(hold).await;
        }
        self.inside.fetch_sub(1, Ordering::SeqCst);
    }
}

/// How many grants to the cancellers' futures make the race exercised.
const RACED: usize = 20;

/// Polls `fut` at most `polls` times, yielding in between, then drops it.
async fn poll_then_drop<F: Future>(fut: F, polls: u64) -> Option<F::Output> {
    let mut fut = pin!(fut);
    for _ in 0..polls {
        if let Poll::Ready(out) = futures::poll!(fut.as_mut()) {
            return Some(out);
        }
        tokio::task::yield_now().await;
    }
    None
}

/// `holders` take the key a quarter of `rounds` times each, `cancellers` start `rounds` lock
/// futures each and drop most. `unit`: the time scale of holds and timeouts. The timer has
/// millisecond resolution, so on the paused clock the unit must be a millisecond for timeouts
/// to race holds at all.
pub async fn torture(env: &Env, holders: usize, cancellers: usize, rounds: u64, unit: Duration) {
    let seed = seed();
    let record = Arc::new(Record::default());
    let mut clients = Vec::new();
    let mut tasks = Vec::new();

    for h in 0..holders {
        let client = env.client().await;
        clients.push(client.clone());
        let record = record.clone();
        let mut rng = Rng::new(seed ^ (h as u64 + 1));
        tasks.push(tokio::spawn(async move {
            for _ in 0..rounds / 4 {
                let asked = tokio::time::Instant::now();
                let guard = client.mutex("torture").lock().await.unwrap();
                let waited = u64::try_from(asked.elapsed().as_micros()).unwrap_or(u64::MAX);
                record.holder_wait_us.store(waited, Ordering::SeqCst);
                let hold = unit * rng.below(3) as u32;
                record.critical(guard.fencing_token(), hold).await;
                if rng.below(2) == 0 {
                    guard.release().await.unwrap();
                } else {
                    drop(guard);
                }
            }
        }));
    }

    for c in 0..cancellers {
        let client = env.client().await;
        clients.push(client.clone());
        let record = record.clone();
        let mut rng = Rng::new(seed ^ (0x1000 + c as u64));
        tasks.push(tokio::spawn(async move {
            // `rounds`, and more (up to four times as many) until the cancellers were granted
            // often enough for the race to mean something: a loaded machine slows the grants
            // their short-lived futures can catch, so the extra rounds time out at random
            // within twice what a holder waited last, whatever the scale of `unit`.
            for round in 0.. {
                let raced = record.canceller_grants.load(Ordering::SeqCst) > RACED;
                if round >= rounds && (raced || round >= rounds * 4) {
                    break;
                }
                let mutex = client.mutex("torture");
                let extra = round >= rounds;
                let got = match if extra { 0 } else { rng.below(3) } {
                    // A tiny timeout.
                    0 => {
                        let limit = if extra {
                            let wait = record.holder_wait_us.load(Ordering::SeqCst);
                            Duration::from_micros(rng.below(2 * wait.clamp(1, 500_000)))
                        } else {
                            unit * rng.below(12) as u32
                        };
                        timeout(limit, mutex.lock()).await.ok()
                    }
                    // A few polls, then drop.
                    1 => poll_then_drop(mutex.lock(), rng.below(40)).await,
                    // A spawned task, aborted after a few yields.
                    _ => {
                        let task = tokio::spawn(mutex.lock());
                        for _ in 0..rng.below(40) {
                            tokio::task::yield_now().await;
                        }
                        task.abort();
                        task.await.ok()
                    }
                };
                match got {
                    Some(result) => {
                        let guard = result.unwrap();
                        record.canceller_grants.fetch_add(1, Ordering::SeqCst);
                        record.critical(guard.fencing_token(), Duration::ZERO).await;
                        drop(guard);
                    }
                    None => {
                        record.cancelled.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
        }));
    }

    for t in tasks {
        timeout(Duration::from_secs(120), t)
            .await
            .unwrap_or_else(|_| panic!("torture stalled on {} (seed {seed})", env.name))
            .unwrap();
    }
    for client in &clients {
        client.shutdown().await;
    }

    let cancelled = record.cancelled.load(Ordering::SeqCst);
    let grants = record.grants.load(Ordering::SeqCst);
    let raced = record.canceller_grants.load(Ordering::SeqCst);
    eprintln!(
        "{} seed {seed}: {grants} grants ({raced} to cancellers), {cancelled} cancelled lock() futures",
        env.name
    );
    assert_eq!(
        record.violations.load(Ordering::SeqCst),
        0,
        "two holders at once (seed {seed})"
    );
    assert!(
        cancelled as u64 >= rounds * cancellers as u64 / 4,
        "too few cancellations to mean anything: {cancelled}"
    );
    assert!(
        raced > RACED,
        "cancellers almost never got the lock ({raced} grants): the race is not exercised"
    );
    let fences = record.fences.lock().unwrap().clone();
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fencing tokens went backwards (seed {seed})"
    );
    env.assert_clean().await;
    // The lock is free: a newcomer gets it at once.
    let fresh = env.client().await;
    let guard = fresh.mutex("torture").try_lock().await.unwrap();
    assert!(guard.fencing_token() > fences.last().copied().unwrap_or(0));
    guard.release().await.unwrap();
    fresh.shutdown().await;
}
