//! A client belongs to the runtime it was built in: its tasks (renewals, releases, the
//! connections' own) run there. Here: clients used from other runtimes that start, idle and end
//! while others hold or wait; `shutdown` with leases taken on several runtimes; and what a user
//! sees once the client's own runtime has ended. Redis standalone, public API only.
#![cfg(feature = "redis")]

use std::time::Duration;

use tokio::runtime::{Builder, Runtime};
use tokio::time::{sleep, timeout, Instant};

/// A current-thread runtime.
fn current_thread() -> Runtime {
    Builder::new_current_thread().enable_all().build().unwrap()
}

/// A multi-thread runtime with `workers` worker threads.
fn multi_thread(workers: usize) -> Runtime {
    Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .unwrap()
}

/// What the churn test's runtimes name their threads: [`threads`] counts them alone, whatever
/// the other tests of the binary run meanwhile (the library starts no thread of its own).
const THREAD_NAME: &str = "engine-churn";

/// A runtime of the churn test: current-thread, or multi-thread with one worker.
fn churn_runtime(multi: bool) -> Runtime {
    let mut builder = if multi {
        let mut b = Builder::new_multi_thread();
        b.worker_threads(1);
        b
    } else {
        Builder::new_current_thread()
    };
    builder
        .thread_name(THREAD_NAME)
        .enable_all()
        .build()
        .unwrap()
}

/// Threads of this process started by the churn test's runtimes (workers and blocking threads).
fn threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .filter(|name| name.trim() == THREAD_NAME)
        .count()
}

/// A Redis client of `url` (leases of `ttl`, renewed) whose first lock is taken (and released)
/// on the runtime this runs on: its renewal engine runs there.
async fn first_locked_here(url: &str, ns: &str, ttl: Duration) -> distlock::LockClient {
    let c = crate::support::redis::client(url, ns, ttl, ttl, true).await;
    c.mutex("first")
        .lock()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    c
}

/// A Redis client (TTL 1 s) built in runtime A holds a lock taken from runtime B, and a second
/// lock of the same key waits in B; then A shuts down. Checked, in B: the waiter ends with
/// `Closed` within 1 s, a new lock is refused with `Closed` at once, the held guard is told lost
/// within its lease, a blocking call from a thread of its own is refused, and `shutdown` ends
/// within 5 s; a second client takes the key within the lease.
#[test]
fn redis_a_client_whose_runtime_ended_is_closed_and_its_guards_lapse() {
    let url = crate::support::server::redis::shared_redis().url();
    let ns = test_namespace!();
    let ttl = Duration::from_secs(1);
    let a = multi_thread(1);
    let c = a.block_on(crate::support::redis::client(&url, &ns, ttl, ttl, true));
    let b = multi_thread(1);
    let (held, waiting) = b.block_on(async {
        let held = c.mutex("k").lock().await.unwrap();
        let m = c.mutex("k");
        let waiting = tokio::spawn(async move { m.lock_timeout(Duration::from_secs(10)).await });
        crate::support::redis::until_queued(&url, &ns, "k", 1).await;
        (held, waiting)
    });
    drop(a);
    let (waited, refused, lost_after) = b.block_on(async {
        let began = Instant::now();
        let waited = timeout(Duration::from_secs(1), waiting)
            .await
            .expect("the waiter did not end within 1 s of the runtime's end")
            .unwrap();
        let refused = c.mutex("other").try_lock().await;
        timeout(ttl * 2, held.lost())
            .await
            .expect("the guard was not told lost within two leases");
        (waited, refused, began.elapsed())
    });
    assert_eq!(
        waited.err().map(|e| e.kind()),
        Some(distlock::ErrorKind::Closed)
    );
    assert_eq!(
        refused.err().map(|e| e.kind()),
        Some(distlock::ErrorKind::Closed)
    );
    assert!(lost_after <= ttl, "told lost after {lost_after:?}");
    let c2 = c.clone();
    let blocking =
        std::thread::spawn(move || c2.mutex("k").blocking_lock().err().map(|e| e.kind()))
            .join()
            .unwrap();
    assert!(
        blocking.is_some(),
        "a blocking lock was granted after the runtime ended"
    );
    b.block_on(async {
        timeout(Duration::from_secs(5), c.shutdown())
            .await
            .expect("shutdown did not end");
        drop(held);
        let other = crate::support::redis::client(&url, &ns, ttl, ttl, true).await;
        let g = timeout(ttl * 4, other.mutex("k").lock())
            .await
            .expect("another client did not get the key within its lease")
            .unwrap();
        g.release().await.unwrap();
        other.shutdown().await;
        crate::support::redis::until_only_fences(&url, &ns).await;
    });
}

