//! Fault scenarios that the backends with queued handoff (Redis, PostgreSQL) share: each takes
//! a [`Service`] that says how to reach the server, directly or through a proxy.

use std::time::Duration;

use distlock::{LockClient, MutexGuard};
use futures::future::BoxFuture;
use tokio::time::{sleep, timeout, Instant};

use super::proxy::{Proxies, Proxy, Which};

/// How a scenario reaches one backend's server.
pub struct Service {
    /// The server's port, which proxies forward to.
    pub port: u16,
    /// Further nodes' ports, each behind a proxy of its own where a check puts a client behind
    /// proxies (Redlock's); empty for one server.
    pub more_ports: Vec<u16>,
    /// A URL for a server (or proxy) listening on a port.
    pub url_for: fn(u16) -> String,
    /// A client with its own connections: `(url, namespace, ttl, handoff ttl)`; the URL of a
    /// service of several nodes lists theirs, separated by ','.
    pub connect: fn(String, String, Duration, Duration) -> BoxFuture<'static, LockClient>,
    /// Waits until `n` claims are queued on `(namespace, key)`.
    pub until_queued: fn(String, String, usize) -> BoxFuture<'static, ()>,
    /// How many traces of locks (holders, waiters) are left in a namespace.
    pub left_in: fn(String) -> BoxFuture<'static, usize>,
}

impl Service {
    pub fn url(&self) -> String {
        self.urls_for(&self.ports())
    }

    /// Every node's port.
    pub fn ports(&self) -> Vec<u16> {
        let mut ports = vec![self.port];
        ports.extend(&self.more_ports);
        ports
    }

    fn urls_for(&self, ports: &[u16]) -> String {
        let urls: Vec<String> = ports.iter().map(|&p| (self.url_for)(p)).collect();
        urls.join(",")
    }

    /// A proxy in front of every node.
    pub fn proxies(&self) -> Proxies {
        Proxies::start(&self.ports())
    }

    /// The service's URL through `proxies`.
    pub fn via_all(&self, proxies: &Proxies) -> String {
        self.urls_for(&proxies.ports())
    }

    pub fn via(&self, proxy: &Proxy) -> String {
        (self.url_for)(proxy.port())
    }

    pub async fn client(
        &self,
        url: String,
        ns: &str,
        ttl: Duration,
        handoff: Duration,
    ) -> LockClient {
        (self.connect)(url, ns.to_owned(), ttl, handoff).await
    }

    pub async fn until_queued(&self, ns: &str, key: &str, n: usize) {
        (self.until_queued)(ns.to_owned(), key.to_owned(), n).await;
    }
}

/// Tries `key` on `other` every few ms until it is granted or `limit` passes, checking at every
/// step that `stale` never goes back from lost to held, and that it reports lost once `other`
/// holds. Returns `other`'s guard and when it was granted.
pub async fn grant_elsewhere(
    other: &LockClient,
    key: &str,
    stale: &MutexGuard,
    limit: Duration,
) -> Option<(MutexGuard, Instant)> {
    let end = Instant::now() + limit;
    let mut seen_lost = false;
    while Instant::now() < end {
        let lost = stale.is_lost();
        assert!(lost || !seen_lost, "a guard went back from lost to held");
        seen_lost |= lost;
        if let Ok(guard) = other.mutex(key).try_lock().await {
            let at = Instant::now();
            assert!(
                stale.is_lost(),
                "another client was granted the lock while the old holder still believes it holds"
            );
            return Some((guard, at));
        }
        sleep(Duration::from_millis(5)).await;
    }
    None
}

/// Checks for `period` that `stale` stays lost.
pub async fn stays_lost(stale: &MutexGuard, period: Duration) {
    let end = Instant::now() + period;
    while Instant::now() < end {
        assert!(stale.is_lost(), "a lost guard reports held again");
        sleep(Duration::from_millis(10)).await;
    }
}

