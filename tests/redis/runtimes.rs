//! Attacks on the lanes' runtime fallback: one client built in a runtime
//! since shut down (a client kept in a static across `#[tokio::test]`s), used from several
//! runtimes, some of which shut down while the others still use it.
#![cfg(feature = "redis")]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::redis::{client, orphaned_client};
use crate::support::release::nothing_left;
use crate::support::server::redis::RedisServer;
use distlock::LockClient;
use tokio::time::Instant;

/// A runtime like a `#[tokio::test]`'s: current-thread, or multi-thread with 2 workers.
fn runtime(multi: bool) -> tokio::runtime::Runtime {
    if multi {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    } else {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }
}

/// What one round of locks saw: the errors (and hangs), and each key's tokens in order.
#[derive(Default)]
struct Seen {
    calls: usize,
    bad: Vec<String>,
    tokens: HashMap<String, Vec<u64>>,
}

/// `n` concurrent lock-then-release calls of `client`, one per key `{prefix}{i}`, each bound
/// to 5 s in all.
async fn round(client: &LockClient, prefix: &str, n: usize, seen: &Mutex<Seen>) {
    let mut calls = Vec::new();
    for i in 0..n {
        let key = format!("{prefix}{i}");
        let mutex = client.mutex(key.clone());
        calls.push(tokio::spawn(async move {
            let got = tokio::time::timeout(Duration::from_secs(5), async {
                let g = mutex.lock_timeout(Duration::from_secs(60)).await?;
                let t = g.fencing_token();
                g.release().await?;
                Ok::<_, distlock::Error>(t)
            })
            .await;
            (key, got)
        }));
    }
    for c in calls {
        let (key, got) = c.await.unwrap();
        let mut seen = seen.lock().unwrap();
        seen.calls += 1;
        match got {
            Ok(Ok(t)) => seen.tokens.entry(key).or_default().push(t),
            Ok(Err(e)) => seen.bad.push(format!("{key}: {e}")),
            Err(_) => seen.bad.push(format!("{key}: hung (5 s)")),
        }
    }
}

/// Tokens that went back (or repeated) on a key.
fn went_back(seen: &Seen) -> Vec<String> {
    let mut out = Vec::new();
    for (k, ts) in &seen.tokens {
        if ts.windows(2).any(|w| w[1] <= w[0]) {
            out.push(format!("{k}: {ts:?}"));
        }
    }
    out
}

/// One runtime (`steady`) uses an orphaned client for 4 s, rounds of 16 concurrent locks;
/// meanwhile runtimes one after another (each like a test of its own) use it too, 10 rounds
/// each, and shut down. Checked: every call of both is granted and released within 5 s, the
/// tokens of each key increase, nothing is left. At 2bdc8f3 both flavors fail every run (8 of
/// 8 runs): the steady runtime's releases fail with "the coalesced call was lost" (10 to 203
/// a run) when a passing runtime ends with the lane's sending task on it, and the next round
/// on those keys waits out their 10 s TTL ("hung (5 s)"); no token went back.
fn steady_while_others_end(multi: bool) {
    let ns = format!("{}.{}", test_namespace!(), multi);
    let server = RedisServer::start();
    let url = server.url();
    let shared = orphaned_client(&url, &ns, Duration::from_secs(10));
    let steady_seen = Arc::new(Mutex::new(Seen::default()));
    let steady = {
        let (c, seen) = (shared.clone(), steady_seen.clone());
        std::thread::spawn(move || {
            let rt = runtime(multi);
            rt.block_on(async {
                let start = Instant::now();
                while start.elapsed() < Duration::from_secs(4) {
                    round(&c, "steady", 16, &seen).await;
                }
            });
        })
    };
    let passing_seen = Mutex::new(Seen::default());
    let mut runtimes = 0;
    while !steady.is_finished() {
        let rt = runtime(multi);
        rt.block_on(async {
            for _ in 0..10 {
                round(&shared, "passing", 16, &passing_seen).await;
            }
        });
        drop(rt);
        runtimes += 1;
    }
    steady.join().unwrap();
    let steady_seen = steady_seen.lock().unwrap();
    let passing_seen = passing_seen.lock().unwrap();
    let mut kinds: HashMap<String, usize> = HashMap::new();
    for b in steady_seen.bad.iter().chain(&passing_seen.bad) {
        let what = b.split_once(": ").map_or(b.as_str(), |(_, w)| w);
        *kinds.entry(what.to_string()).or_default() += 1;
    }
    println!("multi={multi}: failures by kind: {kinds:?}");
    println!("steady's failures, in order: {:?}", steady_seen.bad);
    println!(
        "multi={multi}: steady {} calls, {} bad; {runtimes} passing runtimes, {} calls, {} bad",
        steady_seen.calls,
        steady_seen.bad.len(),
        passing_seen.calls,
        passing_seen.bad.len()
    );
    let mut bad: Vec<String> = (steady_seen.bad.iter().take(8))
        .map(|b| format!("steady {b}"))
        .collect();
    bad.extend(
        passing_seen
            .bad
            .iter()
            .take(8)
            .map(|b| format!("passing {b}")),
    );
    bad.extend(went_back(&steady_seen));
    bad.extend(went_back(&passing_seen));
    let check = runtime(true);
    check.block_on(nothing_left(&url, &ns));
    assert!(
        steady_seen.bad.is_empty() && passing_seen.bad.is_empty() && bad.is_empty(),
        "{bad:#?}"
    );
}

