//! Attacks on the widened coalesced release (`release_many` sending each claim's lock name and
//! owner only, `release_widen` rebuilding the rest on the server) and on the lost signal kept
//! as a flag and one `Notify`, against real servers through the public API.
#![cfg(feature = "redis")]

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use crate::support::redis::{connection as raw, non_fence_keys, until_only_fences};
use crate::support::server::redis::{shared_redis, RedisServer};
use distlock::backend::RedisBackend;
use distlock::LockClient;
use tokio::time::{sleep, timeout, Instant};

/// A client of `url` with the default handoff lease (2 s).
async fn client_at(url: &str, ns: &str, ttl: Duration, renew: bool) -> LockClient {
    crate::support::redis::client(url, ns, ttl, Duration::from_secs(2), renew).await
}

/// Releases `guards` together (one coalesced batch, as far as the client batches them), within
/// 5 s, each release succeeding.
async fn release_together(guards: Vec<distlock::MutexGuard>) {
    let released = timeout(
        Duration::from_secs(5),
        futures::future::join_all(guards.into_iter().map(|g| g.release())),
    )
    .await
    .expect("the releases did not end in 5 s");
    for r in released {
        r.unwrap();
    }
}

/// A waiter of `client` spawned on each of `keys`; returns once the server shows `queued`
/// entries on every key.
async fn queue_on(
    client: &LockClient,
    (url, ns): (&str, &str),
    keys: &[String],
    queued: usize,
) -> Vec<tokio::task::JoinHandle<distlock::Result<distlock::MutexGuard>>> {
    let waits = keys
        .iter()
        .map(|k| {
            let m = client.mutex(k);
            tokio::spawn(async move { m.lock().await })
        })
        .collect();
    for k in keys {
        crate::support::redis::until_queued(url, ns, k, queued).await;
    }
    waits
}

/// Every one of `keys` locked through `client` at once, within 5 s.
async fn lock_all(
    client: &LockClient,
    keys: impl IntoIterator<Item = String>,
) -> Vec<distlock::MutexGuard> {
    let locks = keys.into_iter().map(|k| {
        let m = client.mutex(k);
        async move { m.lock().await }
    });
    timeout(Duration::from_secs(5), futures::future::join_all(locks))
        .await
        .expect("the keys were not all locked within 5 s")
        .into_iter()
        .map(|g| g.unwrap())
        .collect()
}

/// `key`'s value, read with a plain command.
async fn get(con: &mut redis::aio::MultiplexedConnection, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query_async(con).await.unwrap()
}

/// Deletes `keys` with a plain command.
async fn del(con: &mut redis::aio::MultiplexedConnection, keys: &[String]) {
    let _: () = redis::cmd("DEL").arg(keys).query_async(con).await.unwrap();
}

/// `n` keys locked through `client` (`k0`, `k1`, ...), each guard shared, and `watchers` tasks
/// spread over them, each awaiting `lost()` and then checking `is_lost()` agrees.
async fn watched_guards(
    client: &LockClient,
    n: usize,
    watchers: usize,
) -> (
    Vec<Arc<distlock::MutexGuard>>,
    Vec<tokio::task::JoinHandle<()>>,
) {
    let mut guards = Vec::new();
    for i in 0..n {
        guards.push(Arc::new(
            client.mutex(format!("k{i}")).lock().await.unwrap(),
        ));
    }
    let tasks = (0..watchers)
        .map(|t| {
            let guard = guards[t % n].clone();
            tokio::spawn(async move {
                guard.lost().await;
                assert!(guard.is_lost(), "lost() ended but is_lost() is false");
            })
        })
        .collect();
    (guards, tasks)
}

/// Every watcher ends within `within` (of `what`), and then each guard's `lost()` at once.
async fn all_told(
    watchers: Vec<tokio::task::JoinHandle<()>>,
    guards: &[Arc<distlock::MutexGuard>],
    within: Duration,
    what: &str,
) {
    for w in watchers {
        timeout(within, w)
            .await
            .unwrap_or_else(|_| {
                panic!("a watcher of lost() was not woken within {within:?} of {what}")
            })
            .unwrap();
    }
    for g in guards {
        assert!(g.is_lost());
        timeout(Duration::from_millis(100), g.lost())
            .await
            .expect("lost() after the loss did not end at once");
    }
}

