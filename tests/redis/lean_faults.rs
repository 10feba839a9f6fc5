//! Faults against the lean Redis mutex (one string value per hold, the plain-command
//! acquire, the `q` mark on the fencing counter, coalesced calls), against a real
//! `redis-server`.
#![cfg(feature = "redis")]

use std::time::Duration;

use crate::support::proxy::Proxy;
use crate::support::redis::{client, connection, until_queued};
use crate::support::server::redis::shared_redis;
use tokio::time::{sleep, timeout};

fn via(proxy: &Proxy) -> String {
    format!("redis://127.0.0.1:{}/", proxy.port())
}

/// A holder dies while a waiter is queued; the waiter's own re-check at the dead holder's lease
/// end is late (its host is briefly unreachable). A newcomer's `try_lock` in that window must
/// not take the lock past the queued waiter: the lock goes to the head of the queue.
/// With `counter_expired`, the fencing counter reached the end of its life (`FENCE_TTL`, an
/// hour after it (re)started; simulated with `PEXPIRE`) while the waiter was queued, which must
/// change nothing.
async fn newcomer_after_a_dead_holder(counter_expired: bool) {
    let ns = format!("{}.{counter_expired}", test_namespace!());
    let url = shared_redis().url();
    let pa = Proxy::start(shared_redis().port());
    let pb = Proxy::start(shared_redis().port());
    let (ttl, handoff) = (Duration::from_millis(900), Duration::from_millis(300));
    let a = client(&via(&pa), &ns, ttl, handoff, true).await;
    let b = client(&via(&pb), &ns, Duration::from_secs(10), handoff, true).await;
    let c = client(&url, &ns, ttl, handoff, true).await;

    let held = a.mutex("k").lock().await.unwrap();
    let waiter = tokio::spawn(b.mutex("k").lock());
    until_queued(&url, &ns, "k", 1).await;
    if counter_expired {
        let _: i64 = redis::cmd("PEXPIRE")
            .arg(format!("{ns}:fence"))
            .arg(1)
            .query_async(&mut connection(&url).await)
            .await
            .unwrap();
        sleep(Duration::from_millis(20)).await;
    }
    // A's host dies (its renewals stop); B's is unreachable for a moment.
    pa.blackhole();
    pb.blackhole();
    sleep(ttl + Duration::from_millis(400)).await;
    let newcomer = c.mutex("k").try_lock().await;
    let barged = newcomer.is_ok();
    drop(newcomer);
    // The partitions heal as TCP sees it: the old connections are dead, new ones work.
    pb.heal();
    pa.heal();
    let b_guard = timeout(Duration::from_secs(10), waiter).await;
    assert!(
        !barged,
        "a newcomer took the lock past a live queued waiter (counter expired: {counter_expired})"
    );
    let b_guard = b_guard
        .expect("the waiter was never granted")
        .unwrap()
        .unwrap();
    drop(b_guard);
    drop(held);
    for cl in [a, b, c] {
        cl.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomer_does_not_barge_past_a_queued_waiter_when_the_holder_dies() {
    newcomer_after_a_dead_holder(false).await;
}

/// The `q` mark lives on the fencing counter, which expires an hour after its last use; once
/// it has, nothing marks the waiter still queued, so an acquire that finds the counter
/// restarted looks at the queue (before that fix the uncontended path took the free key past
/// the waiter).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomer_does_not_barge_past_a_queued_waiter_after_the_counter_expired() {
    newcomer_after_a_dead_holder(true).await;
}

/// A small deterministic generator (no rand in the dev-dependencies).
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// What the test knows of one key: whether someone in this process holds it, and the last
/// fencing token granted there.
#[derive(Default)]
struct Seen {
    held: bool,
    last: u64,
}

/// Many tasks of three clients lock a few keys at once (so each client's acquire and release
/// calls are coalesced into batches), a good share of them cancelled at random moments
/// (before, while or after their call was queued), one key in ten being a foreign LIST
/// (its claims fail, alone in their batches). Asserts: never two holders at once, tokens
/// strictly increasing per key, every foreign claim an error (not a hang, not a grant),
/// every other claim either granted or cancelled, and nothing left behind but fencing
/// counters, each with a TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalesced_batches_with_cancellations_and_a_failing_claim_keep_the_contract() {
    stress(test_namespace!(), None).await;
}

/// The same with the clients' connections cut every 150 ms (batches in flight fail and are
/// sent again, in doubt); a claim may then also fail with a transient error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalesced_batches_cut_mid_flight_keep_the_contract() {
    let proxy = Proxy::start(shared_redis().port());
    stress(test_namespace!(), Some(proxy)).await;
}

