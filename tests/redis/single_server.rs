//! Redis' own tests against a real `redis-server` (one per test binary, a namespace per test):
//! its messages and hints, ACL users, the function library and EVALSHA, pools, TLS, restarts,
//! and read-write locks and semaphores whose holders are killed or cut off. Contenders use
//! separate `LockClient`s, with their own connections, as separate processes would. The
//! behaviour suite every backend runs is in `tests/contract/matrix.rs` (`matrix::redis::`).
#![cfg(feature = "redis")]

#[cfg(all(feature = "redis-deadpool", feature = "redis-bb8"))]
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use crate::support::contract::Overlap;
use crate::support::redis::{
    connection as raw, keys_in, libraries, library_of, queue_len, until_queued,
};
use crate::support::server::redis::{shared_redis, RedisServer};
use distlock::backend::RedisBackend;
use distlock::LockClient;
use futures::StreamExt;
use tokio::time::{sleep, timeout, Instant};

async fn client_at(url: &str, ns: &str) -> LockClient {
    let backend = RedisBackend::connect(url).await.unwrap();
    LockClient::builder(backend).namespace(ns).build().unwrap()
}

async fn client(ns: &str) -> LockClient {
    client_at(&shared_redis().url(), ns).await
}

/// A client of the shared server whose locks get `ttl`.
async fn client_ttl(ns: &str, ttl: Duration) -> LockClient {
    let backend = RedisBackend::connect(&shared_redis().url()).await.unwrap();
    LockClient::builder(backend)
        .namespace(ns)
        .ttl(ttl)
        .build()
        .unwrap()
}

/// Everything published in namespace `ns`, as the server sends it (channel, payload), until
/// nothing came for 2 s.
async fn published(url: &str, ns: &str) -> tokio::task::JoinHandle<Vec<(String, String)>> {
    let (mut sink, mut stream) = redis::Client::open(url)
        .unwrap()
        .get_async_pubsub()
        .await
        .unwrap()
        .split();
    sink.psubscribe(format!("{ns}:*")).await.unwrap();
    tokio::spawn(async move {
        let _sink = sink;
        let mut seen = Vec::new();
        while let Ok(Some(msg)) = timeout(Duration::from_secs(2), stream.next()).await {
            let payload: String = msg.get_payload().unwrap();
            seen.push((msg.get_channel_name().to_owned(), payload));
        }
        seen
    })
}

/// What a chain of `CLIENTS` handoffs publishes: a holder taken with lease `ttl`, then one
/// waiting client after another (each holds for a lease of `ttl`, handed on with provisional
/// leases of `handoff`), each releasing at once. Checks that every message published in the
/// namespace goes to the one client it names: each waiting client has its own channel for the
/// key, with one subscriber, and every message carries a token of that channel's client.
async fn published_in_a_chain(ns: &str, ttl: Duration, handoff: Duration) -> Vec<(String, String)> {
    const CLIENTS: usize = 8;
    let url = shared_redis().url();
    let seen = published(&url, ns).await;
    let chained = || crate::support::redis::client(&url, ns, ttl, handoff, true);
    let first = chained().await;
    let holder = first.mutex("k").lock().await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..CLIENTS {
        let c = chained().await;
        tasks.push(tokio::spawn(async move {
            let guard = c.mutex("k").lock().await.unwrap();
            guard.release().await.unwrap();
            c.shutdown().await;
        }));
        until_queued(&url, ns, "k", i + 1).await;
    }
    let mut conn = raw(&url).await;
    let channels: Vec<String> = redis::cmd("PUBSUB")
        .arg("CHANNELS")
        .arg(format!("{ns}:*"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        channels.len(),
        CLIENTS,
        "one channel per waiting client: {channels:?}"
    );
    let counts: Vec<(String, i64)> = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(&channels)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        counts.iter().all(|(_, n)| *n == 1),
        "a channel with more than one subscriber: {counts:?}"
    );

    holder.release().await.unwrap();
    for t in tasks {
        timeout(Duration::from_secs(10), t).await.unwrap().unwrap();
    }
    first.shutdown().await;
    let seen = seen.await.unwrap();
    for (channel, payload) in &seen {
        let client_id = channel
            .rsplit_once(":c:")
            .map(|(_, id)| id)
            .unwrap_or_else(|| panic!("not a client channel: {channel}"));
        let named = payload.split(['.', ' ']).next().unwrap_or_default();
        assert_eq!(named, client_id, "{payload} published on {channel}");
    }
    assert_eq!(
        seen.iter()
            .filter(|(_, p)| p.split(' ').count() == 4)
            .count(),
        CLIENTS,
        "a grant per waiter: {seen:?}"
    );
    seen
}