/// One client, 256 tasks, each locking one of 4 hot keys and one of many cold keys, 5 rounds:
/// releases coalesce while waiters are queued on the hot keys. No two holders of a key at once,
/// fencing tokens strictly increase per key, every task finishes in bounded time, and nothing
/// but fence counters is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_and_cold_keys_under_coalesced_releases_keep_exclusion_and_tokens() {
    let url = shared_redis().url();
    let ns = test_namespace!();
    let client = client_at(&url, &ns, Duration::from_secs(10), true).await;
    let tasks = 256;
    let rounds = 5;
    let holders: Arc<Vec<AtomicUsize>> = Arc::new((0..4).map(|_| AtomicUsize::new(0)).collect());
    let tokens: Arc<StdMutex<HashMap<String, u64>>> = Arc::default();
    let overlaps = Arc::new(AtomicUsize::new(0));
    let backwards = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let client = client.clone();
            let (holders, tokens) = (holders.clone(), tokens.clone());
            let (overlaps, backwards) = (overlaps.clone(), backwards.clone());
            tokio::spawn(async move {
                for r in 0..rounds {
                    let hot = (t + r) % 4;
                    let hot_key = format!("hot{hot}");
                    let cold_key = format!("cold{t}-{r}");
                    let cold = client.mutex(&cold_key).lock().await.unwrap();
                    let guard = client.mutex(&hot_key).lock().await.unwrap();
                    if holders[hot].fetch_add(1, Ordering::SeqCst) != 0 {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    {
                        let mut seen = tokens.lock().unwrap();
                        let last = seen.entry(hot_key.clone()).or_insert(0);
                        if guard.fencing_token() <= *last {
                            backwards.fetch_add(1, Ordering::SeqCst);
                        }
                        *last = guard.fencing_token();
                    }
                    tokio::task::yield_now().await;
                    holders[hot].fetch_sub(1, Ordering::SeqCst);
                    let (a, b) = futures::join!(guard.release(), cold.release());
                    a.unwrap();
                    b.unwrap();
                }
            })
        })
        .collect();
    let all = timeout(Duration::from_secs(15), futures::future::join_all(handles))
        .await
        .expect("not every task finished its rounds within 15 s");
    for h in all {
        h.unwrap();
    }
    println!("{tasks} tasks x {rounds} rounds in {:?}", started.elapsed());
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two holders of one key");
    assert_eq!(
        backwards.load(Ordering::SeqCst),
        0,
        "a fencing token went back"
    );
    until_only_fences(&url, &ns).await;
    client.shutdown().await;
}

/// Keys whose names hold `:q`, braces, spaces, `:c:`, `:fence` and unicode, held with a waiter
/// queued behind each and released in one coalesced batch: every waiter is handed its lock,
/// bystander keys (named like the suffixed names of other locks) are untouched, and nothing
/// but fence counters is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_key_names_release_only_their_own_names() {
    let url = shared_redis().url();
    let ns = test_namespace!();
    let holder = client_at(&url, &ns, Duration::from_secs(30), true).await;
    let waiter = client_at(&url, &ns, Duration::from_secs(30), true).await;
    let names = [
        "a",
        "a:q",
        "a}:q",
        "{a",
        "a}",
        "}{",
        "a b",
        "ünïcødé 🔒",
        "a:c:",
        "a:fence",
        "a:w",
        "x",
        "x}:fence",
        "x:q}",
        " ",
        "a:q:q",
    ];
    let mut con = raw(&url).await;
    // Bystanders: keys named as another lock's queue/waiters/fence/channel would be, or as a
    // wrong derivation might name them.
    let bystanders: Vec<String> = vec![
        format!("{ns}:{{a}}:q:q"),
        format!("{ns}:{{a}}:fence:q"),
        format!("{ns}:{{a}}:w:w"),
        format!("{ns}:{{a}}:c:q"),
        format!("{ns}:q"),
        format!("{ns}:{{a}}:h"),
        format!("other:{{a}}:q"),
    ];
    for b in &bystanders {
        let _: () = redis::cmd("SET")
            .arg(b)
            .arg("bystander")
            .query_async(&mut con)
            .await
            .unwrap();
    }
    // Twice: a plain round (quick path only) and one with waiters queued (widened path).
    let mut guards = Vec::new();
    for n in names {
        let g = timeout(Duration::from_secs(5), holder.mutex(n).lock())
            .await
            .unwrap_or_else(|_| panic!("{n:?}: a free key was not granted in 5 s"));
        guards.push(g.unwrap_or_else(|e| panic!("{n:?}: {e}")));
    }
    let keys: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let waits = queue_on(&waiter, (&url, &ns), &keys, 1).await;
    let tokens: Vec<u64> = guards.iter().map(|g| g.fencing_token()).collect();
    release_together(guards).await;
    let mut second = Vec::new();
    for ((n, w), t) in names.iter().zip(waits).zip(tokens) {
        let g = timeout(Duration::from_secs(5), w)
            .await
            .unwrap_or_else(|_| panic!("{n:?}: waiter not handed the lock within 5 s"))
            .unwrap()
            .unwrap();
        assert!(g.fencing_token() > t, "{n:?}: token went back");
        second.push(g);
    }
    release_together(second).await;
    for b in &bystanders {
        let v = get(&mut con, b).await;
        assert_eq!(v.as_deref(), Some("bystander"), "bystander {b} was touched");
    }
    del(&mut con, &bystanders).await;
    until_only_fences(&url, &ns).await;
    holder.shutdown().await;
    waiter.shutdown().await;
}

