//! Attacks on issue 29's coalesced release (`release_many` with the `release_plain` quick path,
//! `src/backend/redis/coalesce.rs`) against a real `redis-server`: many releases of one client
//! going out as one call while other clients wait on some of the keys, with the replies delayed
//! and the connection cut mid-batch, the server restarted without its data, waiters cancelled
//! while the batch is in flight, holds renewed, extended, force-released or expired and re-taken
//! by another owner before their release, and key names with braces, colons, unicode and the
//! maximum length. Each checks: one holder at a time (tokens strictly increase), every waiter
//! served well within the TTL after its holder's release, another owner's hold never deleted,
//! and no key left without an expiry.
#![cfg(feature = "redis")]

mod support;

use std::time::Duration;

use distlock::{LockClient, MutexGuard};
use support::proxy::{Proxy, Which};
use support::redis::{client, commandstats, connection, keys_in, until_only_fences, until_queued};
use support::server::redis::{shared_redis, RedisServer};
use tokio::task::JoinHandle;
use tokio::time::{sleep, timeout, Instant};

fn via(proxy: &Proxy) -> String {
    format!("redis://127.0.0.1:{}/", proxy.port())
}

/// Key names that stress the one-string layout of a claim's names: braces (the hash tag),
/// colons, unicode, the longest key allowed.
fn key_names(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| match i % 6 {
            0 => format!("k{i}"),
            1 => format!("{{a}}:b}}{i}"),
            2 => format!("ключ ☃ {i}"),
            3 => format!("x:{i}:{{}}:c:q:w"),
            4 => {
                let tail = format!("-{i}");
                format!("{}{tail}", "L".repeat(distlock::MAX_KEY_LEN - tail.len()))
            }
            _ => format!("}}{{{i}"),
        })
        .collect()
}

/// Every key of `ns` with no expiry (PTTL -1).
async fn immortal(url: &str, ns: &str) -> Vec<String> {
    let mut con = connection(url).await;
    let mut out = Vec::new();
    for k in keys_in(url, ns).await {
        let pttl: i64 = redis::cmd("PTTL")
            .arg(&k)
            .query_async(&mut con)
            .await
            .unwrap();
        if pttl == -1 {
            out.push(k);
        }
    }
    out
}

/// The value of the lock key of `key` (its hold), if any.
async fn hold_of(url: &str, ns: &str, key: &str) -> Option<Vec<u8>> {
    let mut con = connection(url).await;
    redis::cmd("GET")
        .arg(format!("{ns}:{{{key}}}"))
        .query_async(&mut con)
        .await
        .unwrap()
}

async fn lock_all(client: &LockClient, keys: &[String]) -> Vec<MutexGuard> {
    futures::future::join_all(keys.iter().map(|k| {
        let mutex = client.mutex(k.clone());
        async move { mutex.lock().await.unwrap() }
    }))
    .await
}

/// A waiter of `client` on each of `keys`, each queued (server-side) before this returns.
async fn queue_on(
    client: &LockClient,
    url: &str,
    ns: &str,
    keys: &[String],
) -> Vec<JoinHandle<distlock::Result<MutexGuard>>> {
    let mut waits = Vec::new();
    for k in keys {
        let mutex = client.mutex(k.clone());
        waits.push(tokio::spawn(async move { mutex.lock().await }));
    }
    for k in keys {
        until_queued(url, ns, k, 1).await;
    }
    waits
}

/// Releases every guard at once (one client: they coalesce), each from its own task; the
/// results in order.
fn release_all(guards: Vec<MutexGuard>) -> Vec<JoinHandle<distlock::Result<()>>> {
    guards
        .into_iter()
        .map(|g| tokio::spawn(g.release()))
        .collect()
}

/// Waits for each waiter up to `within` from now: the guard, or why not.
async fn served(
    keys: &[String],
    waits: Vec<JoinHandle<distlock::Result<MutexGuard>>>,
    within: Duration,
) -> (Vec<(String, MutexGuard)>, Vec<String>) {
    let deadline = Instant::now() + within;
    let (mut ok, mut bad) = (Vec::new(), Vec::new());
    for (k, wait) in keys.iter().zip(waits) {
        match tokio::time::timeout_at(deadline, wait).await {
            Ok(Ok(Ok(g))) => ok.push((k.clone(), g)),
            Ok(Ok(Err(e))) => bad.push(format!("{}: {e}", short(k))),
            Ok(Err(e)) => bad.push(format!("{}: panicked {e}", short(k))),
            Err(_) => bad.push(format!("{}: not served within {within:?}", short(k))),
        }
    }
    (ok, bad)
}

fn short(k: &str) -> String {
    k.chars()
        .rev()
        .take(24)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect()
}

