//! Attacks on an acquisition's cleanup when its backend call panics or is cancelled mid-flight
//! (`src/core/acquire.rs` `call()`, `src/core/mod.rs` `release_in_task_after`), against real
//! servers through the public API: a wrapper backend around `RedisBackend`, `PgBackend` and
//! `MemoryBackend` whose acquire panics once the inner call granted or queued the claim, and
//! storms of `lock()` futures cancelled at random points while other clients hold and wait on
//! the same keys. Each checks that the key is free again promptly (not after the claim's TTL),
//! that the panic reaches its task once, that the client still works, one holder at a time with
//! strictly increasing tokens, and nothing live left on the server.
#![cfg(all(feature = "redis", feature = "postgres", feature = "memory"))]

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use distlock::backend::{
    Attempt, Backend, Claim, Grant, LockKind, MemoryBackend, PgBackend, RedisBackend, Renewal,
};
use distlock::{LockClient, Result};
use tokio::sync::{watch, Notify};
use tokio::time::{sleep, timeout, Instant};

use crate::support::{shared_postgres, shared_redis};

/// When an armed [`Faulty`] acquire panics.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum When {
    /// After the inner call granted the claim.
    Granted,
    /// After the inner call queued the claim.
    Queued,
    /// After the inner call granted it, once `gate` is notified (the call stays out till then).
    GrantedAtGate,
    /// After the inner call granted it, stall 3 s, then return the grant.
    GrantedStall,
    /// While the inner call is still out (polled once, still pending): the inner call is
    /// dropped by the unwinding.
    MidFlight,
    /// Not a panic: after the inner call granted the claim, the call never ends.
    GrantedHang,
}

/// What panics, and how often.
struct Plan {
    key: Mutex<Option<(String, When)>>,
    left: AtomicU32,
    fired: AtomicU32,
    gate: Notify,
    /// An armed call is at the gate, granted on the server.
    at_gate: std::sync::atomic::AtomicBool,
    /// Chaos: every acquire call (of any key) panics with this chance in 1000, mid-flight or
    /// after its reply, whatever the reply.
    chaos: AtomicU32,
    dice: AtomicU64,
    /// The claim of the call that hangs (`GrantedHang`).
    hung: Mutex<Option<Claim>>,
    /// Each release's key, and whether its claim was abandoned when it came.
    releases: Mutex<Vec<(String, bool)>>,
}

/// `inner`, with an acquire that panics as the plan says (every other call goes straight
/// through).
#[derive(Clone)]
struct Faulty<B> {
    inner: B,
    plan: Arc<Plan>,
}

impl<B: Backend> Faulty<B> {
    fn new(inner: B) -> Self {
        quiet_defects();
        Self {
            inner,
            plan: Arc::new(Plan {
                key: Mutex::new(None),
                left: AtomicU32::new(0),
                fired: AtomicU32::new(0),
                gate: Notify::new(),
                at_gate: std::sync::atomic::AtomicBool::new(false),
                chaos: AtomicU32::new(0),
                dice: AtomicU64::new(0x2545_F491_4F6C_DD1D),
                hung: Mutex::new(None),
                releases: Mutex::new(Vec::new()),
            }),
        }
    }

    /// The next `n` acquire calls for `key` matching `when` panic.
    fn arm(&self, key: &str, when: When, n: u32) {
        *self.plan.key.lock().unwrap() = Some((key.to_owned(), when));
        self.plan.left.store(n, Ordering::SeqCst);
    }

    fn fired(&self) -> u32 {
        self.plan.fired.load(Ordering::SeqCst)
    }

    fn wants(&self, claim: &Claim, when: When) -> bool {
        let plan = self.plan.key.lock().unwrap();
        match plan.as_ref() {
            Some((key, w)) if key == claim.key() && *w == when => {}
            _ => return false,
        }
        drop(plan);
        self.plan
            .left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }

    /// A roll of the chaos dice: 0 (no panic), 1 (mid-flight) or 2 (after the reply).
    fn roll(&self) -> u8 {
        let chance = u64::from(self.plan.chaos.load(Ordering::Relaxed));
        if chance == 0 {
            return 0;
        }
        let mut x = self
            .plan
            .dice
            .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed);
        x ^= x >> 31;
        x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x ^= x >> 29;
        if x % 1000 >= chance {
            0
        } else if (x >> 20).is_multiple_of(2) {
            1
        } else {
            2
        }
    }

    fn fire(&self, claim: &Claim) -> ! {
        self.plan.fired.fetch_add(1, Ordering::SeqCst);
        panic!("a defect in the backend's acquire of `{}`", claim.key());
    }
}

impl<B: Backend> Backend for Faulty<B> {
    type Ticket = B::Ticket;
    const RENEWS_WAITERS: bool = B::RENEWS_WAITERS;

    fn supports(&self, kind: LockKind) -> bool {
        self.inner.supports(kind)
    }

    fn validate_key(&self, key: &str) -> Result<()> {
        self.inner.validate_key(key)
    }

    fn has_queued(&self, ticket: &B::Ticket) -> bool {
        self.inner.has_queued(ticket)
    }

    async fn acquire(&self, claim: &Claim, ticket: &B::Ticket, wait: bool) -> Result<Attempt> {
        let chaos = self.roll();
        let mut call = std::pin::pin!(self.inner.acquire(claim, ticket, wait));
        let attempt = match futures::poll!(call.as_mut()) {
            Poll::Ready(attempt) => attempt,
            Poll::Pending => {
                if chaos == 1 || self.wants(claim, When::MidFlight) {
                    // Let the request leave before the panic drops the call.
                    tokio::task::yield_now().await;
                    self.fire(claim);
                }
                call.await
            }
        };
        if chaos != 0 {
            self.fire(claim);
        }
        match &attempt {
            Ok(Attempt::Granted(_)) if self.wants(claim, When::Granted) => self.fire(claim),
            Ok(Attempt::Granted(_)) if self.wants(claim, When::GrantedAtGate) => {
                self.plan.at_gate.store(true, Ordering::SeqCst);
                self.plan.gate.notified().await;
                self.fire(claim)
            }
            Ok(Attempt::Queued { .. }) if self.wants(claim, When::Queued) => self.fire(claim),
            Ok(Attempt::Granted(_)) if self.wants(claim, When::GrantedHang) => {
                *self.plan.hung.lock().unwrap() = Some(claim.clone());
                std::future::pending().await
            }
            Ok(Attempt::Granted(_)) if self.wants(claim, When::GrantedStall) => {
                self.plan.at_gate.store(true, Ordering::SeqCst);
                sleep(Duration::from_secs(3)).await;
                attempt
            }
            _ => attempt,
        }
    }

    async fn wait(
        &self,
        claim: &Claim,
        ticket: &B::Ticket,
        recheck_at: Option<Instant>,
    ) -> Result<Option<Grant>> {
        self.inner.wait(claim, ticket, recheck_at).await
    }

    async fn release(&self, claim: &Claim, ticket: &B::Ticket) -> Result<bool> {
        let seen = (claim.key().to_owned(), claim.is_abandoned());
        self.plan.releases.lock().unwrap().push(seen);
        self.inner.release(claim, ticket).await
    }

    async fn downgrade(&self, claim: &Claim, ticket: &B::Ticket) -> Result<Grant> {
        self.inner.downgrade(claim, ticket).await
    }

    async fn renew(&self, claims: &[(&Claim, &B::Ticket)]) -> Vec<Renewal> {
        self.inner.renew(claims).await
    }

    fn reconnects(&self) -> Option<watch::Receiver<u64>> {
        self.inner.reconnects()
    }

    fn lease(&self) -> Option<Duration> {
        self.inner.lease()
    }

    fn name(&self) -> &'static str {
        self.inner.name()
    }

    async fn shutdown(&self) {
        self.inner.shutdown().await;
    }
}

/// Keeps the storms' hundreds of planned panics out of the output (any other panic prints).
fn quiet_defects() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let print = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let planned = info
                .payload()
                .downcast_ref::<String>()
                .is_some_and(|m| m.starts_with("a defect in the backend's acquire"));
            if !planned {
                print(info);
            }
        }));
    });
}

