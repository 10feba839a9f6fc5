//! One fencing counter per namespace on a single Redis server: tokens per key across every
//! kind of grant and a tampered counter, FIFO past a lapsed holder, liveness, cancellation, and
//! what is left behind.
#![cfg(feature = "redis")]

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::proxy::Proxy;
use crate::support::redis::{client, connection, keys_in, until_only_fences, until_queued};
use crate::support::server::redis::shared_redis;
use tokio::time::{sleep, timeout, Instant};

async fn cmd(url: &str, args: &[&str]) -> redis::Value {
    let mut c = redis::cmd(args[0]);
    for a in &args[1..] {
        c.arg(*a);
    }
    c.query_async(&mut connection(url).await)
        .await
        .unwrap_or(redis::Value::Nil)
}

async fn pttl(url: &str, key: &str) -> i64 {
    match cmd(url, &["PTTL", key]).await {
        redis::Value::Int(n) => n,
        other => panic!("PTTL {key}: {other:?}"),
    }
}

/// A counter that is not a number (`SET <ns>:fence hello`): lock() fails with an error (no
/// panic, no hang, no grant), and once the key is deleted the same key is granted promptly,
/// not after the TTL of a hold the failed pipeline left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_counter_errors_then_recovers_promptly() {
    let ns = test_namespace!();
    let url = shared_redis().url();
    let ttl = Duration::from_secs(10);
    let a = client(&url, &ns, ttl, Duration::from_millis(300), true).await;
    let b = client(&url, &ns, ttl, Duration::from_millis(300), true).await;
    let fence = format!("{ns}:fence");
    cmd(&url, &["SET", &fence, "hello"]).await;
    let got = timeout(Duration::from_secs(5), a.mutex("k").lock()).await;
    let first = match &got {
        Ok(Ok(g)) => format!("granted token {}", g.fencing_token()),
        Ok(Err(e)) => format!("error {e}"),
        Err(_) => "still waiting after 5 s".to_string(),
    };
    drop(got);
    let tried = b.mutex("k").try_lock().await.map(|g| g.fencing_token());
    eprintln!("with counter 'hello': lock {first}; try_lock {tried:?}");
    eprintln!("keys then: {:?}", keys_in(&url, &ns).await);
    cmd(&url, &["DEL", &fence]).await;
    let start = Instant::now();
    let again = timeout(Duration::from_secs(4), b.mutex("k").lock()).await;
    let took = start.elapsed();
    let again = match again {
        Ok(Ok(g)) => {
            let t = g.fencing_token();
            g.release().await.unwrap();
            Ok(t)
        }
        Ok(Err(e)) => Err(format!("{e}")),
        Err(_) => Err("not granted within 4 s".to_string()),
    };
    eprintln!("after DEL: {again:?} in {took:?}");
    a.shutdown().await;
    b.shutdown().await;
    assert!(
        first.starts_with("error"),
        "lock with a garbage counter: {first}"
    );
    assert!(
        again.is_ok(),
        "after the counter was deleted: {again:?} ({took:?})"
    );
}

#[derive(Default)]
struct Seen {
    held: bool,
    last: u64,
}