/// Releases coalesced into batches while the holder's replies are delayed, and its connection
/// is cut with the batch in flight (a release in doubt, sent again): every waiter queued behind
/// one of those holds is served well within the TTL, with a larger token, and nothing is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_in_doubt_mid_batch_still_hand_every_hold_on() {
    let ns = test_namespace!();
    let server = RedisServer::start();
    let url = server.url();
    let proxy = Proxy::start(server.port());
    let ttl = Duration::from_secs(20);
    let holder = client(&via(&proxy), &ns, ttl, Duration::from_millis(300), true).await;
    let waiter = client(&url, &ns, ttl, Duration::from_millis(300), true).await;
    let keys = key_names(48);
    let guards = lock_all(&holder, &keys).await;
    let tokens: Vec<u64> = guards.iter().map(|g| g.fencing_token()).collect();
    let waited: Vec<String> = keys.iter().step_by(2).cloned().collect();
    let waits = queue_on(&waiter, &url, &ns, &waited).await;

    let mut stats = connection(&url).await;
    let fcalls = |stats: Vec<(String, u64)>| {
        stats
            .into_iter()
            .find(|(n, _)| n == "fcall")
            .map_or(0, |(_, c)| c)
    };
    let (fcalls_before, connections_before) =
        (fcalls(commandstats(&mut stats).await), proxy.connections());
    proxy.delay_replies(Which::All, Duration::from_millis(400));
    let released = Instant::now();
    let releases = release_all(guards);
    sleep(Duration::from_millis(150)).await;
    proxy.cut();
    sleep(Duration::from_millis(50)).await;
    proxy.heal();
    let mut failed = Vec::new();
    for (k, r) in keys.iter().zip(releases) {
        if let Err(e) = r.await.unwrap() {
            failed.push(format!("{}: {e}", short(k)));
        }
    }
    println!(
        "releases done after {:?}; {} failed: {failed:?}; {} function calls for {} releases, {} new connections",
        released.elapsed(),
        failed.len(),
        fcalls(commandstats(&mut stats).await) - fcalls_before,
        keys.len(),
        proxy.connections() - connections_before,
    );

    let (ok, bad) = served(&waited, waits, Duration::from_secs(8)).await;
    println!(
        "waiters served {:?} after the releases; {} new connections, {} function calls in all",
        released.elapsed(),
        proxy.connections() - connections_before,
        fcalls(commandstats(&mut stats).await) - fcalls_before,
    );
    let mut back = Vec::new();
    for (k, g) in &ok {
        let i = keys.iter().position(|x| x == k).unwrap();
        if g.fencing_token() <= tokens[i] {
            back.push(format!(
                "{}: {} after {}",
                short(k),
                g.fencing_token(),
                tokens[i]
            ));
        }
    }
    for (_, g) in ok {
        g.release().await.unwrap();
    }
    holder.shutdown().await;
    waiter.shutdown().await;
    assert!(bad.is_empty(), "waiters not served: {bad:#?}");
    assert!(back.is_empty(), "tokens went back: {back:#?}");
    until_only_fences(&url, &ns).await;
    assert_eq!(immortal(&url, &ns).await, Vec::<String>::new());
}

/// A hold that ran out and was taken by another owner with the plain commands (its value the
/// other owner's bare token, just like the first holder's was): the first holder's coalesced
/// release must not delete it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coalesced_release_never_deletes_a_hold_taken_after_expiry() {
    let ns = test_namespace!();
    let url = shared_redis().url();
    let late = client(
        &url,
        &ns,
        Duration::from_millis(400),
        Duration::from_millis(300),
        false,
    )
    .await;
    let taker = client(
        &url,
        &ns,
        Duration::from_secs(20),
        Duration::from_millis(300),
        true,
    )
    .await;
    let third = client(
        &url,
        &ns,
        Duration::from_secs(20),
        Duration::from_millis(300),
        true,
    )
    .await;
    let keys = key_names(40);
    let stale = lock_all(&late, &keys).await;
    let stale_tokens: Vec<u64> = stale.iter().map(|g| g.fencing_token()).collect();
    sleep(Duration::from_millis(800)).await;
    let taken = lock_all(&taker, &keys).await;
    let mut before = Vec::new();
    for k in &keys {
        before.push(hold_of(&url, &ns, k).await);
    }
    let mut failed = 0;
    for r in release_all(stale) {
        failed += usize::from(r.await.unwrap().is_err());
    }
    println!("{failed} stale releases reported an error");
    let mut bad = Vec::new();
    for ((k, g), (was, stale)) in keys
        .iter()
        .zip(&taken)
        .zip(before.iter().zip(&stale_tokens))
    {
        let now = hold_of(&url, &ns, k).await;
        if now.is_none() || now.as_ref() != was.as_ref() {
            bad.push(format!("{}: hold {was:?} became {now:?}", short(k)));
        }
        if g.is_lost() {
            bad.push(format!("{}: the new owner's guard is lost", short(k)));
        }
        if g.fencing_token() <= *stale {
            bad.push(format!(
                "{}: token {} after {stale}",
                short(k),
                g.fencing_token()
            ));
        }
        match third.mutex(k.clone()).try_lock().await {
            Err(e) if e.is_would_block() => {}
            Ok(_) => bad.push(format!("{}: a third client took it too", short(k))),
            Err(e) => bad.push(format!("{}: {e}", short(k))),
        }
    }
    for g in taken {
        g.release().await.unwrap();
    }
    late.shutdown().await;
    taker.shutdown().await;
    third.shutdown().await;
    assert!(bad.is_empty(), "{bad:#?}");
    until_only_fences(&url, &ns).await;
    assert_eq!(immortal(&url, &ns).await, Vec::<String>::new());
}