/// A lock handed to a waiter whose process just died (its connections refused, its queue entry
/// still alive for a TTL) passes to the next waiter when the handoff's provisional lease ends,
/// not at the dead waiter's deadline. With `after_a_live_one`, a live waiter queued first takes
/// the lock and gives it up at once, so the handoff to the dead one is the second of the chain
/// (the next waiter queued while the first holder's long lease ran, and must still hear when the
/// dead one's provisional lease ends).
pub async fn handoff_to_a_dead_waiter_passes_on(svc: &Service, ns: &str, after_a_live_one: bool) {
    let proxy = Proxy::start(svc.port);
    let (ttl, handoff) = (Duration::from_secs(10), Duration::from_millis(300));
    let h = svc.client(svc.url(), ns, ttl, handoff).await;
    let live = svc.client(svc.url(), ns, ttl, handoff).await;
    let dead = svc.client(svc.via(&proxy), ns, ttl, handoff).await;
    let next = svc.client(svc.url(), ns, ttl, handoff).await;

    let held = h.mutex("k").lock().await.unwrap();
    let mut queued = 0;
    let first = if after_a_live_one {
        let first = tokio::spawn(live.mutex("k").lock());
        queued += 1;
        svc.until_queued(ns, "k", queued).await;
        Some(first)
    } else {
        None
    };
    let doomed = tokio::spawn(dead.mutex("k").lock());
    queued += 1;
    svc.until_queued(ns, "k", queued).await;
    let waiter = tokio::spawn(next.mutex("k").lock());
    svc.until_queued(ns, "k", queued + 1).await;

    proxy.cut();
    let mut released = Instant::now();
    held.release().await.unwrap();
    if let Some(first) = first {
        let guard = timeout(Duration::from_secs(5), first)
            .await
            .expect("the live waiter was not served")
            .unwrap()
            .unwrap();
        released = Instant::now();
        guard.release().await.unwrap();
    }
    let guard = timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the next waiter waited for the dead waiter's TTL")
        .unwrap()
        .unwrap();
    let waited = released.elapsed();
    assert!(
        waited < handoff + Duration::from_millis(700),
        "the next waiter got the lock {waited:?} after the release"
    );
    doomed.abort();
    drop(guard);
    h.shutdown().await;
    live.shutdown().await;
    next.shutdown().await;
}

/// A message connection gone half-open (bytes vanish, no reset) is found out by its ping and
/// replaced, and the waiter whose grant it swallowed gets the lock within seconds, not at the
/// holder's 10 s TTL.
pub async fn half_open_message_connection_loses_no_grant(svc: &Service, ns: &str) {
    let proxy = Proxy::start(svc.port);
    let (ttl, handoff) = (Duration::from_secs(10), Duration::from_secs(2));
    let h = svc.client(svc.url(), ns, ttl, handoff).await;
    let w = svc.client(svc.via(&proxy), ns, ttl, handoff).await;

    let held = h.mutex("k").lock().await.unwrap();
    let waiter = tokio::spawn(w.mutex("k").lock());
    svc.until_queued(ns, "k", 1).await;
    proxy.blackhole_only(Which::Subscribers);
    let released = Instant::now();
    held.release().await.unwrap();

    let guard = timeout(Duration::from_secs(6), waiter)
        .await
        .expect("the grant went into a half-open connection and the waiter never learned")
        .unwrap()
        .unwrap();
    assert!(!guard.is_lost());
    assert!(
        released.elapsed() < Duration::from_secs(4),
        "{:?}",
        released.elapsed()
    );
    guard.release().await.unwrap();
    proxy.pass();
    h.shutdown().await;
    w.shutdown().await;
}

/// A release that ran on the server but whose reply was lost, sent again after the connection
/// dropped (and finding nothing), is not reported as a lost lock, and nothing is left.
pub async fn release_with_a_lost_reply_is_not_lost(svc: &Service, ns: &str) {
    let proxy = Proxy::start(svc.port);
    let c = svc
        .client(
            svc.via(&proxy),
            ns,
            Duration::from_secs(10),
            Duration::from_secs(2),
        )
        .await;
    let guard = c.mutex("k").lock().await.unwrap();
    proxy.swallow_replies(Which::Commands);
    let release = tokio::spawn(guard.release());
    sleep(Duration::from_millis(300)).await;
    proxy.cut();
    sleep(Duration::from_millis(50)).await;
    proxy.pass();

    let outcome = timeout(Duration::from_secs(10), release)
        .await
        .expect("release never finished")
        .unwrap();
    assert!(
        outcome.is_ok(),
        "a lock released on the server was reported as {outcome:?}"
    );
    assert_eq!((svc.left_in)(ns.to_owned()).await, 0, "left behind");
    c.shutdown().await;
}