/// A grant (or any other message) goes to the one client it names. The waiters queued behind a
/// long lease, so each may re-check only late: each grant is followed by a hint (when the
/// provisional lease just handed out ends) to each of the first three waiters still queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_reaches_only_the_client_it_names() {
    let ns = test_namespace!();
    let seen = published_in_a_chain(&ns, Duration::from_secs(30), Duration::from_secs(2)).await;
    let hints: usize = (1..8).map(|served| (8 - served).min(3)).sum();
    assert_eq!(seen.len(), 8 + hints, "{seen:?}");
}

/// A holder whose lease ran out (it stopped renewing) is replaced by the first waiter, which
/// takes the lock itself when it re-checks; its release hands the lock on at once to the waiter
/// behind it, not at that waiter's own re-check (a lease later).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_taken_after_an_expired_lease_is_handed_on_at_release() {
    let ns = test_namespace!();
    let url = shared_redis().url();
    let handoff = Duration::from_secs(2);
    let stale =
        crate::support::redis::client(&url, &ns, Duration::from_millis(400), handoff, false).await;
    let c = || crate::support::redis::client(&url, &ns, Duration::from_secs(10), handoff, true);
    let (a, b) = (c().await, c().await);
    let held = stale.mutex("k").lock().await.unwrap();
    let first = tokio::spawn({
        let a = a.clone();
        async move { a.mutex("k").lock().await.unwrap() }
    });
    until_queued(&url, &ns, "k", 1).await;
    let second = tokio::spawn({
        let b = b.clone();
        async move { b.mutex("k").lock().await.unwrap() }
    });
    until_queued(&url, &ns, "k", 2).await;
    // The stale lease runs out; the first waiter takes the lock when it looks again.
    let first = timeout(Duration::from_secs(3), first)
        .await
        .unwrap()
        .unwrap();
    assert!(held.is_lost());
    sleep(Duration::from_millis(100)).await;
    let first_token = first.fencing_token();
    let released = Instant::now();
    first.release().await.unwrap();
    let second = timeout(Duration::from_secs(5), second)
        .await
        .expect("the second waiter waited for its own re-check")
        .unwrap();
    assert!(
        released.elapsed() < Duration::from_secs(1),
        "handed on {:?} after the release",
        released.elapsed()
    );
    assert!(second.fencing_token() > first_token);
    second.release().await.unwrap();
    drop(held);
    for c in [stale, a, b] {
        c.shutdown().await;
    }
}

/// Waiters told to re-check no later than a provisional lease would end need no hint when one
/// is handed out: a chain of handoffs behind short leases publishes the grants alone (one
/// message, one client woken per handoff).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_next_in_line_hint_when_every_waiter_re_checks_soon_enough() {
    let ns = test_namespace!();
    let seen = published_in_a_chain(&ns, Duration::from_secs(1), Duration::from_secs(2)).await;
    assert_eq!(seen.len(), 8, "{seen:?}");
}

/// A mutex or read-write lock write hold, as the hint tests take them.
enum Taken {
    Mutex(distlock::MutexGuard),
    Write(distlock::RwLockWriteGuard),
}

impl Taken {
    async fn of(c: &LockClient, write: bool) -> Taken {
        if write {
            Taken::Write(c.rw_lock("k").write().await.unwrap())
        } else {
            Taken::Mutex(c.mutex("k").lock().await.unwrap())
        }
    }

    async fn release(self) {
        match self {
            Taken::Mutex(g) => g.release().await.unwrap(),
            Taken::Write(g) => g.release().await.unwrap(),
        }
    }
}

