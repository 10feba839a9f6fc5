//! The in-process backend's own tests: the contract on the paused clock, blocking calls and
//! runtimes, and what its statistics show. Each contender gets its own `LockClient` (its own
//! renewal task), as separate processes would. The behaviour suite every backend runs is in
//! `tests/contract/matrix.rs` (`matrix::memory::`).
#![cfg(feature = "memory")]

use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use distlock::backend::MemoryBackend;
use distlock::{ErrorKind, LockClient};
use tokio::time::{sleep, timeout};

fn client(backend: &MemoryBackend) -> LockClient {
    LockClient::builder(backend.clone()).build().unwrap()
}

fn client_with(backend: &MemoryBackend, ttl: Duration, auto_renew: bool) -> LockClient {
    LockClient::builder(backend.clone())
        .ttl(ttl)
        .auto_renew(auto_renew)
        .build()
        .unwrap()
}

/// Waits (on the paused or real clock) until the backend lists `n` waiters.
async fn until_waiters(backend: &MemoryBackend, n: usize) {
    timeout(Duration::from_secs(10), async {
        while backend.stats().waiters != n {
            tokio::task::yield_now().await;
            sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("expected {n} waiters, have {:?}", backend.stats()));
}

#[tokio::test(start_paused = true)]
async fn waiters_are_served_in_arrival_order() {
    let backend = MemoryBackend::new();
    let holder = client(&backend).mutex("fifo").lock().await.unwrap();
    let order = Arc::new(StdMutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..10 {
        let mutex = client(&backend).mutex("fifo");
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            let guard = mutex.lock().await.unwrap();
            order.lock().unwrap().push(i);
            sleep(Duration::from_millis(1)).await;
            guard.release().await.unwrap();
        }));
        until_waiters(&backend, i + 1).await;
    }
    holder.release().await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), (0..10).collect::<Vec<_>>());
}

#[tokio::test(start_paused = true)]
async fn a_releasing_holder_cannot_jump_the_queue() {
    let backend = MemoryBackend::new();
    let a = client(&backend);
    let b = client(&backend);
    let first = a.mutex("k").lock().await.unwrap();
    let waiter = tokio::spawn({
        let m = b.mutex("k");
        async move { m.lock().await.unwrap().fencing_token() }
    });
    until_waiters(&backend, 1).await;
    first.release().await.unwrap();
    // A asks again at once: B was first in line, so A waits behind it.
    let again = a.mutex("k").lock().await.unwrap();
    let b_fence = waiter.await.unwrap();
    assert!(again.fencing_token() > b_fence, "A barged ahead of B");
}

#[tokio::test(start_paused = true)]
async fn try_lock_and_lock_timeout_report_busy_and_leave_nothing() {
    let backend = MemoryBackend::new();
    let a = client(&backend);
    let b = client(&backend);
    let held = a.mutex("k").lock().await.unwrap();

    let err = b.mutex("k").try_lock().await.unwrap_err();
    assert!(err.is_would_block(), "{err:?}");
    assert_eq!(err.kind(), ErrorKind::WouldBlock);
    assert_eq!(backend.stats().waiters, 0, "try_lock queued itself");

    let err = b
        .mutex("k")
        .lock_timeout(Duration::from_millis(100))
        .await
        .unwrap_err();
    assert!(err.is_timeout(), "{err:?}");
    b.shutdown().await; // flush the cancelled waiter's cleanup
    assert_eq!(
        backend.stats().waiters,
        0,
        "timed-out waiter left its entry"
    );

    // With a waiter queued, try_lock fails even at the moment the lock is free: no barging.
    let c = client(&backend);
    let queued = tokio::spawn({
        let m = c.mutex("k");
        async move { m.lock().await.unwrap() }
    });
    until_waiters(&backend, 1).await;
    drop(held);
    let guard = queued.await.unwrap();
    assert!(a.mutex("k").try_lock().await.unwrap_err().is_would_block());
    guard.release().await.unwrap();
    assert!(a.mutex("k").try_lock().await.is_ok());
}

