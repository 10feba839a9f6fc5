//! Attacks on plain-command mutex acquire (`src/backend/redis/fast.rs`) against a
//! real `redis-server`: kinds, fencing with a counter tampered with, cancellation mid-pipeline,
//! inspect/force_release on plain holds, and nothing left without an expiry.
#![cfg(feature = "redis")]

use std::time::Duration;

use crate::support::proxy::{Proxy, Which};
use crate::support::redis::{client, connection, keys_in, until_queued};
use crate::support::server::redis::shared_redis;
use distlock::ErrorKind;
use tokio::time::{sleep, timeout, Instant};

fn via(proxy: &Proxy) -> String {
    format!("redis://127.0.0.1:{}/", proxy.port())
}

async fn cmd_i64(url: &str, args: &[&str]) -> i64 {
    let mut c = redis::cmd(args[0]);
    for a in &args[1..] {
        c.arg(*a);
    }
    c.query_async(&mut connection(url).await).await.unwrap()
}

/// Every key of `ns` with no expiry (PTTL -1).
async fn immortal(url: &str, ns: &str) -> Vec<String> {
    let mut out = Vec::new();
    for k in keys_in(url, ns).await {
        if cmd_i64(url, &["PTTL", &k]).await == -1 {
            out.push(k);
        }
    }
    out
}

/// try_lock on a key held as a read-write lock or a semaphore says KindMismatch, not WouldBlock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_lock_on_another_kind_says_so() {
    let ns = test_namespace!();
    let url = shared_redis().url();
    let ttl = Duration::from_secs(5);
    let a = client(&url, &ns, ttl, Duration::from_millis(300), true).await;
    let b = client(&url, &ns, ttl, Duration::from_millis(300), true).await;
    let r = a.rw_lock("rw").read().await.unwrap();
    let s = a.semaphore("sem", 2).acquire().await.unwrap();
    let w = a.rw_lock("wr").write().await.unwrap();
    let mut bad = Vec::new();
    for key in ["rw", "sem", "wr"] {
        let got = b.mutex(key).try_lock().await;
        match &got {
            Err(e) if e.kind() == ErrorKind::KindMismatch => {}
            other => bad.push(format!("{key}: {:?}", other.as_ref().map(|_| "granted"))),
        }
        drop(got);
        // And lock() must not wait (or take it) either.
        let got = timeout(Duration::from_secs(2), b.mutex(key).lock()).await;
        match &got {
            Ok(Err(e)) if e.kind() == ErrorKind::KindMismatch => {}
            Ok(other) => bad.push(format!(
                "lock {key}: {:?}",
                other.as_ref().map(|_| "granted")
            )),
            Err(_) => bad.push(format!("lock {key}: still waiting after 2 s")),
        }
    }
    drop((r, s, w));
    a.shutdown().await;
    b.shutdown().await;
    assert!(bad.is_empty(), "{bad:#?}");
}