/// A Redis client (TTL 1 s) built in multi-thread runtime H, whose first lock is taken on H (H
/// runs a renewal engine). A current-thread runtime C, alive but not being driven (its thread
/// does other, synchronous work between `block_on` calls: the usual way of calling async code
/// from sync code), took a lock through the client and keeps the guard. Then H calls
/// `shutdown()`. Checked: the shutdown ends within 5 s, the guard is told lost, and nothing
/// but fence counters is left on the server.
#[test]
fn redis_shutdown_ends_while_a_current_thread_runtime_that_locked_is_idle() {
    let url = crate::support::server::redis::shared_redis().url();
    let ns = test_namespace!();
    let ttl = Duration::from_secs(1);
    let h = multi_thread(2);
    let c = h.block_on(first_locked_here(&url, &ns, ttl));
    let idle = current_thread();
    let held = idle.block_on(c.mutex("held-on-idle").lock()).unwrap();
    let began = std::time::Instant::now();
    let ended = h.block_on(async { timeout(Duration::from_secs(5), c.shutdown()).await });
    println!("shutdown: {:?} after {:?}", ended.is_ok(), began.elapsed());
    assert!(
        ended.is_ok(),
        "shutdown did not end within 5 s (a current-thread runtime that took a lock is idle)"
    );
    assert!(held.is_lost(), "the guard was not told lost at shutdown");
    h.block_on(crate::support::redis::until_only_fences(&url, &ns));
    drop(held);
    drop(idle);
}

/// A Redis client (TTL 1 s) whose first lock is taken on multi-thread runtime H (its engine
/// runs there). A current-thread runtime C takes a lock through it with `block_on` and keeps
/// the guard while its thread does 3 s of synchronous work (C alive, not driven); H and the
/// server are up all along. Checked: the guard is not lost, and a second client cannot take
/// the key meanwhile.
#[test]
fn redis_lease_taken_on_an_idle_current_thread_runtime_is_kept_while_the_client_runs() {
    let url = crate::support::server::redis::shared_redis().url();
    let ns = test_namespace!();
    let ttl = Duration::from_secs(1);
    let h = multi_thread(2);
    let (c, other) = h.block_on(async {
        let c = first_locked_here(&url, &ns, ttl).await;
        (
            c,
            crate::support::redis::client(&url, &ns, ttl, ttl, true).await,
        )
    });
    let ct = current_thread();
    let held = ct.block_on(c.mutex("held").lock()).unwrap();
    // Synchronous work on C's thread; H keeps running.
    std::thread::sleep(Duration::from_secs(3));
    let lost = held.is_lost();
    let taken = h.block_on(other.mutex("held").try_lock());
    let taken_by_other = taken.is_ok();
    println!("held.is_lost() = {lost}, other client took the key: {taken_by_other}");
    let _ = ct.block_on(held.release());
    // C ended: its engine (if any) answers no shutdown.
    drop(ct);
    h.block_on(async {
        if let Ok(g) = taken {
            g.release().await.unwrap();
        }
        timeout(Duration::from_secs(5), c.shutdown())
            .await
            .expect("shutdown did not end");
        other.shutdown().await;
    });
    assert!(
        !lost,
        "the lease of C (alive, idle) was lost after 3 s, H and the server up"
    );
    assert!(!taken_by_other, "a second client took the key C holds");
}