/// Holds renewed (short TTL, auto-renewal), extended, or force-released and handed to a waiter
/// before the holder's coalesced release: the renewed and extended holds are deleted or handed
/// on at once; a hold the operator gave to a waiter stays that waiter's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewed_extended_and_force_released_holds_release_together() {
    let ns = test_namespace!();
    let url = shared_redis().url();
    let ttl = Duration::from_secs(1);
    let holder = client(&url, &ns, ttl, Duration::from_millis(300), true).await;
    let waiter = client(
        &url,
        &ns,
        Duration::from_secs(20),
        Duration::from_millis(300),
        true,
    )
    .await;
    let admin = client(
        &url,
        &ns,
        Duration::from_secs(20),
        Duration::from_millis(300),
        true,
    )
    .await;
    let keys = key_names(36);
    let guards = lock_all(&holder, &keys).await;
    let tokens: Vec<u64> = guards.iter().map(|g| g.fencing_token()).collect();
    // Several renewals of the 1 s lease.
    sleep(Duration::from_millis(1600)).await;
    for (i, g) in guards.iter().enumerate() {
        if i % 3 == 1 {
            g.extend(Duration::from_secs(2)).await.unwrap();
        }
    }
    let waited: Vec<String> = keys.iter().step_by(2).cloned().collect();
    let waits = queue_on(&waiter, &url, &ns, &waited).await;
    let forced: Vec<usize> = (0..keys.len()).filter(|i| i % 3 == 2).collect();
    for &i in &forced {
        admin.force_release(&keys[i]).await.unwrap();
    }
    // The waiters on the force-released keys are served first.
    let mut waits = waits;
    let mut early = Vec::new();
    let mut bad = Vec::new();
    for (j, k) in waited.clone().iter().enumerate().rev() {
        let i = keys.iter().position(|x| x == k).unwrap();
        if forced.contains(&i) {
            let wait = waits.remove(j);
            match timeout(Duration::from_secs(3), wait).await {
                Ok(Ok(Ok(g))) => early.push((i, g)),
                other => bad.push(format!(
                    "{}: forced, waiter {:?}",
                    short(k),
                    other.map(|r| r.map(|r| r.map(|_| ())))
                )),
            }
        }
    }
    let late_waited: Vec<String> = waited
        .iter()
        .filter(|k| !forced.contains(&keys.iter().position(|x| x == *k).unwrap()))
        .cloned()
        .collect();
    let early_holds: Vec<_> = {
        let mut v = Vec::new();
        for (i, _) in &early {
            v.push(hold_of(&url, &ns, &keys[*i]).await);
        }
        v
    };
    let released = Instant::now();
    let mut failed = Vec::new();
    for (k, r) in keys.iter().zip(release_all(guards)) {
        if let Err(e) = r.await.unwrap() {
            failed.push(format!("{}: {e}", short(k)));
        }
    }
    println!("{} releases failed: {failed:?}", failed.len());
    for ((i, g), was) in early.iter().zip(&early_holds) {
        let now = hold_of(&url, &ns, &keys[*i]).await;
        if g.is_lost() || now.is_none() || now.as_ref() != was.as_ref() {
            bad.push(format!(
                "{}: the forced key's new hold {was:?} became {now:?}",
                short(&keys[*i])
            ));
        }
        if g.fencing_token() <= tokens[*i] {
            bad.push(format!("{}: token went back", short(&keys[*i])));
        }
    }
    let (ok, late_bad) = served(&late_waited, waits, Duration::from_secs(3)).await;
    println!(
        "{} waiters served {:?} after the releases",
        ok.len(),
        released.elapsed()
    );
    bad.extend(late_bad);
    for (k, g) in &ok {
        let i = keys.iter().position(|x| x == k).unwrap();
        if g.fencing_token() <= tokens[i] {
            bad.push(format!("{}: token went back", short(k)));
        }
    }
    for (_, g) in ok {
        g.release().await.unwrap();
    }
    for (_, g) in early {
        g.release().await.unwrap();
    }
    holder.shutdown().await;
    waiter.shutdown().await;
    admin.shutdown().await;
    assert!(bad.is_empty(), "{bad:#?}");
    until_only_fences(&url, &ns).await;
    assert_eq!(immortal(&url, &ns).await, Vec::<String>::new());
}