#[tokio::test(start_paused = true)]
async fn an_expired_lease_is_lost_and_the_next_waiter_gets_in() {
    let backend = MemoryBackend::new();
    let ttl = Duration::from_millis(300);
    let a = client_with(&backend, ttl, false);
    let b = client(&backend);
    let start = tokio::time::Instant::now();
    let stale = a.mutex("k").lock().await.unwrap();
    let waiter = tokio::spawn({
        let m = b.mutex("k");
        async move { m.lock().await.unwrap() }
    });
    until_waiters(&backend, 1).await;
    assert!(!stale.is_lost());

    timeout(Duration::from_secs(5), stale.lost())
        .await
        .expect("lost() never resolved after the TTL");
    assert!(stale.is_lost());
    let lost_after = start.elapsed();
    assert!(lost_after <= ttl, "reported lost only after {lost_after:?}");

    let next = waiter.await.unwrap();
    let took_over = start.elapsed();
    assert!(
        took_over >= ttl && took_over < ttl + Duration::from_millis(50),
        "next waiter got the lock at {took_over:?}, TTL {ttl:?}"
    );
    assert!(next.fencing_token() > stale.fencing_token());
    assert!(!next.is_lost());

    // Releasing a lost lock reports it, and does not disturb the new holder.
    let err = stale.release().await.unwrap_err();
    assert!(err.is_lost(), "{err:?}");
    assert_eq!(backend.stats().held, 1);
    next.release().await.unwrap();
    assert_eq!(backend.stats().keys, 0);
}

