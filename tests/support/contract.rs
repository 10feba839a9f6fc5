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

/// Takes an exclusive hold of a key on a client, as some primitive does: the guard is boxed,
/// and dropping it releases.
pub type Take = Arc<
    dyn Fn(
            LockClient,
            String,
        ) -> futures::future::BoxFuture<'static, distlock::Result<Box<dyn Send>>>
        + Send
        + Sync,
>;

/// [`Take`] for a `Mutex`.
pub fn take_mutex() -> Take {
    Arc::new(|c, key| {
        Box::pin(async move { Ok(Box::new(c.mutex(key).lock().await?) as Box<dyn Send>) })
    })
}

/// [`Take`] for an `RwLock`'s write side.
pub fn take_write() -> Take {
    Arc::new(|c, key| {
        Box::pin(async move { Ok(Box::new(c.rw_lock(key).write().await?) as Box<dyn Send>) })
    })
}

/// [`Take`] for the one permit of a one-permit `Semaphore`.
pub fn take_permit() -> Take {
    Arc::new(|c, key| {
        Box::pin(async move { Ok(Box::new(c.semaphore(key, 1).acquire().await?) as Box<dyn Send>) })
    })
}

/// [`Take`] for a `MultiLock` over `<key>:a` and `<key>:b`.
pub fn take_multi() -> Take {
    Arc::new(|c, key| {
        Box::pin(async move {
            let keys = [format!("{key}:a"), format!("{key}:b")];
            Ok(Box::new(c.multi_lock(keys).lock().await?) as Box<dyn Send>)
        })
    })
}

/// Cancellation torture on mutexes: see [`torture_with`].
pub async fn torture(
    holders: Vec<LockClient>,
    cancellers: Vec<LockClient>,
    key: &str,
    holder_rounds: u64,
    cancel_rounds: u64,
    timeout_unit: Duration,
) {
    torture_with(
        take_mutex(),
        holders,
        cancellers,
        key,
        holder_rounds,
        cancel_rounds,
        timeout_unit,
    )
    .await;
}

/// Cancellation torture: `holders` take `key` (through `take`) `holder_rounds` times each and
/// hold it briefly; meanwhile every canceller starts `cancel_rounds` acquisitions and cancels
/// most of them at random points, by a tiny timeout (`r * timeout_unit`) or by aborting the task
/// after a few polls. Asserts that no two holders ever overlapped and that many futures were
/// cancelled; shuts every client down. The caller then checks the backend holds no trace of the
/// key.
pub async fn torture_with(
    take: Take,
    holders: Vec<LockClient>,
    cancellers: Vec<LockClient>,
    key: &str,
    holder_rounds: u64,
    cancel_rounds: u64,
    timeout_unit: Duration,
) {
    let overlap = Arc::new(Overlap::default());
    let cancelled = Arc::new(AtomicUsize::new(0));
    let clients: Vec<LockClient> = holders.iter().chain(&cancellers).cloned().collect();
    let cancellers_count = cancellers.len() as u64;
    let mut tasks = Vec::new();
    for (h, c) in (0u64..).zip(holders) {
        let (overlap, key, take) = (overlap.clone(), key.to_owned(), take.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..holder_rounds {
                let guard = take(c.clone(), key.clone()).await.unwrap();
                overlap.enter();
                sleep(Duration::from_micros(250 * ((i + h) % 4))).await;
                overlap.exit();
                drop(guard);
            }
        }));
    }
    for (w, c) in (0u64..).zip(cancellers) {
        let (overlap, cancelled, key, take) = (
            overlap.clone(),
            cancelled.clone(),
            key.to_owned(),
            take.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut x = w * 7919 + 13;
            for _ in 0..cancel_rounds {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let r = (x >> 33) % 1000;
                let lock = take(c.clone(), key.clone());
                let got = if r % 2 == 0 {
                    let limit = timeout_unit * u32::try_from(r).unwrap();
                    timeout(limit, lock).await.ok()
                } else {
                    let task = tokio::spawn(lock);
                    for _ in 0..(r % 7) {
                        tokio::task::yield_now().await;
                    }
                    task.abort();
                    task.await.ok()
                };
                match got {
                    Some(guard) => {
                        let guard = guard.unwrap();
                        overlap.enter();
                        overlap.exit();
                        drop(guard);
                    }
                    None => {
                        cancelled.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
        }));
    }
    for t in tasks {
        timeout(Duration::from_secs(120), t)
            .await
            .expect("a torture task never finished")
            .unwrap();
    }
    for c in &clients {
        c.shutdown().await;
    }
    assert_eq!(overlap.violations(), 0, "two holders at once");
    // Half the attempts are aborted after a few polls and most of the rest time out mid-call:
    // fewer than a third cancelled means the torture did not reach the paths it is for.
    let attempts = cancel_rounds * cancellers_count;
    let cancelled = cancelled.load(Ordering::SeqCst) as u64;
    assert!(
        cancelled * 3 >= attempts,
        "too few cancellations to mean anything: {cancelled} of {attempts}"
    );
}