/// Waiters cancelled while the coalesced release that hands them the lock is in flight: the
/// others are served, the keys of the cancelled ones are free again within the handoff TTL
/// (a fresh client takes each), and nothing is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_cancelled_mid_batch_leave_their_keys_free() {
    let ns = test_namespace!();
    let url = shared_redis().url();
    let proxy = Proxy::start(shared_redis().port());
    let ttl = Duration::from_secs(20);
    let holder = client(&via(&proxy), &ns, ttl, Duration::from_millis(300), true).await;
    let waiter = client(&url, &ns, ttl, Duration::from_millis(300), true).await;
    let fresh = client(&url, &ns, ttl, Duration::from_millis(300), true).await;
    let keys = key_names(40);
    let guards = lock_all(&holder, &keys).await;
    let waits = queue_on(&waiter, &url, &ns, &keys).await;
    proxy.delay_replies(Which::Commands, Duration::from_millis(300));
    let releases = release_all(guards);
    sleep(Duration::from_millis(100)).await;
    let (mut kept_keys, mut kept) = (Vec::new(), Vec::new());
    let mut cancelled = Vec::new();
    for (i, (k, w)) in keys.iter().zip(waits).enumerate() {
        if i % 2 == 1 {
            w.abort();
            cancelled.push(k.clone());
        } else {
            kept_keys.push(k.clone());
            kept.push(w);
        }
    }
    for r in releases {
        r.await.unwrap().unwrap();
    }
    proxy.pass();
    let (ok, mut bad) = served(&kept_keys, kept, Duration::from_secs(5)).await;
    let taken = Instant::now();
    for k in &cancelled {
        match timeout(Duration::from_secs(3), fresh.mutex(k.clone()).lock()).await {
            Ok(Ok(g)) => g.release().await.unwrap(),
            Ok(Err(e)) => bad.push(format!("{}: {e}", short(k))),
            Err(_) => bad.push(format!(
                "{}: cancelled waiter's key not free in 3 s",
                short(k)
            )),
        }
    }
    println!("cancelled waiters' keys taken in {:?}", taken.elapsed());
    for (_, g) in ok {
        g.release().await.unwrap();
    }
    holder.shutdown().await;
    waiter.shutdown().await;
    fresh.shutdown().await;
    assert!(bad.is_empty(), "{bad:#?}");
    until_only_fences(&url, &ns).await;
    assert_eq!(immortal(&url, &ns).await, Vec::<String>::new());
}

/// The server restarts without its data while a coalesced release is in flight: every waiter
/// is served (or told) in bounded time, tokens still increase, and nothing is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restart_mid_batch_leaves_no_waiter_stuck() {
    let ns = test_namespace!();
    let mut server = RedisServer::start();
    let url = server.url();
    let proxy = Proxy::start(server.port());
    let ttl = Duration::from_secs(20);
    let holder = client(&via(&proxy), &ns, ttl, Duration::from_millis(300), true).await;
    let waiter = client(&url, &ns, ttl, Duration::from_millis(300), true).await;
    let keys = key_names(30);
    let guards = lock_all(&holder, &keys).await;
    let tokens: Vec<u64> = guards.iter().map(|g| g.fencing_token()).collect();
    let waited: Vec<String> = keys.iter().step_by(2).cloned().collect();
    let waits = queue_on(&waiter, &url, &ns, &waited).await;
    // The releases reach the server late: it restarts (without its data) under them.
    proxy.delay_requests_containing(Which::Commands, b"release", Duration::from_millis(300));
    let releases = release_all(guards);
    sleep(Duration::from_millis(100)).await;
    server.restart_after(|| std::thread::sleep(Duration::from_millis(100)));
    proxy.pass();
    let restarted = Instant::now();
    let mut failed = 0;
    for r in releases {
        failed += usize::from(r.await.unwrap().is_err());
    }
    println!("{failed} releases failed across the restart");
    let (ok, bad) = served(&waited, waits, Duration::from_secs(10)).await;
    println!(
        "{} waiters served {:?} after the restart",
        ok.len(),
        restarted.elapsed()
    );
    let mut back = Vec::new();
    for (k, g) in &ok {
        let i = keys.iter().position(|x| x == k).unwrap();
        if g.fencing_token() <= tokens[i] {
            back.push(format!(
                "{}: {} after {}",
                short(k),
                g.fencing_token(),
                tokens[i]
            ));
        }
    }
    for (_, g) in ok {
        let _ = g.release().await;
    }
    holder.shutdown().await;
    waiter.shutdown().await;
    assert!(bad.is_empty(), "waiters stuck: {bad:#?}");
    assert!(back.is_empty(), "tokens went back: {back:#?}");
    until_only_fences(&url, &ns).await;
    assert_eq!(immortal(&url, &ns).await, Vec::<String>::new());
}