/// A client whose leases (no renewal) expired while another client took the keys releases all
/// of them in one coalesced batch, some with a third client's waiter queued: the other
/// client's holds are not deleted or handed on, and its guards stay unlost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coalesced_release_past_the_lease_keeps_the_next_holders_holds() {
    let url = shared_redis().url();
    let ns = test_namespace!();
    let late = client_at(&url, &ns, Duration::from_millis(600), false).await;
    let next = client_at(&url, &ns, Duration::from_secs(30), true).await;
    let third = client_at(&url, &ns, Duration::from_secs(30), true).await;
    let n = 40;
    let old = lock_all(&late, (0..n).map(|i| format!("k{i}"))).await;
    // The late leases (600 ms) run out well within `lock_all`'s 5 s.
    let taken = lock_all(&next, (0..n).map(|i| format!("k{i}"))).await;
    // Every other key gets a third client's waiter behind the new holder.
    let waits: Vec<_> = (0..n)
        .filter(|i| i % 2 == 0)
        .map(|i| {
            let m = third.mutex(format!("k{i}"));
            tokio::spawn(async move { m.lock_timeout(Duration::from_secs(3)).await })
        })
        .collect();
    for i in (0..n).filter(|i| i % 2 == 0) {
        crate::support::redis::until_queued(&url, &ns, &format!("k{i}"), 1).await;
    }
    let _ = futures::future::join_all(old.into_iter().map(|g| g.release())).await;
    sleep(Duration::from_millis(300)).await;
    let mut con = raw(&url).await;
    for (i, g) in taken.iter().enumerate() {
        assert!(!g.is_lost(), "k{i}: the next holder's guard was lost");
        let exists: i64 = redis::cmd("EXISTS")
            .arg(format!("{ns}:{{k{i}}}"))
            .query_async(&mut con)
            .await
            .unwrap();
        assert_eq!(exists, 1, "k{i}: the next holder's hold was deleted");
        let again = third.mutex(format!("k{i}")).try_lock().await;
        assert!(again.is_err(), "k{i}: another client took a held key");
    }
    for r in futures::future::join_all(taken.into_iter().map(|g| g.release())).await {
        r.unwrap();
    }
    for w in waits {
        let g = timeout(Duration::from_secs(5), w)
            .await
            .expect("a queued waiter was not answered")
            .unwrap()
            .expect("a queued waiter was not granted after the real holder released");
        g.release().await.unwrap();
    }
    until_only_fences(&url, &ns).await;
    for c in [late, next, third] {
        c.shutdown().await;
    }
}