/// A waiter told to re-check late (it queued behind a full lease) hears when the provisional
/// lease of the one ahead of it ends; once the last such waiter is served, the chain behind it
/// (queued behind provisional leases) goes on without hints. `write`: the same with write holds
/// of a read-write lock (its grant pass).
async fn hints_stop_once_the_waiters_told_late_are_served(ns: &str, write: bool) {
    let url = shared_redis().url();
    let seen = published(&url, ns).await;
    let (ttl, handoff) = (Duration::from_secs(30), Duration::from_secs(2));
    let c = || crate::support::redis::client(&url, ns, ttl, handoff, true);
    let (h, w1, w2) = (c().await, c().await, c().await);
    let holder = Taken::of(&h, write).await;
    let first = tokio::spawn({
        let w1 = w1.clone();
        async move { Taken::of(&w1, write).await }
    });
    until_queued(&url, ns, "k", 1).await;
    let second = tokio::spawn({
        let w2 = w2.clone();
        async move { Taken::of(&w2, write).await }
    });
    until_queued(&url, ns, "k", 2).await;
    holder.release().await;
    // w1 holds a provisional lease; w2 was told to re-check at the holder's 30 s lease.
    let first = timeout(Duration::from_secs(5), first)
        .await
        .unwrap()
        .unwrap();
    let mut rest = Vec::new();
    for i in 0..4 {
        let c = c().await;
        rest.push(tokio::spawn(async move {
            Taken::of(&c, write).await.release().await;
            c.shutdown().await;
        }));
        until_queued(&url, ns, "k", i + 2).await;
    }
    first.release().await;
    let second = timeout(Duration::from_secs(5), second)
        .await
        .unwrap()
        .unwrap();
    second.release().await;
    for t in rest {
        timeout(Duration::from_secs(10), t).await.unwrap().unwrap();
    }
    let seen = seen.await.unwrap();
    let hints: Vec<_> = seen
        .iter()
        .filter(|(_, p)| p.split(' ').count() == 3)
        .collect();
    // One hint: to w2, when w1 got the lock. None in the chain queued behind w1's short lease.
    assert_eq!(hints.len(), 1, "{seen:?}");
    assert_eq!(seen.len(), 1 + 6, "six grants and the hint: {seen:?}");
    for c in [h, w1, w2] {
        c.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn next_in_line_hints_stop_once_the_waiters_told_late_are_served() {
    hints_stop_once_the_waiters_told_late_are_served(&test_namespace!(), false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn next_in_line_hints_stop_once_the_writers_told_late_are_served() {
    hints_stop_once_the_waiters_told_late_are_served(&test_namespace!(), true).await;
}

#[tokio::test]
async fn try_lock_and_lock_timeout_leave_no_queue_entry() {
    let ns = test_namespace!();
    let url = shared_redis().url();
    let a = client(&ns).await;
    let b = client(&ns).await;
    let held = a.mutex("k").lock().await.unwrap();
    let err = b.mutex("k").try_lock().await.unwrap_err();
    assert!(err.is_would_block(), "{err:?}");
    assert_eq!(queue_len(&url, &ns, "k").await, 0);
    let err = b
        .mutex("k")
        .lock_timeout(Duration::from_millis(150))
        .await
        .unwrap_err();
    assert!(err.is_timeout(), "{err:?}");
    b.shutdown().await;
    held.release().await.unwrap();
    a.shutdown().await;
    let left = keys_in(&url, &ns).await;
    assert!(
        left.iter().all(|k| k.ends_with(":fence")),
        "keys left: {left:?}"
    );
}

#[cfg(all(feature = "redis-deadpool", feature = "redis-bb8"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadpool_and_bb8_pools_exclude_each_other() {
    let ns = test_namespace!();
    let url = shared_redis().url();
    let pool = deadpool_redis::Config::from_url(url.clone())
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        .unwrap();
    let via_deadpool = RedisBackend::builder(url.clone())
        .deadpool(pool)
        .build()
        .await
        .unwrap();
    let manager = bb8_redis::RedisConnectionManager::new(url.clone()).unwrap();
    let pool = bb8::Pool::builder().build(manager).await.unwrap();
    let via_bb8 = RedisBackend::builder(url.clone())
        .bb8(pool)
        .build()
        .await
        .unwrap();
    let clients = vec![
        LockClient::builder(via_deadpool)
            .namespace(&ns)
            .build()
            .unwrap(),
        LockClient::builder(via_bb8).namespace(&ns).build().unwrap(),
        client(&ns).await,
    ];
    let overlap = Arc::new(Overlap::default());
    let grants = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for c in clients {
        let (overlap, grants) = (overlap.clone(), grants.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..20 {
                let guard = c.mutex("pooled").lock().await.unwrap();
                overlap.enter();
                grants.fetch_add(1, Ordering::SeqCst);
                sleep(Duration::from_micros(500)).await;
                overlap.exit();
                guard.release().await.unwrap();
            }
        }));
    }
    for t in tasks {
        timeout(Duration::from_secs(60), t).await.unwrap().unwrap();
    }
    assert_eq!(grants.load(Ordering::SeqCst), 60);
    assert_eq!(overlap.violations(), 0);
}

/// Creates (or resets) ACL user `name` (password `s3cret`) on `server`, allowed every command
/// but those `denied`, on keys and channels matching `pattern`; returns its URL.
async fn acl_user(server: &RedisServer, name: &str, pattern: &str, denied: &[&str]) -> String {
    let mut setuser = redis::cmd("ACL");
    setuser
        .arg("SETUSER")
        .arg(name)
        .arg("reset")
        .arg("on")
        .arg(">s3cret")
        .arg(format!("~{pattern}"))
        .arg(format!("&{pattern}"))
        .arg("+@all");
    for command in denied {
        setuser.arg(format!("-{command}"));
    }
    let _: () = setuser
        .query_async(&mut raw(&server.url()).await)
        .await
        .unwrap();
    format!("redis://{name}:s3cret@127.0.0.1:{}/", server.port())
}

#[tokio::test]
async fn acl_users_log_in_and_stay_inside_their_namespace() {
    let ns = test_namespace!();
    let server = shared_redis();
    let user = format!("u{}", std::process::id());
    let url = acl_user(server, &user, &format!("{ns}:*"), &[]).await;
    let c = client_at(&url, &ns).await;
    let guard = c.mutex("k").lock().await.unwrap();
    assert!(c.mutex("k").try_lock().await.unwrap_err().is_would_block());
    guard.release().await.unwrap();

    // The same user cannot touch another namespace: the server refuses, the error says so.
    let elsewhere = client_at(&url, "other-ns").await;
    let err = elsewhere.mutex("k").try_lock().await.unwrap_err();
    assert!(err.is_backend(), "{err:?}");
    assert!(err.to_string().contains("permission"), "{err}");

    // A wrong password is a clear error at connect time.
    let bad = format!("redis://{user}:wrong@127.0.0.1:{}/", server.port());
    let err = RedisBackend::connect(&bad).await.unwrap_err();
    assert!(err.is_backend(), "{err:?}");
    assert!(err.to_string().contains("authentication"), "{err}");
}

/// `other` (a client in namespace `ns` of the server at `url`) cannot take `k` while `guard`
/// holds it; it queues, and gets `k` with a higher fencing token once `guard` is released.
async fn excludes_then_hands_on(
    guard: distlock::MutexGuard,
    other: LockClient,
    url: &str,
    ns: &str,
) {
    assert!(other
        .mutex("k")
        .try_lock()
        .await
        .unwrap_err()
        .is_would_block());
    let waiter =
        tokio::spawn(async move { other.mutex("k").lock().await.map(|g| g.fencing_token()) });
    until_queued(url, ns, "k", 1).await;
    let first = guard.fencing_token();
    guard.release().await.unwrap();
    let next = timeout(Duration::from_secs(5), waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(next > first);
}

/// On a server that keeps functions (Redis 7) the scripts are one library, loaded when the
/// backend connects; a server that lost it (deleted here, or restarted without persistence)
/// gets it again at the next call, and every script (acquire, release, renewal, the shared
/// kinds) still works. Its own server: nobody else loads the library in between.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_run_as_functions_and_a_lost_library_is_loaded_again() {
    let server = RedisServer::start();
    let url = server.url();
    let ns = test_namespace!();
    let backend = RedisBackend::connect(&url).await.unwrap();
    let library =
        library_of(&backend).expect("redis 7 keeps functions: scripts are called in them");
    assert!(library.starts_with("distlock_"), "{library}");
    assert_eq!(libraries(&url).await, vec![library.clone()]);
    let c = LockClient::builder(backend)
        .namespace(&ns)
        .ttl(Duration::from_millis(600))
        .build()
        .unwrap();
    let flush = || async {
        let _: () = redis::cmd("FUNCTION")
            .arg("FLUSH")
            .query_async(&mut raw(&url).await)
            .await
            .unwrap();
    };
    // Each kind: the library flushed before it is taken (so its acquire loads it again), and
    // again while it is held (so its renewals and its release do).
    macro_rules! round {
        ($what:literal, $guard:expr) => {{
            flush().await;
            let guard = $guard.unwrap();
            assert_eq!(libraries(&url).await, vec![library.clone()], $what);
            sleep(Duration::from_millis(300)).await;
            flush().await;
            // Renewed (at TTL/3, by the renewal function) well past its TTL of 600 ms.
            sleep(Duration::from_millis(1200)).await;
            assert!(!guard.is_lost(), $what);
            assert_eq!(libraries(&url).await, vec![library.clone()], $what);
            flush().await;
            guard.release().await.unwrap();
        }};
    }
    round!("mutex", c.mutex("k").lock().await);
    round!("write", c.rw_lock("k2").write().await);
    round!("permits", c.semaphore("k3", 2).acquire().await);
    crate::support::redis::until_only_fences(&url, &ns).await;
}

/// A user allowed to call functions but not to load them starts with the library another
/// client loaded. When the server loses it (restarted, flushed), that user cannot load it
/// again: its calls go by EVALSHA from then on, and its locks keep excluding, fencing and
/// renewing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_who_may_not_load_the_lost_library_goes_on_by_evalsha() {
    let server = RedisServer::start();
    let ns = test_namespace!();
    let url = acl_user(&server, "caller", "*", &["function"]).await;
    // Without the library, this user falls back at connect already.
    let early = RedisBackend::connect(&url).await.unwrap();
    assert_eq!(library_of(&early), None);
    // Loaded by a client allowed to: this user's backend calls it.
    let loader = RedisBackend::connect(&server.url()).await.unwrap();
    let library = library_of(&loader).expect("the admin loads the library");
    let backend = RedisBackend::connect(&url).await.unwrap();
    assert_eq!(library_of(&backend), Some(library));
    let a = LockClient::builder(backend)
        .namespace(&ns)
        .ttl(Duration::from_millis(600))
        .build()
        .unwrap();
    let b = client_at(&url, &ns).await;
    let first = a.mutex("k").lock().await.unwrap();
    let _: () = redis::cmd("FUNCTION")
        .arg("FLUSH")
        .query_async(&mut raw(&server.url()).await)
        .await
        .unwrap();
    // Renewed by EVALSHA well past its TTL, and still excluding.
    sleep(Duration::from_millis(1200)).await;
    assert!(!first.is_lost());
    excludes_then_hands_on(first, b, &server.url(), &ns).await;
    assert!(libraries(&server.url()).await.is_empty());
    crate::support::redis::until_only_fences(&server.url(), &ns).await;
}