/// Waiters whose host died (their connections silent, never back) at the head of the queues
/// the coalesced release hands on: each key goes on to the live waiter behind within about
/// the handoff lease, not the TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_handed_to_dead_waiters_in_one_batch_move_on_within_the_handoff_lease() {
    let ns = test_namespace!();
    let url = shared_redis().url();
    let dead_proxy = Proxy::start(shared_redis().port());
    let ttl = Duration::from_secs(20);
    let holder = client(&url, &ns, ttl, Duration::from_millis(300), true).await;
    let dead = client(
        &via(&dead_proxy),
        &ns,
        ttl,
        Duration::from_millis(300),
        true,
    )
    .await;
    let live = client(&url, &ns, ttl, Duration::from_millis(300), true).await;
    let keys = key_names(30);
    let guards = lock_all(&holder, &keys).await;
    let tokens: Vec<u64> = guards.iter().map(|g| g.fencing_token()).collect();
    let dead_waits = queue_on(&dead, &url, &ns, &keys).await;
    let mut live_waits = Vec::new();
    for k in &keys {
        let mutex = live.mutex(k.clone());
        live_waits.push(tokio::spawn(async move { mutex.lock().await }));
    }
    for k in &keys {
        until_queued(&url, &ns, k, 2).await;
    }
    // The dead waiters' host is gone: nothing of theirs reaches the server again.
    dead_proxy.blackhole();
    let released = Instant::now();
    for r in release_all(guards) {
        r.await.unwrap().unwrap();
    }
    let (ok, bad) = served(&keys, live_waits, Duration::from_secs(3)).await;
    println!(
        "{} live waiters served {:?} after the releases",
        ok.len(),
        released.elapsed()
    );
    let mut back = Vec::new();
    for (k, g) in &ok {
        let i = keys.iter().position(|x| x == k).unwrap();
        if g.fencing_token() <= tokens[i] {
            back.push(format!(
                "{}: {} after {}",
                short(k),
                g.fencing_token(),
                tokens[i]
            ));
        }
    }
    for (_, g) in ok {
        g.release().await.unwrap();
    }
    for w in dead_waits {
        w.abort();
    }
    holder.shutdown().await;
    live.shutdown().await;
    drop(dead);
    assert!(bad.is_empty(), "live waiters not served: {bad:#?}");
    assert!(back.is_empty(), "tokens went back: {back:#?}");
    // The dead client's queue entries and channels expire on their own.
    dead_proxy.heal();
    let deadline = Instant::now() + Duration::from_secs(25);
    while !support::redis::non_fence_keys(&url, &ns).await.is_empty() {
        assert!(
            Instant::now() < deadline,
            "keys left: {:?}",
            keys_in(&url, &ns).await
        );
        sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(immortal(&url, &ns).await, Vec::<String>::new());
}

/// One client holds each key and has more claims waiting on it; the holder releases while the
/// first of its own waiters is cancelled, all at once (so one key can appear more than once in
/// a coalesced call): the last waiter gets every key, and nothing is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_key_released_and_cancelled_twice_in_one_batch_goes_to_the_last_waiter() {
    let ns = test_namespace!();
    let url = shared_redis().url();
    let ttl = Duration::from_secs(20);
    let one = client(&url, &ns, ttl, Duration::from_millis(300), true).await;
    let keys = key_names(30);
    let guards = lock_all(&one, &keys).await;
    let tokens: Vec<u64> = guards.iter().map(|g| g.fencing_token()).collect();
    let first = queue_on(&one, &url, &ns, &keys).await;
    let mut last = Vec::new();
    for k in &keys {
        let mutex = one.mutex(k.clone());
        last.push(tokio::spawn(async move { mutex.lock().await }));
    }
    for k in &keys {
        until_queued(&url, &ns, k, 2).await;
    }
    let released = Instant::now();
    let releases = release_all(guards);
    for w in first {
        w.abort();
    }
    for r in releases {
        r.await.unwrap().unwrap();
    }
    let (ok, bad) = served(&keys, last, Duration::from_secs(3)).await;
    println!(
        "{} last waiters served {:?} after the releases",
        ok.len(),
        released.elapsed()
    );
    let mut back = Vec::new();
    for (k, g) in &ok {
        let i = keys.iter().position(|x| x == k).unwrap();
        if g.fencing_token() <= tokens[i] {
            back.push(format!(
                "{}: {} after {}",
                short(k),
                g.fencing_token(),
                tokens[i]
            ));
        }
    }
    for (_, g) in ok {
        g.release().await.unwrap();
    }
    one.shutdown().await;
    assert!(bad.is_empty(), "last waiters not served: {bad:#?}");
    assert!(back.is_empty(), "tokens went back: {back:#?}");
    until_only_fences(&url, &ns).await;
    assert_eq!(immortal(&url, &ns).await, Vec::<String>::new());
}