/// Waiters given up (a lock_timeout expiring, a future dropped) on hot keys while their
/// holder's releases coalesce: the waiters still waiting behind them are granted at once,
/// and nothing but fences is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_given_up_while_releases_coalesce_leave_the_others_granted() {
    let url = shared_redis().url();
    let ns = test_namespace!();
    let holder = client_at(&url, &ns, Duration::from_secs(30), true).await;
    let waiter = client_at(&url, &ns, Duration::from_secs(30), true).await;
    let n = 32;
    let guards: Vec<_> = lock_all(&holder, (0..n).map(|i| format!("k{i}"))).await;
    let mut quitters = Vec::new();
    let mut stayers = Vec::new();
    for i in 0..n {
        let m = waiter.mutex(format!("k{i}"));
        if i % 2 == 0 {
            quitters.push(tokio::spawn(async move {
                drop(m.lock_timeout(Duration::from_millis(400)).await);
            }));
        } else {
            quitters.push(tokio::spawn(async move {
                drop(timeout(Duration::from_millis(400), m.lock()).await);
            }));
        }
    }
    for i in 0..n {
        crate::support::redis::until_queued(&url, &ns, &format!("k{i}"), 1).await;
    }
    for i in 0..n {
        let m = waiter.mutex(format!("k{i}"));
        stayers.push(tokio::spawn(async move { m.lock().await }));
    }
    for i in 0..n {
        crate::support::redis::until_queued(&url, &ns, &format!("k{i}"), 2).await;
    }
    // Release while the first waiters give up.
    sleep(Duration::from_millis(390)).await;
    let release = futures::future::join_all(guards.into_iter().map(|g| g.release()));
    let (released, _) = futures::join!(release, futures::future::join_all(quitters));
    for r in released {
        r.unwrap();
    }
    let started = Instant::now();
    let mut granted = Vec::new();
    for (i, s) in stayers.into_iter().enumerate() {
        let g = timeout(Duration::from_secs(5), s)
            .await
            .unwrap_or_else(|_| panic!("k{i}: the waiter still waiting was not granted in 5 s"))
            .unwrap()
            .unwrap();
        granted.push(g);
    }
    println!("stayers granted within {:?}", started.elapsed());
    for r in futures::future::join_all(granted.into_iter().map(|g| g.release())).await {
        r.unwrap();
    }
    // Any quitter that was granted after all released its guard when dropped.
    until_only_fences(&url, &ns).await;
    assert!(non_fence_keys(&url, &ns).await.is_empty());
    holder.shutdown().await;
    waiter.shutdown().await;
}

/// 64 tasks await `guard.lost()` on one guard (6 s TTL, renewing) while its key is overwritten
/// with `SET`: each of them ends within 3.5 s, before the lease's own end, `is_lost()` agrees, and a `lost()` called afterwards ends at
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_watcher_of_a_guard_hears_its_key_overwritten() {
    let url = shared_redis().url();
    let ns = test_namespace!();
    let client = client_at(&url, &ns, Duration::from_secs(6), true).await;
    let guard = Arc::new(client.mutex("lost").lock().await.unwrap());
    let woken = Arc::new(AtomicUsize::new(0));
    let watchers: Vec<_> = (0..64)
        .map(|_| {
            let (guard, woken) = (guard.clone(), woken.clone());
            tokio::spawn(async move {
                guard.lost().await;
                assert!(guard.is_lost(), "lost() ended but is_lost() is false");
                woken.fetch_add(1, Ordering::SeqCst);
            })
        })
        .collect();
    sleep(Duration::from_millis(100)).await;
    assert_eq!(woken.load(Ordering::SeqCst), 0, "woken before the loss");
    assert!(!guard.is_lost());
    let mut con = raw(&url).await;
    let _: () = redis::cmd("SET")
        .arg(format!("{ns}:{{lost}}"))
        .arg("somebody-else")
        .query_async(&mut con)
        .await
        .unwrap();
    // Noticed at the next renewal (every 2 s), well before the lease's end (4 s or more
    // away): the watchers are woken by the mark, not by their own deadline.
    let overwritten = Instant::now();
    let by = overwritten + Duration::from_millis(3500);
    {
        let guard = guard.clone();
        tokio::spawn(async move {
            while !guard.is_lost() {
                sleep(Duration::from_millis(20)).await;
            }
            println!(
                "is_lost() true {:?} after the overwrite",
                overwritten.elapsed()
            );
        });
    }
    for w in watchers {
        tokio::time::timeout_at(by, w)
            .await
            .expect("a watcher of lost() was not woken within 3.5 s of the overwrite")
            .unwrap();
    }
    println!(
        "every watcher woken {:?} after the overwrite",
        overwritten.elapsed()
    );
    assert!(guard.is_lost());
    timeout(Duration::from_millis(100), guard.lost())
        .await
        .expect("lost() after the loss did not end at once");
    del(&mut con, &[format!("{ns}:{{lost}}")]).await;
    drop(guard);
    client.shutdown().await;
}