async fn stress(ns: String, cuts: Option<Proxy>) {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    let url = shared_redis().url();
    let mut con = connection(&url).await;
    let _: () = redis::cmd("RPUSH")
        .arg(format!("{ns}:{{bad}}"))
        .arg("not a lock")
        .query_async(&mut con)
        .await
        .unwrap();
    let (ttl, handoff) = (Duration::from_secs(3), Duration::from_millis(300));
    // The library is loaded over a direct connection (see above).
    client(&url, &ns, ttl, handoff, true).await.shutdown().await;
    let at = cuts.as_ref().map_or(url.clone(), via);
    let clients = [
        client(&at, &ns, ttl, handoff, true).await,
        client(&at, &ns, ttl, handoff, true).await,
        client(&at, &ns, ttl, handoff, true).await,
    ];
    let done = Arc::new(AtomicBool::new(false));
    let cutter = cuts.map(|proxy| {
        let done = done.clone();
        tokio::spawn(async move {
            let mut n = 0;
            while !done.load(Ordering::SeqCst) {
                sleep(Duration::from_millis(150)).await;
                proxy.cut();
                sleep(Duration::from_millis(5)).await;
                proxy.pass();
                n += 1;
            }
            (proxy, n)
        })
    });
    let cutting = cutter.is_some();
    let keys = ["k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7", "k8"];
    let seen: Arc<HashMap<&str, Mutex<Seen>>> =
        Arc::new(keys.iter().map(|k| (*k, Mutex::default())).collect());
    let before = fcalls(&url).await;
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for round in 0..10 {
        let mut tasks = Vec::new();
        for i in 0..300 {
            let r = next(&mut state);
            let key = if r.is_multiple_of(10) {
                "bad"
            } else {
                keys[(r / 10 % 9) as usize]
            };
            let mutex = clients[i % 3].mutex(key);
            let patience = Duration::from_millis(next(&mut state) % 200);
            let hold = Duration::from_micros(next(&mut state) % 2000);
            let seen = seen.clone();
            tasks.push(tokio::spawn(async move {
                match timeout(patience, mutex.lock()).await {
                    Err(_) => "cancelled",
                    Ok(Err(e)) if key == "bad" && !e.is_transient() => {
                        assert!(!e.is_would_block(), "{e:?}");
                        "foreign"
                    }
                    Ok(Err(e)) if cutting && e.is_transient() => "transient",
                    Ok(Err(e)) => panic!("round {round}: {key}: {e:?}"),
                    Ok(Ok(guard)) => {
                        assert_ne!(key, "bad", "a claim on a foreign LIST was granted");
                        let token = guard.fencing_token();
                        {
                            let mut s = seen[key].lock().unwrap();
                            assert!(!s.held, "two holders of {key} at once");
                            assert!(token > s.last, "{key}: token {token} after {}", s.last);
                            s.held = true;
                            s.last = token;
                        }
                        sleep(hold).await;
                        seen[key].lock().unwrap().held = false;
                        let released = guard.release().await;
                        assert!(cutting || released.is_ok(), "{released:?}");
                        "granted"
                    }
                }
            }));
        }
        for t in tasks {
            *counts.entry(t.await.unwrap()).or_default() += 1;
        }
    }
    done.store(true, Ordering::SeqCst);
    if let Some(cutter) = cutter {
        let (proxy, n) = cutter.await.unwrap();
        eprintln!("{n} cuts");
        proxy.pass();
        // Leases of releases that failed run out.
        sleep(ttl).await;
    }
    let after = fcalls(&url).await;
    eprintln!("{counts:?}; FCALLs on the server: {}", after - before);
    assert!(counts.contains_key("granted") && counts.contains_key("foreign"));
    for c in clients {
        c.shutdown().await;
    }
    // The foreign key is the user's: gone, nothing but counters may be left, and they expire.
    let _: () = redis::cmd("DEL")
        .arg(format!("{ns}:{{bad}}"))
        .query_async(&mut con)
        .await
        .unwrap();
    crate::support::redis::until_only_fences(&url, &ns).await;
    for key in crate::support::redis::keys_in(&url, &ns).await {
        let pttl: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query_async(&mut con)
            .await
            .unwrap();
        assert!(pttl > 0, "{key} left with PTTL {pttl}");
    }
}

/// FCALL calls the server has run so far (INFO commandstats).
async fn fcalls(url: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut connection(url).await)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_fcall:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// A client built in one runtime and used from another too (the renewal engine restarts on
/// whichever runtime calls next once its own is gone): that other runtime shuts down while
/// its calls are out, one sent and others queued behind it to be coalesced. The client's
/// later calls, from its own runtime, must still be sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_shut_down_mid_call_does_not_stall_the_clients_later_calls() {
    let ns = test_namespace!();
    let url = shared_redis().url();
    let (ttl, handoff) = (Duration::from_secs(2), Duration::from_millis(300));
    let c = client(&url, &ns, ttl, handoff, true).await;
    let other = c.clone();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            for i in 0..50 {
                tokio::spawn(other.mutex(format!("r{i}")).lock());
            }
            // Each task makes its call (one goes, the others queue behind it), then the
            // runtime is dropped with them all out.
            for _ in 0..3 {
                tokio::task::yield_now().await;
            }
        });
        drop(rt);
    })
    .join()
    .unwrap();
    let later = timeout(Duration::from_secs(10), c.mutex("later").lock()).await;
    assert!(
        later.is_ok(),
        "the client's acquire never returned once another runtime went away mid-call"
    );
    drop(later);
    timeout(Duration::from_secs(10), c.shutdown())
        .await
        .expect("shutdown hung");
}