/// The fault proxy's `Which::Commands` reaches a Redis client's command connection: the delay
/// the attacks above put on a holder's replies is really there (the library's source, sent by
/// `FUNCTION LOAD` on that connection, says "subscribed" in a comment, which the proxy must
/// not take for a `SUBSCRIBE`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_delays_a_clients_command_replies() {
    let ns = test_namespace!();
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let holder = client(
        &via(&proxy),
        &ns,
        Duration::from_secs(20),
        Duration::from_millis(300),
        true,
    )
    .await;
    // One lock and release first: the connection is open and the library loaded.
    holder
        .mutex("warm")
        .lock()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    proxy.delay_replies(Which::Commands, Duration::from_millis(500));
    let started = Instant::now();
    let guard = holder.mutex("k").lock().await.unwrap();
    let took = started.elapsed();
    proxy.pass();
    guard.release().await.unwrap();
    holder.shutdown().await;
    assert!(
        took >= Duration::from_millis(500),
        "a lock took {took:?} with its replies delayed 500 ms"
    );
}

/// The same as `a_coalesced_release_never_deletes_a_hold_taken_after_expiry`, with the hold
/// re-taken by another claim of the SAME client (the owner tokens share the client id and
/// differ in the claim's part only).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coalesced_release_never_deletes_a_hold_its_own_client_took_after_expiry() {
    let ns = test_namespace!();
    let url = shared_redis().url();
    let one = client(
        &url,
        &ns,
        Duration::from_secs(20),
        Duration::from_millis(300),
        false,
    )
    .await;
    let keys = key_names(30);
    let stale = futures::future::join_all(keys.iter().map(|k| {
        let mutex = one.mutex(k.clone()).with_ttl(Duration::from_millis(400));
        async move { mutex.lock().await.unwrap() }
    }))
    .await;
    sleep(Duration::from_millis(800)).await;
    let taken = lock_all(&one, &keys).await;
    let mut before = Vec::new();
    for k in &keys {
        before.push(hold_of(&url, &ns, k).await);
    }
    for r in release_all(stale) {
        let _ = r.await.unwrap();
    }
    let mut bad = Vec::new();
    for ((k, g), was) in keys.iter().zip(&taken).zip(&before) {
        let now = hold_of(&url, &ns, k).await;
        if now.is_none() || now.as_ref() != was.as_ref() {
            bad.push(format!("{}: hold {was:?} became {now:?}", short(k)));
        }
        if g.is_lost() {
            bad.push(format!("{}: the new claim's guard is lost", short(k)));
        }
    }
    for g in taken {
        g.release().await.unwrap();
    }
    one.shutdown().await;
    assert!(bad.is_empty(), "{bad:#?}");
    until_only_fences(&url, &ns).await;
    assert_eq!(immortal(&url, &ns).await, Vec::<String>::new());
}

/// More releases than one coalesced call carries (128), of keys with braces, colons, unicode
/// and 512 bytes, a third of them with a waiter of another client: every waiter is served at
/// once with a larger token, the rest are deleted, nothing is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_releases_than_a_batch_carries_hand_every_hold_on() {
    let ns = test_namespace!();
    let url = shared_redis().url();
    let ttl = Duration::from_secs(20);
    let holder = client(&url, &ns, ttl, Duration::from_millis(300), true).await;
    let waiter = client(&url, &ns, ttl, Duration::from_millis(300), true).await;
    let keys = key_names(360);
    let guards = lock_all(&holder, &keys).await;
    let tokens: Vec<u64> = guards.iter().map(|g| g.fencing_token()).collect();
    let waited: Vec<String> = keys.iter().step_by(3).cloned().collect();
    let waits = queue_on(&waiter, &url, &ns, &waited).await;
    let released = Instant::now();
    for r in release_all(guards) {
        r.await.unwrap().unwrap();
    }
    let (ok, bad) = served(&waited, waits, Duration::from_secs(3)).await;
    println!(
        "{} waiters served {:?} after the releases",
        ok.len(),
        released.elapsed()
    );
    let mut back = Vec::new();
    for (k, g) in &ok {
        let i = keys.iter().position(|x| x == k).unwrap();
        if g.fencing_token() <= tokens[i] {
            back.push(format!(
                "{}: {} after {}",
                short(k),
                g.fencing_token(),
                tokens[i]
            ));
        }
    }
    for (_, g) in ok {
        g.release().await.unwrap();
    }
    holder.shutdown().await;
    waiter.shutdown().await;
    assert!(bad.is_empty(), "waiters not served: {bad:#?}");
    assert!(back.is_empty(), "tokens went back: {back:#?}");
    until_only_fences(&url, &ns).await;
    assert_eq!(immortal(&url, &ns).await, Vec::<String>::new());
}

