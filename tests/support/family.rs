//! Behaviour checks for read-write locks, semaphores and multi-locks that every backend's
//! tests share. Each takes clients of one backend (separate clients stand for separate
//! processes) and, where order matters, a probe that waits until `n` claims are queued on a key.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use distlock::LockClient;
use futures::future::BoxFuture;
use tokio::time::{sleep, timeout};

/// Waits until `n` claims are queued on the key the check uses.
pub type Queued<'a> = &'a (dyn Fn(usize) -> BoxFuture<'static, ()> + Sync);

/// Readers and writers inside an `RwLock`'s critical sections.
#[derive(Default)]
pub struct RwOverlap {
    readers: AtomicUsize,
    writers: AtomicUsize,
    violations: AtomicUsize,
}

impl RwOverlap {
    fn read(&self) {
        self.readers.fetch_add(1, Ordering::SeqCst);
        if self.writers.load(Ordering::SeqCst) != 0 {
            self.violations.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn unread(&self) {
        self.readers.fetch_sub(1, Ordering::SeqCst);
    }

    fn write(&self) {
        if self.writers.fetch_add(1, Ordering::SeqCst) != 0
            || self.readers.load(Ordering::SeqCst) != 0
        {
            self.violations.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn unwrite(&self) {
        self.writers.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Every client loops `rounds` times on `key`, writing one round in `every` and reading the
/// others. Asserts no writer ever overlapped anyone, that write tokens increase in write order,
/// and that every grant's token exceeds the last write token granted before it.
pub async fn rw_exclusion(clients: Vec<LockClient>, key: &str, rounds: usize, every: usize) {
    let overlap = Arc::new(RwOverlap::default());
    // (is_write, token) in grant order, and the highest write token so far.
    let grants = Arc::new(StdMutex::new((Vec::new(), 0u64)));
    let mut tasks = Vec::new();
    for (c, client) in clients.into_iter().enumerate() {
        let (overlap, grants, key) = (overlap.clone(), grants.clone(), key.to_owned());
        tasks.push(tokio::spawn(async move {
            let rw = client.rw_lock(&key);
            for i in 0..rounds {
                if (i + c) % every == 0 {
                    let g = rw.write().await.unwrap();
                    overlap.write();
                    {
                        let mut grants = grants.lock().unwrap();
                        assert!(
                            g.fencing_token() > grants.1,
                            "write token {} not above the last write token {}",
                            g.fencing_token(),
                            grants.1
                        );
                        grants.1 = g.fencing_token();
                        grants.0.push((true, g.fencing_token()));
                    }
                    tokio::task::yield_now().await;
                    overlap.unwrite();
                    g.release().await.unwrap();
                } else {
                    let g = rw.read().await.unwrap();
                    overlap.read();
                    {
                        let mut grants = grants.lock().unwrap();
                        assert!(
                            g.fencing_token() > grants.1,
                            "read token {} not above the last write token {}",
                            g.fencing_token(),
                            grants.1
                        );
                        grants.0.push((false, g.fencing_token()));
                    }
                    sleep(Duration::from_micros(200)).await;
                    overlap.unread();
                    drop(g);
                }
            }
            client.shutdown().await;
        }));
    }
    for t in tasks {
        timeout(Duration::from_secs(120), t)
            .await
            .expect("an rw contender never finished")
            .unwrap();
    }
    assert_eq!(
        overlap.violations.load(Ordering::SeqCst),
        0,
        "a writer overlapped another holder"
    );
}

/// An event in an order check: `i` started or ended its hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    Start(usize),
    End(usize),
}

/// One writer holds `key`; then readers and writers queue in the order `plan` gives (`true` =
/// writer), each waiting until the one before is queued; then the first writer releases. Each
/// holds briefly. Asserts the queue is served in order with readers queued together granted
/// together: a writer starts only after everyone before it ended, a reader only after the
/// writers before it ended, and nobody after a writer starts before that writer ended.
pub async fn rw_fifo(clients: Vec<LockClient>, key: &str, plan: &[bool], queued: Queued<'_>) {
    assert_eq!(clients.len(), plan.len() + 1);
    let mut clients = clients.into_iter();
    let first = clients.next().unwrap().rw_lock(key).write().await.unwrap();
    let events = Arc::new(StdMutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (i, (client, &is_write)) in clients.zip(plan).enumerate() {
        let (events, key) = (events.clone(), key.to_owned());
        let next_reads = !is_write && plan.get(i + 1) == Some(&false);
        tasks.push(tokio::spawn(async move {
            let rw = client.rw_lock(&key);
            let hold = Duration::from_millis(30);
            if is_write {
                let g = rw.write().await.unwrap();
                events.lock().unwrap().push(Event::Start(i));
                sleep(hold).await;
                events.lock().unwrap().push(Event::End(i));
                g.release().await.unwrap();
            } else {
                let g = rw.read().await.unwrap();
                events.lock().unwrap().push(Event::Start(i));
                if next_reads {
                    // Hold until the reader queued next to us is in too (it should be granted
                    // with us): a wait that ends at the limit shows as a failure below.
                    let _ = timeout(Duration::from_secs(5), async {
                        while !events.lock().unwrap().contains(&Event::Start(i + 1)) {
                            sleep(Duration::from_millis(1)).await;
                        }
                    })
                    .await;
                }
                sleep(hold).await;
                events.lock().unwrap().push(Event::End(i));
                g.release().await.unwrap();
            }
            client.shutdown().await;
        }));
        queued(i + 1).await;
    }
    first.release().await.unwrap();
    for t in tasks {
        timeout(Duration::from_secs(30), t)
            .await
            .expect("a queued contender never finished")
            .unwrap();
    }
    let events = events.lock().unwrap().clone();
    let at = |e: Event| {
        events
            .iter()
            .position(|x| *x == e)
            .unwrap_or_else(|| panic!("{e:?} missing from {events:?}"))
    };
    for (i, &wi) in plan.iter().enumerate() {
        for (j, &wj) in plan.iter().enumerate().take(i) {
            // j queued before i: i may start before j ends only if both read.
            if wi || wj {
                assert!(
                    at(Event::End(j)) < at(Event::Start(i)),
                    "{i} ({}) started before {j} ({}) ended: {events:?}",
                    if wi { "writer" } else { "reader" },
                    if wj { "writer" } else { "reader" },
                );
            }
        }
    }
    // Readers queued together went together: the second of two adjacent readers started
    // before the first ended.
    for i in 1..plan.len() {
        if !plan[i] && !plan[i - 1] {
            assert!(
                at(Event::Start(i)) < at(Event::End(i - 1)),
                "readers {} and {i}, queued together, were not granted together: {events:?}",
                i - 1
            );
        }
    }
}

/// Every client takes 1 or 2 of `max` permits of `key`, `rounds` times. Asserts the permits
/// held at once never exceed `max`.
pub async fn semaphore_bound(clients: Vec<LockClient>, key: &str, max: u32, rounds: usize) {
    let in_use = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for (c, client) in clients.into_iter().enumerate() {
        let (in_use, peak, key) = (in_use.clone(), peak.clone(), key.to_owned());
        tasks.push(tokio::spawn(async move {
            let sem = client.semaphore(&key, max);
            for i in 0..rounds {
                let n = 1 + u32::try_from((i + c) % 2).unwrap();
                let p = sem.acquire_many(n).await.unwrap();
                let now = in_use.fetch_add(n as usize, Ordering::SeqCst) + n as usize;
                peak.fetch_max(now, Ordering::SeqCst);
                sleep(Duration::from_micros(300)).await;
                in_use.fetch_sub(n as usize, Ordering::SeqCst);
                if i % 2 == 0 {
                    p.release().await.unwrap();
                } else {
                    drop(p);
                }
            }
            client.shutdown().await;
        }));
    }
    for t in tasks {
        timeout(Duration::from_secs(120), t)
            .await
            .expect("a semaphore contender never finished")
            .unwrap();
    }
    let peak = peak.load(Ordering::SeqCst);
    assert!(peak <= max as usize, "{peak} permits held at once of {max}");
    assert!(peak > 1, "the check never had permits held together");
}

/// A request for many permits at the head of the queue is not overtaken by a smaller one behind
/// it, even when the smaller one would fit now; both are granted once enough is free.
pub async fn semaphore_head_is_not_overtaken(
    clients: [LockClient; 3],
    key: &str,
    queued: Queued<'_>,
) {
    let [a, b, c] = clients;
    let held = a.semaphore(key, 4).acquire_many(3).await.unwrap();
    let big = tokio::spawn({
        let sem = b.semaphore(key, 4);
        async move { sem.acquire_many(3).await }
    });
    queued(1).await;
    let small = tokio::spawn({
        let sem = c.semaphore(key, 4);
        async move { sem.acquire().await }
    });
    queued(2).await;
    sleep(Duration::from_millis(100)).await;
    assert!(
        !small.is_finished(),
        "a one-permit request overtook a three-permit request queued before it"
    );
    held.release().await.unwrap();
    let big = timeout(Duration::from_secs(10), big)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let small = timeout(Duration::from_secs(10), small)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!((big.count(), small.count()), (3, 1));
    assert!(small.fencing_token() > big.fencing_token());
    drop((big, small));
    for client in [a, b, c] {
        client.shutdown().await;
    }
}

/// A writer downgrades while a writer and then a reader are queued: the queued writer does not
/// get in while the downgraded reader holds; once it releases, the writer goes first, then the
/// reader. With the reader queued first instead, the downgrade lets it in at once.
pub async fn downgrade_keeps_queued_writers_out(
    clients: [LockClient; 3],
    key: &str,
    queued: Queued<'_>,
) {
    let [a, b, c] = clients;
    let w = a.rw_lock(key).write().await.unwrap();
    let token = w.fencing_token();
    let writer = tokio::spawn({
        let rw = b.rw_lock(key);
        async move { rw.write().await }
    });
    queued(1).await;
    let reader = tokio::spawn({
        let rw = c.rw_lock(key);
        async move { rw.read().await }
    });
    queued(2).await;

    let r = w.downgrade().await.unwrap();
    assert_eq!(
        r.fencing_token(),
        token,
        "a downgrade keeps the write token"
    );
    sleep(Duration::from_millis(150)).await;
    assert!(
        !writer.is_finished(),
        "a queued writer got in beside a downgraded reader"
    );
    assert!(
        !reader.is_finished(),
        "a reader overtook the writer queued before it"
    );
    assert!(!r.is_lost());
    r.release().await.unwrap();
    let w2 = timeout(Duration::from_secs(10), writer)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(w2.fencing_token() > token);
    sleep(Duration::from_millis(50)).await;
    assert!(!reader.is_finished(), "a reader got in beside a writer");
    w2.release().await.unwrap();
    let r2 = timeout(Duration::from_secs(10), reader)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    drop(r2);

    // A reader queued behind the writer: the downgrade lets it in at once.
    let w = a.rw_lock(key).write().await.unwrap();
    let reader = tokio::spawn({
        let rw = c.rw_lock(key);
        async move { rw.read().await }
    });
    queued(1).await;
    let r = w.downgrade().await.unwrap();
    let r2 = timeout(Duration::from_secs(10), reader)
        .await
        .expect("a downgrade did not let the reader queued behind it in")
        .unwrap()
        .unwrap();
    drop((r, r2));
    for client in [a, b, c] {
        client.shutdown().await;
    }
}

/// One key holds one kind of lock: every other kind (and, where the backend records it, a
/// semaphore with another number of permits) is refused while it is in use, with a
/// kind-mismatch error.
pub async fn kinds_do_not_mix(clients: [LockClient; 2], prefix: &str, max_recorded: bool) {
    let [a, b] = clients;
    let (m, r, s) = (
        format!("{prefix}:m"),
        format!("{prefix}:r"),
        format!("{prefix}:s"),
    );
    let mutex = a.mutex(&m).lock().await.unwrap();
    let rw = a.rw_lock(&r).read().await.unwrap();
    let sem = a.semaphore(&s, 2).acquire().await.unwrap();
    let mismatch = |e: distlock::Error| {
        assert!(e.is_kind_mismatch(), "{e:?}");
    };
    mismatch(b.rw_lock(&m).try_read().await.unwrap_err());
    mismatch(
        b.rw_lock(&m)
            .read_timeout(Duration::from_secs(1))
            .await
            .unwrap_err(),
    );
    mismatch(b.semaphore(&m, 1).try_acquire().await.unwrap_err());
    mismatch(b.mutex(&r).try_lock().await.unwrap_err());
    mismatch(
        b.mutex(&r)
            .lock_timeout(Duration::from_secs(1))
            .await
            .unwrap_err(),
    );
    mismatch(b.semaphore(&r, 2).try_acquire().await.unwrap_err());
    if max_recorded {
        mismatch(b.semaphore(&s, 3).try_acquire().await.unwrap_err());
    }
    mismatch(b.rw_lock(&s).try_write().await.unwrap_err());
    mismatch(b.mutex(&s).try_lock().await.unwrap_err());
    // The right kind still works.
    drop(b.semaphore(&s, 2).try_acquire().await.unwrap());
    drop(b.rw_lock(&r).try_read().await.unwrap());
    drop((mutex, rw, sem));
    // Once free, a key may become another kind.
    sleep(Duration::from_millis(100)).await;
    drop(b.semaphore(&m, 3).acquire().await.unwrap());
    a.shutdown().await;
    b.shutdown().await;
}

/// `inspect` sees two readers holding and a writer waiting on an `RwLock`, and a two-permit
/// holder and a two-permit waiter on a semaphore of 3 (`max_recorded`: the backend knows the
/// 3; ZooKeeper, like Curator, does not).
pub async fn inspect_sees_the_family(
    clients: [LockClient; 3],
    prefix: &str,
    max_recorded: bool,
    queued_rw: Queued<'_>,
    queued_sem: Queued<'_>,
) {
    use distlock::backend::{Family, LockKind};
    let [a, b, c] = clients;
    let (rw, sem) = (format!("{prefix}:rw"), format!("{prefix}:sem"));
    assert!(a.inspect(&rw).await.unwrap().is_free());
    let r1 = a.rw_lock(&rw).read().await.unwrap();
    let r2 = b.rw_lock(&rw).read().await.unwrap();
    let w = tokio::spawn({
        let rw = c.rw_lock(&rw);
        async move { rw.write().await }
    });
    queued_rw(1).await;
    let seen = a.inspect(&rw).await.unwrap();
    assert_eq!(seen.family, Some(Family::RwLock), "{seen:?}");
    assert_eq!(seen.holders.len(), 2, "{seen:?}");
    assert!(
        seen.holders.iter().all(|h| h.kind == LockKind::Read),
        "{seen:?}"
    );
    let mut tokens: Vec<Option<u64>> = seen.holders.iter().map(|h| h.fencing_token).collect();
    tokens.sort();
    let mut expected = vec![Some(r1.fencing_token()), Some(r2.fencing_token())];
    expected.sort();
    assert_eq!(tokens, expected);
    assert_eq!(seen.waiters.len(), 1, "{seen:?}");
    assert_eq!(seen.waiters[0].kind, LockKind::Write);
    drop((r1, r2));
    drop(super::contract::granted(w, Duration::from_secs(10), "a queued claim").await);

    let p = a.semaphore(&sem, 3).acquire_many(2).await.unwrap();
    let more = tokio::spawn({
        let s = b.semaphore(&sem, 3);
        async move { s.acquire_many(2).await }
    });
    queued_sem(1).await;
    let seen = c.inspect(&sem).await.unwrap();
    let max = if max_recorded { 3 } else { 0 };
    assert_eq!(seen.family, Some(Family::Semaphore { max }), "{seen:?}");
    assert_eq!(seen.holders.len(), 1, "{seen:?}");
    assert!(
        matches!(seen.holders[0].kind, LockKind::Permits { count: 2, .. }),
        "{seen:?}"
    );
    assert_eq!(seen.holders[0].fencing_token, Some(p.fencing_token()));
    assert_eq!(seen.waiters.len(), 1, "{seen:?}");
    assert!(matches!(seen.waiters[0].kind, LockKind::Permits { .. }));
    drop(p);
    drop(super::contract::granted(more, Duration::from_secs(10), "a queued claim").await);
    for client in [a, b, c] {
        client.shutdown().await;
    }
}