/// 64 tasks await `lost()` on guards of 8 keys while a private redis-server is restarted
/// without data: every watcher ends in bounded time and agrees with `is_lost()`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_watcher_hears_a_restart_without_data() {
    let mut server = RedisServer::start();
    let url = server.url();
    let ns = test_namespace!();
    let client = client_at(&url, &ns, Duration::from_millis(1500), true).await;
    let (guards, watchers) = watched_guards(&client, 8, 64).await;
    sleep(Duration::from_millis(100)).await;
    server.restart_after(|| std::thread::sleep(Duration::from_millis(200)));
    all_told(watchers, &guards, Duration::from_secs(8), "the restart").await;
    drop(guards);
    client.shutdown().await;
}

/// The memory backend with a 300 ms TTL and renewal off: 64 tasks awaiting `lost()` on one
/// guard all end once the lease runs out, `is_lost()` agrees, and another claimant is granted.
#[cfg(feature = "memory")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_leases_expiring_wake_every_watcher() {
    let _ns = test_namespace!();
    let client = LockClient::builder(distlock::backend::MemoryBackend::new())
        .ttl(Duration::from_millis(300))
        .auto_renew(false)
        .build()
        .unwrap();
    for round in 0..20 {
        let guard = Arc::new(client.mutex("m").lock().await.unwrap());
        let watchers: Vec<_> = (0..64)
            .map(|_| {
                let guard = guard.clone();
                tokio::spawn(async move {
                    guard.lost().await;
                    assert!(guard.is_lost(), "lost() ended but is_lost() is false");
                })
            })
            .collect();
        for w in watchers {
            timeout(Duration::from_secs(3), w)
                .await
                .unwrap_or_else(|_| panic!("round {round}: a watcher not woken in 3 s"))
                .unwrap();
        }
        assert!(guard.is_lost());
        let next = timeout(Duration::from_secs(2), client.mutex("m").lock())
            .await
            .expect("the expired key was not granted again")
            .unwrap();
        assert!(!next.is_lost());
        drop(next);
        drop(guard);
    }
}

/// Watches a private server with `MONITOR` while one client releases 24 holds (8 with a
/// waiter queued, so the widened body runs) of odd names at once: the releases do go as a
/// widened `release_many` call (one key per claim), every waiter is granted, and nothing but
/// fences is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_names_released_together_go_as_one_widened_call() {
    let server = RedisServer::start();
    let url = server.url();
    let ns = test_namespace!();
    let dir = tempfile_path(&ns);
    // Line-buffered, so nothing is lost when it is killed.
    let mut monitor = std::process::Command::new("stdbuf")
        .arg("-oL")
        .arg("redis-cli")
        .arg("-p")
        .arg(server.port().to_string())
        .arg("monitor")
        .stdout(std::fs::File::create(&dir).unwrap())
        .spawn()
        .unwrap();
    sleep(Duration::from_millis(200)).await;
    let holder = client_at(&url, &ns, Duration::from_secs(30), true).await;
    let waiter = client_at(&url, &ns, Duration::from_secs(30), true).await;
    let names: Vec<String> = (0..24).map(|i| format!("k{i}:q}} {{ü")).collect();
    let guards: Vec<_> = lock_all(&holder, names.iter().cloned()).await;
    let waited: Vec<String> = names.iter().step_by(3).cloned().collect();
    let waits = queue_on(&waiter, (&url, &ns), &waited, 1).await;
    release_together(guards).await;
    for w in waits {
        let g = timeout(Duration::from_secs(5), w)
            .await
            .expect("a waiter was not handed its lock in 5 s")
            .unwrap()
            .unwrap();
        g.release().await.unwrap();
    }
    until_only_fences(&url, &ns).await;
    sleep(Duration::from_millis(200)).await;
    monitor.kill().unwrap();
    let _ = monitor.wait();
    let log = std::fs::read_to_string(&dir).unwrap();
    let widest = log
        .lines()
        .filter(|l| l.contains("release_many\""))
        .filter_map(|l| {
            let after = l.split("release_many\" \"").nth(1)?;
            after.split('"').next()?.parse::<usize>().ok()
        })
        .max();
    println!("largest release_many call: {widest:?} keys");
    assert!(
        widest.is_some_and(|k| k >= 2),
        "no release_many call carried two claims"
    );
    holder.shutdown().await;
    waiter.shutdown().await;
    let _ = std::fs::remove_file(&dir);
}