/// Through the sentinels (where the plain-command acquire is off and tokens are lifted above
/// the clocks): releases coalesced into one call, a waiter of another client on every other
/// key, each served at once with a larger token, and nothing left on the primary.
#[cfg(feature = "redis-sentinel")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_sentinel_coalesced_releases_hand_every_hold_on() {
    let ns = test_namespace!();
    let setup = support::server::sentinel::SentinelSetup::start();
    let primary = setup.primary.url();
    let ttl = Duration::from_secs(20);
    let holder = support::failover::client_for(&setup.url(), &ns, ttl).await;
    let waiter = support::failover::client_for(&setup.url(), &ns, ttl).await;
    let keys = key_names(60);
    let guards = lock_all(&holder, &keys).await;
    let tokens: Vec<u64> = guards.iter().map(|g| g.fencing_token()).collect();
    let waited: Vec<String> = keys.iter().step_by(2).cloned().collect();
    let waits = queue_on(&waiter, &primary, &ns, &waited).await;
    let released = Instant::now();
    for r in release_all(guards) {
        r.await.unwrap().unwrap();
    }
    let (ok, bad) = served(&waited, waits, Duration::from_secs(3)).await;
    println!(
        "{} waiters served {:?} after the releases",
        ok.len(),
        released.elapsed()
    );
    let mut back = Vec::new();
    for (k, g) in &ok {
        let i = keys.iter().position(|x| x == k).unwrap();
        if g.fencing_token() <= tokens[i] {
            back.push(format!(
                "{}: {} after {}",
                short(k),
                g.fencing_token(),
                tokens[i]
            ));
        }
    }
    for (_, g) in ok {
        g.release().await.unwrap();
    }
    holder.shutdown().await;
    waiter.shutdown().await;
    assert!(bad.is_empty(), "waiters not served: {bad:#?}");
    assert!(back.is_empty(), "tokens went back: {back:#?}");
    until_only_fences(&primary, &ns).await;
    assert_eq!(immortal(&primary, &ns).await, Vec::<String>::new());
}

/// One client leads elections and holds mutexes, with another client's candidates and waiters
/// queued behind: it resigns every lead and releases every mutex at once (the mutexes'
/// releases coalesce; a lead's release goes alone). Each election goes to the other
/// candidate, each mutex to its waiter, at once, with larger terms and tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leads_resigned_with_mutexes_released_all_at_once_move_on() {
    let ns = test_namespace!();
    let url = shared_redis().url();
    let ttl = Duration::from_secs(20);
    let one = client(&url, &ns, ttl, Duration::from_millis(300), true).await;
    let two = client(&url, &ns, ttl, Duration::from_millis(300), true).await;
    let elections: Vec<String> = (0..6).map(|i| format!("e{{{i}}}:☃")).collect();
    let keys = key_names(30);
    let mut leads = Vec::new();
    for e in &elections {
        leads.push(one.election(e.clone()).campaign(b"one").await.unwrap());
    }
    let terms: Vec<u64> = leads.iter().map(|l| l.term()).collect();
    let guards = lock_all(&one, &keys).await;
    let tokens: Vec<u64> = guards.iter().map(|g| g.fencing_token()).collect();
    let mut campaigns = Vec::new();
    for e in &elections {
        let election = two.election(e.clone());
        campaigns.push(tokio::spawn(async move { election.campaign(b"two").await }));
    }
    for e in &elections {
        until_queued(&url, &ns, e, 1).await;
    }
    let waited: Vec<String> = keys.iter().step_by(2).cloned().collect();
    let waits = queue_on(&two, &url, &ns, &waited).await;
    let released = Instant::now();
    let resigns: Vec<_> = leads
        .into_iter()
        .map(|l| tokio::spawn(l.resign()))
        .collect();
    let releases = release_all(guards);
    for r in resigns {
        r.await.unwrap().unwrap();
    }
    for r in releases {
        r.await.unwrap().unwrap();
    }
    let mut bad = Vec::new();
    let mut won = Vec::new();
    for ((e, c), term) in elections.iter().zip(campaigns).zip(&terms) {
        match timeout(Duration::from_secs(3), c).await {
            Ok(Ok(Ok(l))) => {
                if l.term() <= *term {
                    bad.push(format!("{e}: term {} after {term}", l.term()));
                }
                won.push(l);
            }
            other => bad.push(format!(
                "{e}: {:?}",
                other.map(|r| r.map(|r| r.map(|_| ())))
            )),
        }
    }
    let (ok, late) = served(&waited, waits, Duration::from_secs(3)).await;
    println!(
        "{} leads and {} mutexes moved on {:?} after the releases",
        won.len(),
        ok.len(),
        released.elapsed()
    );
    bad.extend(late);
    for (k, g) in &ok {
        let i = keys.iter().position(|x| x == k).unwrap();
        if g.fencing_token() <= tokens[i] {
            bad.push(format!("{}: token went back", short(k)));
        }
    }
    for (_, g) in ok {
        g.release().await.unwrap();
    }
    for l in won {
        l.resign().await.unwrap();
    }
    one.shutdown().await;
    two.shutdown().await;
    assert!(bad.is_empty(), "{bad:#?}");
    until_only_fences(&url, &ns).await;
    assert_eq!(immortal(&url, &ns).await, Vec::<String>::new());
}