/// Many keys of one namespace locked from three clients (one of them never renews and
/// abandons a third of its guards), while the counter is PEXPIREd to 1 ms, deleted, set to "5"
/// and to "abc" in a loop: never two holders of a key, tokens per key strictly increasing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tampered_counter_many_keys_no_overlap_tokens_increase() {
    let ns = test_namespace!();
    let url = shared_redis().url();
    let ttl = Duration::from_millis(800);
    let clients = vec![
        client(&url, &ns, ttl, Duration::from_millis(200), true).await,
        client(&url, &ns, ttl, Duration::from_millis(200), true).await,
        client(&url, &ns, ttl, Duration::from_millis(200), false).await,
    ];
    let fence = format!("{ns}:fence");
    let done = Arc::new(AtomicBool::new(false));
    let tamper = {
        let (url, fence, done) = (url.clone(), fence.clone(), done.clone());
        tokio::spawn(async move {
            let mut i = 0u64;
            while !done.load(Ordering::SeqCst) {
                match i % 4 {
                    0 => cmd(&url, &["PEXPIRE", &fence, "1"]).await,
                    1 => cmd(&url, &["DEL", &fence]).await,
                    2 => cmd(&url, &["SET", &fence, "5"]).await,
                    _ => {
                        cmd(&url, &["SET", &fence, "abc"]).await;
                        sleep(Duration::from_millis(5)).await;
                        cmd(&url, &["DEL", &fence]).await
                    }
                };
                i += 1;
                sleep(Duration::from_millis(7)).await;
            }
            i
        })
    };
    let keys = ["k0", "k1", "k2", "k3", "k4", "k5"];
    let seen: Arc<HashMap<&str, Mutex<Seen>>> =
        Arc::new(keys.iter().map(|k| (*k, Mutex::default())).collect());
    let errors = Arc::new(AtomicU64::new(0));
    let grants = Arc::new(AtomicU64::new(0));
    let violations = Arc::new(Mutex::new(Vec::<String>::new()));
    let deadline = Instant::now() + Duration::from_secs(8);
    let mut tasks = Vec::new();
    for w in 0..12usize {
        let c = clients[w % 3].clone();
        let (seen, errors, grants, violations) = (
            seen.clone(),
            errors.clone(),
            grants.clone(),
            violations.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut n = w as u64 * 7919 + 1;
            while Instant::now() < deadline {
                n = n
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let key = keys[(n >> 33) as usize % keys.len()];
                match timeout(Duration::from_millis(1500), c.mutex(key).lock()).await {
                    Err(_) => {}
                    Ok(Err(_)) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                        sleep(Duration::from_millis(5)).await;
                    }
                    Ok(Ok(g)) => {
                        grants.fetch_add(1, Ordering::Relaxed);
                        let t = g.fencing_token();
                        {
                            let mut s = seen[key].lock().unwrap();
                            if s.held {
                                violations
                                    .lock()
                                    .unwrap()
                                    .push(format!("{key}: two holders"));
                            }
                            if t <= s.last {
                                violations
                                    .lock()
                                    .unwrap()
                                    .push(format!("{key}: token {t} after {}", s.last));
                            }
                            s.held = true;
                            s.last = s.last.max(t);
                        }
                        sleep(Duration::from_millis((n >> 20) % 20)).await;
                        seen[key].lock().unwrap().held = false;
                        if w % 3 == 2 && (n >> 40).is_multiple_of(3) {
                            // Abandoned: its lease (800 ms, never renewed) runs out.
                            std::mem::forget(g);
                        } else {
                            let _ = g.release().await;
                        }
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    done.store(true, Ordering::SeqCst);
    let tampers = tamper.await.unwrap();
    cmd(&url, &["DEL", &fence]).await;
    for c in &clients {
        c.shutdown().await;
    }
    let v = violations.lock().unwrap().clone();
    eprintln!(
        "grants {} errors {} tampers {tampers} violations {}",
        grants.load(Ordering::Relaxed),
        errors.load(Ordering::Relaxed),
        v.len()
    );
    assert!(v.is_empty(), "{v:#?}");
    assert!(grants.load(Ordering::Relaxed) > 50, "too few grants");
}

/// FIFO: a waiter queued behind a holder whose lease ran out (renewals off, guard abandoned) is
/// not barged past by a newcomer's plain pipeline, even when the counter is deleted, expired or
/// set to "5" just as the lease runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiter_not_barged_when_counter_tampered_at_expiry() {
    let ns = test_namespace!();
    let url = shared_redis().url();
    let fence = format!("{ns}:fence");
    let mut bad = Vec::new();
    for (round, tamper) in ["none", "del", "expire", "set5"].iter().enumerate() {
        let key = format!("k{round}");
        let ttl = Duration::from_millis(1000);
        let holder = client(&url, &ns, ttl, Duration::from_millis(300), false).await;
        let waiter = client(
            &url,
            &ns,
            Duration::from_secs(5),
            Duration::from_millis(300),
            true,
        )
        .await;
        let newcomer = client(
            &url,
            &ns,
            Duration::from_secs(5),
            Duration::from_millis(300),
            true,
        )
        .await;
        let g = holder.mutex(key.as_str()).lock().await.unwrap();
        let held_at = Instant::now();
        let ht = g.fencing_token();
        std::mem::forget(g);
        let order = Arc::new(Mutex::new(Vec::<(&str, u64)>::new()));
        let w = {
            let (m, order) = (waiter.mutex(key.as_str()), order.clone());
            tokio::spawn(async move {
                let g = m.lock().await.unwrap();
                order.lock().unwrap().push(("waiter", g.fencing_token()));
                sleep(Duration::from_millis(200)).await;
                g.release().await.unwrap();
            })
        };
        until_queued(&url, &ns, &key, 1).await;
        // Just before the lease runs out: tamper, then the newcomer tries (plain path first).
        let at = held_at + ttl;
        sleep(
            at.saturating_duration_since(Instant::now())
                .saturating_sub(Duration::from_millis(3)),
        )
        .await;
        match *tamper {
            "del" => {
                cmd(&url, &["DEL", &fence]).await;
            }
            "expire" => {
                cmd(&url, &["PEXPIRE", &fence, "1"]).await;
            }
            "set5" => {
                cmd(&url, &["SET", &fence, "5"]).await;
            }
            _ => {}
        }
        let mut n_token = None;
        for _ in 0..200 {
            if let Ok(g) = newcomer.mutex(key.as_str()).try_lock().await {
                n_token = Some(g.fencing_token());
                order.lock().unwrap().push(("newcomer", g.fencing_token()));
                g.release().await.unwrap();
                break;
            }
            if !order.lock().unwrap().is_empty() {
                break;
            }
            sleep(Duration::from_millis(2)).await;
        }
        timeout(Duration::from_secs(5), w).await.unwrap().unwrap();
        let o = order.lock().unwrap().clone();
        eprintln!("round {round} ({tamper}): holder {ht}, order {o:?}, newcomer {n_token:?}");
        if o.first().map(|x| x.0) != Some("waiter") {
            bad.push(format!("{tamper}: {o:?}"));
        }
        for c in [&holder, &waiter, &newcomer] {
            c.shutdown().await;
        }
    }
    assert!(
        bad.is_empty(),
        "newcomer barged past the queued waiter: {bad:?}"
    );
}

/// lock() futures cancelled at random points on a namespace with no counter (a warm client,
/// its counter deleted before each try): afterwards nothing is left but `<ns>:fence`; a counter
/// left without a TTL (the documented window) is counted, and must get one at the next acquire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_locks_leave_only_an_expiring_counter() {
    let ns = test_namespace!();
    let url = shared_redis().url();
    let fence = format!("{ns}:fence");
    let ttl = Duration::from_secs(3);
    let c = client(&url, &ns, ttl, Duration::from_millis(300), true).await;
    c.mutex("warm")
        .lock()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let (mut no_ttl, mut granted, mut runs) = (0, 0, 0);
    let mut bad = Vec::new();
    let start = Instant::now();
    let mut i = 0u64;
    while start.elapsed() < Duration::from_secs(8) {
        i += 1;
        cmd(&url, &["DEL", &fence]).await;
        let cut = Duration::from_micros(10 + (i * 37) % 1500);
        if let Ok(Ok(g)) = timeout(cut, c.mutex(format!("k{}", i % 5)).lock()).await {
            granted += 1;
            g.release().await.unwrap();
        }
        sleep(Duration::from_millis(3)).await;
        runs += 1;
        if pttl(&url, &fence).await == -1 {
            no_ttl += 1;
            c.mutex("z").lock().await.unwrap().release().await.unwrap();
            let p = pttl(&url, &fence).await;
            if p <= 0 {
                bad.push(format!(
                    "try {i}: counter still without TTL after an acquire ({p})"
                ));
            }
        }
    }
    c.shutdown().await;
    until_only_fences(&url, &ns).await;
    let left = keys_in(&url, &ns).await;
    if left.iter().any(|k| k != &fence) {
        bad.push(format!("left: {left:?}"));
    }
    if left.contains(&fence) && pttl(&url, &fence).await == -1 {
        bad.push("counter without TTL at the end".into());
    }
    eprintln!(
        "counter left without TTL after {no_ttl} of {runs} cancelled tries ({granted} granted)"
    );
    assert!(bad.is_empty(), "{bad:#?}");
}

/// Two namespaces on one server: tampering with one's counter touches nothing of the other,
/// and the other's tokens keep increasing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_namespaces_stay_apart() {
    let a_ns = format!("{}a", test_namespace!());
    let b_ns = format!("{}b", test_namespace!());
    let url = shared_redis().url();
    let ttl = Duration::from_secs(3);
    let a = client(&url, &a_ns, ttl, Duration::from_millis(300), true).await;
    let b = client(&url, &b_ns, ttl, Duration::from_millis(300), true).await;
    let mut bt = Vec::new();
    for i in 0..20 {
        let ga = a.mutex("k").lock().await.unwrap();
        if i % 3 == 0 {
            cmd(&url, &["DEL", &format!("{a_ns}:fence")]).await;
        }
        let gb = b.mutex("k").lock().await.unwrap();
        bt.push(gb.fencing_token());
        ga.release().await.unwrap();
        gb.release().await.unwrap();
    }
    a.shutdown().await;
    b.shutdown().await;
    until_only_fences(&url, &a_ns).await;
    until_only_fences(&url, &b_ns).await;
    let (ka, kb) = (keys_in(&url, &a_ns).await, keys_in(&url, &b_ns).await);
    assert_eq!(ka, vec![format!("{a_ns}:fence")]);
    assert_eq!(kb, vec![format!("{b_ns}:fence")]);
    assert!(bt.windows(2).all(|w| w[0] < w[1]), "{bt:?}");
    assert!(pttl(&url, &kb[0]).await > 0);
}