#[tokio::test(start_paused = true)]
async fn renewal_keeps_a_lease_alive_far_past_its_ttl() {
    let backend = MemoryBackend::new();
    let a = client_with(&backend, Duration::from_millis(90), true);
    let b = client(&backend);
    let guard = a.mutex("k").lock().await.unwrap();
    for _ in 0..50 {
        sleep(Duration::from_millis(40)).await;
        assert!(!guard.is_lost());
        assert!(b.mutex("k").try_lock().await.unwrap_err().is_would_block());
    }
    guard.release().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn dropping_a_guard_releases_it_in_the_background() {
    let backend = MemoryBackend::new();
    let a = client(&backend);
    let guard = a.mutex("k").lock().await.unwrap();
    let moved = tokio::spawn(async move {
        // Guards are Send + 'static: they can live in another task.
        let token = guard.fencing_token();
        drop(guard);
        token
    });
    let first = moved.await.unwrap();
    let second = timeout(Duration::from_secs(1), client(&backend).mutex("k").lock())
        .await
        .expect("the dropped guard was never released")
        .unwrap();
    assert!(second.fencing_token() > first);
    drop(second);
    a.shutdown().await;
    tokio::task::yield_now().await;
    assert_eq!(backend.stats().keys, 0);
}

#[tokio::test(start_paused = true)]
async fn a_grant_that_races_a_cancelled_waiter_is_passed_on() {
    let backend = MemoryBackend::new();
    let holder = client(&backend).mutex("k").lock().await.unwrap();
    // B is polled by hand, so it cannot run between the handoff and its cancellation.
    let mut b = Box::pin(client(&backend).mutex("k").lock());
    assert!(futures::poll!(&mut b).is_pending());
    assert_eq!(backend.stats().waiters, 1);
    let c = tokio::spawn(client(&backend).mutex("k").lock());
    until_waiters(&backend, 2).await;

    // The release hands the lock to B; B is dropped without ever seeing its grant.
    holder.release().await.unwrap();
    assert_eq!(backend.stats().waiters, 1, "the lock was not handed to B");
    drop(b);

    let c = timeout(Duration::from_secs(1), c)
        .await
        .expect("B's raced grant was never released")
        .unwrap()
        .unwrap();
    drop(c);
    sleep(Duration::from_millis(1)).await;
    assert_eq!(backend.stats().keys, 0);
}

#[tokio::test]
async fn bad_input_is_a_clear_error_before_any_io() {
    let backend = MemoryBackend::new();
    let c = client(&backend);
    let long = "k".repeat(distlock::MAX_KEY_LEN + 1);
    for key in ["", "a\0b", long.as_str()] {
        let err = c.mutex(key).lock().await.unwrap_err();
        assert!(err.is_invalid_key(), "{key:?}: {err:?}");
        assert!(c.mutex(key).try_lock().await.unwrap_err().is_invalid_key());
    }
    let err = c
        .mutex("k")
        .with_ttl(Duration::ZERO)
        .lock()
        .await
        .unwrap_err();
    assert!(err.is_invalid_config(), "{err:?}");
    assert!(err.to_string().contains("ttl"), "{err}");
    let err = LockClient::builder(backend.clone())
        .ttl(Duration::ZERO)
        .build()
        .unwrap_err();
    assert!(err.is_invalid_config());
    for ns in ["", "a:b", "a{b}"] {
        let err = LockClient::builder(backend.clone())
            .namespace(ns)
            .build()
            .unwrap_err();
        assert!(err.is_invalid_config(), "{ns:?}: {err:?}");
    }
    assert_eq!(backend.stats().keys, 0);
}

/// A TTL past [`distlock::MAX_TTL`] is refused before any I/O, wherever it is given (the
/// client, a primitive, an election, a guard's `extend`), never a panic on a deadline past the
/// clock, and the guard asked to extend still holds; a timeout past the clock is no deadline.
#[tokio::test]
async fn a_ttl_or_timeout_past_the_clock_is_an_error_or_no_deadline_never_a_panic() {
    let backend = MemoryBackend::new();
    let c = client(&backend);
    let too_long = [distlock::MAX_TTL + Duration::from_secs(1), Duration::MAX];
    for ttl in too_long {
        let err = LockClient::builder(backend.clone())
            .ttl(ttl)
            .build()
            .unwrap_err();
        assert!(err.is_invalid_config(), "{ttl:?}: {err:?}");
        let err = c.mutex("k").with_ttl(ttl).lock().await.unwrap_err();
        assert!(err.is_invalid_config(), "{ttl:?}: {err:?}");
        let err = c
            .election("e")
            .with_ttl(ttl)
            .campaign("v")
            .await
            .unwrap_err();
        assert!(err.is_invalid_config(), "{ttl:?}: {err:?}");
    }
    assert_eq!(backend.stats().keys, 0);
    let guard = c.mutex("k").lock().await.unwrap();
    let multi = c.multi_lock(["m1", "m2"]).lock().await.unwrap();
    for ttl in too_long {
        let err = guard.extend(ttl).await.unwrap_err();
        assert!(err.is_invalid_config(), "{ttl:?}: {err:?}");
        assert!(multi.extend(ttl).await.unwrap_err().is_invalid_config());
    }
    assert!(!guard.is_lost());
    guard.extend(distlock::MAX_TTL).await.unwrap();
    assert!(!guard.is_lost());
    drop((guard, multi));
    let waited = c.mutex("free").lock_timeout(Duration::MAX).await.unwrap();
    let leading = c
        .election("free-election")
        .campaign_timeout("v", Duration::MAX)
        .await
        .unwrap();
    let both = c
        .multi_lock(["f1", "f2"])
        .lock_timeout(Duration::MAX)
        .await
        .unwrap();
    drop((waited, leading, both));
}

/// An unset `DISTLOCK_URL` read as "" must not give in-process locks that exclude nothing
/// across replicas: in-process locks are asked for by name.
#[tokio::test]
async fn an_empty_url_is_an_error_and_memory_is_asked_for_by_name() {
    for url in ["", "  "] {
        let err = LockClient::connect(url).await.unwrap_err();
        assert!(err.is_invalid_config(), "{url:?}: {err:?}");
        assert!(err.to_string().contains("memory:"), "{err}");
        assert!(LockClient::builder_for(url).await.is_err());
    }
    let client = LockClient::connect("memory:").await.unwrap();
    drop(client.mutex("k").lock().await.unwrap());
    client.shutdown().await;
}

#[test]
fn outside_a_runtime_lock_is_an_error_not_a_panic() {
    let c = LockClient::memory();
    let err = futures::executor::block_on(c.mutex("k").lock()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NoRuntime);
}

#[tokio::test(start_paused = true)]
async fn namespaces_keep_clients_apart() {
    let backend = MemoryBackend::new();
    let a = LockClient::builder(backend.clone())
        .namespace("a")
        .build()
        .unwrap();
    let b = LockClient::builder(backend.clone())
        .namespace("b")
        .build()
        .unwrap();
    let _ga = a.mutex("k").try_lock().await.unwrap();
    let _gb = b.mutex("k").try_lock().await.unwrap();
    assert_eq!(backend.stats().held, 2);
}

#[tokio::test(start_paused = true)]
async fn shutdown_wakes_waiters_and_releases_held_locks() {
    let backend = MemoryBackend::new();
    let c = client(&backend);
    let held = c.mutex("k").lock().await.unwrap();
    let waiter = tokio::spawn(c.mutex("k").lock());
    until_waiters(&backend, 1).await;
    c.shutdown().await;
    let err = waiter.await.unwrap().unwrap_err();
    assert!(err.is_closed(), "{err:?}");
    assert!(held.is_lost());
    assert!(c.mutex("other").lock().await.unwrap_err().is_closed());
    sleep(Duration::from_millis(1)).await;
    assert_eq!(backend.stats().keys, 0, "{:?}", backend.stats());
    // Releasing after shutdown reports the loss, never panics.
    assert!(held.release().await.unwrap_err().is_lost());
}

/// Leases reach the renewal task without waking it when they fall due after its next timer;
/// a lease due before it must wake it. Here the task sleeps toward a 30 s lease's renewal when
/// a 300 ms lease comes in: that one must still be renewed every 100 ms, not lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_lease_taken_while_renewal_sleeps_on_a_long_one_is_renewed() {
    let backend = MemoryBackend::new();
    let c = LockClient::builder(backend.clone()).build().unwrap();
    let other = LockClient::builder(backend).build().unwrap();
    let long = c
        .mutex("long")
        .with_ttl(Duration::from_secs(30))
        .lock()
        .await
        .unwrap();
    sleep(Duration::from_millis(50)).await;
    let short = c
        .mutex("short")
        .with_ttl(Duration::from_millis(300))
        .lock()
        .await
        .unwrap();
    sleep(Duration::from_millis(1500)).await;
    assert!(!short.is_lost(), "a short lease was not renewed");
    assert!(other
        .mutex("short")
        .try_lock()
        .await
        .unwrap_err()
        .is_would_block());
    // And many locks taken and released meanwhile change nothing.
    for i in 0..600 {
        c.mutex(format!("churn{i}"))
            .lock()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    sleep(Duration::from_millis(500)).await;
    assert!(!short.is_lost() && !long.is_lost());
    short.release().await.unwrap();
    long.release().await.unwrap();
    c.shutdown().await;
}

/// Synchronous code locks with the blocking forms: a client built outside any runtime runs
/// them on its own, renews the lease while the thread holds it, and two threads exclude each
/// other in order.
#[test]
fn blocking_calls_work_without_a_runtime_and_renew() {
    let backend = MemoryBackend::new();
    let ttl = Duration::from_millis(300);
    let a = LockClient::builder(backend.clone())
        .ttl(ttl)
        .build()
        .unwrap();
    let b = LockClient::builder(backend.clone())
        .ttl(ttl)
        .build()
        .unwrap();
    let held = a.mutex("k").blocking_lock().unwrap();
    // Held past several TTLs: the client's own runtime renews it.
    std::thread::sleep(ttl * 4);
    assert!(!held.is_lost());
    let err = b
        .mutex("k")
        .blocking_lock_timeout(Duration::from_millis(50))
        .unwrap_err();
    assert!(err.is_timeout(), "{err}");
    let waiter = std::thread::spawn(move || {
        let g = b.mutex("k").blocking_lock().unwrap();
        let token = g.fencing_token();
        drop(g);
        b.blocking_shutdown().unwrap();
        token
    });
    std::thread::sleep(Duration::from_millis(100));
    let first = held.fencing_token();
    drop(held);
    let second = waiter.join().unwrap();
    assert!(second > first);
    let r = a.rw_lock("rw").blocking_read().unwrap();
    drop(r);
    let w = a.rw_lock("rw").blocking_write().unwrap();
    drop(w);
    let p = a.semaphore("s", 3).blocking_acquire_many(2).unwrap();
    assert_eq!(p.count(), 2);
    drop(p);
    drop(a.multi_lock(["x", "y"]).blocking_lock().unwrap());
    a.blocking_shutdown().unwrap();
    assert_eq!(backend.stats().holders, 0);
}

/// A blocking call inside a current-thread runtime (its one thread runs every task) is
/// refused with an error, not a panic, and leaves nothing held.
#[tokio::test]
async fn a_blocking_call_inside_a_current_thread_runtime_is_an_error() {
    let backend = MemoryBackend::new();
    let c = client(&backend);
    let err = c.mutex("k").blocking_lock().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InAsyncContext, "{err}");
    assert!(err.to_string().contains("current-thread"), "{err}");
    let err = c.blocking_shutdown().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InAsyncContext);
    assert!(c.mutex("k").try_lock().await.is_ok());
    // From a thread of its own it is refused too: a current-thread runtime runs its tasks
    // only inside its own `block_on`, so nothing may drive the call (it would hang).
    let c2 = c.clone();
    let job =
        std::thread::spawn(move || c2.mutex("other").blocking_lock().map(|g| g.fencing_token()));
    let err = job.join().unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NoRuntime, "{err}");
    // From its `spawn_blocking` threads as well, which tokio cannot tell from its async
    // thread: the error says so, naming what to do instead.
    let c3 = c.clone();
    let err = tokio::task::spawn_blocking(move || c3.mutex("third").blocking_lock().map(drop))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InAsyncContext, "{err}");
    assert!(err.to_string().contains("spawn_blocking"), "{err}");
}