/// Set in the holder process the killed-holder scenario re-runs its test in.
const CHILD_ENV: &str = "DISTLOCK_TEST_CHILD_HOLDER";
/// The killed holder's lease.
pub const CHILD_TTL: Duration = Duration::from_millis(1500);

/// A holder in another process (the test binary re-run for test `test`), SIGKILLed: its lock
/// is free for the queued waiter within the TTL plus `slack`, with a larger token. The test
/// calls this in both processes: in the child it takes the lock and holds it until killed.
pub async fn killed_holder_frees_the_lock(svc: &Service, test: &str, ns: &str, slack: Duration) {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        let (url, ns) = spec.split_once(' ').expect("`<url> <namespace>`");
        let c = svc
            .client(url.to_owned(), ns, CHILD_TTL, Duration::from_secs(2))
            .await;
        let guard = c.mutex("k").lock().await.unwrap();
        super::holder::report_and_hold(guard.fencing_token()).await;
    }
    let url = svc.url();
    let (child, child_fence) = super::holder::spawn(test, CHILD_ENV, format!("{url} {ns}")).await;
    let c = svc
        .client(url, ns, Duration::from_secs(10), Duration::from_secs(2))
        .await;
    let waiter = tokio::spawn(c.mutex("k").lock());
    svc.until_queued(ns, "k", 1).await;
    // Past the child's first renewals, so its lease was refreshed before it died.
    sleep(CHILD_TTL).await;
    let (guard, waited) = super::holder::kill_and_await(child, waiter, CHILD_TTL * 3).await;
    assert!(
        waited <= CHILD_TTL + slack,
        "took {waited:?} after the kill, TTL {CHILD_TTL:?}"
    );
    assert!(guard.fencing_token() > child_fence);
    guard.release().await.unwrap();
    c.shutdown().await;
}

/// Which read-write lock or semaphore claim a scenario takes.
#[derive(Clone, Copy, Debug)]
pub enum Shared {
    /// A one-permit semaphore: the holder and everyone after it take one permit.
    Permit,
    /// A read-write lock: the holder writes, everyone after it reads.
    WriteThenRead,
}

/// Holds a read-write lock or semaphore claim of `shape` as the first holder (`first`) or as
/// anyone after it, on `client`; boxed so a scenario can spawn it.
fn boxed<G: Send + 'static>(guard: G) -> Box<dyn std::any::Any + Send> {
    Box::new(guard)
}

fn take_shared(
    client: &LockClient,
    shape: Shared,
    first: bool,
    patience: Duration,
) -> BoxFuture<'static, distlock::Result<Box<dyn std::any::Any + Send>>> {
    match (shape, first) {
        (Shared::Permit, _) => {
            let f = client.semaphore("k", 1).acquire_timeout(patience);
            Box::pin(async move { f.await.map(boxed) })
        }
        (Shared::WriteThenRead, true) => {
            let f = client.rw_lock("k").write_timeout(patience);
            Box::pin(async move { f.await.map(boxed) })
        }
        (Shared::WriteThenRead, false) => {
            let f = client.rw_lock("k").read_timeout(patience);
            Box::pin(async move { f.await.map(boxed) })
        }
    }
}