/// One key through every kind of grant in turn (plain pipeline, handoff to a waiter, rw write,
/// downgrade (same token as the write), read, semaphore, force_release then a mutex, multi_lock, an election), the
/// namespace's counter deleted or set to "5" between some: its tokens strictly increase.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_increase_across_every_kind_of_grant() {
    let ns = test_namespace!();
    let url = shared_redis().url();
    let fence = format!("{ns}:fence");
    let ttl = Duration::from_secs(3);
    let a = client(&url, &ns, ttl, Duration::from_millis(300), true).await;
    let b = client(&url, &ns, ttl, Duration::from_millis(300), true).await;
    let mut t: Vec<(&str, u64)> = Vec::new();
    // Another key draws from the same counter in between.
    let other = |c: &distlock::LockClient| c.mutex("other");
    let g = a.mutex("k").lock().await.unwrap();
    t.push(("plain", g.fencing_token()));
    let waiting = tokio::spawn(b.mutex("k").lock());
    until_queued(&url, &ns, "k", 1).await;
    g.release().await.unwrap();
    let g = waiting.await.unwrap().unwrap();
    t.push(("handoff", g.fencing_token()));
    cmd(&url, &["DEL", &fence]).await;
    g.release().await.unwrap();
    other(&a).lock().await.unwrap().release().await.unwrap();
    let w = a.rw_lock("k").write().await.unwrap();
    t.push(("write", w.fencing_token()));
    let r = w.downgrade().await.unwrap();
    t.push(("downgrade", r.fencing_token()));
    let r2 = b.rw_lock("k").read().await.unwrap();
    t.push(("read", r2.fencing_token()));
    drop(r);
    r2.release().await.unwrap();
    sleep(Duration::from_millis(100)).await;
    cmd(&url, &["SET", &fence, "5"]).await;
    let s = a.semaphore("k", 2).acquire().await.unwrap();
    t.push(("sem", s.fencing_token()));
    s.release().await.unwrap();
    let g = a.mutex("k").lock().await.unwrap();
    t.push(("plain2", g.fencing_token()));
    std::mem::forget(g);
    b.force_release("k").await.unwrap();
    cmd(&url, &["PEXPIRE", &fence, "1"]).await;
    sleep(Duration::from_millis(5)).await;
    let g = b.mutex("k").lock().await.unwrap();
    t.push(("after force", g.fencing_token()));
    g.release().await.unwrap();
    let m = a.multi_lock(["k", "other"]).lock().await.unwrap();
    for (k, tok) in m.fencing_tokens() {
        if k == "k" {
            t.push(("multi", tok));
        }
    }
    drop(m);
    sleep(Duration::from_millis(100)).await;
    let e = b.election("k").campaign("v").await.unwrap();
    t.push(("election", e.term()));
    e.resign().await.unwrap();
    let g = a.mutex("k").lock().await.unwrap();
    t.push(("plain3", g.fencing_token()));
    g.release().await.unwrap();
    a.shutdown().await;
    b.shutdown().await;
    eprintln!("{t:?}");
    // A downgrade keeps the writer's token (rw_lock.rs): the one pair allowed to be equal.
    assert!(
        t.windows(2)
            .all(|w| w[0].1 < w[1].1 || (w[1].0 == "downgrade" && w[0].1 == w[1].1)),
        "tokens not increasing: {t:?}"
    );
}