#[test]
fn an_orphaned_client_serves_a_current_thread_runtime_while_others_end() {
    steady_while_others_end(false);
}

#[test]
fn an_orphaned_client_serves_a_multi_thread_runtime_while_others_end() {
    steady_while_others_end(true);
}

/// Runtimes B, C, D one after another (like `#[tokio::test]`s) use an orphaned client: 24
/// concurrent locks each, on distinct keys, then released. Checked: all granted within 5 s,
/// tokens increase, nothing left.
#[test]
fn an_orphaned_client_serves_runtimes_in_sequence() {
    let ns = test_namespace!();
    let server = RedisServer::start();
    let url = server.url();
    let shared = orphaned_client(&url, &ns, Duration::from_secs(10));
    let seen = Mutex::new(Seen::default());
    for i in 0..6 {
        let rt = runtime(i % 2 == 0);
        rt.block_on(round(&shared, "seq", 24, &seen));
    }
    let seen = seen.lock().unwrap();
    let mut bad = seen.bad.clone();
    bad.extend(went_back(&seen));
    println!("{} calls, {} bad", seen.calls, seen.bad.len());
    runtime(true).block_on(nothing_left(&url, &ns));
    assert!(bad.is_empty(), "{bad:#?}");
}

/// Guards taken in runtime B and dropped (not released) after B has shut down: their release
/// is spawned on B's handle. How long until a fresh client gets each key (TTL 3 s)?
#[test]
fn guards_dropped_after_their_runtime_are_freed_within_their_ttl() {
    let ns = test_namespace!();
    let server = RedisServer::start();
    let url = server.url();
    let ttl = Duration::from_secs(3);
    let shared = orphaned_client(&url, &ns, ttl);
    let b = runtime(false);
    let guards = b.block_on(async {
        let mut gs = Vec::new();
        for i in 0..8 {
            gs.push(
                tokio::time::timeout(Duration::from_secs(5), shared.mutex(format!("g{i}")).lock())
                    .await
                    .unwrap()
                    .unwrap(),
            );
        }
        gs
    });
    drop(b);
    let dropped = std::time::Instant::now();
    drop(guards);
    let c = runtime(true);
    let waits = c.block_on(async {
        let fresh = client(&url, &ns, ttl, Duration::from_secs(2), true).await;
        let mut waits = Vec::new();
        for i in 0..8 {
            let got = tokio::time::timeout(
                Duration::from_secs(10),
                fresh
                    .mutex(format!("g{i}"))
                    .lock_timeout(Duration::from_secs(10)),
            )
            .await;
            waits.push((dropped.elapsed(), got.is_ok_and(|r| r.is_ok())));
            // Released at once by the drop here (this runtime lives).
        }
        fresh.shutdown().await;
        waits
    });
    println!("after the drop, each key got by a fresh client at: {waits:?}");
    c.block_on(nothing_left(&url, &ns));
    assert!(waits
        .iter()
        .all(|(at, ok)| *ok && *at < ttl + Duration::from_secs(1)));
}