fn tempfile_path(ns: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("{ns}.monitor"))
}

/// Waiters queued by another process (`redis-cli` calling the library's acquire by hand, then
/// SIGKILLed) ahead of a live client's waiters on 16 keys whose holder releases them all at
/// once: each live waiter is granted in bounded time (the dead one's handoff lease of 1 s, its
/// waiter lease of 2 s), with a larger token, and nothing but fences is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_of_a_killed_process_ahead_of_coalesced_releases_do_not_strand_the_rest() {
    let server = RedisServer::start();
    let url = server.url();
    let ns = test_namespace!();
    let backend = RedisBackend::builder(&url)
        .handoff_ttl(Duration::from_secs(1))
        .build()
        .await
        .unwrap();
    let library =
        crate::support::redis::library_of(&backend).expect("scripts in a function library");
    let holder = LockClient::builder(backend)
        .namespace(&ns)
        .ttl(Duration::from_secs(30))
        .build()
        .unwrap();
    let waiter = crate::support::redis::client(
        &url,
        &ns,
        Duration::from_secs(30),
        Duration::from_secs(1),
        true,
    )
    .await;
    let n = 16;
    let guards: Vec<_> = lock_all(&holder, (0..n).map(|i| format!("k{i}"))).await;
    for i in 0..n {
        let lock = format!("{ns}:{{k{i}}}");
        let mut child = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "redis-cli -p {} FCALL {library}_acquire 4 '{lock}' '{lock}:q' '{lock}:w' \
                 '{ns}:fence' dead.{i} 60000 1 3600000 2000 '{lock}:c:' 0 >/dev/null; \
                 exec sleep 30",
                server.port()
            ))
            .spawn()
            .unwrap();
        crate::support::redis::until_queued(&url, &ns, &format!("k{i}"), 1).await;
        child.kill().unwrap();
        let _ = child.wait();
    }
    let keys: Vec<String> = (0..n).map(|i| format!("k{i}")).collect();
    let waits = queue_on(&waiter, (&url, &ns), &keys, 2).await;
    let tokens: Vec<u64> = guards.iter().map(|g| g.fencing_token()).collect();
    release_together(guards).await;
    let started = Instant::now();
    let mut granted = Vec::new();
    for (i, w) in waits.into_iter().enumerate() {
        let g = timeout(Duration::from_secs(8), w)
            .await
            .unwrap_or_else(|_| panic!("k{i}: the live waiter was not granted within 8 s"))
            .unwrap()
            .unwrap();
        assert!(g.fencing_token() > tokens[i], "k{i}: token went back");
        granted.push(g);
    }
    println!("live waiters granted within {:?}", started.elapsed());
    for r in futures::future::join_all(granted.into_iter().map(|g| g.release())).await {
        r.unwrap();
    }
    until_only_fences(&url, &ns).await;
    holder.shutdown().await;
    waiter.shutdown().await;
}

/// A fault proxy blackholes the connection of a renewing client (1.5 s TTL) holding 4 keys,
/// each watched by 16 tasks awaiting `lost()`: every watcher ends within 4 s, agreeing with
/// `is_lost()`, and a `lost()` called after ends at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_watcher_hears_a_blackholed_connection_past_the_ttl() {
    let server = RedisServer::start();
    let proxy = crate::support::proxy::Proxy::start(server.port());
    let url = format!("redis://127.0.0.1:{}/", proxy.port());
    let ns = test_namespace!();
    let client = client_at(&url, &ns, Duration::from_millis(1500), true).await;
    let (guards, watchers) = watched_guards(&client, 4, 64).await;
    sleep(Duration::from_millis(100)).await;
    assert!(guards.iter().all(|g| !g.is_lost()));
    let cut = Instant::now();
    proxy.blackhole();
    all_told(watchers, &guards, Duration::from_secs(4), "the blackhole").await;
    println!(
        "every watcher woken {:?} after the blackhole",
        cut.elapsed()
    );
    proxy.heal();
    drop(guards);
    let _ = timeout(Duration::from_secs(5), client.shutdown()).await;
}