/// A waiter whose client is blackholed while queued (it will never come back): after the
/// holder releases, a newcomer is granted within the dead waiter's liveness bound (its TTL,
/// 2 s, plus a handoff lease), not later.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dead_waiter_does_not_block_newcomer_past_its_bound() {
    let ns = test_namespace!();
    let url = shared_redis().url();
    let port = shared_redis().port();
    let ttl = Duration::from_secs(2);
    let proxy = Proxy::start(port);
    let holder = client(&url, &ns, ttl, Duration::from_millis(300), true).await;
    let dead = client(
        &format!("redis://127.0.0.1:{}/", proxy.port()),
        &ns,
        ttl,
        Duration::from_millis(300),
        true,
    )
    .await;
    let newcomer = client(&url, &ns, ttl, Duration::from_millis(300), true).await;
    let g = holder.mutex("k").lock().await.unwrap();
    let w = tokio::spawn(dead.mutex("k").lock());
    until_queued(&url, &ns, "k", 1).await;
    let queued_at = Instant::now();
    proxy.blackhole();
    w.abort();
    cmd(&url, &["DEL", &format!("{ns}:fence")]).await;
    g.release().await.unwrap();
    let got = timeout(Duration::from_secs(6), newcomer.mutex("k").lock()).await;
    let took = queued_at.elapsed();
    let ok = matches!(got, Ok(Ok(_)));
    drop(got);
    holder.shutdown().await;
    newcomer.shutdown().await;
    eprintln!("newcomer granted: {ok} after {took:?} from the waiter's queueing");
    assert!(
        ok && took < ttl + Duration::from_millis(1200),
        "{ok} {took:?}"
    );
}