/// Two runtimes share an orphaned client (behind a proxy, replies 150 ms late): B's lock goes
/// alone, C's 4 locks (distinct keys) queue behind it. B's call answered, the lane's sending
/// task for C's queue goes to the built runtime (gone), so to B's, the current one; B then
/// ends (its test is over) while that batch is out. Checked: C's 4 locks, whose runtime lives,
/// are each granted within 5 s. At 2bdc8f3 all 4 fail with "redis acquire: the coalesced
/// call was lost", every run (6 of 6); their cleanups free the keys (~150 ms).
#[test]
fn a_runtime_that_ends_does_not_take_the_queued_calls_of_another_with_it() {
    use crate::support::proxy::{Proxy, Which};
    use crate::support::release::via;
    let ns = test_namespace!();
    let server = RedisServer::start();
    let url = server.url();
    let proxy = Proxy::start(server.port());
    let fresh_rt = runtime(true);
    let fresh = fresh_rt.block_on(client(
        &url,
        &ns,
        Duration::from_secs(10),
        Duration::from_secs(2),
        true,
    ));
    let shared = orphaned_client(&via(&proxy), &ns, Duration::from_secs(10));
    let c = runtime(true);
    // C reconnects the client's connection (its task now on C, which lives).
    c.block_on(async {
        let g = shared.mutex("warm").lock().await.unwrap();
        g.release().await.unwrap();
    });
    proxy.delay_replies(Which::Commands, Duration::from_millis(150));
    let (b_sent_tx, b_sent_rx) = std::sync::mpsc::channel();
    let b = {
        let shared = shared.clone();
        std::thread::spawn(move || {
            let b = runtime(false);
            let guard = b.block_on(async {
                let lock = shared.mutex("b").lock();
                b_sent_tx.send(()).unwrap();
                lock.await
            });
            // B's test is over: its runtime shuts down, then its guard goes.
            drop(b);
            drop(guard);
        })
    };
    b_sent_rx.recv().unwrap();
    let outcomes = c.block_on(async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut calls = Vec::new();
        for i in 0..4 {
            let mutex = shared.mutex(format!("c{i}"));
            calls.push(tokio::spawn(async move {
                tokio::time::timeout(
                    Duration::from_secs(5),
                    mutex.lock_timeout(Duration::from_secs(60)),
                )
                .await
                .map(|r| r.map(|g| g.fencing_token()))
            }));
        }
        let mut outcomes = Vec::new();
        for c in calls {
            outcomes.push(format!("{:?}", c.await.unwrap()));
        }
        outcomes
    });
    b.join().unwrap();
    println!("C's locks: {outcomes:#?}");
    // Are C's keys free (its cleanups released what the lost batch took)?
    let free = fresh_rt.block_on(async {
        let at = Instant::now();
        let mut free = Vec::new();
        for i in 0..4 {
            let got = fresh
                .mutex(format!("c{i}"))
                .lock_timeout(Duration::from_secs(15))
                .await;
            free.push((
                at.elapsed(),
                got.map(|g| g.fencing_token()).map_err(|e| e.to_string()),
            ));
        }
        free
    });
    println!("a fresh client then got C's keys at: {free:?}");
    let failed: Vec<_> = (outcomes.iter())
        .filter(|o| !o.contains("Ok(Ok("))
        .collect();
    assert!(failed.is_empty(), "C's locks not granted: {failed:#?}");
}

/// As above, for releases: C holds 4 locks; B's release goes alone (replies 150 ms late), C's 4
/// releases queue behind it, and B ends once its release is answered, with the batch sending
/// C's out. Checked: C's releases succeed, and a fresh client gets C's keys at once (TTL 10 s).
/// At 2bdc8f3 all 4 fail with "redis release: the coalesced call was lost", every run (4 of
/// 4), and the keys stay held until their TTL runs out (a fresh client gets them at 9.85 s).
#[test]
fn a_runtime_that_ends_does_not_take_the_queued_releases_of_another_with_it() {
    use crate::support::proxy::{Proxy, Which};
    use crate::support::release::via;
    let ns = test_namespace!();
    let server = RedisServer::start();
    let url = server.url();
    let proxy = Proxy::start(server.port());
    let fresh_rt = runtime(true);
    let fresh = fresh_rt.block_on(client(
        &url,
        &ns,
        Duration::from_secs(10),
        Duration::from_secs(2),
        true,
    ));
    let shared = orphaned_client(&via(&proxy), &ns, Duration::from_secs(10));
    let c = runtime(true);
    let held = c.block_on(async {
        let mut held = Vec::new();
        for i in 0..4 {
            held.push(shared.mutex(format!("c{i}")).lock().await.unwrap());
        }
        held
    });
    let (b_guard_tx, b_guard_rx) = std::sync::mpsc::channel();
    let (b_go_tx, b_go_rx) = std::sync::mpsc::channel::<()>();
    let (b_sent_tx, b_sent_rx) = std::sync::mpsc::channel();
    let b = {
        let shared = shared.clone();
        std::thread::spawn(move || {
            let b = runtime(false);
            b.block_on(async {
                let g = shared.mutex("b").lock().await.unwrap();
                b_guard_tx.send(()).unwrap();
                b_go_rx.recv().unwrap();
                let release = g.release();
                b_sent_tx.send(()).unwrap();
                release.await.unwrap();
            });
            drop(b);
        })
    };
    b_guard_rx.recv().unwrap();
    proxy.delay_replies(Which::Commands, Duration::from_millis(150));
    b_go_tx.send(()).unwrap();
    b_sent_rx.recv().unwrap();
    let outcomes = c.block_on(async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let calls: Vec<_> = (held.into_iter())
            .map(|g| tokio::spawn(tokio::time::timeout(Duration::from_secs(5), g.release())))
            .collect();
        let mut outcomes = Vec::new();
        for c in calls {
            outcomes.push(format!("{:?}", c.await.unwrap()));
        }
        outcomes
    });
    b.join().unwrap();
    println!("C's releases: {outcomes:#?}");
    let free = fresh_rt.block_on(async {
        let at = Instant::now();
        let mut free = Vec::new();
        for i in 0..4 {
            let got = fresh
                .mutex(format!("c{i}"))
                .lock_timeout(Duration::from_secs(15))
                .await;
            free.push((
                at.elapsed(),
                got.map(|g| g.fencing_token()).map_err(|e| e.to_string()),
            ));
        }
        free
    });
    println!("a fresh client then got C's keys at: {free:?}");
    let failed: Vec<_> = (outcomes.iter())
        .filter(|o| !o.contains("Ok(Ok("))
        .collect();
    assert!(
        failed.is_empty() && free.iter().all(|(at, _)| *at < Duration::from_secs(1)),
        "C's releases: {failed:#?}; C's keys got at {free:?}"
    );
}