/// Fencing tokens strictly increase across grants while the counter is deleted, set by hand to
/// a small number, or expired between them (each grant through the plain pipeline).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_increase_when_the_counter_is_tampered_with() {
    let ns = test_namespace!();
    let url = shared_redis().url();
    let ttl = Duration::from_secs(5);
    let a = client(&url, &ns, ttl, Duration::from_millis(300), true).await;
    let b = client(&url, &ns, ttl, Duration::from_millis(300), true).await;
    let fence = format!("{ns}:fence");
    let mut tokens = Vec::new();
    let mut what = Vec::new();
    for (i, tamper) in [
        "none", "del", "set5", "set1", "expire", "none", "set0", "del",
    ]
    .iter()
    .enumerate()
    {
        let c = if i % 2 == 0 { &a } else { &b };
        let g = c.mutex("k").lock().await.unwrap();
        tokens.push(g.fencing_token());
        what.push(*tamper);
        match *tamper {
            "del" => {
                cmd_i64(&url, &["DEL", &fence]).await;
            }
            "set5" => {
                let _: () = redis::cmd("SET")
                    .arg(&fence)
                    .arg(5)
                    .query_async(&mut connection(&url).await)
                    .await
                    .unwrap();
            }
            "set1" => {
                let _: () = redis::cmd("SET")
                    .arg(&fence)
                    .arg(1)
                    .query_async(&mut connection(&url).await)
                    .await
                    .unwrap();
            }
            "set0" => {
                let _: () = redis::cmd("SET")
                    .arg(&fence)
                    .arg(0)
                    .query_async(&mut connection(&url).await)
                    .await
                    .unwrap();
            }
            "expire" => {
                cmd_i64(&url, &["PEXPIRE", &fence, "1"]).await;
                sleep(Duration::from_millis(20)).await;
            }
            _ => {}
        }
        g.release().await.unwrap();
    }
    let left = immortal(&url, &ns).await;
    a.shutdown().await;
    b.shutdown().await;
    eprintln!("tokens {tokens:?} after {what:?}");
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens not strictly increasing: {tokens:?} (tamper before next: {what:?})"
    );
    // A counter SET by hand has no expiry; the next grant must give it one.
    assert!(left.is_empty(), "keys without an expiry: {left:?}");
}

/// lock() dropped while its pipeline is in flight (replies delayed 1.5 s; TTL 8 s): once the
/// reply came and the cleanup ran, nothing holds the key, long before the TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_cancelled_mid_pipeline_leaves_nothing() {
    let ns = test_namespace!();
    let url = shared_redis().url();
    let proxy = Proxy::start(shared_redis().port());
    let ttl = Duration::from_secs(8);
    client(&url, &ns, ttl, Duration::from_millis(300), true)
        .await
        .shutdown()
        .await;
    let x = client(&via(&proxy), &ns, ttl, Duration::from_millis(300), true).await;
    drop(x.mutex("warm").lock().await.unwrap());
    drop(x.mutex("k").lock().await.unwrap().release().await);
    sleep(Duration::from_millis(200)).await;
    proxy.delay_replies(Which::Commands, Duration::from_millis(1500));
    let dropped = timeout(Duration::from_millis(100), x.mutex("k").lock()).await;
    assert!(dropped.is_err(), "{dropped:?}");
    let start = Instant::now();
    sleep(Duration::from_millis(4000)).await;
    let lock_exists = cmd_i64(&url, &["EXISTS", &format!("{ns}:{{k}}")]).await;
    let y = client(&url, &ns, ttl, Duration::from_millis(300), true).await;
    let got = y.mutex("k").try_lock().await;
    let ok = got.is_ok();
    drop(got);
    proxy.pass();
    let _ = timeout(Duration::from_secs(10), x.shutdown()).await;
    y.shutdown().await;
    assert!(
        lock_exists == 0 && ok,
        "{:?} after a lock() dropped mid-pipeline: key exists {lock_exists}, try_lock ok {ok}",
        start.elapsed()
    );
}