/// The documented window made certain: a warm client behind a proxy that delays replies by
/// 40 ms; on a namespace whose counter was just deleted, lock() is cancelled at 10 ms, after
/// the pipeline ran (SET NX, INCR made the counter) and before the script. Counts how often the
/// counter is left without a TTL, checks the next acquire (through the pipeline) repairs it,
/// and that the cancelled claim's hold does not outlive the cancel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_between_pipeline_and_script_counter_repaired() {
    let ns = test_namespace!();
    let url = shared_redis().url();
    let fence = format!("{ns}:fence");
    let proxy = Proxy::start(shared_redis().port());
    let ttl = Duration::from_secs(5);
    let slow = client(
        &format!("redis://127.0.0.1:{}/", proxy.port()),
        &ns,
        ttl,
        Duration::from_millis(300),
        true,
    )
    .await;
    let other = client(&url, &ns, ttl, Duration::from_millis(300), true).await;
    slow.mutex("warm")
        .lock()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let (mut no_ttl, runs) = (0, 8);
    let mut bad = Vec::new();
    for i in 0..runs {
        cmd(&url, &["DEL", &fence]).await;
        proxy.delay_replies(
            crate::support::proxy::Which::Commands,
            Duration::from_millis(40),
        );
        let key = format!("k{i}");
        let r = timeout(Duration::from_millis(10), slow.mutex(key.as_str()).lock()).await;
        assert!(r.is_err(), "granted in 10 ms through a 40 ms delay");
        sleep(Duration::from_millis(60)).await;
        proxy.pass();
        let p = pttl(&url, &fence).await;
        if p == -1 {
            no_ttl += 1;
        }
        // The cancelled claim's key: free at once (its hold deleted), in under a second.
        let t0 = Instant::now();
        match timeout(Duration::from_secs(3), other.mutex(key.as_str()).lock()).await {
            Ok(Ok(g)) => {
                if t0.elapsed() > Duration::from_secs(1) {
                    bad.push(format!("{key} granted only after {:?}", t0.elapsed()));
                }
                g.release().await.unwrap();
            }
            other => bad.push(format!("{key}: {:?}", other.map(|r| r.map(|_| ())))),
        }
        let after = pttl(&url, &fence).await;
        eprintln!("try {i}: counter PTTL after the cancel {p}, after the next acquire {after}");
        if after <= 0 {
            bad.push(format!(
                "try {i}: counter PTTL {after} after the next acquire"
            ));
        }
    }
    slow.shutdown().await;
    other.shutdown().await;
    until_only_fences(&url, &ns).await;
    eprintln!("counter left without TTL in {no_ttl} of {runs} cancels");
    assert!(bad.is_empty(), "{bad:#?}");
}