/// A Redis client (TTL 1 s) used from five runtimes: a multi-thread one H that built it and
/// holds a lock, two live multi-thread runtimes each holding a mutex and a read lock, one
/// multi-thread runtime and one current-thread runtime that took locks and then ended with
/// the guards kept. `shutdown()` is called from a sixth runtime. Checked: it ends within 5 s,
/// every guard is lost, and within 5 s only fence counters are left.
#[test]
fn redis_shutdown_releases_the_leases_of_every_live_runtime() {
    let url = crate::support::server::redis::shared_redis().url();
    let ns = test_namespace!();
    let ttl = Duration::from_secs(1);
    let h = multi_thread(1);
    let c = h.block_on(crate::support::redis::client(&url, &ns, ttl, ttl, true));
    let mut guards: Vec<Box<dyn Fn() -> bool>> = Vec::new();
    let g = h.block_on(c.mutex("on-h").lock()).unwrap();
    guards.push(Box::new(move || g.is_lost()));
    let live: Vec<Runtime> = (0..2).map(|_| multi_thread(1)).collect();
    for (i, rt) in live.iter().enumerate() {
        let (m, r) = rt.block_on(async {
            let m = c.mutex(format!("live-{i}")).lock().await.unwrap();
            let r = c.rw_lock(format!("rw-{i}")).read().await.unwrap();
            (m, r)
        });
        guards.push(Box::new(move || m.is_lost()));
        guards.push(Box::new(move || r.is_lost()));
    }
    for (i, rt) in [multi_thread(1), current_thread()].into_iter().enumerate() {
        let m = rt.block_on(c.mutex(format!("ended-{i}")).lock()).unwrap();
        drop(rt);
        guards.push(Box::new(move || m.is_lost()));
    }
    // Keep the live leases a couple of renewals long first.
    std::thread::sleep(Duration::from_millis(1500));
    let lost_before: Vec<bool> = guards[..5].iter().map(|g| g()).collect();
    let s = multi_thread(1);
    let began = Instant::now();
    let ended = s.block_on(async { timeout(Duration::from_secs(5), c.shutdown()).await });
    println!(
        "lost before shutdown (live ones): {lost_before:?}; shutdown ended: {} after {:?}",
        ended.is_ok(),
        began.elapsed()
    );
    assert_eq!(
        lost_before,
        vec![false; 5],
        "a live runtime's lease was lost"
    );
    assert!(ended.is_ok(), "shutdown did not end within 5 s");
    let told: Vec<bool> = guards.iter().map(|g| g()).collect();
    assert_eq!(told, vec![true; 7], "guards not told lost after shutdown");
    s.block_on(crate::support::redis::until_only_fences(&url, &ns));
    drop(live);
}