/// A cancelled acquisition whose acquire call never ends: the cleanup waits for the call (at
/// most the claim's TTL, and at least 5 s), and only then marks the claim abandoned, before
/// its release goes: what tells a backend holding a request for the claim, not sent yet, to
/// leave it unsent (it would overtake the release and take the lock for no one). Not while
/// the call is out: the request may still be answered and the release must follow it.
#[tokio::test(start_paused = true)]
async fn a_cancelled_claim_is_abandoned_once_its_call_is_given_up_and_before_its_release() {
    let faulty = Faulty::new(MemoryBackend::new());
    let client = LockClient::builder(faulty.clone())
        .ttl(Duration::from_secs(1))
        .build()
        .unwrap();
    faulty.arm("k", When::GrantedHang, 1);
    let err = client
        .mutex("k")
        .lock_timeout(Duration::from_millis(10))
        .await;
    assert!(err.is_err_and(|e| e.is_timeout()));
    sleep(Duration::from_secs(4)).await;
    let hung = faulty
        .plan
        .hung
        .lock()
        .unwrap()
        .clone()
        .expect("the call hung");
    assert!(!hung.is_abandoned(), "abandoned while its call was out");
    assert!(faulty.plan.releases.lock().unwrap().is_empty());
    sleep(Duration::from_secs(2)).await;
    assert!(hung.is_abandoned());
    assert_eq!(
        *faulty.plan.releases.lock().unwrap(),
        [("k".to_owned(), true)]
    );
    let again = client.mutex("k").try_lock().await.expect("the key is free");
    again.release().await.unwrap();
    client.shutdown().await;
}

const LONG_TTL: Duration = Duration::from_secs(30);
const HANDOFF: Duration = Duration::from_secs(5);

async fn redis_backend(handoff: Duration) -> RedisBackend {
    RedisBackend::builder(shared_redis().url())
        .handoff_ttl(handoff)
        .build()
        .await
        .unwrap()
}

async fn pg_backend(handoff: Duration) -> PgBackend {
    PgBackend::builder(shared_postgres().url())
        .handoff_ttl(handoff)
        .build()
        .await
        .unwrap()
}

fn client_of(backend: impl Backend, ns: &str, ttl: Duration) -> LockClient {
    LockClient::builder(backend)
        .namespace(ns)
        .ttl(ttl)
        .build()
        .unwrap()
}

/// `mutex` is granted within `limit` (far below the 30 s lease the panic's claim had), with a
/// token above `after`; returns the token.
async fn granted_within(mutex: &distlock::Mutex, limit: Duration, after: u64, what: &str) -> u64 {
    let started = std::time::Instant::now();
    let guard = timeout(limit, mutex.lock())
        .await
        .unwrap_or_else(|_| panic!("{what}: still held {:?} after the panic", started.elapsed()))
        .unwrap();
    let token = guard.fencing_token();
    assert!(token > after, "{what}: token {token} after {after}");
    guard.release().await.unwrap();
    token
}

/// The client still locks and releases `n` keys of its own, and the panicked key.
async fn still_works(client: &LockClient, key: &str, n: usize) {
    for i in 0..n {
        let guard = timeout(
            Duration::from_secs(2),
            client.mutex(format!("after:{i}")).lock(),
        )
        .await
        .expect("the client still grants after the panic")
        .unwrap();
        guard.release().await.unwrap();
    }
    let guard = timeout(Duration::from_secs(2), client.mutex(key).lock())
        .await
        .expect("the panicked key is granted again through the same client")
        .unwrap();
    guard.release().await.unwrap();
}

/// The client that panicked still hears a handoff: it waits on `key` held by `holder`, and is
/// granted within 500 ms of the release (by its notification, not a lease running out).
async fn hears_handoff(client: &LockClient, holder: &LockClient, key: &str) {
    for round in 0..3 {
        let held = holder.mutex(key).lock().await.unwrap();
        let waiter = client.mutex(key);
        let waiting = tokio::spawn(async move { waiter.lock().await });
        sleep(Duration::from_millis(100)).await;
        let released = Instant::now();
        held.release().await.unwrap();
        let guard = timeout(Duration::from_millis(500), waiting)
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "round {round}: no handoff heard {:?} after the release",
                    released.elapsed()
                )
            })
            .unwrap()
            .unwrap();
        guard.release().await.unwrap();
    }
}

/// Redis: nothing but fence counters (each with a TTL) left in `ns`.
async fn redis_clean(ns: &str) {
    crate::support::redis::assert_only_expiring_fences(&shared_redis().url(), ns).await;
}

/// PostgreSQL: no claim left in `ns`.
async fn pg_clean(ns: &str) {
    let url = shared_postgres().url();
    crate::support::until_none_left(Duration::from_secs(5), "claims", || async {
        let rows = crate::support::pg::connection(&url)
            .await
            .query(
                "SELECT key || ' ' || owner || ' fence=' || coalesce(fence::text, 'queued') \
                 || ' left_ms=' || floor(extract(epoch FROM deadline - now()) * 1000)::text \
                 FROM distlock.claims WHERE ns = $1 AND deadline > now()",
                &[&ns],
            )
            .await
            .unwrap();
        rows.iter()
            .map(|r| r.get::<_, String>(0))
            .collect::<Vec<_>>()
    })
    .await;
}

/// The panic of a granted call reaches the task once, the key is granted to another client at
/// once (not after the 30 s lease), and the client that panicked still works.
async fn grant_panic<B: Backend + Clone>(faulty: Faulty<B>, other: LockClient, ns: &str) {
    let client = client_of(faulty.clone(), ns, LONG_TTL);
    let key = "orders:1";
    // A grant first, for a token to compare with.
    let before = granted_within(&other.mutex(key), Duration::from_secs(2), 0, "first").await;
    faulty.arm(key, When::Granted, 1);
    let err = tokio::spawn(client.mutex(key).lock())
        .await
        .expect_err("the acquire call panicked");
    assert!(err.is_panic(), "{err}");
    assert_eq!(faulty.fired(), 1);
    granted_within(
        &other.mutex(key),
        Duration::from_secs(2),
        before,
        "other client",
    )
    .await;
    still_works(&client, key, 8).await;
    hears_handoff(&client, &other, "handoff").await;
    crate::support::shut_down([client, other]).await;
}

/// Redis: an acquire call that panics after the server granted the lock leaves the key free
/// at once for another client, the panic reaches the task once, and the client still locks.
#[tokio::test]
async fn redis_granted_call_that_panics_frees_the_key_at_once() {
    let ns = test_namespace!();
    let faulty = Faulty::new(redis_backend(HANDOFF).await);
    let other = client_of(redis_backend(HANDOFF).await, &ns, LONG_TTL);
    grant_panic(faulty, other, &ns).await;
    redis_clean(&ns).await;
}

/// PostgreSQL: as on Redis, a granted call that panics leaves the key free at once.
#[tokio::test]
async fn postgres_granted_call_that_panics_frees_the_key_at_once() {
    let ns = test_namespace!();
    let faulty = Faulty::new(pg_backend(HANDOFF).await);
    let other = client_of(pg_backend(HANDOFF).await, &ns, LONG_TTL);
    grant_panic(faulty, other, &ns).await;
    pg_clean(&ns).await;
}

/// A claim whose acquire call panicked after the server QUEUED it leaves the queue: when the
/// holder releases, the waiter queued behind it is granted at once, not after a handoff lease
/// (5 s) given to the dead claim.
async fn queued_panic<B: Backend + Clone>(
    faulty: Faulty<B>,
    holder: LockClient,
    behind: LockClient,
    ns: &str,
    until_queued: impl Fn(usize) -> futures::future::BoxFuture<'static, ()>,
) {
    let client = client_of(faulty.clone(), ns, LONG_TTL);
    let key = "orders:2";
    let held = holder.mutex(key).lock().await.unwrap();
    let first = held.fencing_token();
    faulty.arm(key, When::Queued, 1);
    let dead = tokio::spawn(client.mutex(key).lock());
    let err = dead.await.expect_err("the acquire call panicked");
    assert!(err.is_panic(), "{err}");
    // The waiter behind it.
    let waiter = behind.mutex(key);
    let waiting = tokio::spawn(async move {
        let guard = waiter.lock().await.unwrap();
        let at = std::time::Instant::now();
        let token = guard.fencing_token();
        guard.release().await.unwrap();
        (at, token)
    });
    until_queued(1).await;
    let released = std::time::Instant::now();
    held.release().await.unwrap();
    let (at, token) = timeout(Duration::from_secs(8), waiting)
        .await
        .expect("the waiter is granted")
        .unwrap();
    let late = at.saturating_duration_since(released);
    assert!(
        late < Duration::from_secs(1),
        "the waiter was granted {late:?} after the holder released: the panicked claim kept its place"
    );
    assert!(token > first);
    still_works(&client, key, 4).await;
    hears_handoff(&client, &holder, "handoff").await;
    crate::support::shut_down([client, holder, behind]).await;
}