/// A read-write lock's or semaphore's holder (lease 1 s) and a waiter queued behind it (lease
/// 10 s) both die (their connections cut). Once the holder's bookkeeping has expired, a new
/// claim must still be granted within a handoff lease or two (the dead waiter is handed the
/// lock first): no state of a dead holder may outlive its lease while anyone is queued.
pub async fn dead_holder_state_does_not_outlive_its_lease(svc: &Service, ns: &str, shape: Shared) {
    let handoff = Duration::from_millis(300);
    let (p1, p2) = (Proxy::start(svc.port), Proxy::start(svc.port));
    let holder = svc
        .client(svc.via(&p1), ns, Duration::from_secs(1), handoff)
        .await;
    let waiter = svc
        .client(svc.via(&p2), ns, Duration::from_secs(10), handoff)
        .await;
    let held = take_shared(&holder, shape, true, Duration::from_secs(5))
        .await
        .unwrap();
    let doomed = tokio::spawn(take_shared(&waiter, shape, false, Duration::from_secs(60)));
    svc.until_queued(ns, "k", 1).await;
    // Past a renewal of each, then both die.
    sleep(Duration::from_millis(600)).await;
    p1.cut();
    p2.cut();
    // Longer than the holder's bookkeeping lives (twice its lease).
    sleep(Duration::from_millis(2600)).await;

    let fresh = svc
        .client(svc.url(), ns, Duration::from_secs(10), handoff)
        .await;
    let started = Instant::now();
    let got = take_shared(&fresh, shape, false, Duration::from_secs(8)).await;
    let waited = started.elapsed();
    assert!(
        got.is_ok(),
        "{shape:?}: a dead holder's state blocked a new claim for {waited:?}: {:?}",
        got.err()
    );
    assert!(
        waited < handoff * 2 + Duration::from_millis(1500),
        "{shape:?}: a new claim waited {waited:?} behind dead claims"
    );
    drop(got);
    doomed.abort();
    drop(held);
    fresh.shutdown().await;
}

/// How the dead waiters of [`dead_waiters_in_a_row_cost_a_handoff_lease_each`] die.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Death {
    /// Their connections close (the server sees them go).
    Closed,
    /// Their hosts crash: nothing more reaches the server, and their connections stay open
    /// on its side (no FIN, until TCP keepalive gives up), so they look alive.
    Crashed,
}

/// `dead` waiters queued in a row behind a holder die (`how`), a live one waits behind them;
/// the holder releases. Each dead waiter may cost one provisional handoff lease, no more: the
/// live one is granted within `dead` handoff leases and some slack, never at a TTL.
pub async fn dead_waiters_in_a_row_cost_a_handoff_lease_each(
    svc: &Service,
    ns: &str,
    dead: usize,
    how: Death,
) {
    dead_waiters_in_line_cost_a_handoff_lease_each(svc, ns, &vec![how; dead]).await;
}

/// Waiters queued in a row behind a holder die, the `i`th as `deaths[i]` says, a live one
/// waits behind them; the holder releases. Each dead waiter may cost one provisional handoff
/// lease, no more: the live one is granted within as many handoff leases and some slack.
pub async fn dead_waiters_in_line_cost_a_handoff_lease_each(
    svc: &Service,
    ns: &str,
    deaths: &[Death],
) {
    let dead = deaths.len();
    let (ttl, handoff) = (Duration::from_secs(10), Duration::from_millis(300));
    let h = svc.client(svc.url(), ns, ttl, handoff).await;
    let next = svc.client(svc.url(), ns, ttl, handoff).await;
    let held = h.mutex("k").lock().await.unwrap();
    let mut doomed = Vec::new();
    for i in 0..dead {
        let proxy = Proxy::start(svc.port);
        let c = svc.client(svc.via(&proxy), ns, ttl, handoff).await;
        doomed.push((proxy, tokio::spawn(c.mutex("k").lock()), c));
        svc.until_queued(ns, "k", i + 1).await;
    }
    let waiter = tokio::spawn(next.mutex("k").lock());
    svc.until_queued(ns, "k", dead + 1).await;
    for ((proxy, task, _), how) in doomed.iter().zip(deaths) {
        match how {
            Death::Closed => proxy.cut(),
            Death::Crashed => {
                // Open connections look alive past the test; new ones reach nothing.
                proxy.crash(ttl * 2);
                proxy.blackhole();
                task.abort();
            }
        }
    }
    // A moment for the server to see the dead clients' connections close (a process that
    // died a moment before the release may still look subscribed).
    sleep(Duration::from_millis(200)).await;
    let released = Instant::now();
    held.release().await.unwrap();
    let guard = timeout(ttl, waiter)
        .await
        .expect("the live waiter waited for a dead waiter's TTL")
        .unwrap()
        .unwrap();
    let waited = released.elapsed();
    println!("dead waiters {deaths:?} in a row: the live one granted {waited:?} after the release");
    let bound = handoff * u32::try_from(dead).unwrap_or(u32::MAX) + Duration::from_millis(700);
    assert!(
        waited < bound,
        "dead waiters {deaths:?} in a row held the lock {waited:?} (bound {bound:?})"
    );
    for (_, task, _) in &doomed {
        task.abort();
    }
    drop(guard);
    h.shutdown().await;
    next.shutdown().await;
}