/// A plain hold with a waiter queued behind it: inspect shows the holder and the waiter, and
/// force_release hands the lock to the waiter at once (not after the plain holder's TTL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_of_a_plain_hold_grants_the_waiter() {
    let ns = test_namespace!();
    let url = shared_redis().url();
    let (ttl, handoff) = (Duration::from_secs(20), Duration::from_millis(300));
    let a = client(&url, &ns, Duration::from_secs(3), handoff, true).await;
    let b = client(&url, &ns, ttl, handoff, true).await;
    let c = client(&url, &ns, ttl, handoff, true).await;
    // Warm the counter so that the next acquire is a bare plain hold.
    drop(c.mutex("k").lock().await.unwrap().release().await);
    sleep(Duration::from_millis(100)).await;
    let held = a.mutex("k").lock().await.unwrap();
    let raw: Option<String> = redis::cmd("GET")
        .arg(format!("{ns}:{{k}}"))
        .query_async(&mut connection(&url).await)
        .await
        .unwrap();
    eprintln!("hold value {raw:?}, token {}", held.fencing_token());
    let seen = c.inspect("k").await.unwrap();
    eprintln!("inspect plain: {seen:?}");
    let waiter = tokio::spawn(b.mutex("k").lock());
    until_queued(&url, &ns, "k", 1).await;
    let seen2 = c.inspect("k").await.unwrap();
    eprintln!("inspect queued: {seen2:?}");
    let removed = c.force_release("k").await.unwrap();
    eprintln!("force_release: {removed:?}");
    let start = Instant::now();
    let got = timeout(Duration::from_secs(5), waiter).await;
    let elapsed = start.elapsed();
    let ok = matches!(&got, Ok(Ok(Ok(_))));
    let token_b = match &got {
        Ok(Ok(Ok(g))) => Some(g.fencing_token()),
        _ => None,
    };
    drop(got);
    let lost = timeout(Duration::from_secs(5), held.lost()).await.is_ok();
    drop(held);
    for cl in [a, b, c] {
        cl.shutdown().await;
    }
    assert!(
        lost,
        "the force-released plain holder never learnt it lost the lock"
    );
    assert_eq!(seen.holders.len(), 1, "{seen:?}");
    assert_eq!(removed.removed.len(), 1, "{removed:?}");
    assert!(
        ok,
        "waiter not granted within 5 s of force_release ({elapsed:?})"
    );
    eprintln!("waiter token {token_b:?}");
}

/// A holder dies with a waiter queued; a newcomer's pipeline SETs the freed key and the
/// newcomer is then cut off, never settling. The waiter must get the lock no later than the
/// newcomer's own lease after its SET (plus slack), and tokens must increase.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_newcomer_delays_a_waiter_at_most_its_lease() {
    let ns = test_namespace!();
    let url = shared_redis().url();
    let pa = Proxy::start(shared_redis().port());
    let pn = Proxy::start(shared_redis().port());
    let pb = Proxy::start(shared_redis().port());
    let handoff = Duration::from_millis(300);
    let ttl_a = Duration::from_millis(900);
    let ttl_n = Duration::from_millis(1500);
    client(&url, &ns, ttl_a, handoff, true)
        .await
        .shutdown()
        .await;
    let a = client(&via(&pa), &ns, ttl_a, handoff, true).await;
    let b = client(&via(&pb), &ns, Duration::from_secs(10), handoff, true).await;
    let n = client(&via(&pn), &ns, ttl_n, handoff, true).await;
    drop(n.mutex("warm").lock().await.unwrap());
    let held = a.mutex("k").lock().await.unwrap();
    let ta = held.fencing_token();
    let waiter = tokio::spawn(b.mutex("k").lock());
    until_queued(&url, &ns, "k", 1).await;
    pa.blackhole();
    pb.blackhole();
    sleep(ttl_a + Duration::from_millis(400)).await;
    pn.swallow_replies(Which::Commands);
    let sent = Instant::now();
    let nc = tokio::spawn({
        let m = n.mutex("k");
        async move { m.try_lock().await }
    });
    sleep(Duration::from_millis(30)).await;
    pn.blackhole();
    pb.heal();
    let got = timeout(Duration::from_secs(10), waiter).await;
    let elapsed = sent.elapsed();
    let token_b = match &got {
        Ok(Ok(Ok(g))) => Some(g.fencing_token()),
        _ => None,
    };
    eprintln!(
        "waiter granted {elapsed:?} after the newcomer's pipeline; tokens A {ta} B {token_b:?}"
    );
    drop(got);
    nc.abort();
    drop(held);
    pa.heal();
    pn.heal();
    for cl in [a, b, n] {
        let _ = timeout(Duration::from_secs(10), cl.shutdown()).await;
    }
    let tb = token_b.expect("waiter never granted");
    assert!(tb > ta, "token went back: A {ta}, B {tb}");
    assert!(
        elapsed < ttl_n + Duration::from_millis(1000),
        "waiter delayed {elapsed:?} (newcomer lease {ttl_n:?})"
    );
    sleep(Duration::from_secs(2)).await;
    let left = immortal(&url, &ns).await;
    assert!(left.is_empty(), "keys without an expiry: {left:?}");
}