/// [`torture_with`] for an `RwLock`'s writers, one-permit semaphores and multi-locks in turn,
/// on keys `torture0..2`, with fresh clients from `clients(n)` for each.
pub async fn torture_family<F, Fut>(mut clients: F, holder_rounds: u64, cancel_rounds: u64)
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = Vec<LockClient>>,
{
    for (i, take) in [take_write(), take_permit(), take_multi()]
        .into_iter()
        .enumerate()
    {
        torture_with(
            take,
            clients(2).await,
            clients(4).await,
            &format!("torture{i}"),
            holder_rounds,
            cancel_rounds,
            Duration::from_micros(4),
        )
        .await;
    }
}

/// What the partition check needs of a guard, for every guard type.
pub trait Guard: Send + Sync {
    fn lost_signal(&self) -> futures::future::BoxFuture<'_, ()>;
    fn lease_end(&self) -> std::time::Instant;
}

macro_rules! impl_guard {
    ($($t:ty),*) => {$(
        impl Guard for $t {
            fn lost_signal(&self) -> futures::future::BoxFuture<'_, ()> {
                Box::pin(self.lost())
            }
            fn lease_end(&self) -> std::time::Instant {
                self.valid_until()
            }
        }
    )*};
}
impl_guard!(
    distlock::MutexGuard,
    distlock::RwLockReadGuard,
    distlock::RwLockWriteGuard,
    distlock::SemaphorePermit,
    distlock::Leadership
);

/// An acquisition (`lock()`, `write()`, ...) in its own task that notes when it was granted.
pub fn spawn_timed<G: Send + 'static>(
    acquire: impl std::future::Future<Output = distlock::Result<G>> + Send + 'static,
) -> tokio::task::JoinHandle<(tokio::time::Instant, distlock::Result<G>)> {
    tokio::spawn(async move {
        let g = acquire.await;
        (tokio::time::Instant::now(), g)
    })
}

/// A mutex `lock()` in its own task that notes when it was granted.
pub fn spawn_timed_lock(
    mutex: distlock::Mutex,
) -> tokio::task::JoinHandle<(tokio::time::Instant, distlock::Result<distlock::MutexGuard>)> {
    spawn_timed(mutex.lock())
}

/// The partition check: `waiter` (from [`spawn_timed`]) is queued behind `held`. Runs `cut`
/// (which partitions the holder from the service, e.g. a proxy blackhole), waits for both the
/// holder's `lost()` and the waiter's grant, and asserts the holder stopped believing it held
/// the lock first. Returns the waiter's guard and, from the cut, when the holder stopped
/// believing and when the waiter was granted.
///
/// When the holder stopped believing is the earlier of its lease's end (`valid_until`, fixed
/// by the guard, not by when a task ran) and the moment this task saw `lost()` resolve: on a
/// loaded machine the task may be scheduled well after the signal, and the margin a lease
/// keeps over the server's expiry is its drift margin, a few milliseconds.
pub async fn partition_then_handover<G>(
    cut: impl FnOnce(),
    held: &dyn Guard,
    waiter: tokio::task::JoinHandle<(tokio::time::Instant, distlock::Result<G>)>,
    limit: Duration,
) -> (G, Duration, Duration) {
    cut();
    let cut = tokio::time::Instant::now();
    let lost = async {
        held.lost_signal().await;
        tokio::time::Instant::now()
    };
    let (outcome, lost_at) = tokio::join!(timeout(limit, waiter), lost);
    let (granted_at, guard) = outcome
        .expect("the waiter never got the lock of the partitioned holder")
        .expect("waiter task");
    let guard = guard.expect("waiter lock()");
    let lost_at = lost_at.min(tokio::time::Instant::from_std(held.lease_end()));
    assert!(
        lost_at <= granted_at,
        "another client was granted the lock {:?} after the partition, {:?} before the old holder learned it lost it",
        granted_at - cut,
        lost_at - granted_at
    );
    (guard, lost_at - cut, granted_at - cut)
}