/// Who holds each key (as the callers see it) and the tokens granted on it, in grant order.
#[derive(Default)]
struct Holders {
    held: HashMap<String, bool>,
    tokens: HashMap<String, Vec<u64>>,
    overlaps: Vec<String>,
    errors: Vec<String>,
}

/// 16 concurrent lock-then-release calls of `client`, two per key of 8 shared keys, each bound
/// to 10 s in all.
async fn contended_round(client: &LockClient, holders: &Arc<Mutex<Holders>>) {
    let mut calls = Vec::new();
    for i in 0..16 {
        let key = format!("k{}", i % 8);
        let mutex = client.mutex(key.clone());
        let holders = holders.clone();
        calls.push(tokio::spawn(async move {
            let got = tokio::time::timeout(Duration::from_secs(10), async {
                let g = mutex.lock_timeout(Duration::from_secs(60)).await?;
                {
                    let mut h = holders.lock().unwrap();
                    if h.held.insert(key.clone(), true) == Some(true) {
                        h.overlaps.push(key.clone());
                    }
                    h.tokens
                        .entry(key.clone())
                        .or_default()
                        .push(g.fencing_token());
                }
                tokio::task::yield_now().await;
                holders.lock().unwrap().held.insert(key.clone(), false);
                g.release().await
            })
            .await;
            match got {
                Ok(Ok(())) => {}
                Ok(Err(e)) => holders.lock().unwrap().errors.push(e.to_string()),
                Err(_) => holders.lock().unwrap().errors.push("hung (10 s)".into()),
            }
        }));
    }
    for c in calls {
        c.await.unwrap();
    }
}

/// A steady runtime and passing runtimes (current-thread, ending one after another) contend
/// for the same 8 keys through one orphaned client (TTL 2 s), for 4 s. Checked: never two
/// holders of a key at once, the tokens of each key increase in grant order. (Errors are
/// counted, not checked: the lost calls are the tests above.)
#[test]
fn an_orphaned_client_shared_by_ending_runtimes_never_grants_a_key_twice() {
    let ns = test_namespace!();
    let server = RedisServer::start();
    let url = server.url();
    let shared = orphaned_client(&url, &ns, Duration::from_secs(2));
    let holders = Arc::new(Mutex::new(Holders::default()));
    let steady = {
        let (c, holders) = (shared.clone(), holders.clone());
        std::thread::spawn(move || {
            runtime(false).block_on(async {
                let start = Instant::now();
                while start.elapsed() < Duration::from_secs(4) {
                    contended_round(&c, &holders).await;
                }
            });
        })
    };
    let mut runtimes = 0;
    while !steady.is_finished() {
        let rt = runtime(false);
        rt.block_on(async {
            for _ in 0..5 {
                contended_round(&shared, &holders).await;
            }
        });
        drop(rt);
        runtimes += 1;
    }
    steady.join().unwrap();
    let h = holders.lock().unwrap();
    let grants: usize = h.tokens.values().map(Vec::len).sum();
    let back: Vec<_> = (h.tokens.iter())
        .filter(|(_, ts)| ts.windows(2).any(|w| w[1] <= w[0]))
        .map(|(k, _)| k.clone())
        .collect();
    println!(
        "{runtimes} passing runtimes; {grants} grants, {} errors ({:?}), overlaps {:?}, tokens back on {back:?}",
        h.errors.len(),
        h.errors.iter().take(3).collect::<Vec<_>>(),
        h.overlaps
    );
    assert!(h.overlaps.is_empty() && back.is_empty());
}
