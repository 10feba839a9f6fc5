//! Attacks on coalesced release (`release_many` with the `release_plain` quick path,
//! `src/backend/redis/coalesce.rs`) against a real `redis-server`, without faults: many
//! releases of one client going out as one call while other clients wait on some of the keys,
//! holds renewed, extended, force-released or expired and re-taken by another owner before
//! their release, leads resigned with them, more releases than one call carries, through the
//! sentinels, and key names with braces, colons, unicode and the maximum length. Each checks:
//! one holder at a time (tokens strictly increase), every waiter served well within the TTL
//! after its holder's release, another owner's hold never deleted, and no key left without an
//! expiry. The same under faults: `tests/redis/release_faults.rs`.
#![cfg(feature = "redis")]

use std::time::Duration;

use crate::support::redis::{client, until_queued};
use crate::support::release::{
    every, hold_of, holds_changed, holds_of, key_names, lock_all, nothing_left, queue_behind,
    queue_on, release_all, release_all_ok, release_each, renewing, serve_and_check, served, short,
    tokens, went_back, Handoff,
};
use crate::support::server::redis::shared_redis;
use crate::support::shut_down;
use tokio::time::{sleep, timeout, Instant};

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
    let taker = renewing(&url, &ns, Duration::from_secs(20)).await;
    let third = renewing(&url, &ns, Duration::from_secs(20)).await;
    let keys = key_names(40);
    let stale = lock_all(&late, &keys).await;
    let stale_tokens = tokens(&stale);
    sleep(Duration::from_millis(800)).await;
    let taken = lock_all(&taker, &keys).await;
    let before = holds_of(&url, &ns, &keys).await;
    let mut failed = 0;
    for r in release_all(stale) {
        failed += usize::from(r.await.unwrap().is_err());
    }
    println!("{failed} stale releases reported an error");
    let mut bad = holds_changed(&url, &ns, &keys, &taken, &before).await;
    for ((k, g), stale) in keys.iter().zip(&taken).zip(&stale_tokens) {
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
    shut_down([late, taker, third]).await;
    assert!(bad.is_empty(), "{bad:#?}");
    nothing_left(&url, &ns).await;
}

/// Holds renewed (short TTL, auto-renewal), extended, or force-released and handed to a waiter
/// before the holder's coalesced release: the renewed and extended holds are deleted or handed
/// on at once; a hold the operator gave to a waiter stays that waiter's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewed_extended_and_force_released_holds_release_together() {
    let ns = test_namespace!();
    let url = shared_redis().url();
    let ttl = Duration::from_secs(1);
    let holder = renewing(&url, &ns, ttl).await;
    let waiter = renewing(&url, &ns, Duration::from_secs(20)).await;
    let admin = renewing(&url, &ns, Duration::from_secs(20)).await;
    let keys = key_names(36);
    let guards = lock_all(&holder, &keys).await;
    let tokens = tokens(&guards);
    // Several renewals of the 1 s lease.
    sleep(Duration::from_millis(1600)).await;
    for (i, g) in guards.iter().enumerate() {
        if i % 3 == 1 {
            g.extend(Duration::from_secs(2)).await.unwrap();
        }
    }
    let waited = every(&keys, 2);
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
    bad.extend(went_back(&keys, &tokens, &ok));
    release_each(ok).await;
    release_each(early).await;
    shut_down([holder, waiter, admin]).await;
    assert!(bad.is_empty(), "{bad:#?}");
    nothing_left(&url, &ns).await;
}