/// The same coalesced handoffs by `EVALSHA`: an ACL user kept to `<ns>:*` (keys and channels)
/// and refused the function commands holds 30 keys, a second such client queues on every
/// other one, and all are released at once: every waiter is granted within 5 s with a larger
/// token (the rebuilt names are inside the user's pattern), and nothing but fences is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn widened_releases_by_evalsha_under_an_acl_pattern_hand_on() {
    let server = RedisServer::start();
    let ns = test_namespace!();
    let user = format!("nofn{}", std::process::id());
    let mut setuser = redis::cmd("ACL");
    setuser
        .arg("SETUSER")
        .arg(&user)
        .arg("reset")
        .arg("on")
        .arg(">s3cret")
        .arg(format!("~{ns}:*"))
        .arg(format!("&{ns}:*"))
        .arg("+@all")
        .arg("-function")
        .arg("-fcall")
        .arg("-fcall_ro");
    let _: () = setuser
        .query_async(&mut raw(&server.url()).await)
        .await
        .unwrap();
    let url = format!("redis://{user}:s3cret@127.0.0.1:{}/", server.port());
    let backend = RedisBackend::connect(&url).await.unwrap();
    assert_eq!(crate::support::redis::library_of(&backend), None);
    let holder = LockClient::builder(backend)
        .namespace(&ns)
        .ttl(Duration::from_secs(30))
        .build()
        .unwrap();
    let waiter = client_at(&url, &ns, Duration::from_secs(30), true).await;
    let n = 30;
    let guards: Vec<_> = lock_all(&holder, (0..n).map(|i| format!("k{i} :q}}"))).await;
    let waited: Vec<usize> = (0..n).filter(|i| i % 2 == 0).collect();
    let keys: Vec<String> = waited.iter().map(|i| format!("k{i} :q}}")).collect();
    let waits = queue_on(&waiter, (&server.url(), &ns), &keys, 1).await;
    let tokens: Vec<u64> = guards.iter().map(|g| g.fencing_token()).collect();
    release_together(guards).await;
    for (i, w) in waited.iter().zip(waits) {
        let g = timeout(Duration::from_secs(5), w)
            .await
            .unwrap_or_else(|_| panic!("k{i}: not handed on within 5 s"))
            .unwrap()
            .unwrap();
        assert!(g.fencing_token() > tokens[*i], "k{i}: token went back");
        g.release().await.unwrap();
    }
    until_only_fences(&server.url(), &ns).await;
    holder.shutdown().await;
    waiter.shutdown().await;
}