/// Two clients, one whose replies come 600 ms late (TTL 1 s, past half the TTL: its pipeline's
/// grants go to the script), the other direct, trying in a loop: the intervals each believes it
/// holds (grant returned .. it lets go, or its lease_left ends if sooner) never overlap, and tokens follow grant order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_replies_never_make_two_holders() {
    late_replies(600).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_later_than_the_ttl_never_make_two_holders() {
    late_replies(1200).await;
}

/// Who held, from when to when (by its own lease), with what token.
type Held = (char, Instant, Instant, u64);

async fn late_replies(delay_ms: u64) {
    use std::sync::{Arc, Mutex as StdMutex};
    let ns = format!("{}.{delay_ms}", test_namespace!());
    let url = shared_redis().url();
    let proxy = Proxy::start(shared_redis().port());
    let ttl = Duration::from_millis(1000);
    let handoff = Duration::from_millis(300);
    client(&url, &ns, ttl, handoff, false)
        .await
        .shutdown()
        .await;
    let a = client(&via(&proxy), &ns, ttl, handoff, false).await;
    let b = client(&url, &ns, ttl, handoff, false).await;
    drop(a.mutex("k").lock().await.unwrap().release().await);
    drop(b.mutex("k").lock().await.unwrap().release().await);
    proxy.delay_replies(Which::Commands, Duration::from_millis(delay_ms));
    let log: Arc<StdMutex<Vec<Held>>> = Arc::default();
    let end = Instant::now() + Duration::from_secs(5);
    let la = log.clone();
    let ma = a.mutex("k");
    let ta = tokio::spawn(async move {
        while Instant::now() < end {
            if let Ok(Ok(g)) = timeout(Duration::from_secs(5), ma.lock()).await {
                let (now, token) = (Instant::now(), g.fencing_token());
                let lease_end = now + g.lease_left();
                sleep(g.lease_left().min(Duration::from_millis(150))).await;
                // Its belief ends when it lets go (or at its lease's end, if sooner).
                let let_go = Instant::now().min(lease_end);
                drop(g);
                la.lock().unwrap().push(('a', now, let_go, token));
            }
        }
    });
    let lb = log.clone();
    let mb = b.mutex("k");
    let tb = tokio::spawn(async move {
        while Instant::now() < end {
            if let Ok(g) = mb.try_lock().await {
                let (now, token) = (Instant::now(), g.fencing_token());
                let lease_end = now + g.lease_left();
                sleep(Duration::from_millis(100)).await;
                let let_go = Instant::now().min(lease_end);
                let _ = g.release().await;
                lb.lock().unwrap().push(('b', now, let_go, token));
            }
            sleep(Duration::from_millis(5)).await;
        }
    });
    let _ = ta.await;
    let _ = tb.await;
    proxy.pass();
    let _ = timeout(Duration::from_secs(10), a.shutdown()).await;
    b.shutdown().await;
    let mut log = log.lock().unwrap().clone();
    log.sort_by_key(|e| e.1);
    let grants: Vec<(char, u64)> = log.iter().map(|e| (e.0, e.3)).collect();
    eprintln!("{} grants: {grants:?}", log.len());
    let mut bad = Vec::new();
    for w in log.windows(2) {
        if w[1].1 < w[0].2 && w[0].0 != w[1].0 {
            bad.push(format!(
                "{:?} overlaps {:?}",
                (w[0].0, w[0].3),
                (w[1].0, w[1].3)
            ));
        }
        if w[1].3 <= w[0].3 {
            bad.push(format!(
                "token order {:?} then {:?}",
                (w[0].0, w[0].3),
                (w[1].0, w[1].3)
            ));
        }
    }
    sleep(Duration::from_secs(3)).await;
    let left = immortal(&url, &ns).await;
    assert!(bad.is_empty(), "{bad:#?}");
    assert!(left.is_empty(), "keys without an expiry: {left:?}");
}