/// A Redis client (TTL 1 s) built in H. Two long-lived threads, one driving a current-thread
/// runtime and one a multi-thread runtime, each hold a lock and have a waiter queued for a key
/// a second client holds, for 3.5 s, while a third thread starts and ends runtimes in a tight
/// loop (current-thread and multi-thread in turn), each taking a lock, then releasing it,
/// dropping the guard after its runtime ended, or keeping it. Checked: neither long-lived
/// lease is lost, both waiters stay queued and each is granted within 1 s of the key's
/// release, a released churn key is gone at once, the process's thread count comes back,
/// and shutdown leaves only fences.
#[test]
fn redis_leases_and_waiters_of_live_runtimes_outlive_a_churn_of_runtimes() {
    let url = crate::support::server::redis::shared_redis().url();
    let ns = test_namespace!();
    let ttl = Duration::from_secs(1);
    let h = multi_thread(1);
    let (c, other) = h.block_on(async {
        (
            crate::support::redis::client(&url, &ns, ttl, ttl, true).await,
            crate::support::redis::client(&url, &ns, ttl, ttl, true).await,
        )
    });
    let busy = h.block_on(other.mutex("busy").lock()).unwrap();
    let busy_token = busy.fencing_token();
    let baseline = threads();
    let released = std::sync::Arc::new(std::sync::OnceLock::<std::time::Instant>::new());
    let long_lived = |flavor: u8| {
        let c = c.clone();
        let released = released.clone();
        std::thread::spawn(move || {
            let rt = churn_runtime(flavor != 0);
            rt.block_on(async move {
                let held = c.mutex(format!("hold-{flavor}")).lock().await.unwrap();
                let m = c.mutex("busy");
                let waiting =
                    tokio::spawn(async move { m.lock_timeout(Duration::from_secs(15)).await });
                let began = Instant::now();
                let mut lost_after = None;
                while began.elapsed() < Duration::from_millis(3500) {
                    if lost_after.is_none() && held.is_lost() {
                        lost_after = Some(began.elapsed());
                    }
                    sleep(Duration::from_millis(20)).await;
                }
                let g = timeout(Duration::from_secs(8), waiting)
                    .await
                    .map(|j| j.unwrap());
                let waited = released.get().map(|at| at.elapsed());
                let token = g
                    .as_ref()
                    .ok()
                    .and_then(|g| g.as_ref().ok())
                    .map(|g| g.fencing_token());
                if let Ok(Ok(g)) = g {
                    g.release().await.unwrap();
                }
                let _ = held.release().await;
                (lost_after, token, waited)
            })
        })
    };
    let t0 = long_lived(0);
    let t1 = long_lived(1);
    h.block_on(crate::support::redis::until_queued(&url, &ns, "busy", 2));
    let churn = {
        let c = c.clone();
        let url = url.clone();
        let ns = ns.clone();
        std::thread::spawn(move || {
            let began = std::time::Instant::now();
            let mut kept = Vec::new();
            let mut stale = Vec::new();
            let mut i = 0u32;
            while began.elapsed() < Duration::from_millis(3000) {
                let rt = churn_runtime(!i.is_multiple_of(2));
                let key = format!("churn-{i}");
                let g = rt.block_on(c.mutex(key.clone()).lock()).unwrap();
                match i % 3 {
                    0 => rt.block_on(async {
                        g.release().await.unwrap();
                        let left: Vec<String> = crate::support::redis::non_fence_keys(&url, &ns)
                            .await
                            .into_iter()
                            .filter(|k| k.contains(&format!("{{{key}}}")))
                            .collect();
                        if !left.is_empty() {
                            stale.push(left);
                        }
                    }),
                    1 => {
                        drop(rt);
                        drop(g);
                        continue_after(&mut i);
                        continue;
                    }
                    _ => kept.push(g),
                }
                drop(rt);
                i += 1;
            }
            (i, kept, stale)
        })
    };
    let (rounds, kept, stale) = churn.join().unwrap();
    std::thread::sleep(Duration::from_millis(600));
    released.set(std::time::Instant::now()).unwrap();
    h.block_on(busy.release()).unwrap();
    let r0 = t0.join().unwrap();
    let r1 = t1.join().unwrap();
    println!(
        "churn: {rounds} runtimes; current-thread holder: {r0:?}; multi-thread holder: {r1:?}"
    );
    let after = threads();
    println!("threads: {baseline} before, {after} after");
    drop(kept);
    h.block_on(async {
        timeout(Duration::from_secs(5), c.shutdown())
            .await
            .expect("shutdown did not end");
        other.shutdown().await;
        crate::support::redis::until_only_fences(&url, &ns).await;
    });
    assert!(stale.is_empty(), "released keys still there: {stale:?}");
    for (name, (lost_after, token, waited)) in [("current-thread", r0), ("multi-thread", r1)] {
        assert_eq!(lost_after, None, "{name} holder lost");
        assert!(
            token.is_some_and(|t| t > busy_token),
            "{name} waiter not granted"
        );
        assert!(
            waited.is_some_and(|w| w < Duration::from_secs(3)),
            "{name} waiter granted {waited:?} after the release"
        );
    }
    assert!(
        after <= baseline + 4,
        "threads piled up: {baseline} -> {after}"
    );
}

