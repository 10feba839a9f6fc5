//! The lock family (read-write locks, semaphores, multi-locks) on the memory backend and on a
//! real `redis-server`: the same checks (tests/support/family.rs) on both.

mod support;

use std::time::Duration;

use distlock::backend::MemoryBackend;
use distlock::LockClient;
use futures::future::BoxFuture;
use support::contract::{take_multi, take_permit, take_write, torture_with, Take};
use support::family::{
    downgrade_keeps_queued_writers_out, inspect_sees_the_family, kinds_do_not_mix, rw_exclusion,
    rw_fifo, semaphore_bound, semaphore_head_is_not_overtaken,
};
use tokio::time::{sleep, timeout};

/// A reader-writer plan: `true` is a writer.
const PLAN: [bool; 8] = [false, false, true, false, false, true, true, false];

fn memory_clients(backend: &MemoryBackend, n: usize) -> Vec<LockClient> {
    (0..n)
        .map(|_| LockClient::builder(backend.clone()).build().unwrap())
        .collect()
}

fn memory_queued(backend: &MemoryBackend) -> impl Fn(usize) -> BoxFuture<'static, ()> + Sync {
    let backend = backend.clone();
    move |n| {
        let backend = backend.clone();
        Box::pin(async move {
            timeout(Duration::from_secs(10), async {
                while backend.stats().waiters != n {
                    tokio::task::yield_now().await;
                }
            })
            .await
            .unwrap_or_else(|_| panic!("expected {n} waiters"));
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_rw_exclusion_and_tokens() {
    let backend = MemoryBackend::new();
    rw_exclusion(memory_clients(&backend, 6), "rw", 40, 4).await;
    assert_eq!(backend.stats().keys, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_rw_fifo_with_readers_together() {
    let backend = MemoryBackend::new();
    let clients = memory_clients(&backend, PLAN.len() + 1);
    rw_fifo(clients, "rw", &PLAN, &memory_queued(&backend)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_semaphore_never_exceeds_its_permits() {
    let backend = MemoryBackend::new();
    semaphore_bound(memory_clients(&backend, 6), "sem", 3, 40).await;
    assert_eq!(backend.stats().keys, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_semaphore_head_is_not_overtaken() {
    let backend = MemoryBackend::new();
    let c = memory_clients(&backend, 3);
    let clients: [LockClient; 3] = c.try_into().unwrap();
    semaphore_head_is_not_overtaken(clients, "sem", &memory_queued(&backend)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_downgrade_keeps_queued_writers_out() {
    let backend = MemoryBackend::new();
    let clients: [LockClient; 3] = memory_clients(&backend, 3).try_into().unwrap();
    downgrade_keeps_queued_writers_out(clients, "rw", &memory_queued(&backend)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_inspect_sees_the_family() {
    let backend = MemoryBackend::new();
    let clients: [LockClient; 3] = memory_clients(&backend, 3).try_into().unwrap();
    let q = memory_queued(&backend);
    inspect_sees_the_family(clients, "k", true, &q, &q).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_kinds_do_not_mix() {
    let backend = MemoryBackend::new();
    let clients: [LockClient; 2] = memory_clients(&backend, 2).try_into().unwrap();
    kinds_do_not_mix(clients, "k", true).await;
}

async fn memory_torture(take: Take) {
    let backend = MemoryBackend::new();
    torture_with(
        take,
        memory_clients(&backend, 2),
        memory_clients(&backend, 4),
        "torture",
        60,
        120,
        Duration::from_micros(3),
    )
    .await;
    assert_eq!(backend.stats().keys, 0, "{:?}", backend.stats());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_cancelled_family_futures_leave_nothing_behind() {
    for take in [take_write(), take_permit(), take_multi()] {
        memory_torture(take).await;
    }
}

#[tokio::test(start_paused = true)]
async fn memory_a_writer_behind_an_expired_reader_gets_in_at_its_deadline() {
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
async fn memory_multi_locks_over_overlapping_keys_never_deadlock() {
    let backend = MemoryBackend::new();
    let clients = memory_clients(&backend, 4);
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

#[cfg(feature = "redis")]
mod redis_backend {
    use super::*;
    use distlock::backend::RedisBackend;
    use support::contract::torture_family;
    use support::redis::{until_only_fences, until_queued};
    use support::server::redis::shared_redis;

    async fn client(ns: &str) -> LockClient {
        let backend = RedisBackend::connect(&shared_redis().url()).await.unwrap();
        LockClient::builder(backend).namespace(ns).build().unwrap()
    }

    async fn clients(ns: &str, n: usize) -> Vec<LockClient> {
        let mut out = Vec::new();
        for _ in 0..n {
            out.push(client(ns).await);
        }
        out
    }

    fn queued(ns: &str, key: &str) -> impl Fn(usize) -> BoxFuture<'static, ()> + Sync {
        let (ns, key) = (ns.to_owned(), key.to_owned());
        move |n| {
            let (ns, key) = (ns.clone(), key.clone());
            Box::pin(async move { until_queued(&shared_redis().url(), &ns, &key, n).await })
        }
    }

    async fn assert_only_fences(ns: &str) {
        until_only_fences(&shared_redis().url(), ns).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_rw_exclusion_and_tokens() {
        let ns = test_namespace!();
        rw_exclusion(clients(&ns, 6).await, "rw", 20, 4).await;
        assert_only_fences(&ns).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_rw_fifo_with_readers_together() {
        let ns = test_namespace!();
        let c = clients(&ns, PLAN.len() + 1).await;
        rw_fifo(c, "rw", &PLAN, &queued(&ns, "rw")).await;
        assert_only_fences(&ns).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_semaphore_never_exceeds_its_permits() {
        let ns = test_namespace!();
        semaphore_bound(clients(&ns, 6).await, "sem", 3, 20).await;
        assert_only_fences(&ns).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_semaphore_head_is_not_overtaken() {
        let ns = test_namespace!();
        let c: [LockClient; 3] = clients(&ns, 3).await.try_into().unwrap();
        semaphore_head_is_not_overtaken(c, "sem", &queued(&ns, "sem")).await;
        assert_only_fences(&ns).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_downgrade_keeps_queued_writers_out() {
        let ns = test_namespace!();
        let c: [LockClient; 3] = clients(&ns, 3).await.try_into().unwrap();
        downgrade_keeps_queued_writers_out(c, "rw", &queued(&ns, "rw")).await;
        assert_only_fences(&ns).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_inspect_sees_the_family() {
        let ns = test_namespace!();
        let c: [LockClient; 3] = clients(&ns, 3).await.try_into().unwrap();
        let (q_rw, q_sem) = (queued(&ns, "k:rw"), queued(&ns, "k:sem"));
        inspect_sees_the_family(c, "k", true, &q_rw, &q_sem).await;
        assert_only_fences(&ns).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_kinds_do_not_mix() {
        let ns = test_namespace!();
        let c: [LockClient; 2] = clients(&ns, 2).await.try_into().unwrap();
        kinds_do_not_mix(c, "k", true).await;
        assert_only_fences(&ns).await;
    }

    const CHILD_ENV: &str = "DISTLOCK_TEST_FAMILY_CHILD";
    const CHILD_TTL: Duration = Duration::from_millis(1500);

    /// The child process of the SIGKILL tests: takes `k` as `what` says, reports, holds.
    async fn child(spec: &str) -> ! {
        let mut parts = spec.split(' ');
        let (url, ns, what) = (
            parts.next().unwrap(),
            parts.next().unwrap(),
            parts.next().unwrap(),
        );
        let backend = RedisBackend::connect(url).await.unwrap();
        let c = LockClient::builder(backend)
            .namespace(ns)
            .ttl(CHILD_TTL)
            .build()
            .unwrap();
        let fence = match what {
            "read" => {
                let g = c.rw_lock("k").read().await.unwrap();
                let f = g.fencing_token();
                std::mem::forget(g);
                f
            }
            _ => {
                let p = c.semaphore("k", 2).acquire_many(2).await.unwrap();
                let f = p.fencing_token();
                std::mem::forget(p);
                f
            }
        };
        support::holder::report_and_hold(fence).await
    }

    /// The child holds `k` (as `what`), `waiter` queues behind it, the child is SIGKILLed: the
    /// waiter is granted within the child's TTL (its lease was renewed up to the kill).
    async fn killed_holder_frees_within_its_ttl<G: Send + 'static>(
        test: &str,
        what: &str,
        ns: &str,
        waiter: impl std::future::Future<Output = distlock::Result<G>> + Send + 'static,
    ) -> (G, u64) {
        let (child, child_fence) = support::holder::spawn(
            test,
            CHILD_ENV,
            format!("{} {ns} {what}", shared_redis().url()),
        )
        .await;
        let waiter = tokio::spawn(waiter);
        queued(ns, "k")(1).await;
        // Past the child's first renewals, so the lease was refreshed before it died.
        sleep(CHILD_TTL).await;
        let (guard, waited) = support::holder::kill_and_await(child, waiter, CHILD_TTL * 3).await;
        assert!(
            waited <= CHILD_TTL + Duration::from_millis(50),
            "granted {waited:?} after the kill, TTL {CHILD_TTL:?}"
        );
        (guard, child_fence)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_a_writer_behind_a_killed_reader_gets_in_within_its_ttl() {
        if let Ok(spec) = std::env::var(CHILD_ENV) {
            child(&spec).await;
        }
        let ns = test_namespace!();
        let c = client(&ns).await;
        let (w, child_fence) = killed_holder_frees_within_its_ttl(
            "redis_backend::redis_a_writer_behind_a_killed_reader_gets_in_within_its_ttl",
            "read",
            &ns,
            c.rw_lock("k").write(),
        )
        .await;
        assert!(w.fencing_token() > child_fence);
        w.release().await.unwrap();
        c.shutdown().await;
        assert_only_fences(&ns).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_permits_of_a_killed_holder_come_back() {
        if let Ok(spec) = std::env::var(CHILD_ENV) {
            child(&spec).await;
        }
        let ns = test_namespace!();
        let c = client(&ns).await;
        let (p, child_fence) = killed_holder_frees_within_its_ttl(
            "redis_backend::redis_permits_of_a_killed_holder_come_back",
            "permits",
            &ns,
            c.semaphore("k", 2).acquire_many(2),
        )
        .await;
        assert_eq!(p.count(), 2);
        assert!(p.fencing_token() > child_fence);
        p.release().await.unwrap();
        c.shutdown().await;
        assert_only_fences(&ns).await;
    }

    /// A reader cut off from Redis (its renewals go nowhere) is told it lost the lock before
    /// the writer queued behind it is granted.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_a_paused_reader_is_told_before_the_writer_gets_in() {
        let ns = test_namespace!();
        let proxy = support::proxy::Proxy::start(shared_redis().port());
        let ttl = Duration::from_millis(900);
        let behind = LockClient::builder(
            RedisBackend::connect(&format!("redis://127.0.0.1:{}/", proxy.port()))
                .await
                .unwrap(),
        )
        .namespace(&ns)
        .ttl(ttl)
        .build()
        .unwrap();
        let writer = client(&ns).await;
        let r = behind.rw_lock("k").read().await.unwrap();
        let w = support::contract::spawn_timed(writer.rw_lock("k").write());
        queued(&ns, "k")(1).await;
        let (w, lost, granted) = support::contract::partition_then_handover(
            || proxy.blackhole(),
            &r,
            w,
            Duration::from_secs(10),
        )
        .await;
        assert!(lost <= ttl, "{lost:?}");
        assert!(granted <= ttl + Duration::from_millis(100), "{granted:?}");
        assert!(w.fencing_token() > r.fencing_token());
        proxy.heal();
        w.release().await.unwrap();
        drop(r);
        writer.shutdown().await;
        behind.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_cancelled_family_futures_leave_nothing_behind() {
        let ns = test_namespace!();
        torture_family(|n| clients(&ns, n), 20, 60).await;
        assert_only_fences(&ns).await;
    }
}
