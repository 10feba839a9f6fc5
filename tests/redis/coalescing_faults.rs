//! Faults under the coalescing lanes' batches (the attacks on the hold
//! itself are in `redis_lane_attacks.rs`): a batch whose first attempt was sent and whose
//! connection is cut, after some of its acquires were given up, so that the retry carries fewer
//! claims than the first attempt.
#![cfg(feature = "redis")]

use std::time::Duration;

use crate::support::proxy::{Proxy, Which};
use crate::support::redis::client;
use crate::support::release::{hold_of, key_names, lock_all, nothing_left, short, via};
use crate::support::server::redis::RedisServer;
use tokio::time::{sleep, Instant};

/// One client (behind the proxy, replies 4 s late; requests reach the server at once) asks for
/// 6 keys held by another client: the first call goes alone, the 5 others queue behind it and
/// go as a batch past the hold, with a release of a lock the client holds on a seventh key.
/// The callers of keys 3..6 give up at once; their cleanups wait for the acquire at most the
/// claim's TTL (3 s) and release. At 3.4 s, the batch's first attempt sent but unanswered, the
/// connection is cut: the retry carries the wanted acquires and the release, not the given-up
/// acquires. Checked: the wanted callers are granted once the holder lets their keys go (tokens
/// above the holder's), the release succeeds and frees its key, and the given-up keys are held
/// by no one afterwards (a fresh client gets each at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_cut_after_its_acquires_were_given_up_grants_the_wanted_and_takes_none_for_no_one()
{
    let ns = test_namespace!();
    let server = RedisServer::start();
    let url = server.url();
    let proxy = Proxy::start(server.port());
    let ttl = Duration::from_secs(3);
    let handoff = Duration::from_secs(2);
    let busy = client(&via(&proxy), &ns, ttl, handoff, true).await;
    let holder = client(&url, &ns, ttl, handoff, true).await;
    let fresh = client(&url, &ns, ttl, handoff, true).await;
    let keys = key_names(7);
    let (keys, own) = keys.split_at(6);
    let guards = lock_all(&holder, keys).await;
    let holder_tokens: Vec<u64> = guards.iter().map(|g| g.fencing_token()).collect();
    let own_guard = busy.mutex(own[0].clone()).lock().await.unwrap();
    // Subscribed on each key first: the next locks there go by the acquire script at once.
    for k in keys {
        assert!(busy
            .mutex(k.clone())
            .lock_timeout(Duration::from_millis(50))
            .await
            .is_err());
    }
    sleep(Duration::from_millis(300)).await;

    proxy.delay_replies(Which::Commands, Duration::from_secs(4));
    let asked = Instant::now();
    let mut wanted = Vec::new();
    for (i, k) in keys[..3].iter().enumerate() {
        wanted.push(tokio::spawn(
            busy.mutex(k.clone()).lock_timeout(Duration::from_secs(20)),
        ));
        if i == 0 {
            sleep(Duration::from_millis(10)).await;
        }
    }
    let given_up = &keys[3..];
    let mut gone = Vec::new();
    for k in given_up {
        gone.push(tokio::spawn(
            busy.mutex(k.clone())
                .lock_timeout(Duration::from_millis(100)),
        ));
    }
    let release = tokio::spawn(own_guard.release());
    for g in gone {
        assert!(g.await.unwrap().is_err_and(|e| e.is_timeout()));
    }
    // The batch (past the hold) sent, its reply due at ~4.3 s; the cleanups' bound (the TTL)
    // is past at ~3.1 s.
    sleep(Duration::from_millis(3400).saturating_sub(asked.elapsed())).await;
    proxy.cut();
    sleep(Duration::from_millis(50)).await;
    proxy.heal();
    println!("cut at {:?}", asked.elapsed());
    sleep(Duration::from_millis(500)).await;
    proxy.pass();
    // The holder lets every key go: the wanted ones go to the busy client's waiters.
    for g in guards {
        g.release().await.unwrap();
    }
    let mut bad = Vec::new();
    match tokio::time::timeout(Duration::from_secs(10), release).await {
        Ok(Ok(Ok(()))) => {}
        other => bad.push(format!("the batch's release: {other:?}")),
    }
    for (i, w) in wanted.into_iter().enumerate() {
        match tokio::time::timeout(Duration::from_secs(10), w).await {
            Ok(Ok(Ok(g))) => {
                if g.fencing_token() <= holder_tokens[i] {
                    bad.push(format!(
                        "{}: token {} went back",
                        short(&keys[i]),
                        g.fencing_token()
                    ));
                }
                g.release().await.unwrap();
            }
            other => bad.push(format!("{}: wanted, got {other:?}", short(&keys[i]))),
        }
    }
    println!(
        "wanted callers answered {:?} after the ask",
        asked.elapsed()
    );
    if hold_of(&url, &ns, &own[0]).await.is_some() {
        bad.push("the released key is still held".into());
    }
    // Past any attempt the batch could still make.
    sleep(Duration::from_secs(1)).await;
    for k in given_up {
        if let Some(h) = hold_of(&url, &ns, k).await {
            bad.push(format!(
                "{}: held for no one by {:?}",
                short(k),
                String::from_utf8_lossy(&h)
            ));
        }
        let t = Instant::now();
        match fresh
            .mutex(k.clone())
            .lock_timeout(Duration::from_secs(8))
            .await
        {
            Ok(g) => {
                if t.elapsed() > Duration::from_millis(500) {
                    bad.push(format!(
                        "{}: a fresh client waited {:?}",
                        short(k),
                        t.elapsed()
                    ));
                }
                g.release().await.unwrap();
            }
            Err(e) => bad.push(format!("{}: a fresh client: {e}", short(k))),
        }
    }
    busy.shutdown().await;
    holder.shutdown().await;
    fresh.shutdown().await;
    assert!(bad.is_empty(), "{bad:#?}");
    nothing_left(&url, &ns).await;
}