/// One batch mixing plain holds, holds with a waiter queued, holds deleted by `redis-cli`
/// (some with a waiter) and holds overwritten with a foreign value (some with a waiter): the
/// foreign values stay, every waiter behind a deleted or released hold is granted within 5 s,
/// and nothing is left but fences and the foreign keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_plain_handed_deleted_and_overwritten_holds() {
    let url = shared_redis().url();
    let ns = test_namespace!();
    let holder = client_at(&url, &ns, Duration::from_secs(30), false).await;
    let waiter = client_at(&url, &ns, Duration::from_secs(30), true).await;
    let n = 40;
    let guards: Vec<_> = lock_all(&holder, (0..n).map(|i| format!("k{i}"))).await;
    // i % 4: 0 plain, 1 waiter, 2 deleted (odd i/4: with a waiter), 3 overwritten (likewise).
    let waited: Vec<usize> = (0..n)
        .filter(|i| i % 4 == 1 || (i % 4 >= 2 && (i / 4) % 2 == 1))
        .collect();
    let waits: Vec<_> = waited
        .iter()
        .map(|i| {
            let m = waiter.mutex(format!("k{i}"));
            tokio::spawn(async move { m.lock_timeout(Duration::from_secs(8)).await })
        })
        .collect();
    for i in &waited {
        crate::support::redis::until_queued(&url, &ns, &format!("k{i}"), 1).await;
    }
    let mut con = raw(&url).await;
    let foreign: Vec<usize> = (0..n).filter(|i| i % 4 == 3).collect();
    for i in 0..n {
        let key = format!("{ns}:{{k{i}}}");
        if i % 4 == 2 {
            del(&mut con, std::slice::from_ref(&key)).await;
        } else if i % 4 == 3 {
            let _: () = redis::cmd("SET")
                .arg(&key)
                .arg("foreign")
                .query_async(&mut con)
                .await
                .unwrap();
        }
    }
    let _ = timeout(
        Duration::from_secs(5),
        futures::future::join_all(guards.into_iter().map(|g| g.release())),
    )
    .await
    .expect("the releases did not end in 5 s");
    for i in &foreign {
        let v = get(&mut con, &format!("{ns}:{{k{i}}}")).await;
        assert_eq!(
            v.as_deref(),
            Some("foreign"),
            "k{i}: a foreign hold was touched"
        );
    }
    for (i, w) in waited.iter().zip(waits) {
        let got = timeout(Duration::from_secs(9), w).await.unwrap().unwrap();
        if i % 4 == 3 {
            assert!(got.is_err(), "k{i}: granted over a foreign hold");
        } else {
            got.unwrap_or_else(|e| panic!("k{i}: not granted: {e}"))
                .release()
                .await
                .unwrap();
        }
    }
    let foreign_keys: Vec<String> = foreign.iter().map(|i| format!("{ns}:{{k{i}}}")).collect();
    del(&mut con, &foreign_keys).await;
    until_only_fences(&url, &ns).await;
    holder.shutdown().await;
    waiter.shutdown().await;
}

/// 24 waiters of one client queue on a hot key one after another; each, once granted, records
/// its turn and releases while 8 cold holds of the same client are released with it (so the
/// hot key's handoffs go in coalesced batches): the grants come in queue order, one holder at
/// a time, with strictly increasing tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handoffs_in_coalesced_batches_keep_fifo_order() {
    let url = shared_redis().url();
    let ns = test_namespace!();
    let client = client_at(&url, &ns, Duration::from_secs(30), true).await;
    let first = client.mutex("hot").lock().await.unwrap();
    let order: Arc<StdMutex<Vec<(usize, u64)>>> = Arc::default();
    let inside = Arc::new(AtomicUsize::new(0));
    let n = 24;
    let mut waits = Vec::new();
    for w in 0..n {
        let (client, order, inside) = (client.clone(), order.clone(), inside.clone());
        waits.push(tokio::spawn(async move {
            let g = client.mutex("hot").lock().await.unwrap();
            assert_eq!(
                inside.fetch_add(1, Ordering::SeqCst),
                0,
                "two holders at once"
            );
            order.lock().unwrap().push((w, g.fencing_token()));
            let colds = lock_all(&client, (0..8).map(|c| format!("cold{w}-{c}"))).await;
            inside.fetch_sub(1, Ordering::SeqCst);
            let releases = colds.into_iter().map(|c| c.release());
            let (hot, cold) = futures::join!(g.release(), futures::future::join_all(releases));
            hot.unwrap();
            for c in cold {
                c.unwrap();
            }
        }));
        crate::support::redis::until_queued(&url, &ns, "hot", w + 1).await;
    }
    let t0 = first.fencing_token();
    first.release().await.unwrap();
    timeout(Duration::from_secs(10), futures::future::join_all(waits))
        .await
        .expect("not every waiter was granted within 10 s")
        .into_iter()
        .for_each(|r| r.unwrap());
    let order = order.lock().unwrap().clone();
    let turns: Vec<usize> = order.iter().map(|(w, _)| *w).collect();
    assert_eq!(
        turns,
        (0..n).collect::<Vec<_>>(),
        "grants out of queue order"
    );
    let mut last = t0;
    for (w, t) in order {
        assert!(t > last, "waiter {w}: token {t} after {last}");
        last = t;
    }
    until_only_fences(&url, &ns).await;
    client.shutdown().await;
}