/// A user the server does not let call or load functions (or a server without them) runs the
/// same scripts by EVALSHA: the backend says so, and locks exclude and fence as ever.
#[tokio::test]
async fn scripts_go_by_evalsha_where_functions_are_refused() {
    let ns = test_namespace!();
    let server = shared_redis();
    let user = format!("nofn{}", std::process::id());
    let url = acl_user(
        server,
        &user,
        &format!("{ns}:*"),
        &["function", "fcall", "fcall_ro"],
    )
    .await;
    let backend = RedisBackend::connect(&url).await.unwrap();
    assert_eq!(library_of(&backend), None);
    let a = LockClient::builder(backend).namespace(&ns).build().unwrap();
    let b = client_at(&url, &ns).await;
    let guard = a.mutex("k").lock().await.unwrap();
    excludes_then_hands_on(guard, b, &server.url(), &ns).await;
}

#[tokio::test]
async fn deleting_the_key_behind_our_back_marks_the_guard_lost() {
    let ns = test_namespace!();
    let url = shared_redis().url();
    let backend = RedisBackend::connect(&url).await.unwrap();
    let c = LockClient::builder(backend)
        .namespace(&ns)
        .ttl(Duration::from_millis(600))
        .build()
        .unwrap();
    let guard = c.mutex("k").lock().await.unwrap();
    let mut conn = raw(&url).await;
    let deleted: i64 = redis::cmd("DEL")
        .arg(format!("{ns}:{{k}}"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(deleted, 1);
    let started = Instant::now();
    timeout(Duration::from_secs(3), guard.lost())
        .await
        .expect("lost() did not resolve after the key was deleted");
    assert!(guard.is_lost());
    // Noticed at the next renewal, a third of the TTL in, not at the TTL.
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "{:?}",
        started.elapsed()
    );
    let err = guard.release().await.unwrap_err();
    assert!(err.is_lost(), "{err:?}");
}

#[tokio::test]
async fn a_holder_killed_with_sigkill_frees_the_lock_within_its_ttl() {
    crate::support::faults::killed_holder_frees_the_lock(
        &crate::support::redis::service(),
        "single_server::a_holder_killed_with_sigkill_frees_the_lock_within_its_ttl",
        &test_namespace!(),
        Duration::from_millis(300),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_resume_after_redis_restarts() {
    let ns = test_namespace!();
    let mut server = RedisServer::start();
    let url = server.url();
    let ttl = Duration::from_millis(1500);
    let make = |url: String, ns: String| async move {
        let backend = RedisBackend::connect(&url).await.unwrap();
        LockClient::builder(backend)
            .namespace(ns)
            .ttl(ttl)
            .build()
            .unwrap()
    };
    let old = make(url.clone(), ns.clone())
        .await
        .mutex("k")
        .lock()
        .await
        .unwrap();
    let overlap = Arc::new(Overlap::default());
    let fences = Arc::new(StdMutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..3 {
        let c = make(url.clone(), ns.clone()).await;
        let (overlap, fences) = (overlap.clone(), fences.clone());
        tasks.push(tokio::spawn(async move {
            let guard = c.mutex("k").lock().await.unwrap();
            overlap.enter();
            fences.lock().unwrap().push(guard.fencing_token());
            sleep(Duration::from_millis(50)).await;
            overlap.exit();
            guard.release().await.unwrap();
        }));
        until_queued(&url, &ns, "k", i + 1).await;
    }
    // Redis goes away for a moment and comes back empty (no persistence).
    let _server = tokio::task::spawn_blocking(move || {
        server.restart_after(|| std::thread::sleep(Duration::from_millis(300)));
        server
    })
    .await
    .unwrap();
    for t in tasks {
        timeout(Duration::from_secs(20), t)
            .await
            .expect("a waiter did not resume after the restart")
            .unwrap();
    }
    assert_eq!(overlap.violations(), 0, "double grant");
    // The old holder learns its lock is gone at its next renewal.
    timeout(ttl, old.lost())
        .await
        .expect("the holder from before the restart was not told it lost the lock");
    let fences = fences.lock().unwrap().clone();
    assert!(
        fences.iter().all(|f| *f > old.fencing_token()),
        "{fences:?}"
    );
}

#[tokio::test]
async fn bad_keys_and_foreign_values_are_clear_errors() {
    let ns = test_namespace!();
    let url = shared_redis().url();
    let c = client(&ns).await;
    for key in ["", "nul\0byte"] {
        assert!(c.mutex(key).lock().await.unwrap_err().is_invalid_key());
    }
    assert!(keys_in(&url, &ns).await.is_empty());

    let mut conn = raw(&url).await;
    let _: () = redis::cmd("SET")
        .arg(format!("{ns}:{{typed}}"))
        .arg("not a lock")
        .query_async(&mut conn)
        .await
        .unwrap();
    let err = c.mutex("typed").lock().await.unwrap_err();
    assert!(err.is_backend(), "{err:?}");
    assert!(err.to_string().contains("WRONGTYPE"), "{err}");
    // The foreign value is untouched.
    let v: String = redis::cmd("GET")
        .arg(format!("{ns}:{{typed}}"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(v, "not a lock");
}

#[tokio::test]
async fn an_unreachable_server_is_a_clear_error_not_a_hang() {
    let port = crate::support::free_port();
    let started = Instant::now();
    let err = RedisBackend::connect(&format!("redis://127.0.0.1:{port}/"))
        .await
        .unwrap_err();
    assert!(err.is_backend(), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(10));
    let err = RedisBackend::connect("redis://").await.unwrap_err();
    assert!(err.is_invalid_config() || err.is_backend(), "{err:?}");
}

#[cfg(feature = "redis-tls")]
#[tokio::test]
async fn rediss_urls_speak_tls_and_check_the_certificate() {
    let ns = test_namespace!();
    let tls = crate::support::server::redis::TlsRedis::start();
    let backend = RedisBackend::builder(tls.url())
        .tls_root_certificate(tls.ca.clone())
        .build()
        .await
        .unwrap();
    let a = LockClient::builder(backend).namespace(&ns).build().unwrap();
    let b = client_at(&tls.server.url(), &ns).await; // the same server, in plain text
    let guard = a.mutex("k").lock().await.unwrap();
    assert!(b.mutex("k").try_lock().await.unwrap_err().is_would_block());
    // A waiter over TLS is woken through the TLS pub/sub connection.
    let held = b.mutex("w").lock().await.unwrap();
    let waiter = tokio::spawn({
        let m = a.mutex("w");
        async move { m.lock().await }
    });
    until_queued(&tls.server.url(), &ns, "w", 1).await;
    held.release().await.unwrap();
    timeout(Duration::from_secs(5), waiter)
        .await
        .expect("a TLS waiter was not woken")
        .unwrap()
        .unwrap()
        .release()
        .await
        .unwrap();
    guard.release().await.unwrap();

    // Without our CA the server's certificate is refused: a clear error, not a hang.
    let err = RedisBackend::connect(&tls.url()).await.unwrap_err();
    assert!(err.is_backend(), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_missed_its_handoff_during_a_cut_still_gets_the_lock() {
    let ns = test_namespace!();
    let server = shared_redis();
    let proxy = crate::support::proxy::Proxy::start(server.port());
    let behind = client_at(&format!("redis://127.0.0.1:{}/", proxy.port()), &ns).await;
    let direct = client(&ns).await;
    let held = direct.mutex("k").lock().await.unwrap();
    let waiter = tokio::spawn({
        let m = behind.mutex("k");
        async move { m.lock().await }
    });
    until_queued(&server.url(), &ns, "k", 1).await;

    // The handoff is published while the waiter's connections are down: it never sees it.
    proxy.cut();
    held.release().await.unwrap();
    sleep(Duration::from_millis(500)).await;
    proxy.pass();

    let guard = timeout(Duration::from_secs(10), waiter)
        .await
        .expect("a waiter that missed its handoff never got the lock")
        .unwrap()
        .unwrap();
    assert!(direct
        .mutex("k")
        .try_lock()
        .await
        .unwrap_err()
        .is_would_block());
    guard.release().await.unwrap();
    behind.shutdown().await;
    direct.shutdown().await;
}

/// A pub/sub connection whose SUBSCRIBE is refused after a reconnect (the user lost the channel
/// permission: Redis drops its subscribers) comes back at the reconnect back-off, not in a loop:
/// it opened about a thousand connections a second. The waiter is served once the permission
/// is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_resubscribe_backs_off() {
    let ns = test_namespace!();
    // Its own server: the check counts every connection the server receives.
    let server = &RedisServer::start();
    let user = format!("sub{}", std::process::id());
    let url = acl_user(server, &user, "*", &[]).await;
    let admin = client_at(&server.url(), &ns).await;
    let waiter = client_at(&url, &ns).await;
    let held = admin.mutex("k").lock().await.unwrap();
    let wait = tokio::spawn({
        let m = waiter.mutex("k");
        async move { m.lock().await }
    });
    until_queued(&server.url(), &ns, "k", 1).await;
    let connections = || async {
        let info: String = redis::cmd("INFO")
            .arg("stats")
            .query_async(&mut raw(&server.url()).await)
            .await
            .unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix("total_connections_received:"))
            .and_then(|n| n.trim().parse::<u64>().ok())
            .unwrap()
    };
    let set = |rule: &'static str| {
        let user = user.clone();
        async move {
            let _: () = redis::cmd("ACL")
                .arg("SETUSER")
                .arg(&user)
                .arg(rule)
                .query_async(&mut raw(&server.url()).await)
                .await
                .unwrap();
        }
    };
    let before = connections().await;
    set("resetchannels").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let opened = connections().await - before;
    // A back-off of 20 ms doubling to 2 s opens under 10 here (the loop, about 2,000).
    assert!(
        opened < 20,
        "{opened} connections in 2 s while SUBSCRIBE was refused"
    );
    set("allchannels").await;
    held.release().await.unwrap();
    let granted = tokio::time::timeout(Duration::from_secs(10), wait)
        .await
        .expect("the waiter was never granted once the permission was back")
        .unwrap()
        .unwrap();
    granted.release().await.unwrap();
    admin.shutdown().await;
    waiter.shutdown().await;
}

/// A service's synchronous code (a `spawn_blocking` job) locks with the blocking form on the
/// runtime the client was built in: the lease is renewed while the job holds it, and a
/// contender elsewhere is kept out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_lock_from_a_blocking_task_is_renewed() {
    let ns = test_namespace!();
    let ttl = Duration::from_millis(600);
    let (a, b) = (client_ttl(&ns, ttl).await, client_ttl(&ns, ttl).await);
    let job = tokio::task::spawn_blocking(move || {
        let g = a.mutex("job").blocking_lock().unwrap();
        std::thread::sleep(ttl * 3);
        let lost = g.is_lost();
        drop(g);
        a.blocking_shutdown().unwrap();
        lost
    });
    sleep(ttl * 2).await;
    let err = b.mutex("job").try_lock().await.unwrap_err();
    assert!(err.is_would_block(), "{err}");
    assert!(
        !job.await.unwrap(),
        "the blocking holder's lease was not renewed"
    );
    let g = timeout(Duration::from_secs(2), b.mutex("job").lock())
        .await
        .expect("the blocking holder's release never came")
        .unwrap();
    g.release().await.unwrap();
}

/// `force_release` while the holder is paused (its connections blackholed, as a
/// stopped process looks to the server). The waiter is granted at once with a greater token;
/// once the holder resumes, its fenced write is refused and its guard reports lost at its next
/// renewal, well before its long lease would have ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_of_a_paused_holder_fences_it_out() {
    let ns = test_namespace!();
    let server = shared_redis();
    let ttl = Duration::from_secs(6);
    let proxy = crate::support::proxy::Proxy::start(server.port());
    let paused = {
        let backend = RedisBackend::connect(&format!("redis://127.0.0.1:{}/", proxy.port()))
            .await
            .unwrap();
        LockClient::builder(backend)
            .namespace(&ns)
            .ttl(ttl)
            .build()
            .unwrap()
    };
    let (waiter_client, op) = (client(&ns).await, client(&ns).await);
    let held = paused.mutex("k").lock().await.unwrap();
    let old = held.fencing_token();
    let waiter = crate::support::contract::spawn_timed_lock(waiter_client.mutex("k"));
    until_queued(&server.url(), &ns, "k", 1).await;

    proxy.blackhole();
    let unlocked = Instant::now();
    let removed = op.force_release("k").await.unwrap();
    assert_eq!(removed.removed.len(), 1, "{removed:?}");
    assert_eq!(removed.removed[0].fencing_token, Some(old));
    let (granted_at, next) = timeout(Duration::from_secs(2), waiter)
        .await
        .expect("the waiter was not granted after the unlock")
        .unwrap();
    let next = next.unwrap();
    assert!(granted_at - unlocked <= Duration::from_secs(1));
    assert!(next.fencing_token() > old);
    // The store took the new holder's write; the paused one still believes it holds.
    let mut highest = next.fencing_token();
    sleep(Duration::from_millis(500)).await;
    assert!(!held.is_lost(), "a blackholed holder cannot have heard yet");

    proxy.heal();
    let resumed = Instant::now();
    // Its fenced write after resume: refused (its token is below the highest seen).
    assert!(
        held.fencing_token() < highest,
        "the paused holder's write would pass"
    );
    highest = highest.max(held.fencing_token());
    assert_eq!(highest, next.fencing_token());
    timeout(ttl / 3 + Duration::from_secs(3), held.lost())
        .await
        .expect("the paused holder never learned it was unlocked");
    println!("paused holder told {:?} after resuming", resumed.elapsed());
    assert!(held.is_lost());
    // Its late release leaves the new grant alone.
    let _ = held.release().await;
    assert!(op.mutex("k").try_lock().await.unwrap_err().is_would_block());
    next.release().await.unwrap();
    for c in [paused, waiter_client, op] {
        c.shutdown().await;
    }
}

/// Read-write locks and semaphores on Redis: holders killed or cut off.
mod family {
    use super::*;
    use crate::support::redis::until_only_fences;

    fn queued(
        ns: &str,
        key: &str,
    ) -> impl Fn(usize) -> futures::future::BoxFuture<'static, ()> + Sync {
        let (ns, key) = (ns.to_owned(), key.to_owned());
        move |n| {
            let (ns, key) = (ns.clone(), key.clone());
            Box::pin(async move { until_queued(&shared_redis().url(), &ns, &key, n).await })
        }
    }

    async fn assert_only_fences(ns: &str) {
        until_only_fences(&shared_redis().url(), ns).await;
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
        crate::support::holder::report_and_hold(fence).await
    }

    /// The child holds `k` (as `what`), `waiter` queues behind it, the child is SIGKILLed: the
    /// waiter is granted within the child's TTL (its lease was renewed up to the kill).
    async fn killed_holder_frees_within_its_ttl<G: Send + 'static>(
        test: &str,
        what: &str,
        ns: &str,
        waiter: impl std::future::Future<Output = distlock::Result<G>> + Send + 'static,
    ) -> (G, u64) {
        let (child, child_fence) = crate::support::holder::spawn(
            test,
            CHILD_ENV,
            format!("{} {ns} {what}", shared_redis().url()),
        )
        .await;
        let waiter = tokio::spawn(waiter);
        queued(ns, "k")(1).await;
        // Past the child's first renewals, so the lease was refreshed before it died.
        sleep(CHILD_TTL).await;
        let (guard, waited) =
            crate::support::holder::kill_and_await(child, waiter, CHILD_TTL * 3).await;
        assert!(
            waited <= CHILD_TTL + Duration::from_millis(50),
            "granted {waited:?} after the kill, TTL {CHILD_TTL:?}"
        );
        (guard, child_fence)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_writer_behind_a_killed_reader_gets_in_within_its_ttl() {
        if let Ok(spec) = std::env::var(CHILD_ENV) {
            child(&spec).await;
        }
        let ns = test_namespace!();
        let c = client(&ns).await;
        let (w, child_fence) = killed_holder_frees_within_its_ttl(
            "single_server::family::a_writer_behind_a_killed_reader_gets_in_within_its_ttl",
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
    async fn permits_of_a_killed_holder_come_back() {
        if let Ok(spec) = std::env::var(CHILD_ENV) {
            child(&spec).await;
        }
        let ns = test_namespace!();
        let c = client(&ns).await;
        let (p, child_fence) = killed_holder_frees_within_its_ttl(
            "single_server::family::permits_of_a_killed_holder_come_back",
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
    async fn a_paused_reader_is_told_before_the_writer_gets_in() {
        let ns = test_namespace!();
        let proxy = crate::support::proxy::Proxy::start(shared_redis().port());
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
        let w = crate::support::contract::spawn_timed(writer.rw_lock("k").write());
        queued(&ns, "k")(1).await;
        let (w, lost, granted) = crate::support::contract::partition_then_handover(
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
}