/// `pooled` sends its statements through a pool whose connections reach the
/// server through `proxy`, which holds back every request containing `pattern` (the acquire
/// call's name) by 300 ms. Its `lock_timeout(50 ms)` gives up while the acquire is on its way;
/// the release that follows must not overtake it on another pooled connection (finding
/// nothing, and leaving the late acquire to hold the lock for no one for a whole TTL). Asserts
/// that `other` gets the lock soon after the late acquire landed; returns how long the key was
/// blocked, from the timeout.
pub async fn a_timed_out_pooled_lock_leaves_no_holder(
    pooled: &LockClient,
    other: &LockClient,
    proxy: &Proxy,
    pattern: &'static [u8],
) -> Duration {
    let delay = Duration::from_millis(300);
    proxy.delay_requests_containing(Which::Commands, pattern, delay);
    let err = pooled
        .mutex("k")
        .lock_timeout(Duration::from_millis(50))
        .await
        .expect_err("the delayed acquire was granted within 50 ms");
    assert!(err.is_timeout(), "{err}");
    let gave_up = Instant::now();
    // The late acquire reaches the server now.
    sleep(delay + Duration::from_millis(200)).await;
    let guard = timeout(Duration::from_secs(30), other.mutex("k").lock())
        .await
        .expect("the key stayed blocked")
        .unwrap();
    let blocked = gave_up.elapsed();
    println!("the key was free {blocked:?} after the timeout");
    assert!(
        blocked < Duration::from_millis(1500),
        "a holder nobody owns blocked the key for {blocked:?}"
    );
    guard.release().await.unwrap();
    proxy.pass();
    blocked
}

/// `holder` holds `k` (with a long lease); a client on `waiter` (whose
/// renewals `renews` counts, and whose message connection goes through `proxy`) queues behind
/// it, renewing its queue entry every 0.8 s (a third of its TTL). The proxy then drops every
/// byte, of that connection and of any new one, and `holder` releases: the handoff's message
/// is lost, and the waiter's next queue renewal finds it holding the lock. It must take the
/// lock then, within about a renewal period of the release, with a handful of renew calls
/// (not one after another until its own re-check at the holder's old lease end).
pub async fn a_grant_seen_by_a_queue_renewal_is_taken<B: distlock::backend::Backend>(
    svc: &Service,
    ns: &str,
    holder: &LockClient,
    waiter: B,
    renews: &std::sync::atomic::AtomicU64,
    proxy: &Proxy,
) {
    let w = LockClient::builder(waiter)
        .namespace(ns)
        .ttl(Duration::from_millis(2400))
        .build()
        .unwrap();
    let held = holder.mutex("k").lock().await.unwrap();
    let waiter = super::contract::spawn_timed_lock(w.mutex("k"));
    svc.until_queued(ns, "k", 1).await;
    proxy.blackhole();
    let fence = held.fencing_token();
    let before = super::counting::count(renews);
    let released = Instant::now();
    held.release().await.unwrap();

    let (granted_at, guard) = timeout(Duration::from_secs(15), waiter)
        .await
        .expect("the waiter was never granted")
        .unwrap();
    let guard = guard.unwrap();
    let after = granted_at - released;
    let calls = super::counting::count(renews).saturating_sub(before);
    println!(
        "granted {after:?} after the release, {calls} renew calls ({:.0}/s)",
        calls as f64 / after.as_secs_f64()
    );
    assert!(
        after <= Duration::from_millis(1200),
        "granted {after:?} after the release"
    );
    assert!(calls <= 4, "{calls} renew calls in {after:?}");
    assert!(!guard.is_lost());
    assert!(guard.fencing_token() > fence);
    guard.release().await.unwrap();
    proxy.heal();
    w.shutdown().await;
}