/// A client whose runtime has shut down answers a blocking call with an error, not a panic
/// (tokio panics at the first timer on a runtime that is gone).
#[test]
fn a_blocking_call_after_the_clients_runtime_shut_down_is_an_error() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let backend = MemoryBackend::new();
    let c = rt.block_on(async { client(&backend) });
    let held = rt.block_on(c.mutex("k").lock()).unwrap();
    drop(rt);
    let err = c
        .mutex("k")
        .blocking_lock_timeout(Duration::from_millis(200))
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NoRuntime, "{err}");
    drop(held);
}

/// On a multi-thread runtime a blocking call blocks in place, from a task or from a
/// `spawn_blocking` job, while renewals go on: a task that blocks for the lock is served
/// when the holder (another task) releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_calls_on_a_multi_thread_runtime_block_in_place() {
    let backend = MemoryBackend::new();
    let ttl = Duration::from_millis(300);
    let c = client_with(&backend, ttl, true);
    let held = c.mutex("k").lock().await.unwrap();
    let c2 = c.clone();
    let job = tokio::task::spawn_blocking(move || {
        c2.mutex("k").blocking_lock().map(|g| g.fencing_token())
    });
    sleep(ttl * 3).await;
    assert!(!held.is_lost(), "renewal stopped while a thread blocked");
    assert!(!job.is_finished());
    let first = held.fencing_token();
    drop(held);
    let second = timeout(Duration::from_secs(5), job)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(second > first);
    // In a task itself.
    let token = c.mutex("in-task").blocking_lock().unwrap().fencing_token();
    assert!(token > 0);
}