/// Counts a churn round that ended its runtime early.
fn continue_after(i: &mut u32) {
    *i += 1;
}

/// Four threads contend for one key through one client for 2.5 s, each round on a runtime of
/// its own (current-thread and multi-thread in turn) that ends right after the round: the
/// guard released in it, or dropped after it ended. Checked: never two holders at once, and
/// fencing tokens strictly increasing in the order of the grants.
fn contend_from_short_lived_runtimes(c: &distlock::LockClient) -> (u32, Vec<String>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    let holding = Arc::new(AtomicUsize::new(0));
    let last = Arc::new(Mutex::new(0u64));
    let faults = Arc::new(Mutex::new(Vec::new()));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let (c, holding, last, faults) =
                (c.clone(), holding.clone(), last.clone(), faults.clone());
            std::thread::spawn(move || {
                let began = std::time::Instant::now();
                let mut rounds = 0u32;
                while began.elapsed() < Duration::from_millis(2500) {
                    let rt = if (rounds + t).is_multiple_of(2) {
                        current_thread()
                    } else {
                        multi_thread(1)
                    };
                    let g = rt
                        .block_on(c.mutex("contended").lock_timeout(Duration::from_secs(5)))
                        .unwrap();
                    if holding.fetch_add(1, Ordering::SeqCst) != 0 {
                        faults
                            .lock()
                            .unwrap()
                            .push(format!("two holders (thread {t})"));
                    }
                    {
                        let mut last = last.lock().unwrap();
                        if g.fencing_token() <= *last {
                            faults.lock().unwrap().push(format!(
                                "token {} after {}",
                                g.fencing_token(),
                                *last
                            ));
                        }
                        *last = g.fencing_token();
                    }
                    std::thread::sleep(Duration::from_millis(2));
                    if g.is_lost() {
                        faults.lock().unwrap().push(format!("lost (thread {t})"));
                    }
                    holding.fetch_sub(1, Ordering::SeqCst);
                    if rounds.is_multiple_of(2) {
                        rt.block_on(g.release()).unwrap();
                        drop(rt);
                    } else {
                        drop(rt);
                        drop(g);
                    }
                    rounds += 1;
                }
                rounds
            })
        })
        .collect();
    let rounds = threads.into_iter().map(|t| t.join().unwrap()).sum();
    let faults = faults.lock().unwrap().clone();
    (rounds, faults)
}

/// [`contend_from_short_lived_runtimes`] on Redis (TTL 1 s, client built in H).
#[test]
fn redis_contention_from_short_lived_runtimes_has_one_holder_and_rising_tokens() {
    let url = crate::support::server::redis::shared_redis().url();
    let ns = test_namespace!();
    let ttl = Duration::from_secs(1);
    let h = multi_thread(1);
    let c = h.block_on(crate::support::redis::client(&url, &ns, ttl, ttl, true));
    let (rounds, faults) = contend_from_short_lived_runtimes(&c);
    println!("{rounds} grants; faults: {faults:?}");
    h.block_on(async {
        timeout(Duration::from_secs(5), c.shutdown())
            .await
            .expect("shutdown did not end");
        crate::support::redis::until_only_fences(&url, &ns).await;
    });
    assert!(faults.is_empty(), "{faults:?}");
}