/// A coalesced release whose reply is lost (it ran: the waiters were served, and another
/// owner has since taken every key with the plain commands) is sent again once the holder's
/// connection is cut: the resent release must leave the new owner's holds alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_sent_again_after_its_keys_changed_hands_deletes_nothing() {
    let ns = test_namespace!();
    let url = shared_redis().url();
    let proxy = Proxy::start(shared_redis().port());
    let ttl = Duration::from_secs(20);
    let holder = client(&via(&proxy), &ns, ttl, Duration::from_millis(300), true).await;
    let waiter = client(&url, &ns, ttl, Duration::from_millis(300), true).await;
    let taker = client(&url, &ns, ttl, Duration::from_millis(300), true).await;
    let keys = key_names(40);
    let guards = lock_all(&holder, &keys).await;
    let waited: Vec<String> = keys.iter().step_by(2).cloned().collect();
    let waits = queue_on(&waiter, &url, &ns, &waited).await;
    // The first release goes alone, its reply late: the others queue behind it in the lane
    // and go as one call when it is answered, whose reply is lost.
    proxy.delay_replies(Which::Commands, Duration::from_millis(300));
    let releases = release_all(guards);
    sleep(Duration::from_millis(100)).await;
    proxy.swallow_replies(Which::Commands);
    // The releases ran: each waiter is served; it lets go, and the taker takes every key.
    let (ok, mut bad) = served(&waited, waits, Duration::from_secs(3)).await;
    for (_, g) in ok {
        g.release().await.unwrap();
    }
    let taken = lock_all(&taker, &keys).await;
    let mut before = Vec::new();
    for k in &keys {
        before.push(hold_of(&url, &ns, k).await);
    }
    // The holder's connection goes: its releases, in doubt, are sent again.
    let connections = proxy.connections();
    proxy.cut();
    sleep(Duration::from_millis(50)).await;
    proxy.pass();
    let mut failed = 0;
    for r in releases {
        failed += usize::from(r.await.unwrap().is_err());
    }
    println!(
        "{failed} releases failed; {} new holder connections",
        proxy.connections() - connections
    );
    for ((k, g), was) in keys.iter().zip(&taken).zip(&before) {
        let now = hold_of(&url, &ns, k).await;
        if now.is_none() || now.as_ref() != was.as_ref() || g.is_lost() {
            bad.push(format!("{}: hold {was:?} became {now:?}", short(k)));
        }
    }
    for g in taken {
        g.release().await.unwrap();
    }
    holder.shutdown().await;
    waiter.shutdown().await;
    taker.shutdown().await;
    assert!(bad.is_empty(), "{bad:#?}");
    until_only_fences(&url, &ns).await;
    assert_eq!(immortal(&url, &ns).await, Vec::<String>::new());
}

/// The first of many concurrent releases goes alone and its reply is lost (the request ran;
/// the connection stays open): the releases queued behind it in the lane are not sent until
/// that call's every attempt has timed out (3 x 5 s), so their waiters are served only then,
/// where each release sent at once would have run at once. Asserted: served within the TTL
/// (30 s); printed: when each waiter was served (on main, one at about 1 ms, 19 at 15.0 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_queued_behind_a_lost_reply_wait_for_its_timeout() {
    let ns = test_namespace!();
    let url = shared_redis().url();
    let proxy = Proxy::start(shared_redis().port());
    let ttl = Duration::from_secs(30);
    let holder = client(&via(&proxy), &ns, ttl, Duration::from_millis(300), true).await;
    let waiter = client(&url, &ns, ttl, Duration::from_millis(300), true).await;
    let keys = key_names(20);
    let guards = lock_all(&holder, &keys).await;
    let waits = queue_on(&waiter, &url, &ns, &keys).await;
    proxy.swallow_replies(Which::Commands);
    let released = Instant::now();
    let releases = release_all(guards);
    let mut times = Vec::new();
    let mut bad = Vec::new();
    for (k, w) in keys.iter().zip(waits) {
        match tokio::time::timeout_at(released + ttl, w).await {
            Ok(Ok(Ok(g))) => {
                times.push(released.elapsed());
                drop(g);
            }
            other => bad.push(format!(
                "{}: {:?}",
                short(k),
                other.map(|r| r.map(|r| r.map(|_| ())))
            )),
        }
    }
    proxy.pass();
    let mut failed = Vec::new();
    for r in releases {
        if let Err(e) = r.await.unwrap() {
            failed.push(e.to_string());
        }
    }
    times.sort();
    println!(
        "{} releases failed ({:?}); waiters served after {times:?}",
        failed.len(),
        failed.first()
    );
    holder.shutdown().await;
    waiter.shutdown().await;
    assert!(bad.is_empty(), "{bad:#?}");
}