/// The first attempt of a call sent alone (no other call out: the lane idle) is cut after the
/// server ran it, its reply 500 ms late: the retry path (made only after a failed first
/// attempt) sends it again. An acquire: the lock is granted once, held, its token above the
/// last; a release: it succeeds (in doubt, the second attempt finds the lock already let go)
/// and the key is free. Each call completes within 3 s, and nothing is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_alone_cut_during_its_first_attempt_is_answered_by_its_retry() {
    let ns = test_namespace!();
    let server = RedisServer::start();
    let url = server.url();
    let proxy = Proxy::start(server.port());
    let ttl = Duration::from_secs(10);
    let handoff = Duration::from_secs(2);
    let busy = client(&via(&proxy), &ns, ttl, handoff, true).await;
    let fresh = client(&url, &ns, ttl, handoff, true).await;
    let key = key_names(1).remove(0);
    let before = fresh.mutex(key.clone()).lock().await.unwrap();
    let last = before.fencing_token();
    before.release().await.unwrap();
    let mut bad = Vec::new();
    for round in 0..3 {
        proxy.delay_replies(Which::Commands, Duration::from_millis(500));
        let asked = Instant::now();
        let lock = tokio::spawn(busy.mutex(key.clone()).lock_timeout(Duration::from_secs(8)));
        sleep(Duration::from_millis(200)).await;
        proxy.cut();
        sleep(Duration::from_millis(20)).await;
        proxy.heal();
        let g = match tokio::time::timeout(Duration::from_secs(3), lock).await {
            Ok(Ok(Ok(g))) => g,
            other => {
                bad.push(format!("round {round}: acquire {other:?}"));
                break;
            }
        };
        println!(
            "round {round}: acquire answered after {:?}",
            asked.elapsed()
        );
        if g.fencing_token() <= last {
            bad.push(format!(
                "round {round}: token {} after {last}",
                g.fencing_token()
            ));
        }
        if hold_of(&url, &ns, &key).await.is_none() {
            bad.push(format!("round {round}: granted, not held on the server"));
        }
        let asked = Instant::now();
        let release = tokio::spawn(g.release());
        sleep(Duration::from_millis(200)).await;
        proxy.cut();
        sleep(Duration::from_millis(20)).await;
        proxy.heal();
        match tokio::time::timeout(Duration::from_secs(3), release).await {
            Ok(Ok(Ok(()))) => {}
            other => bad.push(format!("round {round}: release {other:?}")),
        }
        println!(
            "round {round}: release answered after {:?}",
            asked.elapsed()
        );
        proxy.pass();
        if let Some(h) = hold_of(&url, &ns, &key).await {
            bad.push(format!(
                "round {round}: still held by {:?}",
                String::from_utf8_lossy(&h)
            ));
        }
        let t = Instant::now();
        match fresh
            .mutex(key.clone())
            .lock_timeout(Duration::from_secs(8))
            .await
        {
            Ok(g) => {
                if t.elapsed() > Duration::from_millis(500) {
                    bad.push(format!(
                        "round {round}: a fresh client waited {:?}",
                        t.elapsed()
                    ));
                }
                g.release().await.unwrap();
            }
            Err(e) => bad.push(format!("round {round}: a fresh client: {e}")),
        }
    }
    busy.shutdown().await;
    fresh.shutdown().await;
    assert!(bad.is_empty(), "{bad:#?}");
    nothing_left(&url, &ns).await;
}