/// An acquisition dropped while its call waits in the coalescing lane: the cleanup waits for
/// that call at most its bound (the claim's TTL, at least 5 s), then releases. Behind a first
/// call whose replies come 6 s late (its attempt times out and is sent again), the queued call
/// goes only when the first is answered, after the release ran: it then takes the lock for no
/// one. Asserts that nothing holds the key once its only claim was dropped and released (on
/// `main`, whose call went at once, its hold ends with that release).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_claim_queued_in_the_lane_does_not_take_the_lock_after_its_release() {
    use crate::support::proxy::Which;

    let ns = test_namespace!();
    let url = shared_redis().url();
    let proxy = Proxy::start(shared_redis().port());
    let (ttl, handoff) = (Duration::from_secs(3), Duration::from_millis(300));
    // The function library is loaded over a direct connection: its text says "subscribed",
    // which would make the proxy count x's command connection as a pub/sub one.
    client(&url, &ns, ttl, handoff, true).await.shutdown().await;
    let x = client(&via(&proxy), &ns, ttl, handoff, true).await;
    // Warm the connection, then slow the server's replies on it.
    drop(x.mutex("warm").lock().await.unwrap());
    sleep(Duration::from_millis(200)).await;
    proxy.delay_replies(Which::Commands, Duration::from_millis(6000));
    let first = tokio::spawn(x.mutex("a").lock());
    sleep(Duration::from_millis(50)).await;
    // Queued behind the first call, then dropped.
    let dropped = timeout(Duration::from_millis(100), x.mutex("k").lock()).await;
    assert!(dropped.is_err(), "{dropped:?}");
    let start = tokio::time::Instant::now();
    let mut con = connection(&url).await;
    let mut held_at = Vec::new();
    while start.elapsed() < Duration::from_secs(16) {
        let n: i64 = redis::cmd("EXISTS")
            .arg(format!("{ns}:{{k}}"))
            .query_async(&mut con)
            .await
            .unwrap();
        // Its release is sent 5 s after the drop (the cleanup's bound on the call it waits
        // for): from then on nothing may hold the key.
        if n == 1 && start.elapsed() > Duration::from_secs(6) {
            held_at.push(start.elapsed().as_millis());
        }
        sleep(Duration::from_millis(100)).await;
    }
    proxy.pass();
    let _ = timeout(Duration::from_secs(10), first).await;
    let _ = timeout(Duration::from_secs(10), x.shutdown()).await;
    assert!(
        held_at.is_empty(),
        "`k` was held (ms after its claim was dropped: {:?}..{:?}) though its one claim was dropped and released",
        held_at.first(),
        held_at.last()
    );
}

/// A single server's fencing counter serves the whole namespace (`<ns>:fence`): a waiter queued
/// on one key puts no mark on it (a mark would send every lock of the namespace to the acquire
/// script), so another key is still taken by the plain commands (its hold is the bare owner
/// token), and the counter keeps its expiry throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_on_one_key_leaves_the_namespace_counter_unmarked() {
    let ns = test_namespace!();
    let url = shared_redis().url();
    let (ttl, handoff) = (Duration::from_secs(2), Duration::from_millis(300));
    let a = client(&url, &ns, ttl, handoff, true).await;
    let b = client(&url, &ns, ttl, handoff, true).await;
    let fence = format!("{ns}:fence");
    let mut con = connection(&url).await;
    for i in 0..5 {
        let held = a.mutex("k").lock().await.unwrap();
        let waiter = tokio::spawn(b.mutex("k").lock());
        until_queued(&url, &ns, "k", 1).await;
        let (value, pttl): (String, i64) = redis::pipe()
            .cmd("GET")
            .arg(&fence)
            .cmd("PTTL")
            .arg(&fence)
            .query_async(&mut con)
            .await
            .unwrap();
        assert!(
            value.parse::<u64>().is_ok(),
            "round {i}: the namespace's counter is marked: {value:?}"
        );
        assert!(pttl > 0, "round {i}: the counter has no expiry ({pttl})");
        let other = a.mutex(format!("other{i}")).lock().await.unwrap();
        let hold: String = redis::cmd("GET")
            .arg(format!("{ns}:{{other{i}}}"))
            .query_async(&mut con)
            .await
            .unwrap();
        assert!(
            !hold.contains(' '),
            "round {i}: a free key was taken by the script, not the plain commands: {hold:?}"
        );
        other.release().await.unwrap();
        held.release().await.unwrap();
        waiter.await.unwrap().unwrap().release().await.unwrap();
    }
    a.shutdown().await;
    b.shutdown().await;
}