/// Every fencing counter of `ns` (the namespace's, or per-lock ones) expires now,
/// as it does an hour after it (re)started.
async fn expire_counters(url: &str, ns: &str) {
    for k in keys_in(url, ns).await {
        if k.ends_with(":fence") {
            cmd(url, &["PEXPIRE", &k, "1"]).await;
        }
    }
    sleep(Duration::from_millis(10)).await;
}

/// force_release of a key held since early in the counter's life, at a moment the counter has
/// expired (an hour after it started, busy or not): another key's tokens must not go back.
/// (force_release lifted a missing counter to the released hold's token, `lift_fence`; with one
/// counter per namespace that set it below tokens other keys drew since.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_after_counter_expiry_keeps_other_keys_tokens_increasing() {
    force_release_after_counter_expiry(test_namespace!(), false).await;
}

/// The same with a read-write lock's holder force-released (its token lifts the counter) and a
/// semaphore on the other key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_rw_after_counter_expiry_keeps_other_keys_tokens_increasing() {
    force_release_after_counter_expiry(test_namespace!(), true).await;
}

/// x held (a mutex, or with `rw` a read-write lock's writer), y taken and released five times
/// (a mutex, or a semaphore), the counter expired, x force-released: y's next token is above
/// its last.
async fn force_release_after_counter_expiry(ns: String, rw: bool) {
    let url = shared_redis().url();
    let ttl = Duration::from_secs(5);
    let a = client(&url, &ns, ttl, Duration::from_millis(300), true).await;
    let b = client(&url, &ns, ttl, Duration::from_millis(300), true).await;
    let (tx, x): (u64, Box<dyn std::any::Any + Send>) = if rw {
        let x = a.rw_lock("x").write().await.unwrap();
        (x.fencing_token(), Box::new(x))
    } else {
        // x's grant goes by the script (the counter is new), which records its token on the
        // hold.
        cmd(&url, &["DEL", &format!("{ns}:fence")]).await;
        let x = a.mutex("x").lock().await.unwrap();
        (x.fencing_token(), Box::new(x))
    };
    let y = || async {
        if rw {
            let g = b.semaphore("y", 2).acquire().await.unwrap();
            let t = g.fencing_token();
            g.release().await.unwrap();
            t
        } else {
            let g = b.mutex("y").lock().await.unwrap();
            let t = g.fencing_token();
            g.release().await.unwrap();
            t
        }
    };
    let mut y_last = 0;
    for _ in 0..5 {
        y_last = y().await;
    }
    expire_counters(&url, &ns).await;
    let forced = b.force_release("x").await.unwrap();
    let fence = cmd(&url, &["GET", &format!("{ns}:fence")]).await;
    eprintln!("counter after force_release: {fence:?}");
    let ty = y().await;
    drop(x);
    a.shutdown().await;
    b.shutdown().await;
    eprintln!("x held with {tx}; y's last {y_last}; force_release(x) {forced:?}; then y got {ty}");
    assert!(
        ty > y_last,
        "y's token went back: {y_last} then {ty} (x's was {tx})"
    );
}