/// The guard an acquisition task (`tokio::spawn(m.lock())`) got, within `within`; panics
/// naming `who` otherwise.
pub async fn granted<G>(
    task: tokio::task::JoinHandle<distlock::Result<G>>,
    within: Duration,
    who: &str,
) -> G {
    timeout(within, task)
        .await
        .unwrap_or_else(|_| panic!("{who} was not granted within {within:?}"))
        .expect("acquisition task")
        .expect("acquisition")
}

/// Lease control on a guard, judged against the server through a second client: `a` and `b`
/// share a namespace and a TTL of `ttl` (a second or so). Checks what `lease_left`,
/// `set_auto_renew(false)` and `extend` promise: a fixed lease ends (for the server too: `b`
/// is granted) one TTL after the grant; an extended one outlasts its first TTL and then ends;
/// a shorter TTL is what later renewals ask for; a lost guard cannot be extended.
pub async fn lease_control(a: &LockClient, b: &LockClient, ttl: Duration) {
    let slack = Duration::from_millis(1500);
    // 1. What is left: within the TTL, not zero.
    let g = a.mutex("lease-left").lock().await.unwrap();
    let left = g.lease_left();
    assert!(
        left > Duration::ZERO && left <= ttl,
        "lease_left {left:?} with ttl {ttl:?}"
    );
    assert!(g.valid_until() > std::time::Instant::now());
    let err = g.extend(Duration::ZERO).await.unwrap_err();
    assert_eq!(err.kind(), distlock::ErrorKind::InvalidConfig, "{err}");
    drop(g);

    // 2. A fixed lease: not renewed, so the guard reports lost and the server lets `b` in,
    // both about one TTL after the grant.
    let g = a.mutex("fixed").lock().await.unwrap();
    let granted = tokio::time::Instant::now();
    g.set_auto_renew(false).unwrap();
    timeout(ttl + slack, g.lost())
        .await
        .expect("a fixed lease never ended");
    assert!(g.lease_left().is_zero());
    let b_got = timeout(ttl + slack, b.mutex("fixed").lock())
        .await
        .expect("the server kept a fixed lease past its TTL")
        .unwrap();
    assert!(
        granted.elapsed() >= ttl / 2,
        "the fixed lease ended after {:?} of a {ttl:?} TTL",
        granted.elapsed()
    );
    let err = g.extend(ttl).await.unwrap_err();
    assert!(err.is_lost(), "extending a lost lease: {err}");
    drop((g, b_got));

    // 3. A fixed lease extended to three TTLs: still held (here and on the server) past its
    // first TTL, then it ends.
    let g = a.mutex("extended").lock().await.unwrap();
    g.set_auto_renew(false).unwrap();
    g.extend(ttl * 3).await.unwrap();
    assert!(g.lease_left() > ttl * 2, "left {:?}", g.lease_left());
    sleep(ttl + ttl / 2).await;
    assert!(!g.is_lost(), "an extended lease ended at its first TTL");
    let err = b.mutex("extended").try_lock().await.unwrap_err();
    assert!(err.is_would_block(), "{err}");
    timeout(ttl * 3 + slack, g.lost())
        .await
        .expect("the extended lease never ended");
    timeout(ttl + slack, b.mutex("extended").lock())
        .await
        .expect("the server kept the extended lease")
        .unwrap()
        .release()
        .await
        .unwrap();
    drop(g);

    // 4. A shorter TTL, renewed: held across several of them; then, not renewed, it ends on
    // the server within the shorter TTL.
    let short = ttl / 2;
    let g = a.mutex("shorter").lock().await.unwrap();
    g.extend(short).await.unwrap();
    assert!(
        g.lease_left() <= short,
        "left {:?} after extend({short:?})",
        g.lease_left()
    );
    sleep(short * 3).await;
    assert!(!g.is_lost(), "a renewed shorter lease was lost");
    let err = b.mutex("shorter").try_lock().await.unwrap_err();
    assert!(err.is_would_block(), "{err}");
    g.set_auto_renew(false).unwrap();
    let off = tokio::time::Instant::now();
    timeout(short + slack, b.mutex("shorter").lock())
        .await
        .expect("the server did not take the shorter TTL")
        .unwrap()
        .release()
        .await
        .unwrap();
    assert!(
        off.elapsed() < ttl + slack / 2,
        "b waited {:?}: the server kept the old TTL",
        off.elapsed()
    );
    assert!(g.is_lost());
}