/// One client holds each key and has more claims waiting on it; the holder releases while the
/// first of its own waiters is cancelled, all at once (so one key can appear more than once in
/// a coalesced call): the last waiter gets every key, and nothing is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_key_released_and_cancelled_twice_in_one_batch_goes_to_the_last_waiter() {
    let ns = test_namespace!();
    let url = shared_redis().url();
    let ttl = Duration::from_secs(20);
    let one = renewing(&url, &ns, ttl).await;
    let keys = key_names(30);
    let guards = lock_all(&one, &keys).await;
    let tokens = tokens(&guards);
    let first = queue_on(&one, &url, &ns, &keys).await;
    let last = queue_behind(&one, &url, &ns, &keys, 2).await;
    let released = Instant::now();
    let releases = release_all(guards);
    for w in first {
        w.abort();
    }
    for r in releases {
        r.await.unwrap().unwrap();
    }
    let bad = serve_and_check(
        &keys,
        &tokens,
        &keys,
        last,
        Duration::from_secs(3),
        released,
    )
    .await;
    one.shutdown().await;
    assert!(bad.is_empty(), "last waiters not served: {bad:#?}");
    nothing_left(&url, &ns).await;
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
    let before = holds_of(&url, &ns, &keys).await;
    for r in release_all(stale) {
        let _ = r.await.unwrap();
    }
    let bad = holds_changed(&url, &ns, &keys, &taken, &before).await;
    for g in taken {
        g.release().await.unwrap();
    }
    one.shutdown().await;
    assert!(bad.is_empty(), "{bad:#?}");
    nothing_left(&url, &ns).await;
}

/// More releases than one coalesced call carries (128), of keys with braces, colons, unicode
/// and 512 bytes, a third of them with a waiter of another client: every waiter is served at
/// once with a larger token, the rest are deleted, nothing is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_releases_than_a_batch_carries_hand_every_hold_on() {
    let ns = test_namespace!();
    let url = shared_redis().url();
    let ttl = Duration::from_secs(20);
    let holder = renewing(&url, &ns, ttl).await;
    let waiter = renewing(&url, &ns, ttl).await;
    let (handoff, guards) = Handoff::set_up(&holder, &waiter, &url, &ns, 360, 3).await;
    let released = Instant::now();
    release_all_ok(guards).await;
    let bad = handoff.served_after(Duration::from_secs(3), released).await;
    shut_down([holder, waiter]).await;
    assert!(bad.is_empty(), "waiters not served: {bad:#?}");
    nothing_left(&url, &ns).await;
}

/// Through the sentinels (where the plain-command acquire is off and tokens are lifted above
/// the clocks): releases coalesced into one call, a waiter of another client on every other
/// key, each served at once with a larger token, and nothing left on the primary.
#[cfg(feature = "redis-sentinel")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_sentinel_coalesced_releases_hand_every_hold_on() {
    let ns = test_namespace!();
    let setup = crate::support::server::sentinel::SentinelSetup::start();
    let primary = setup.primary.url();
    let ttl = Duration::from_secs(20);
    let holder = crate::support::failover::client_for(&setup.url(), &ns, ttl).await;
    let waiter = crate::support::failover::client_for(&setup.url(), &ns, ttl).await;
    let (handoff, guards) = Handoff::set_up(&holder, &waiter, &primary, &ns, 60, 2).await;
    let released = Instant::now();
    release_all_ok(guards).await;
    let bad = handoff.served_after(Duration::from_secs(3), released).await;
    shut_down([holder, waiter]).await;
    assert!(bad.is_empty(), "waiters not served: {bad:#?}");
    nothing_left(&primary, &ns).await;
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
    let one = renewing(&url, &ns, ttl).await;
    let two = renewing(&url, &ns, ttl).await;
    let elections: Vec<String> = (0..6).map(|i| format!("e{{{i}}}:☃")).collect();
    let keys = key_names(30);
    let mut leads = Vec::new();
    for e in &elections {
        leads.push(one.election(e.clone()).campaign(b"one").await.unwrap());
    }
    let terms: Vec<u64> = leads.iter().map(|l| l.term()).collect();
    let guards = lock_all(&one, &keys).await;
    let tokens = tokens(&guards);
    let mut campaigns = Vec::new();
    for e in &elections {
        let election = two.election(e.clone());
        campaigns.push(tokio::spawn(async move { election.campaign(b"two").await }));
    }
    for e in &elections {
        until_queued(&url, &ns, e, 1).await;
    }
    let waited = every(&keys, 2);
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
    bad.extend(went_back(&keys, &tokens, &ok));
    release_each(ok).await;
    for l in won {
        l.resign().await.unwrap();
    }
    shut_down([one, two]).await;
    assert!(bad.is_empty(), "{bad:#?}");
    nothing_left(&url, &ns).await;
}