/// A holder releases while a waiter is queued and the namespace's counter is not a number
/// (one bad `<ns>:fence` reaches every lock of the namespace): the release fails with a clear
/// error (no panic, no two holders) and changes nothing, so the waiter keeps its place in the
/// queue; once the counter is deleted, the waiter is granted by the time the released hold's
/// lease (4 s) runs out. (Before the token was drawn ahead of the queue's pop, the failed
/// handoff had taken the waiter off the queue.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn garbage_counter_at_handoff_keeps_the_waiters_place() {
    let ns = test_namespace!();
    let url = shared_redis().url();
    let fence = format!("{ns}:fence");
    let ttl = Duration::from_secs(4);
    let holder = client(&url, &ns, ttl, Duration::from_millis(300), true).await;
    let waiter = client(&url, &ns, ttl, Duration::from_millis(300), true).await;
    let g = holder.mutex("k").lock().await.unwrap();
    let w = tokio::spawn(waiter.mutex("k").lock());
    until_queued(&url, &ns, "k", 1).await;
    cmd(&url, &["SET", &fence, "hello"]).await;
    let released = g.release().await;
    let err = released.expect_err("a release that must hand on through a counter not ours");
    assert!(format!("{err:?}").contains("not an integer"), "{err:?}");
    let queue = cmd(&url, &["LLEN", &format!("{ns}:{{k}}:q")]).await;
    assert_eq!(
        queue,
        redis::Value::Int(1),
        "the failed handoff took the waiter off the queue"
    );
    cmd(&url, &["DEL", &fence]).await;
    let t0 = Instant::now();
    let got = timeout(ttl + Duration::from_secs(2), w)
        .await
        .expect("the waiter was not granted after the lease ran out")
        .unwrap()
        .unwrap();
    eprintln!(
        "waiter granted {:?} after the counter was deleted",
        t0.elapsed()
    );
    got.release().await.unwrap();
    holder.shutdown().await;
    waiter.shutdown().await;
}

/// An error with its causes, as a user's error report prints them.
fn chain(e: &distlock::Error) -> String {
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        text.push_str(&format!(": {c}"));
        cause = c.source();
    }
    text
}

/// A counter past 2^53 (set by hand: real ones start near 1.8e15 and gain one a grant) cannot
/// be counted on by the scripts, whose numbers are doubles: every kind of grant fails with an
/// error that names the counter, none hands out a token (before, `i64::MAX` made the first
/// grant's token wrap negative, and one at 2^60 repeated tokens); once it is deleted, the
/// next grant comes at once, with a token above server time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counter_past_exact_numbers_fails_clearly_and_grants_nothing() {
    let ns = test_namespace!();
    let url = shared_redis().url();
    let a = client(
        &url,
        &ns,
        Duration::from_secs(10),
        Duration::from_millis(300),
        true,
    )
    .await;
    let fence = format!("{ns}:fence");
    let mut seen = Vec::new();
    for value in [
        "9223372036854775807",
        "1152921504606846976",
        "9007199254740993",
    ] {
        for what in ["mutex", "try", "write", "read", "permit"] {
            cmd(&url, &["SET", &fence, value]).await;
            let key = format!("k-{what}");
            let took = timeout(Duration::from_secs(5), async {
                match what {
                    "mutex" => a.mutex(&key).lock().await.map(|g| g.fencing_token()),
                    "try" => a.mutex(&key).try_lock().await.map(|g| g.fencing_token()),
                    "write" => a.rw_lock(&key).write().await.map(|g| g.fencing_token()),
                    "read" => a.rw_lock(&key).read().await.map(|g| g.fencing_token()),
                    _ => a
                        .semaphore(&key, 2)
                        .acquire()
                        .await
                        .map(|g| g.fencing_token()),
                }
            })
            .await;
            seen.push(match took {
                Ok(Ok(token)) => format!("{what} at {value}: granted token {token}"),
                Ok(Err(e)) if chain(&e).contains("fencing counter") => String::new(),
                Ok(Err(e)) => format!("{what} at {value}: unclear error: {}", chain(&e)),
                Err(_) => format!("{what} at {value}: still waiting after 5 s"),
            });
        }
    }
    cmd(&url, &["DEL", &fence]).await;
    let again = timeout(Duration::from_secs(3), a.mutex("k-mutex").lock()).await;
    let again = match again {
        Ok(Ok(g)) => {
            let token = g.fencing_token();
            g.release().await.unwrap();
            Ok(token)
        }
        other => Err(format!("{:?}", other.map(|r| r.map(|g| g.fencing_token())))),
    };
    a.shutdown().await;
    let wrong: Vec<_> = seen.into_iter().filter(|s| !s.is_empty()).collect();
    assert!(wrong.is_empty(), "{wrong:#?}");
    let token = again.expect("granted once the counter is deleted");
    assert!(
        token > 1 << 50 && token < 1 << 53,
        "a restarted counter's token is server time in µs: {token}"
    );
}