/// Which families a backend's force-release check covers (Redlock has no semaphores).
#[derive(Clone, Copy)]
pub struct ForceFamilies {
    pub rw: bool,
    pub semaphore: bool,
}

impl ForceFamilies {
    pub const ALL: Self = Self {
        rw: true,
        semaphore: true,
    };
}

/// A fenced store: a write carries its fencing token and is refused below the highest token
/// seen (what a database with a token column does).
#[derive(Default)]
struct FencedStore {
    highest: u64,
}

impl FencedStore {
    fn write(&mut self, token: u64) -> bool {
        if token < self.highest {
            return false;
        }
        self.highest = token;
        true
    }
}

/// The operator's unlock, judged through the service: `a` holds (its holders renew at a third
/// of `ttl`, so their guards hear within about `ttl / 3` after the unlock), `b` waits, `op`
/// force-releases. `b` is granted within `prompt` with a greater token, every holder of `a`
/// reports lost, a fenced write of theirs after `b`'s is refused, and their late release does
/// not touch `b`'s grant. For a read-write lock every reader goes, for a semaphore every
/// permit holder. `outsider` is a client of another namespace holding the same key: untouched.
/// Invalid keys are refused before any I/O.
pub async fn force_release(
    a: &LockClient,
    b: &LockClient,
    op: &LockClient,
    outsider: &LockClient,
    ttl: Duration,
    families: ForceFamilies,
) {
    let prompt = Duration::from_secs(1);
    let slack = Duration::from_millis(1500);

    // Bad input: a clear error, no I/O, no panic.
    for bad in ["", "nul\0key"] {
        let err = op.force_release(bad).await.unwrap_err();
        assert!(err.is_invalid_key(), "{bad:?}: {err}");
    }
    let long = "k".repeat(distlock::MAX_KEY_LEN + 1);
    assert!(op.force_release(&long).await.unwrap_err().is_invalid_key());

    // A free key: nothing removed.
    let nothing = op.force_release("force-free").await.unwrap();
    assert!(nothing.removed.is_empty(), "{nothing:?}");
    assert_eq!(nothing.family, None);

    // The same key in another namespace is held by `outsider` throughout: never touched.
    let kept = outsider.mutex("force-mutex").lock().await.unwrap();

    // 1. A mutex.
    let held = a.mutex("force-mutex").lock().await.unwrap();
    let old = held.fencing_token();
    let waiter = spawn_timed_lock(b.mutex("force-mutex"));
    sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "b got a held mutex");
    let seen = op.inspect("force-mutex").await.unwrap();
    assert_eq!(seen.holders.len(), 1, "{seen:?}");
    let unlocked = tokio::time::Instant::now();
    let removed = op.force_release("force-mutex").await.unwrap();
    assert_eq!(removed.family, Some(distlock::backend::Family::Mutex));
    assert_eq!(removed.removed.len(), 1, "{removed:?}");
    if let Some(t) = removed.removed[0].fencing_token {
        assert_eq!(t, old, "the removed holder's token");
    }
    let (granted_at, next) = timeout(prompt + slack, waiter)
        .await
        .expect("the waiter was never granted after the unlock")
        .expect("waiter task");
    let next = next.unwrap();
    assert!(
        granted_at - unlocked <= prompt,
        "the waiter was granted {:?} after the unlock",
        granted_at - unlocked
    );
    assert!(
        next.fencing_token() > old,
        "new token {} not above the dropped holder's {old}",
        next.fencing_token()
    );
    timeout(ttl + slack, held.lost())
        .await
        .expect("the dropped holder never learned it lost the lock");
    assert!(held.is_lost());
    let mut store = FencedStore::default();
    assert!(store.write(next.fencing_token()));
    assert!(
        !store.write(held.fencing_token()),
        "the dropped holder's fenced write went through"
    );
    // Its late release does not touch the new holder's grant.
    let _ = held.release().await;
    let err = a.mutex("force-mutex").try_lock().await.unwrap_err();
    assert!(err.is_would_block(), "{err}");
    assert!(!kept.is_lost(), "a holder in another namespace was dropped");
    let err = outsider.mutex("force-mutex").try_lock().await.unwrap_err();
    assert!(
        err.is_would_block(),
        "the other namespace's key was unlocked: {err}"
    );
    next.release().await.unwrap();
    kept.release().await.unwrap();

    // 2. A read-write lock: both readers go, the writer behind them gets it.
    if families.rw {
        let rw = a.rw_lock("force-rw");
        let (r1, r2) = (rw.read().await.unwrap(), rw.read().await.unwrap());
        let top = r1.fencing_token().max(r2.fencing_token());
        let writer = spawn_timed(b.rw_lock("force-rw").write());
        sleep(Duration::from_millis(300)).await;
        assert!(!writer.is_finished(), "a writer got a read-held lock");
        let unlocked = tokio::time::Instant::now();
        let removed = op.force_release("force-rw").await.unwrap();
        assert_eq!(removed.removed.len(), 2, "{removed:?}");
        assert!(
            removed
                .removed
                .iter()
                .all(|h| h.kind == distlock::backend::LockKind::Read),
            "{removed:?}"
        );
        let (granted_at, w) = timeout(prompt + slack, writer)
            .await
            .expect("the writer was never granted after the unlock")
            .expect("writer task");
        let w = w.unwrap();
        assert!(
            granted_at - unlocked <= prompt,
            "the writer was granted {:?} after the unlock",
            granted_at - unlocked
        );
        assert!(w.fencing_token() > top, "{} <= {top}", w.fencing_token());
        timeout(ttl + slack, async { tokio::join!(r1.lost(), r2.lost()) })
            .await
            .expect("a dropped reader never learned it lost the lock");
        let mut store = FencedStore::default();
        assert!(store.write(w.fencing_token()));
        assert!(!store.write(r1.fencing_token()) && !store.write(r2.fencing_token()));
        drop((r1, r2));
        w.release().await.unwrap();
    }

    // 3. A semaphore: every permit holder goes, the one waiting gets its permits.
    if families.semaphore {
        let sem = a.semaphore("force-sem", 2);
        let (p1, p2) = (sem.acquire().await.unwrap(), sem.acquire().await.unwrap());
        let top = p1.fencing_token().max(p2.fencing_token());
        let waiting = spawn_timed(b.semaphore("force-sem", 2).acquire_many(2));
        sleep(Duration::from_millis(300)).await;
        assert!(
            !waiting.is_finished(),
            "a full semaphore granted more permits"
        );
        let unlocked = tokio::time::Instant::now();
        let removed = op.force_release("force-sem").await.unwrap();
        assert_eq!(removed.removed.len(), 2, "{removed:?}");
        let (granted_at, p) = timeout(prompt + slack, waiting)
            .await
            .expect("the waiting permits were never granted after the unlock")
            .expect("semaphore task");
        let p = p.unwrap();
        assert!(
            granted_at - unlocked <= prompt,
            "the permits were granted {:?} after the unlock",
            granted_at - unlocked
        );
        assert!(p.fencing_token() > top, "{} <= {top}", p.fencing_token());
        timeout(ttl + slack, async { tokio::join!(p1.lost(), p2.lost()) })
            .await
            .expect("a dropped permit holder never learned it lost its permit");
        drop((p1, p2));
        p.release().await.unwrap();
    }
}