/// A client (TTL 1 s, through the fault proxy) takes one lock while 4 tasks of the same client
/// churn, and holds it for 3 TTLs of churn: short locks released or dropped, and waiters on the
/// held key cancelled mid-wait, so the renewal engine's inbox takes in and gives back hundreds
/// of leases around the held one (a lease released before the task took it in is taken back
/// out of the inbox, and the held lease arrives among them).
/// Checked: the hold is renewed throughout (never reported lost, never taken by another client);
/// then the proxy blackholes the connection, and the guard's `lost()` fires within 2 TTLs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_hold_is_renewed_through_churn_of_short_leases_and_lost_when_the_link_goes_dark() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;

    let ns = test_namespace!();
    let ttl = Duration::from_secs(1);
    let redis = crate::support::server::redis::shared_redis();
    let proxy = crate::support::proxy::Proxy::start(redis.port());
    let url = format!("redis://127.0.0.1:{}/", proxy.port());
    let c = crate::support::redis::client(&url, &ns, ttl, ttl, true).await;
    let other = crate::support::redis::client(&redis.url(), &ns, ttl, ttl, true).await;
    let (stop, ops) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let holding = Arc::new(AtomicBool::new(false));
    let churners: Vec<_> = (0..4)
        .map(|t| {
            let (c, stop, ops) = (c.clone(), stop.clone(), ops.clone());
            let holding = holding.clone();
            tokio::spawn(async move {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let short = c.mutex(format!("short-{t}-{}", i % 8));
                    match i % 3 {
                        0 => short.lock().await.unwrap().release().await.unwrap(),
                        1 => drop(short.lock().await.unwrap()),
                        _ if !holding.load(Ordering::Acquire) => {}
                        // A waiter on the held key, cancelled mid-wait.
                        _ => {
                            let wait = Duration::from_millis(2 + i % 10);
                            let waited = timeout(wait, c.mutex("held").lock()).await;
                            assert!(waited.is_err(), "a waiter took the held lock");
                        }
                    }
                    ops.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    sleep(Duration::from_millis(200)).await;
    let held = c.mutex("held").lock().await.unwrap();
    holding.store(true, Ordering::Release);
    let start = Instant::now();
    while start.elapsed() < ttl * 3 {
        assert!(
            !held.is_lost(),
            "the hold was reported lost after {:?}",
            start.elapsed()
        );
        match other.mutex("held").try_lock().await {
            Ok(_) => panic!(
                "another client took the held lock after {:?}",
                start.elapsed()
            ),
            Err(e) => assert!(e.is_would_block(), "{e}"),
        }
        sleep(ttl / 4).await;
    }
    stop.store(true, Ordering::Relaxed);
    for t in churners {
        timeout(Duration::from_secs(10), t).await.unwrap().unwrap();
    }
    assert!(
        ops.load(Ordering::Relaxed) > 100,
        "too little churn to tell"
    );
    assert!(!held.is_lost());

    proxy.blackhole();
    timeout(ttl * 2, held.lost())
        .await
        .expect("lost() did not fire within 2 TTLs of the blackhole");
    proxy.heal();
    drop(held);
    c.shutdown().await;
    other.shutdown().await;
    crate::support::redis::until_only_fences(&redis.url(), &ns).await;
}

/// A Redis client built in runtime A (alive throughout), through the test proxy. The proxy
/// cuts the connection; a short-lived runtime B makes the first call after the cut, so the
/// connection's reconnect starts there, with B's timers; B ends 30 ms later, and the proxy
/// lets connections through again. Checked, three rounds: a lock taken on A is granted and
/// held for 2 s without being lost. Before: the reconnect's timer panicked once B was gone,
/// the connection stayed poisoned, and the renewal engine died with it (every call `Closed`).
#[test]
fn redis_a_reconnect_begun_on_a_runtime_that_ended_leaves_the_client_working() {
    let redis = crate::support::server::redis::shared_redis();
    let proxy = crate::support::proxy::Proxy::start(redis.port());
    let url = format!("redis://127.0.0.1:{}/", proxy.port());
    let ttl = Duration::from_secs(1);
    let a = multi_thread(1);
    for round in 0..3 {
        let ns = format!("{}.{round}", test_namespace!());
        let c = a.block_on(crate::support::redis::client(&url, &ns, ttl, ttl, true));
        proxy.cut();
        std::thread::sleep(Duration::from_millis(150));
        let b = current_thread();
        b.block_on(async {
            let _ = c.inspect("x").await;
            sleep(Duration::from_millis(30)).await;
        });
        drop(b);
        proxy.pass();
        let c2 = c.clone();
        let held = a.block_on(async move {
            tokio::spawn(async move {
                let g = timeout(Duration::from_secs(12), c2.mutex("k").lock())
                    .await
                    .map_err(|_| "the lock hung".to_string())?
                    .map_err(|e| format!("the lock failed: {e}"))?;
                sleep(Duration::from_secs(2)).await;
                Ok::<_, String>(g.is_lost())
            })
            .await
            .map_err(|e| format!("the lock's task: {e}"))
        });
        assert_eq!(held, Ok(Ok(false)), "round {round}");
        a.block_on(async {
            timeout(Duration::from_secs(5), c.shutdown())
                .await
                .expect("shutdown did not end");
        });
    }
}

/// A Redis client built in runtime A and never used; A ends. Checked, from runtime B: reading,
/// the operator's unlock and a lock are refused with `Closed`, and `shutdown` ends. Before:
/// only a lock found out; the operator's unlock went to the server.
#[test]
fn redis_a_client_never_used_is_closed_once_its_runtime_ends() {
    let url = crate::support::server::redis::shared_redis().url();
    let ns = test_namespace!();
    let ttl = Duration::from_secs(1);
    let a = multi_thread(1);
    let c = a.block_on(crate::support::redis::client(&url, &ns, ttl, ttl, true));
    drop(a);
    let b = multi_thread(1);
    b.block_on(async {
        let closed = Some(distlock::ErrorKind::Closed);
        assert_eq!(c.inspect("k").await.err().map(|e| e.kind()), closed);
        assert_eq!(c.force_release("k").await.err().map(|e| e.kind()), closed);
        assert_eq!(
            c.election("e").leader().await.err().map(|e| e.kind()),
            closed
        );
        assert_eq!(
            c.mutex("k").try_lock().await.err().map(|e| e.kind()),
            closed
        );
        timeout(Duration::from_secs(5), c.shutdown())
            .await
            .expect("shutdown did not end");
    });
}

/// A Redis client built in multi-thread runtime A; the key is held; a thread of its own waits
/// in `blocking_lock` (on A), and A shuts down. Checked, five rounds: the call returns an
/// error within 5 s. Before: tokio panicked at the wait's next timer, in the caller's thread
/// (one round in four).
#[test]
fn redis_a_blocking_lock_waiting_when_the_runtime_ends_returns_an_error() {
    let url = crate::support::server::redis::shared_redis().url();
    let ttl = Duration::from_secs(1);
    for round in 0..5 {
        let ns = format!("{}.{round}", test_namespace!());
        let a = multi_thread(1);
        let c = a.block_on(crate::support::redis::client(&url, &ns, ttl, ttl, true));
        let held = a.block_on(c.mutex("k").lock()).unwrap();
        let c2 = c.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                c2.mutex("k").blocking_lock().map(|g| g.fencing_token())
            }));
            let _ = tx.send(out.map_err(|_| "panicked"));
        });
        std::thread::sleep(Duration::from_millis(300));
        drop(a);
        let out = rx
            .recv_timeout(Duration::from_secs(5))
            .expect("the blocking lock did not return within 5 s");
        assert!(
            matches!(out, Ok(Err(_))),
            "round {round}: {:?}",
            out.map(|r| r.map_err(|e| e.to_string()))
        );
        drop(held);
    }
}