#[tokio::test(start_paused = true)]
async fn a_writer_behind_an_expired_reader_gets_in_at_its_deadline() {
    let backend = MemoryBackend::new();
    let stale = LockClient::builder(backend.clone())
        .ttl(Duration::from_millis(300))
        .auto_renew(false)
        .build()
        .unwrap();
    let writer = LockClient::builder(backend.clone()).build().unwrap();
    let reader = stale.rw_lock("k").read().await.unwrap();
    let started = tokio::time::Instant::now();
    let w = writer.rw_lock("k").write().await.unwrap();
    assert!(
        reader.is_lost(),
        "the reader must know before the writer is in"
    );
    assert_eq!(started.elapsed(), Duration::from_millis(300));
    assert!(w.fencing_token() > reader.fencing_token());
}

#[tokio::test]
async fn bad_family_input_is_a_clear_error_before_any_io() {
    let client = LockClient::memory();
    let err = client.semaphore("s", 0).acquire().await.unwrap_err();
    assert!(err.is_invalid_config(), "{err:?}");
    let err = client.semaphore("s", 2).acquire_many(3).await.unwrap_err();
    assert!(err.is_invalid_config(), "{err:?}");
    let err = client
        .semaphore("s", 2)
        .try_acquire_many(0)
        .await
        .unwrap_err();
    assert!(err.is_invalid_config(), "{err:?}");
    let err = client.rw_lock("").read().await.unwrap_err();
    assert!(err.is_invalid_key(), "{err:?}");
    let err = client.multi_lock(["a"]).read("a").lock().await.unwrap_err();
    assert!(err.is_kind_mismatch(), "{err:?}");
    let err = client
        .multi_lock(Vec::<String>::new())
        .lock()
        .await
        .unwrap_err();
    assert!(err.is_invalid_config(), "{err:?}");
    // The same key twice is taken once, the stronger way.
    let g = client
        .multi_lock(Vec::<String>::new())
        .read("x")
        .write("x")
        .lock()
        .await
        .unwrap();
    assert_eq!(g.keys(), ["x"]);
    assert!(client
        .rw_lock("x")
        .try_read()
        .await
        .unwrap_err()
        .is_would_block());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_locks_over_overlapping_keys_never_deadlock() {
    let backend = MemoryBackend::new();
    let clients: Vec<LockClient> = (0..4).map(|_| client(&backend)).collect();
    let mut tasks = Vec::new();
    for (i, c) in clients.into_iter().enumerate() {
        tasks.push(tokio::spawn(async move {
            // Opposite orders, overlapping sets.
            let keys: Vec<&str> = match i % 4 {
                0 => vec!["a", "b", "c"],
                1 => vec!["c", "b", "a"],
                2 => vec!["b", "c"],
                _ => vec!["c", "a"],
            };
            for _ in 0..50 {
                let g = c.multi_lock(keys.clone()).lock().await.unwrap();
                tokio::task::yield_now().await;
                drop(g);
            }
        }));
    }
    for t in tasks {
        timeout(Duration::from_secs(30), t)
            .await
            .expect("multi-locks deadlocked")
            .unwrap();
    }
    sleep(Duration::from_millis(50)).await;
    assert_eq!(backend.stats().keys, 0);
}

/// Cancellation torture on the paused clock (the suite runs it on real threads, on every
/// backend): see `support/cancellation.rs`.
#[tokio::test(start_paused = true)]
async fn cancelled_lock_futures_leave_nothing_behind_paused_clock() {
    let env = crate::support::server::memory::env(test_namespace!()).await;
    crate::support::cancellation::torture(&env, 3, 6, 600, Duration::from_millis(1)).await;
}

/// A downgrade sets the lease again, as the servers' downgrades do: the read guard has a full
/// TTL, not what was left of the write's.
#[tokio::test(start_paused = true)]
async fn a_downgrade_starts_a_full_lease() {
    let backend = MemoryBackend::new();
    let ttl = Duration::from_secs(1);
    let write = client_with(&backend, ttl, false)
        .rw_lock("d")
        .write()
        .await
        .unwrap();
    sleep(Duration::from_millis(600)).await;
    let read = write.downgrade().await.unwrap();
    assert!(
        read.lease_left() > Duration::from_millis(800),
        "{:?} left after the downgrade",
        read.lease_left()
    );
}