/// The holder (lease `HOLDER_TTL`) and `dead` waiters queued behind it crash together (their
/// connections stay open on the server, silent); a live waiter behind them must be granted
/// within the holder's lease, a handoff lease per dead waiter and some slack, from the crash.
/// `shape`: `None` a mutex; `Some(Permit)` a one-permit semaphore; `Some(WriteThenRead)` the
/// holder and the dead waiters write, the live one reads.
pub async fn crashed_holder_and_waiters_cost_its_lease_and_a_handoff_lease_each(
    svc: &Service,
    ns: &str,
    dead: usize,
    shape: Option<Shared>,
) {
    const HOLDER_TTL: Duration = Duration::from_millis(2000);
    let (ttl, handoff) = (Duration::from_secs(10), Duration::from_millis(300));
    let take = |c: &LockClient,
                first: bool|
     -> BoxFuture<'static, distlock::Result<Box<dyn std::any::Any + Send>>> {
        match shape {
            None => {
                let f = c.mutex("k").lock();
                Box::pin(async move { f.await.map(boxed) })
            }
            Some(s) => take_shared(c, s, first, Duration::from_secs(60)),
        }
    };
    let hp = Proxy::start(svc.port);
    let h = svc.client(svc.via(&hp), ns, HOLDER_TTL, handoff).await;
    let next = svc.client(svc.url(), ns, ttl, handoff).await;
    let held = take(&h, true).await.unwrap();
    let mut doomed = Vec::new();
    for i in 0..dead {
        let proxy = Proxy::start(svc.port);
        let c = svc.client(svc.via(&proxy), ns, ttl, handoff).await;
        doomed.push((proxy, tokio::spawn(take(&c, true)), c));
        svc.until_queued(ns, "k", i + 1).await;
    }
    let waiter = tokio::spawn(take(&next, false));
    svc.until_queued(ns, "k", dead + 1).await;
    // Past a renewal of the holder's.
    sleep(HOLDER_TTL / 2).await;
    let crashed = Instant::now();
    for proxy in std::iter::once(&hp).chain(doomed.iter().map(|(p, _, _)| p)) {
        proxy.crash(ttl * 2);
        proxy.blackhole();
    }
    for (_, task, _) in &doomed {
        task.abort();
    }
    std::mem::forget(held);
    let guard = timeout(ttl * 2, waiter)
        .await
        .expect("the live waiter was never granted")
        .unwrap()
        .unwrap();
    let waited = crashed.elapsed();
    println!(
        "{shape:?}: crashed holder and {dead} crashed waiters: the live one granted {waited:?} after the crash"
    );
    let bound =
        HOLDER_TTL + handoff * u32::try_from(dead).unwrap_or(u32::MAX) + Duration::from_millis(700);
    assert!(
        waited < bound,
        "{shape:?}: a crashed holder and {dead} crashed waiters held the lock {waited:?} (bound {bound:?})"
    );
    drop(guard);
    next.shutdown().await;
}

/// Locks and releases `n` keys (`warm<i>`) through `client`, so that its connections are open
/// before a fault is set on them.
pub async fn open_connections(client: &LockClient, n: usize) {
    for i in 0..n {
        let guard = client.mutex(format!("warm{i}")).lock().await.unwrap();
        guard.release().await.unwrap();
    }
}

/// Asks for `key` again and again (each ask bounded) until it is granted, for at most
/// `within`; releases it and returns its token. Panics, saying how long it asked, if it is
/// never granted.
pub async fn granted_within(client: &LockClient, key: &str, within: Duration) -> u64 {
    let started = Instant::now();
    let token = timeout(within, async {
        loop {
            if let Ok(g) = client.mutex(key).lock_timeout(Duration::from_secs(3)).await {
                let token = g.fencing_token();
                g.release().await.unwrap();
                return token;
            }
        }
    })
    .await;
    token.unwrap_or_else(|_| panic!("`{key}` not granted {:?} after", started.elapsed()))
}