/// Redis: an acquire call that panics after it queued the claim (the key held by another
/// client) leaves nothing in the queue: the next waiter is granted as soon as the holder
/// releases.
#[tokio::test]
async fn redis_queued_call_that_panics_leaves_the_queue() {
    let ns = test_namespace!();
    let faulty = Faulty::new(redis_backend(HANDOFF).await);
    let holder = client_of(redis_backend(HANDOFF).await, &ns, LONG_TTL);
    let behind = client_of(redis_backend(HANDOFF).await, &ns, LONG_TTL);
    let url = shared_redis().url();
    let ns2 = ns.clone();
    queued_panic(faulty, holder, behind, &ns, move |n| {
        let (url, ns) = (url.clone(), ns2.clone());
        Box::pin(async move { crate::support::redis::until_queued(&url, &ns, "orders:2", n).await })
    })
    .await;
    redis_clean(&ns).await;
}

/// PostgreSQL: as on Redis, a queued claim whose call panicked leaves the queue.
#[tokio::test]
async fn postgres_queued_call_that_panics_leaves_the_queue() {
    let ns = test_namespace!();
    let faulty = Faulty::new(pg_backend(HANDOFF).await);
    let holder = client_of(pg_backend(HANDOFF).await, &ns, LONG_TTL);
    let behind = client_of(pg_backend(HANDOFF).await, &ns, LONG_TTL);
    let url = shared_postgres().url();
    let ns2 = ns.clone();
    queued_panic(faulty, holder, behind, &ns, move |n| {
        let (url, ns) = (url.clone(), ns2.clone());
        Box::pin(async move {
            crate::support::pg::until_queued(&url, &ns, "orders:2", i64::try_from(n).unwrap()).await
        })
    })
    .await;
    pg_clean(&ns).await;
}

/// A cancelled acquisition whose call, driven to its end by the cleanup, panics after the
/// server granted: the key is free at once after the panic, on a real server.
async fn cancelled_then_panics<B: Backend + Clone>(faulty: Faulty<B>, other: LockClient, ns: &str) {
    let client = client_of(faulty.clone(), ns, LONG_TTL);
    let key = "orders:3";
    faulty.arm(key, When::GrantedAtGate, 1);
    let task = tokio::spawn(client.mutex(key).lock());
    // Granted on the server, the call still out (at the gate): abort the acquisition.
    timeout(Duration::from_secs(5), async {
        while !faulty.plan.at_gate.load(Ordering::SeqCst) {
            sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("granted on the server");
    let busy = other.mutex(key).try_lock().await;
    assert!(busy.is_err(), "the gated call holds the key on the server");
    task.abort();
    assert!(task.await.expect_err("aborted").is_cancelled());
    faulty.plan.gate.notify_one();
    granted_within(
        &other.mutex(key),
        Duration::from_secs(2),
        0,
        "after the gate",
    )
    .await;
    assert_eq!(faulty.fired(), 1);
    still_works(&client, key, 4).await;
    hears_handoff(&client, &other, "handoff").await;
    crate::support::shut_down([client, other]).await;
}

/// Redis: a cancelled acquisition whose call panics while the cleanup drives it is released
/// at once.
#[tokio::test]
async fn redis_cancelled_call_that_panics_later_is_released() {
    let ns = test_namespace!();
    let faulty = Faulty::new(redis_backend(HANDOFF).await);
    let other = client_of(redis_backend(HANDOFF).await, &ns, LONG_TTL);
    cancelled_then_panics(faulty, other, &ns).await;
    redis_clean(&ns).await;
}

/// PostgreSQL: a cancelled acquisition whose call panics while the cleanup drives it is
/// released at once.
#[tokio::test]
async fn postgres_cancelled_call_that_panics_later_is_released() {
    let ns = test_namespace!();
    let faulty = Faulty::new(pg_backend(HANDOFF).await);
    let other = client_of(pg_backend(HANDOFF).await, &ns, LONG_TTL);
    cancelled_then_panics(faulty, other, &ns).await;
    pg_clean(&ns).await;
}

/// Redis, one client with 64 tasks locking 64 keys at once (their acquires coalesced into
/// batches): one member's call panics after its grant. Every other task gets its lock, the
/// panicked key is free at once, and the client locks all 64 again afterwards.
/// 64 tasks of `client` lock `k0`..`k63` at once (one coalesced batch), hold 20 ms and
/// release; only `victim`'s task may fail, and only with a panic. Returns how many panicked.
async fn batch_of_64(client: &LockClient, victim: &str, round: usize) -> usize {
    let start = Arc::new(tokio::sync::Barrier::new(64));
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let mutex = client.mutex(format!("k{i}"));
            let start = start.clone();
            tokio::spawn(async move {
                start.wait().await;
                let guard = timeout(Duration::from_secs(5), mutex.lock()).await;
                let guard = guard.expect("granted in time").unwrap();
                sleep(Duration::from_millis(20)).await;
                guard.release().await.unwrap();
            })
        })
        .collect();
    let mut panics = 0;
    let mut failed = Vec::new();
    for (i, t) in tasks.into_iter().enumerate() {
        match t.await {
            Ok(()) => {}
            Err(e) if e.is_panic() && format!("k{i}") == victim => panics += 1,
            Err(e) => failed.push(format!("k{i}: {e}")),
        }
    }
    assert!(failed.is_empty(), "round {round}: {failed:?}");
    panics
}

#[tokio::test]
async fn redis_panic_in_one_coalesced_member_spares_the_batch() {
    let ns = test_namespace!();
    let faulty = Faulty::new(redis_backend(HANDOFF).await);
    let client = client_of(faulty.clone(), &ns, LONG_TTL);
    let other = client_of(redis_backend(HANDOFF).await, &ns, LONG_TTL);
    for round in 0..3 {
        let victim = format!("k{}", 7 + round * 13);
        faulty.arm(&victim, When::Granted, 1);
        let panics = batch_of_64(&client, &victim, round).await;
        assert_eq!(panics, 1, "round {round}");
        granted_within(
            &other.mutex(&victim),
            Duration::from_secs(1),
            0,
            "victim after the batch",
        )
        .await;
    }
    assert_eq!(faulty.fired(), 3);
    crate::support::shut_down([client, other]).await;
    redis_clean(&ns).await;
}

/// A tiny xorshift, seeded per task.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// What the workers saw: holders per key now, the last token per key, what went wrong.
struct Book {
    held: Vec<AtomicU32>,
    last: Mutex<Vec<u64>>,
    bad: Mutex<Vec<String>>,
    grants: AtomicU64,
    cancels: AtomicU64,
}

impl Book {
    fn new(keys: usize) -> Self {
        Self {
            held: (0..keys).map(|_| AtomicU32::new(0)).collect(),
            last: Mutex::new(vec![0; keys]),
            bad: Mutex::default(),
            grants: AtomicU64::new(0),
            cancels: AtomicU64::new(0),
        }
    }

    fn enter(&self, i: usize, token: u64) {
        self.grants.fetch_add(1, Ordering::SeqCst);
        if self.held[i].fetch_add(1, Ordering::SeqCst) != 0 {
            self.bad.lock().unwrap().push(format!("k{i}: two holders"));
        }
        let mut last = self.last.lock().unwrap();
        if token <= last[i] {
            let was = last[i];
            self.bad
                .lock()
                .unwrap()
                .push(format!("k{i}: token {token} after {was}"));
        }
        last[i] = last[i].max(token);
    }

    fn exit(&self, i: usize) {
        self.held[i].fetch_sub(1, Ordering::SeqCst);
    }
}

/// Tasks on `clients` (`per` each) lock `keys` keys for `run`, their `lock()` cancelled at
/// random points: a 0–5 ms timeout, an abort of the spawned lock after 0–5 ms, or a `select!`
/// against a 0–5 ms sleep. Holds are 0–2 ms, and a guard is released or dropped.
async fn storm(clients: &[LockClient], per: usize, keys: usize, run: Duration) -> Arc<Book> {
    let book = Arc::new(Book::new(keys));
    let until = Instant::now() + run;
    let mut tasks = Vec::new();
    for (c, client) in clients.iter().enumerate() {
        for t in 0..per {
            let client = client.clone();
            let book = book.clone();
            let seed = 0x9E37_79B9_7F4A_7C15 ^ (((c as u64) << 32) | (t as u64 + 1));
            tasks.push(tokio::spawn(async move {
                let mut rng = Rng(seed);
                while Instant::now() < until {
                    let i = rng.below(keys as u64) as usize;
                    let mutex = client.mutex(format!("k{i}"));
                    let budget = Duration::from_micros(rng.below(5_000));
                    let got = match rng.below(4) {
                        0 => timeout(budget, mutex.lock()).await.ok(),
                        1 => {
                            let task = tokio::spawn(mutex.lock());
                            sleep(budget).await;
                            task.abort();
                            task.await.ok()
                        }
                        2 => tokio::select! {
                            g = mutex.lock() => Some(g),
                            () = sleep(budget) => None,
                        },
                        _ => timeout(Duration::from_secs(3), mutex.lock()).await.ok(),
                    };
                    let Some(got) = got else {
                        book.cancels.fetch_add(1, Ordering::Relaxed);
                        continue;
                    };
                    let guard = match got {
                        Ok(g) => g,
                        Err(e) => {
                            book.bad.lock().unwrap().push(format!("k{i}: {e}"));
                            continue;
                        }
                    };
                    book.enter(i, guard.fencing_token());
                    sleep(Duration::from_micros(rng.below(2_000))).await;
                    book.exit(i);
                    if rng.below(2) == 0 {
                        let _ = guard.release().await;
                    } else {
                        drop(guard);
                    }
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    book
}

/// After the storm, a fresh client takes each key with `try_lock` within `limit`.
async fn each_key_free(fresh: &LockClient, keys: usize, limit: Duration) {
    for i in 0..keys {
        let mutex = fresh.mutex(format!("k{i}"));
        let started = Instant::now();
        loop {
            match mutex.try_lock().await {
                Ok(g) => {
                    g.release().await.unwrap();
                    break;
                }
                Err(e) => assert!(
                    started.elapsed() < limit,
                    "k{i} still taken {:?} after the storm: {e}",
                    started.elapsed()
                ),
            }
            sleep(Duration::from_millis(10)).await;
        }
    }
}

fn verdict(book: &Book, what: &str) {
    let bad = book.bad.lock().unwrap();
    eprintln!(
        "{what}: {} grants, {} cancellations, {} problems",
        book.grants.load(Ordering::SeqCst),
        book.cancels.load(Ordering::SeqCst),
        bad.len()
    );
    assert!(bad.is_empty(), "{what}: {:?}", &bad[..bad.len().min(20)]);
    assert!(book.grants.load(Ordering::SeqCst) > 0);
}

/// Redis: one client with 64 tasks (coalesced lanes) and a second with 8, on 4 keys, their
/// lock futures cancelled at random points for 4 s. One holder at a time, tokens increase,
/// and afterwards every key is free within the handoff lease (1 s) and only fence counters
/// are left.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_cancellation_storm_leaves_nothing_held() {
    let ns = test_namespace!();
    let ttl = Duration::from_secs(5);
    let handoff = Duration::from_secs(1);
    let a = client_of(redis_backend(handoff).await, &ns, ttl);
    let b = client_of(redis_backend(handoff).await, &ns, ttl);
    let book = storm(&[a.clone(), b.clone()], 36, 4, Duration::from_secs(4)).await;
    let fresh = client_of(redis_backend(handoff).await, &ns, ttl);
    each_key_free(&fresh, 4, Duration::from_millis(1500)).await;
    verdict(&book, "redis");
    redis_clean(&ns).await;
    crate::support::shut_down([a, b, fresh]).await;
}

/// PostgreSQL: the same storm (two clients, 16 tasks each, 4 keys); afterwards every key is
/// free within the handoff lease and no claim is left in the namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_cancellation_storm_leaves_nothing_held() {
    let ns = test_namespace!();
    let ttl = Duration::from_secs(5);
    let handoff = Duration::from_secs(1);
    let a = client_of(pg_backend(handoff).await, &ns, ttl);
    let b = client_of(pg_backend(handoff).await, &ns, ttl);
    let book = storm(&[a.clone(), b.clone()], 16, 4, Duration::from_secs(4)).await;
    let fresh = client_of(pg_backend(handoff).await, &ns, ttl);
    each_key_free(&fresh, 4, Duration::from_millis(1500)).await;
    verdict(&book, "postgres");
    pg_clean(&ns).await;
    crate::support::shut_down([a, b, fresh]).await;
}

/// Memory: the same storm (two clients of one backend, 32 tasks each); afterwards nothing is
/// held or queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_cancellation_storm_leaves_nothing_held() {
    let ns = test_namespace!();
    let ttl = Duration::from_secs(5);
    let backend = MemoryBackend::new();
    let a = client_of(backend.clone(), &ns, ttl);
    let b = client_of(backend.clone(), &ns, ttl);
    let book = storm(&[a.clone(), b.clone()], 32, 4, Duration::from_secs(3)).await;
    let fresh = client_of(backend.clone(), &ns, ttl);
    each_key_free(&fresh, 4, Duration::from_millis(1500)).await;
    verdict(&book, "memory");
    timeout(Duration::from_secs(2), async {
        loop {
            let s = backend.stats();
            if s.held == 0 && s.waiters == 0 {
                break;
            }
            sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("left behind: {:?}", backend.stats()));
    crate::support::shut_down([a, b, fresh]).await;
}

/// Redis behind a proxy delaying every reply 30 ms (so the lanes fill): one client with 64
/// tasks on 64 keys, where one task's acquire panics while its inner call is still out (the
/// call dropped by the unwinding, after its request left). Every other task gets its lock,
/// the victim's key is free at once, and nothing but fences is left.
#[tokio::test]
async fn redis_mid_flight_panic_of_one_coalesced_member_spares_the_batch() {
    let ns = test_namespace!();
    let proxy = crate::support::proxy::Proxy::start(shared_redis().port());
    let url = format!("redis://127.0.0.1:{}/", proxy.port());
    let inner = RedisBackend::builder(url)
        .handoff_ttl(HANDOFF)
        .build()
        .await
        .unwrap();
    let faulty = Faulty::new(inner);
    let client = client_of(faulty.clone(), &ns, LONG_TTL);
    let other = client_of(redis_backend(HANDOFF).await, &ns, LONG_TTL);
    // Opens the client's connections before the delay is set on them.
    client
        .mutex("warm")
        .lock()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    proxy.delay_replies(crate::support::proxy::Which::All, Duration::from_millis(30));
    for round in 0..4 {
        let victim = format!("k{}", 3 + round * 17);
        faulty.arm(&victim, When::MidFlight, 1);
        let panics = batch_of_64(&client, &victim, round).await;
        assert_eq!(panics, 1, "round {round}: the victim's call never went out");
        granted_within(
            &other.mutex(&victim),
            Duration::from_secs(1),
            0,
            "victim after a mid-flight panic",
        )
        .await;
    }
    proxy.pass();
    crate::support::shut_down([client, other]).await;
    redis_clean(&ns).await;
}

/// PostgreSQL behind a proxy delaying the acquire statement 300 ms: an acquire that panics
/// while its statement is still on its way (dropped by the unwinding) leaves the key free once
/// the statement has run (its release is queued behind it on the claim's connection), well
/// before the 30 s lease.
#[tokio::test]
async fn postgres_mid_flight_panic_frees_the_key_once_the_statement_ran() {
    let ns = test_namespace!();
    let proxy = crate::support::proxy::Proxy::start(shared_postgres().port());
    let inner = PgBackend::builder(format!(
        "postgres://postgres@127.0.0.1:{}/postgres",
        proxy.port()
    ))
    .handoff_ttl(HANDOFF)
    .build()
    .await
    .unwrap();
    let faulty = Faulty::new(inner);
    let client = client_of(faulty.clone(), &ns, LONG_TTL);
    let other = client_of(pg_backend(HANDOFF).await, &ns, LONG_TTL);
    proxy.delay_requests_containing(
        crate::support::proxy::Which::Commands,
        b"acquire",
        Duration::from_millis(300),
    );
    for round in 0..3 {
        let key = format!("orders:{round}");
        faulty.arm(&key, When::MidFlight, 1);
        let err = tokio::spawn(client.mutex(&key).lock())
            .await
            .expect_err("the acquire call panicked");
        assert!(err.is_panic(), "{err}");
        granted_within(
            &other.mutex(&key),
            Duration::from_secs(3),
            0,
            "after a mid-flight panic",
        )
        .await;
    }
    assert_eq!(faulty.fired(), 3);
    proxy.pass();
    crate::support::shut_down([client, other]).await;
    pg_clean(&ns).await;
}

/// A multi-lock over three keys whose middle key's acquire panics after its grant, a
/// semaphore permit and a read lock whose acquire panics after its grant: the panic reaches the
/// task once, and every key (the one taken before the panic too) is free at once.
async fn panics_in_other_primitives<B: Backend + Clone>(
    faulty: Faulty<B>,
    other: LockClient,
    ns: &str,
) {
    let client = client_of(faulty.clone(), ns, LONG_TTL);
    faulty.arm("multi:b", When::Granted, 1);
    let err = tokio::spawn(client.multi_lock(["multi:a", "multi:b", "multi:c"]).lock())
        .await
        .expect_err("the middle key's call panicked");
    assert!(err.is_panic(), "{err}");
    let all = timeout(
        Duration::from_secs(2),
        other.multi_lock(["multi:a", "multi:b", "multi:c"]).lock(),
    )
    .await
    .expect("every key of the multi-lock free at once")
    .unwrap();
    all.release().await.unwrap();

    faulty.arm("permits", When::Granted, 1);
    let err = tokio::spawn(client.semaphore("permits", 2).acquire())
        .await
        .expect_err("the permit's call panicked");
    assert!(err.is_panic(), "{err}");
    let sem = other.semaphore("permits", 2);
    let both = timeout(Duration::from_secs(2), async {
        (sem.acquire().await.unwrap(), sem.acquire().await.unwrap())
    })
    .await
    .expect("both permits free at once");
    both.0.release().await.unwrap();
    both.1.release().await.unwrap();

    faulty.arm("rw", When::Granted, 1);
    let err = tokio::spawn(client.rw_lock("rw").read())
        .await
        .expect_err("the read lock's call panicked");
    assert!(err.is_panic(), "{err}");
    let write = timeout(Duration::from_secs(2), other.rw_lock("rw").write())
        .await
        .expect("the writer granted at once")
        .unwrap();
    write.release().await.unwrap();
    assert_eq!(faulty.fired(), 3);
    still_works(&client, "multi:b", 2).await;
    hears_handoff(&client, &other, "handoff").await;
    crate::support::shut_down([client, other]).await;
}

/// Redis: multi-lock, semaphore and read lock calls that panic leave every key free at once.
#[tokio::test]
async fn redis_panics_in_multi_lock_semaphore_and_read_free_every_key() {
    let ns = test_namespace!();
    let faulty = Faulty::new(redis_backend(HANDOFF).await);
    let other = client_of(redis_backend(HANDOFF).await, &ns, LONG_TTL);
    panics_in_other_primitives(faulty, other, &ns).await;
    redis_clean(&ns).await;
}

/// PostgreSQL: multi-lock, semaphore and read lock calls that panic leave every key free at
/// once.
#[tokio::test]
async fn postgres_panics_in_multi_lock_semaphore_and_read_free_every_key() {
    let ns = test_namespace!();
    let faulty = Faulty::new(pg_backend(HANDOFF).await);
    let other = client_of(pg_backend(HANDOFF).await, &ns, LONG_TTL);
    panics_in_other_primitives(faulty, other, &ns).await;
    pg_clean(&ns).await;
}

/// Redis, blocking API: `blocking_lock` from a plain thread, whose acquire panics after the
/// grant, unwinds that thread once; the key is free at once and the client still blocks and
/// locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_blocking_lock_whose_call_panics_frees_the_key() {
    let ns = test_namespace!();
    let faulty = Faulty::new(redis_backend(HANDOFF).await);
    let client = client_of(faulty.clone(), &ns, LONG_TTL);
    let other = client_of(redis_backend(HANDOFF).await, &ns, LONG_TTL);
    faulty.arm("blocking", When::Granted, 1);
    let mutex = client.mutex("blocking");
    let thread = std::thread::spawn(move || mutex.blocking_lock().map(|_| ()));
    let joined = tokio::task::spawn_blocking(move || thread.join())
        .await
        .unwrap();
    assert!(joined.is_err(), "the panic unwound the thread");
    granted_within(
        &other.mutex("blocking"),
        Duration::from_secs(2),
        0,
        "after blocking",
    )
    .await;
    let mutex = client.mutex("blocking");
    let again = tokio::task::spawn_blocking(move || {
        let guard = mutex.blocking_lock().unwrap();
        drop(guard);
        Ok::<(), distlock::Error>(())
    });
    timeout(Duration::from_secs(3), again)
        .await
        .expect("the client blocks and locks again")
        .unwrap()
        .unwrap();
    crate::support::shut_down([client, other]).await;
    redis_clean(&ns).await;
}

/// Like [`storm`], with every lock taken in a task of its own, so a panicking acquire call
/// (the chaos of [`Faulty`]) kills only that task; returns the book and how many panicked.
async fn panic_storm(
    clients: &[LockClient],
    per: usize,
    keys: usize,
    run: Duration,
) -> (Arc<Book>, u64) {
    let book = Arc::new(Book::new(keys));
    let panics = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + run;
    let mut tasks = Vec::new();
    for (c, client) in clients.iter().enumerate() {
        for t in 0..per {
            let client = client.clone();
            let (book, panics) = (book.clone(), panics.clone());
            let seed = 0x51_7CC1_B727_220A ^ (((c as u64) << 32) | (t as u64 + 1));
            tasks.push(tokio::spawn(async move {
                let mut rng = Rng(seed);
                while Instant::now() < until {
                    let i = rng.below(keys as u64) as usize;
                    let mutex = client.mutex(format!("k{i}"));
                    let budget = Duration::from_micros(rng.below(5_000));
                    let task = tokio::spawn(mutex.lock());
                    let abort = task.abort_handle();
                    let got = match rng.below(3) {
                        0 => {
                            sleep(budget).await;
                            abort.abort();
                            task.await
                        }
                        _ => match timeout(Duration::from_secs(3), task).await {
                            Ok(joined) => joined,
                            Err(_) => {
                                abort.abort();
                                book.bad
                                    .lock()
                                    .unwrap()
                                    .push(format!("k{i}: not granted in 3 s"));
                                continue;
                            }
                        },
                    };
                    let guard = match got {
                        Ok(Ok(g)) => g,
                        Ok(Err(e)) => {
                            book.bad.lock().unwrap().push(format!("k{i}: {e}"));
                            continue;
                        }
                        Err(e) if e.is_panic() => {
                            panics.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                        Err(_) => {
                            book.cancels.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                    };
                    book.enter(i, guard.fencing_token());
                    sleep(Duration::from_micros(rng.below(2_000))).await;
                    book.exit(i);
                    let _ = guard.release().await;
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let panics = panics.load(Ordering::SeqCst);
    (book, panics)
}

/// Redis: a client whose acquire calls panic at random (2 %: mid-flight or after the reply,
/// granted or queued) with 64 tasks, a plain client with 8, on 4 keys, lock tasks also aborted
/// at random, for 4 s. One holder at a time, tokens increase, every lock granted within 3 s,
/// and afterwards every key free within the handoff lease and only fences left.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_panic_storm_leaves_nothing_held() {
    let ns = test_namespace!();
    let ttl = Duration::from_secs(5);
    let handoff = Duration::from_secs(1);
    let faulty = Faulty::new(redis_backend(handoff).await);
    faulty.plan.chaos.store(20, Ordering::SeqCst);
    let a = client_of(faulty.clone(), &ns, ttl);
    let b = client_of(redis_backend(handoff).await, &ns, ttl);
    // 8 × 8 tasks on the faulty client (one backend: its lanes coalesce), 8 on the plain one.
    let mut clients = vec![a.clone(); 8];
    clients.push(b.clone());
    let (book, panics) = panic_storm(&clients, 8, 4, Duration::from_secs(4)).await;
    faulty.plan.chaos.store(0, Ordering::SeqCst);
    eprintln!("redis panic storm: {panics} panics");
    assert!(panics > 0);
    let fresh = client_of(redis_backend(handoff).await, &ns, ttl);
    each_key_free(&fresh, 4, Duration::from_millis(1500)).await;
    verdict(&book, "redis panic storm");
    redis_clean(&ns).await;
    crate::support::shut_down([a, b, fresh]).await;
}

/// PostgreSQL: the same panic storm (faulty client 24 tasks, plain client 8).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_panic_storm_leaves_nothing_held() {
    let ns = test_namespace!();
    let ttl = Duration::from_secs(5);
    let handoff = Duration::from_secs(1);
    let faulty = Faulty::new(pg_backend(handoff).await);
    faulty.plan.chaos.store(20, Ordering::SeqCst);
    let a = client_of(faulty.clone(), &ns, ttl);
    let b = client_of(pg_backend(handoff).await, &ns, ttl);
    let (book, panics) = panic_storm(
        &[a.clone(), a.clone(), a.clone(), b.clone()],
        8,
        4,
        Duration::from_secs(4),
    )
    .await;
    faulty.plan.chaos.store(0, Ordering::SeqCst);
    eprintln!("postgres panic storm: {panics} panics");
    assert!(panics > 0);
    let fresh = client_of(pg_backend(handoff).await, &ns, ttl);
    each_key_free(&fresh, 4, Duration::from_millis(1500)).await;
    verdict(&book, "postgres panic storm");
    pg_clean(&ns).await;
    crate::support::shut_down([a, b, fresh]).await;
}

/// Memory: the same panic storm (faulty client 32 tasks, plain client 8, one backend).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_panic_storm_leaves_nothing_held() {
    let ns = test_namespace!();
    let ttl = Duration::from_secs(5);
    let backend = MemoryBackend::new();
    let faulty = Faulty::new(backend.clone());
    faulty.plan.chaos.store(20, Ordering::SeqCst);
    let a = client_of(faulty.clone(), &ns, ttl);
    let b = client_of(backend.clone(), &ns, ttl);
    let mut clients = vec![a.clone(); 4];
    clients.push(b.clone());
    let (book, panics) = panic_storm(&clients, 8, 4, Duration::from_secs(3)).await;
    faulty.plan.chaos.store(0, Ordering::SeqCst);
    eprintln!("memory panic storm: {panics} panics");
    assert!(panics > 0);
    let fresh = client_of(backend.clone(), &ns, ttl);
    each_key_free(&fresh, 4, Duration::from_millis(1500)).await;
    verdict(&book, "memory panic storm");
    timeout(Duration::from_secs(2), async {
        loop {
            let s = backend.stats();
            if s.held == 0 && s.waiters == 0 {
                break;
            }
            sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("left behind: {:?}", backend.stats()));
    crate::support::shut_down([a, b, fresh]).await;
}

/// Polls `mutex.try_lock()` until it is granted; fails naming `what` after `limit`. Returns
/// how long it took.
async fn free_within(mutex: &distlock::Mutex, limit: Duration, what: &str) -> Duration {
    let started = Instant::now();
    loop {
        match mutex.try_lock().await {
            Ok(g) => {
                g.release().await.unwrap();
                return started.elapsed();
            }
            Err(e) => assert!(
                started.elapsed() < limit,
                "{what}: still taken after {:?}: {e}",
                started.elapsed()
            ),
        }
        sleep(Duration::from_millis(20)).await;
    }
}

/// Redis (a private server behind the proxy): an acquisition cancelled while its acquire
/// request is held up in the proxy (1.5 s), whose connection is then cut (the request lost
/// with it) and comes back: the cleanup drives the call through its retry on the new
/// connection and releases after it. Another client is granted the key within the claim's
/// TTL (2 s) once the call has ended, and only fences are left. The namespace's counter is
/// deleted first, so the plain pipeline takes the key but leaves the grant to the acquire
/// script (a new counter restarts there): that call is the one held up, with the key held.
#[tokio::test]
async fn redis_cancelled_call_cut_mid_flight_is_released_after_its_retry() {
    let ns = test_namespace!();
    let server = crate::support::RedisServer::start();
    let proxy = crate::support::proxy::Proxy::start(server.port());
    let ttl = Duration::from_secs(2);
    let a = crate::support::redis::client(
        &format!("redis://127.0.0.1:{}/", proxy.port()),
        &ns,
        ttl,
        Duration::from_secs(1),
        true,
    )
    .await;
    let b =
        crate::support::redis::client(&server.url(), &ns, ttl, Duration::from_secs(1), true).await;
    a.mutex("warm")
        .lock()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    proxy.delay_requests_containing(
        crate::support::proxy::Which::Commands,
        b"acquire",
        Duration::from_millis(1500),
    );
    let _: () = redis::cmd("DEL")
        .arg(format!("{ns}:fence"))
        .query_async(&mut crate::support::redis::connection(&server.url()).await)
        .await
        .unwrap();
    let cancelled = timeout(Duration::from_millis(50), a.mutex("k").lock()).await;
    assert!(cancelled.is_err(), "the acquire call is held up");
    sleep(Duration::from_millis(300)).await;
    proxy.cut();
    sleep(Duration::from_millis(100)).await;
    proxy.pass();
    let took = free_within(&b.mutex("k"), Duration::from_secs(8), "after the cut").await;
    eprintln!("free after {took:?}");
    let url = server.url();
    crate::support::until_none_left(Duration::from_secs(5), "keys", || async {
        crate::support::redis::non_fence_keys(&url, &ns).await
    })
    .await;
    crate::support::shut_down([a, b]).await;
}

/// Redis (a private server): an acquisition cancelled while its acquire call is out to a
/// server that is stopped (SIGSTOP) for 6 s, longer than the cleanup waits for the call
/// (5 s): the cleanup gives up on the call and releases; once the server runs again, the key
/// is free for another client within the claim's TTL (2 s), and only fences are left.
#[tokio::test]
async fn redis_cancelled_call_to_a_stopped_server_is_released_within_the_ttl() {
    let ns = test_namespace!();
    let server = crate::support::RedisServer::start();
    let ttl = Duration::from_secs(2);
    let a =
        crate::support::redis::client(&server.url(), &ns, ttl, Duration::from_secs(1), true).await;
    a.mutex("warm")
        .lock()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let pid = server.pid();
    crate::support::RedisServer::signal(pid, "STOP");
    let cont = scopeguard_cont(pid);
    let cancelled = timeout(Duration::from_millis(50), a.mutex("k").lock()).await;
    assert!(cancelled.is_err(), "the server is stopped");
    sleep(Duration::from_secs(6)).await;
    drop(cont);
    let running = Instant::now();
    let b =
        crate::support::redis::client(&server.url(), &ns, ttl, Duration::from_secs(1), true).await;
    let took = free_within(&b.mutex("k"), Duration::from_secs(3), "after SIGCONT").await;
    eprintln!(
        "free {took:?} after the client connected, {:?} after SIGCONT",
        running.elapsed()
    );
    let url = server.url();
    crate::support::until_none_left(Duration::from_secs(5), "keys", || async {
        crate::support::redis::non_fence_keys(&url, &ns).await
    })
    .await;
    crate::support::shut_down([a, b]).await;
}

/// Sends SIGCONT to `pid` when dropped (also when the test fails while the server is stopped).
fn scopeguard_cont(pid: u32) -> impl Drop {
    struct Cont(u32);
    impl Drop for Cont {
        fn drop(&mut self) {
            crate::support::RedisServer::signal(self.0, "CONT");
        }
    }
    Cont(pid)
}

/// PostgreSQL behind the proxy: an acquisition cancelled while its acquire statement is held
/// up in the proxy (1.5 s), whose connection is then cut and comes back: the cleanup drives the
/// call through its retry on a fresh connection and releases after it. Another client is
/// granted the key once the call has ended, and no live claim is left.
#[tokio::test]
async fn postgres_cancelled_call_cut_mid_flight_is_released_after_its_retry() {
    let ns = test_namespace!();
    let proxy = crate::support::proxy::Proxy::start(shared_postgres().port());
    let ttl = Duration::from_secs(2);
    let a = crate::support::pg::client(
        &format!("postgres://postgres@127.0.0.1:{}/postgres", proxy.port()),
        &ns,
        ttl,
        Duration::from_secs(1),
    )
    .await;
    let b = crate::support::pg::client(&shared_postgres().url(), &ns, ttl, Duration::from_secs(1))
        .await;
    a.mutex("warm")
        .lock()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    proxy.delay_requests_containing(
        crate::support::proxy::Which::Commands,
        b"acquire",
        Duration::from_millis(1500),
    );
    let cancelled = timeout(Duration::from_millis(50), a.mutex("k").lock()).await;
    assert!(
        cancelled.is_err(),
        "the acquire statement was not held up: the lock returned {:?}",
        cancelled.map(|r| r.map(|g| g.fencing_token()))
    );
    sleep(Duration::from_millis(300)).await;
    proxy.cut();
    sleep(Duration::from_millis(100)).await;
    proxy.pass();
    let took = free_within(&b.mutex("k"), Duration::from_secs(8), "after the cut").await;
    eprintln!("free after {took:?}");
    pg_clean(&ns).await;
    crate::support::shut_down([a, b]).await;
}

/// An acquisition cancelled while its call, granted on the server, stalls 3 s (past the
/// claim's 1 s TTL): another client is granted the key once that lease ends, and the
/// cleanup's release, sent when the stalled call finally returns, must not take the key from
/// that client: its guard stays valid, a third client cannot take the key, and its release
/// works.
async fn stalled_call_release_spares_the_next_holder<B: Backend + Clone>(
    faulty: Faulty<B>,
    b: LockClient,
    c: LockClient,
    ns: &str,
) {
    let a = client_of(faulty.clone(), ns, Duration::from_secs(1));
    faulty.arm("k", When::GrantedStall, 1);
    let cancelled = tokio::spawn(a.mutex("k").lock());
    timeout(Duration::from_secs(2), async {
        while !faulty.plan.at_gate.load(Ordering::SeqCst) {
            sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("granted on the server");
    cancelled.abort();
    let stalled_at = Instant::now();
    let held = timeout(Duration::from_secs(3), b.mutex("k").lock())
        .await
        .expect("granted once the stalled claim's lease ended")
        .unwrap();
    // The stalled call returns at 3 s; its cleanup releases then.
    sleep(Duration::from_secs(3).saturating_sub(stalled_at.elapsed()) + Duration::from_millis(500))
        .await;
    assert!(
        !held.is_lost(),
        "the next holder's guard lost after the stalled call's release"
    );
    let third = c.mutex("k").try_lock().await;
    assert!(
        third.is_err(),
        "a third client took the key while the next holder still held it"
    );
    held.release().await.unwrap();
    free_within(
        &c.mutex("k"),
        Duration::from_secs(1),
        "after the holder released",
    )
    .await;
    crate::support::shut_down([a, b, c]).await;
}

/// Redis: the stalled call's late release spares the client that holds the key by then.
#[tokio::test]
async fn redis_stalled_cancelled_call_release_spares_the_next_holder() {
    let ns = test_namespace!();
    let faulty = Faulty::new(redis_backend(HANDOFF).await);
    let b = client_of(redis_backend(HANDOFF).await, &ns, LONG_TTL);
    let c = client_of(redis_backend(HANDOFF).await, &ns, LONG_TTL);
    stalled_call_release_spares_the_next_holder(faulty, b, c, &ns).await;
    redis_clean(&ns).await;
}

/// PostgreSQL: the stalled call's late release spares the client that holds the key by then.
#[tokio::test]
async fn postgres_stalled_cancelled_call_release_spares_the_next_holder() {
    let ns = test_namespace!();
    let faulty = Faulty::new(pg_backend(HANDOFF).await);
    let b = client_of(pg_backend(HANDOFF).await, &ns, LONG_TTL);
    let c = client_of(pg_backend(HANDOFF).await, &ns, LONG_TTL);
    stalled_call_release_spares_the_next_holder(faulty, b, c, &ns).await;
    pg_clean(&ns).await;
}

/// Memory (no renewal of waiters): an acquisition NOT cancelled whose call, granted on the
/// service, stalls 3 s (past the claim's 1 s TTL) while another client is granted the key once
/// that lease ended. `lock()` must not hand back a guard for a lease that ended before it
/// returned (a caller that trusts it works beside the other holder): it should ask again (or
/// fail), as it does for a grant learned from a notification too late to trust.
#[tokio::test]
async fn memory_stalled_grant_is_not_handed_back_lost() {
    let ns = test_namespace!();
    let backend = MemoryBackend::new();
    let faulty = Faulty::new(backend.clone());
    let a = client_of(faulty.clone(), &ns, Duration::from_secs(1));
    let b = client_of(backend, &ns, LONG_TTL);
    faulty.arm("k", When::GrantedStall, 1);
    let waiting = tokio::spawn(a.mutex("k").lock());
    timeout(Duration::from_secs(2), async {
        while !faulty.plan.at_gate.load(Ordering::SeqCst) {
            sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("granted on the service");
    let held = timeout(Duration::from_secs(3), b.mutex("k").lock())
        .await
        .expect("granted once the stalled claim's lease ended")
        .unwrap();
    let got = timeout(Duration::from_millis(3500), waiting).await;
    if let Ok(Ok(Ok(guard))) = got {
        let left = guard
            .valid_until()
            .saturating_duration_since(std::time::Instant::now());
        panic!(
            "lock() returned a guard (token {}, lost: {}, lease left {left:?}) while another \
             client holds the key (token {}, lost: {})",
            guard.fencing_token(),
            guard.is_lost(),
            held.fencing_token(),
            held.is_lost()
        );
    }
    held.release().await.unwrap();
    crate::support::shut_down([a, b]).await;
}

/// Redis and PostgreSQL renew a waiting claim, so a claim whose granted call stalls 3 s (past
/// its 1 s TTL), not cancelled, keeps the key on the server meanwhile: the guard `lock()`
/// hands back must then be valid (not lost on arrival while the server holds the key for it),
/// and no other client may take the key while it is held.
async fn stalled_grant_renewed_is_handed_back_valid<B: Backend + Clone>(
    faulty: Faulty<B>,
    c: LockClient,
    ns: &str,
) {
    let a = client_of(faulty.clone(), ns, Duration::from_secs(1));
    faulty.arm("k", When::GrantedStall, 1);
    let guard = timeout(Duration::from_secs(5), a.mutex("k").lock())
        .await
        .expect("lock() returns once the call does")
        .unwrap();
    let other = c.mutex("k").try_lock().await;
    let taken = other.is_ok();
    if let Ok(g) = other {
        g.release().await.unwrap();
    }
    let left = guard
        .valid_until()
        .saturating_duration_since(std::time::Instant::now());
    assert!(
        !guard.is_lost() && !taken,
        "after the stall: guard lost: {}, lease left {left:?}, another client could take the key: {taken}",
        guard.is_lost()
    );
    guard.release().await.unwrap();
    crate::support::shut_down([a, c]).await;
}

/// Redis: the guard of a stalled but renewed grant is valid when `lock()` returns.
#[tokio::test]
async fn redis_stalled_grant_renewed_is_handed_back_valid() {
    let ns = test_namespace!();
    let faulty = Faulty::new(redis_backend(HANDOFF).await);
    let c = client_of(redis_backend(HANDOFF).await, &ns, LONG_TTL);
    stalled_grant_renewed_is_handed_back_valid(faulty, c, &ns).await;
    redis_clean(&ns).await;
}

/// PostgreSQL: the guard of a stalled but renewed grant is valid when `lock()` returns.
#[tokio::test]
async fn postgres_stalled_grant_renewed_is_handed_back_valid() {
    let ns = test_namespace!();
    let faulty = Faulty::new(pg_backend(HANDOFF).await);
    let c = client_of(pg_backend(HANDOFF).await, &ns, LONG_TTL);
    stalled_grant_renewed_is_handed_back_valid(faulty, c, &ns).await;
    pg_clean(&ns).await;
}

/// Cuts the proxy's connections every 300 ms (for 50 ms) while `clients`' tasks (8 each) lock
/// 4 keys with their futures cancelled at random, for 3 s. Errors of the outage (naming
/// `service`, a connection, or the service unavailable) are allowed; the book keeps the rest.
async fn storm_through_cuts(
    proxy: Arc<crate::support::proxy::Proxy>,
    clients: &[LockClient],
    service: &str,
) -> Arc<Book> {
    let cutter = {
        let proxy = proxy.clone();
        tokio::spawn(async move {
            loop {
                sleep(Duration::from_millis(300)).await;
                proxy.cut();
                sleep(Duration::from_millis(50)).await;
                proxy.pass();
            }
        })
    };
    let book = storm(clients, 8, 4, Duration::from_secs(3)).await;
    cutter.abort();
    let _ = cutter.await;
    proxy.pass();
    let all = std::mem::take(&mut *book.bad.lock().unwrap());
    eprintln!(
        "{} errors during the cuts: {:?}",
        all.len(),
        &all[..all.len().min(3)]
    );
    let outage: Vec<String> = all
        .into_iter()
        .filter(|e| {
            let transient =
                e.contains(service) || e.contains("connection") || e.contains("unavailable");
            !transient
        })
        .collect();
    *book.bad.lock().unwrap() = outage;
    book
}

/// Redis behind the proxy, its connections cut every 300 ms while two clients' tasks (32 and
/// 8) lock 4 keys with their futures cancelled at random, for 3 s: errors of the outage are
/// allowed, but one holder at a time with increasing tokens, and afterwards every key free
/// within the claims' TTL (5 s) and only fences left.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_cancellation_storm_through_cuts_leaves_nothing_held() {
    let ns = test_namespace!();
    let ttl = Duration::from_secs(5);
    let handoff = Duration::from_secs(1);
    let proxy = Arc::new(crate::support::proxy::Proxy::start(shared_redis().port()));
    let url = format!("redis://127.0.0.1:{}/", proxy.port());
    let a = crate::support::redis::client(&url, &ns, ttl, handoff, true).await;
    let b = crate::support::redis::client(&url, &ns, ttl, handoff, true).await;
    let mut clients = vec![a.clone(); 4];
    clients.push(b.clone());
    let book = storm_through_cuts(proxy, &clients, "redis").await;
    let fresh = client_of(redis_backend(handoff).await, &ns, ttl);
    each_key_free(&fresh, 4, Duration::from_secs(7)).await;
    verdict(&book, "redis through cuts");
    redis_clean(&ns).await;
    crate::support::shut_down([a, b, fresh]).await;
}

/// PostgreSQL behind the proxy, its connections cut every 300 ms (for 50 ms) while two
/// clients' tasks (24 and 8) lock 4 keys with their futures cancelled at random, for 3 s:
/// errors of the outage are allowed, but one holder at a time with increasing tokens, and
/// afterwards every key free within the claims' TTL (5 s) and no live claim left.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_cancellation_storm_through_cuts_leaves_nothing_held() {
    let ns = test_namespace!();
    let ttl = Duration::from_secs(5);
    let handoff = Duration::from_secs(1);
    let proxy = Arc::new(crate::support::proxy::Proxy::start(
        shared_postgres().port(),
    ));
    let url = format!("postgres://postgres@127.0.0.1:{}/postgres", proxy.port());
    let a = crate::support::pg::client(&url, &ns, ttl, handoff).await;
    let b = crate::support::pg::client(&url, &ns, ttl, handoff).await;
    let mut clients = vec![a.clone(); 3];
    clients.push(b.clone());
    let book = storm_through_cuts(proxy, &clients, "postgres").await;
    let fresh = client_of(pg_backend(handoff).await, &ns, ttl);
    each_key_free(&fresh, 4, Duration::from_secs(7)).await;
    verdict(&book, "postgres through cuts");
    pg_clean(&ns).await;
    crate::support::shut_down([a, b, fresh]).await;
}

/// A client used from a second runtime (a client kept in a static across `#[tokio::test]`s,
/// each test its own runtime): an acquisition there is cancelled while its call, granted on
/// the server, is still out (held at the wrapper's gate), so its release task starts there and
/// drives the call; then that runtime shuts down. The release must still be sent (handed on,
/// as for a release task dropped unrun), not lost with the task: the key must be free for
/// another client well before the claim's 30 s lease ends.
async fn release_task_dropped_mid_drive<B: Backend + Clone>(
    faulty: Faulty<B>,
    other: LockClient,
    ns: &str,
    shut_down_first: bool,
) {
    let client = client_of(faulty.clone(), ns, LONG_TTL);
    client
        .mutex("warm")
        .lock()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    faulty.arm("k", When::GrantedAtGate, 1);
    let (c, f) = (client.clone(), faulty.clone());
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let task = tokio::spawn(c.mutex("k").lock());
            timeout(Duration::from_secs(5), async {
                while !f.plan.at_gate.load(Ordering::SeqCst) {
                    sleep(Duration::from_millis(1)).await;
                }
            })
            .await
            .expect("granted on the server");
            task.abort();
            let _ = task.await;
            // The release task runs now, driving the call out (at the gate).
            sleep(Duration::from_millis(50)).await;
        });
        drop(rt);
    })
    .join()
    .unwrap();
    // The call ends (its runtime is gone: nothing polls it any more).
    faulty.plan.gate.notify_one();
    if shut_down_first {
        // `shutdown` flushes pending releases and those whose task went unrun.
        client.shutdown().await;
    }
    let took = free_within(
        &other.mutex("k"),
        Duration::from_secs(5),
        "after the release task's runtime shut down",
    )
    .await;
    eprintln!("free after {took:?}");
    crate::support::shut_down([client, other]).await;
}

/// Redis: a release task dropped with its runtime while it drives a cancelled call still
/// sends the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_release_task_dropped_mid_drive_still_releases() {
    let ns = test_namespace!();
    let faulty = Faulty::new(redis_backend(HANDOFF).await);
    let other = client_of(redis_backend(HANDOFF).await, &ns, LONG_TTL);
    release_task_dropped_mid_drive(faulty, other, &ns, false).await;
    redis_clean(&ns).await;
}

/// Memory: a release task dropped with its runtime while it drives a cancelled call still
/// sends the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_release_task_dropped_mid_drive_still_releases() {
    let ns = test_namespace!();
    let backend = MemoryBackend::new();
    let faulty = Faulty::new(backend.clone());
    let other = client_of(backend, &ns, LONG_TTL);
    release_task_dropped_mid_drive(faulty, other, &ns, false).await;
}

/// Memory: as above, and the client is shut down before the check: `shutdown` (which sends
/// the releases whose task went unrun) does not send this one either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_release_task_dropped_mid_drive_is_released_at_shutdown_at_least() {
    let ns = test_namespace!();
    let backend = MemoryBackend::new();
    let faulty = Faulty::new(backend.clone());
    let other = client_of(backend, &ns, LONG_TTL);
    release_task_dropped_mid_drive(faulty, other, &ns, true).await;
}

/// The client talks to Redis through the proxy, which delays the replies 1 s; in a second
/// runtime a `lock()` is cancelled 100 ms after its acquire went out (granted on the server,
/// the reply on its way), so its release task starts there and drives the call; that runtime
/// shuts down `alive` after the cancellation. The key must be free for another client well
/// before the claim's 30 s lease ends.
async fn slow_reply_then_runtime_ends(ns: &str, alive: Duration) {
    let proxy = crate::support::proxy::Proxy::start(shared_redis().port());
    let url = format!("redis://127.0.0.1:{}/", proxy.port());
    let client = crate::support::redis::client(&url, ns, LONG_TTL, HANDOFF, true).await;
    let other = client_of(redis_backend(HANDOFF).await, ns, LONG_TTL);
    client
        .mutex("warm")
        .lock()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    proxy.delay_replies(
        crate::support::proxy::Which::Commands,
        Duration::from_secs(1),
    );
    let c = client.clone();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let cancelled = timeout(Duration::from_millis(100), c.mutex("k").lock()).await;
            assert!(cancelled.is_err(), "the reply is delayed");
            // The release task runs now, driving the call out (its reply delayed).
            sleep(alive).await;
        });
        drop(rt);
    })
    .join()
    .unwrap();
    let took = free_within(
        &other.mutex("k"),
        Duration::from_secs(5),
        "after the release task's runtime shut down",
    )
    .await;
    eprintln!("free after {took:?}");
    proxy.pass();
    crate::support::shut_down([client, other]).await;
    redis_clean(ns).await;
}

/// As [`redis_release_task_dropped_mid_drive_still_releases`] with no wrapper: the runtime
/// running the release task shuts down 50 ms after the cancellation, while the acquire call
/// it drives is still out (reply delayed 1 s by the proxy). The key must be free at once
/// after, not held for the claim's 30 s lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_release_task_dropped_mid_drive_with_a_slow_reply_still_releases() {
    let ns = test_namespace!();
    slow_reply_then_runtime_ends(&ns, Duration::from_millis(50)).await;
}

/// The control of the test above: the runtime lives 3 s, past the end of the acquire call,
/// and the key is free at once after (the release task ran to its end).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_release_task_that_outlives_the_call_releases() {
    let ns = test_namespace!();
    slow_reply_then_runtime_ends(&ns, Duration::from_secs(3)).await;
}

/// Redis behind the proxy, every reply delayed 1.5 s with a 1 s TTL: each grant comes back
/// past its lease, so `lock()` asks again, a round trip at a time, rather than return a guard
/// lost on arrival. Once the replies are prompt again it returns a valid guard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_grants_slower_than_the_ttl_are_asked_again_not_returned_lost() {
    let ns = test_namespace!();
    let proxy = crate::support::proxy::Proxy::start(shared_redis().port());
    let url = format!("redis://127.0.0.1:{}/", proxy.port());
    let client =
        crate::support::redis::client(&url, &ns, Duration::from_secs(1), HANDOFF, true).await;
    let warm = client.mutex("warm").lock().await.unwrap();
    warm.release().await.unwrap();
    proxy.delay_replies(
        crate::support::proxy::Which::Commands,
        Duration::from_millis(1500),
    );
    let waiting = tokio::spawn(client.mutex("k").lock());
    sleep(Duration::from_secs(4)).await;
    if waiting.is_finished() {
        let guard = waiting.await.unwrap();
        panic!(
            "lock() returned while every grant came back past its lease: lost {:?}",
            guard.map(|g| g.is_lost())
        );
    }
    proxy.pass();
    let guard = timeout(Duration::from_secs(5), waiting)
        .await
        .expect("granted once the replies are prompt")
        .unwrap()
        .unwrap();
    let left = guard
        .valid_until()
        .saturating_duration_since(std::time::Instant::now());
    assert!(!guard.is_lost() && !left.is_zero(), "lease left {left:?}");
    // The lease it came with may be short; renewals keep it.
    sleep(Duration::from_millis(1500)).await;
    assert!(!guard.is_lost(), "lost after it was returned valid");
    guard.release().await.unwrap();
    crate::support::shut_down([client]).await;
    redis_clean(&ns).await;
}
