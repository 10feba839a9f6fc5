//! Attacks on Redis elections: a Redis restart without data under an
//! observer and a leader, observers that must not poll, an operator's unlock of an election,
//! empty values, and a mutex taking a free election's key while candidates wait.
#![cfg(feature = "redis")]

use std::time::Duration;

use crate::support::observed::{observer, until};
use crate::support::proxy::Proxy;
use crate::support::redis::{client, commands, commands_since, connection, total_commands};
use crate::support::server::redis::{shared_redis, RedisServer};
use distlock::{ErrorKind, Leader, LockClient};
use futures::StreamExt;
use tokio::time::{sleep, timeout, Instant};

/// Redis restarts without its data under a leader with a long lease: the leader is gone at
/// once, so an observer must say nobody leads soon after the server is back (the hub's
/// reconnect tells every observer to read again), not only at the old lease's end; a new
/// leader's term is above the old one's; and the observer does not poll meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_sees_the_leader_gone_after_a_restart_without_data() {
    let ns = test_namespace!();
    let mut server = RedisServer::start();
    let url = server.url();
    let (ttl, handoff) = (Duration::from_secs(20), Duration::from_millis(300));
    let a = client(&url, &ns, ttl, handoff, true).await;
    let b = client(&url, &ns, ttl, handoff, true).await;
    let watcher = client(&url, &ns, ttl, handoff, true).await;
    let (mut rx, task) = observer(&watcher, "e");
    until(&mut rx, Duration::from_secs(3), "nobody", Option::is_none).await;
    let leading = a.election("e").campaign("a").await.unwrap();
    until(&mut rx, Duration::from_secs(3), "a", Option::is_some).await;

    server.restart_after(|| std::thread::sleep(Duration::from_millis(500)));
    let back = Instant::now();
    let (at, _) = until(
        &mut rx,
        Duration::from_secs(10),
        "nobody leading",
        Option::is_none,
    )
    .await;
    println!(
        "the observer saw nobody leading {:?} after the server was back",
        at - back
    );
    assert!(at - back < Duration::from_secs(3), "{:?}", at - back);

    // Quiet: nobody leads, an observer waits. It must not poll.
    sleep(Duration::from_millis(500)).await;
    let before = total_commands(&url).await;
    sleep(Duration::from_secs(3)).await;
    let quiet = total_commands(&url).await - before;
    println!("commands in 3 s with nobody leading and one observer: {quiet}");

    let second = b.election("e").campaign("b").await.unwrap();
    let (_, seen) = until(&mut rx, Duration::from_secs(3), "b", |l| {
        l.as_ref().and_then(Leader::value_str) == Some("b")
    })
    .await;
    assert_eq!(seen.unwrap().term(), second.term());
    assert!(
        second.term() > leading.term(),
        "{} <= {}",
        second.term(),
        leading.term()
    );
    timeout(ttl, leading.lost())
        .await
        .expect("the old leader never learnt its lead was gone");
    assert!(quiet < 30, "the observer polled: {quiet} commands in 3 s");
    second.resign().await.unwrap();
    task.abort();
    drop(leading);
    for c in [a, b, watcher] {
        c.shutdown().await;
    }
}

/// Many observers of one election on one client, a leader renewing a short lease: the server
/// runs no more for two hundred observers than for one (the client reads once for all of
/// them), and each still sees every change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observers_on_one_client_cost_the_server_what_one_does() {
    let ns = test_namespace!();
    let server = RedisServer::start();
    let one = observed_script_calls(&server.url(), &ns, 1).await;
    let many = observed_script_calls(&server.url(), &ns, 200).await;
    println!("script calls in the calm: {one} for one observer, {many} for 200");
    assert!(
        many as f64 <= one as f64 * 1.5 + 5.0,
        "200 observers cost {many} script calls, one cost {one}"
    );
}

/// The script calls (the observers' reads and the leader's renewals) the server ran in 5 s of
/// calm, with `n` observers of an election led by another client renewing a 1 s lease.
async fn observed_script_calls(url: &str, ns: &str, n: usize) -> u64 {
    let (ttl, handoff) = (Duration::from_secs(1), Duration::from_millis(300));
    let a = client(url, ns, ttl, handoff, true).await;
    let watcher = client(url, ns, ttl, handoff, true).await;
    let key = format!("e{n}");
    let mut observers: Vec<_> = (0..n).map(|_| observer(&watcher, &key)).collect();
    for (rx, _) in &mut observers {
        until(rx, Duration::from_secs(3), "nobody", Option::is_none).await;
    }
    let leading = a.election(&key).campaign("a").await.unwrap();
    for (rx, _) in &mut observers {
        until(rx, Duration::from_secs(3), "a", Option::is_some).await;
    }
    sleep(Duration::from_millis(500)).await;
    let before = commands(url).await;
    sleep(Duration::from_secs(5)).await;
    let after = commands(url).await;
    // INFO counts the commands scripts run too: the calls are the FCALLs.
    let total = commands_since(&before, &after)
        .iter()
        .filter(|(name, _)| name.starts_with("fcall") || name.starts_with("eval"))
        .map(|(_, n)| n)
        .sum();
    leading.proclaim("a2").await.unwrap();
    for (rx, _) in &mut observers {
        until(rx, Duration::from_secs(3), "a2", |l| {
            l.as_ref().and_then(Leader::value_str) == Some("a2")
        })
        .await;
    }
    leading.resign().await.unwrap();
    for (_, t) in observers {
        t.abort();
    }
    a.shutdown().await;
    watcher.shutdown().await;
    total
}

/// Observers on a client that shuts down end; one made after the shutdown ends at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observers_end_when_their_client_shuts_down() {
    let ns = test_namespace!();
    let url = shared_redis().url();
    let ttl = Duration::from_secs(5);
    let watcher = client(&url, &ns, ttl, Duration::from_millis(300), true).await;
    let election = watcher.election("e");
    let mut changes = Box::pin(election.observe());
    assert!(changes.next().await.unwrap().unwrap().is_none());
    watcher.shutdown().await;
    let end = timeout(Duration::from_secs(3), changes.next())
        .await
        .expect("an observer outlived its client's shutdown");
    assert!(end.is_none(), "{end:?}");
    let mut after = Box::pin(election.observe());
    let first = timeout(Duration::from_secs(3), after.next())
        .await
        .expect("an observer made after the shutdown hangs");
    println!("after shutdown, a new observer yields {first:?}");
}

/// An empty value is a value: the leader is reported with it, and observed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_value_is_reported() {
    let ns = test_namespace!();
    let url = shared_redis().url();
    let ttl = Duration::from_secs(5);
    let a = client(&url, &ns, ttl, Duration::from_millis(300), true).await;
    let (mut rx, task) = observer(&a, "empty");
    until(&mut rx, Duration::from_secs(3), "nobody", Option::is_none).await;
    let leading = a.election("empty").campaign("").await.unwrap();
    let now = a
        .election("empty")
        .leader()
        .await
        .unwrap()
        .expect("nobody leads");
    assert_eq!((now.term(), now.value()), (leading.term(), &b""[..]));
    let (_, seen) = until(
        &mut rx,
        Duration::from_secs(3),
        "the leader",
        Option::is_some,
    )
    .await;
    assert_eq!(seen.unwrap().value(), b"");
    leading.proclaim("x").await.unwrap();
    leading.proclaim("").await.unwrap();
    let now = a
        .election("empty")
        .leader()
        .await
        .unwrap()
        .expect("nobody leads");
    assert_eq!(now.value(), b"");
    leading.resign().await.unwrap();
    task.abort();
    a.shutdown().await;
}

/// The operator's unlock of an election: the leader is dropped, the candidate in line leads
/// with a higher term, observers hear of it, the old leader's guard turns lost and its
/// proclaim is refused; `inspect` calls the key an election before and after.
// The `distlock` binary is built with the `cli` feature only.
#[cfg(feature = "cli")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_of_an_election() {
    use crate::support::observed::until_value;
    let ns = test_namespace!();
    let url = shared_redis().url();
    let (ttl, handoff) = (Duration::from_secs(3), Duration::from_millis(300));
    let (a, b, op) = (
        client(&url, &ns, ttl, handoff, true).await,
        client(&url, &ns, ttl, handoff, true).await,
        client(&url, &ns, ttl, handoff, true).await,
    );
    let (mut rx, task) = observer(&op, "e");
    let leading = a.election("e").campaign("a").await.unwrap();
    until_value(&mut rx, "a").await;
    let election = b.election("e");
    let waiting = tokio::spawn(async move { election.campaign("b").await });
    crate::support::redis::until_queued(&url, &ns, "e", 1).await;
    println!("inspect before: {:?}", op.inspect("e").await.unwrap());
    let cli = |args: &[&str]| crate::support::cli::distlock(&url, &ns, args);
    cli(&["inspect", "e"]);
    cli(&["unlock", "e"]);
    assert_eq!(cli(&["unlock", "e", "--force"]), Some(0));
    let next = timeout(Duration::from_secs(3), waiting)
        .await
        .expect("the candidate in line never led")
        .unwrap()
        .unwrap();
    assert!(next.term() > leading.term());
    until_value(&mut rx, "b").await;
    timeout(ttl, leading.lost())
        .await
        .expect("the unlocked leader never learnt it");
    let err = leading.proclaim("a, again").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
    let now = op.election("e").leader().await.unwrap().unwrap();
    assert_eq!(now.value_str(), Some("b"));
    println!("inspect after: {:?}", op.inspect("e").await.unwrap());
    next.resign().await.unwrap();
    task.abort();
    drop(leading);
    for c in [a, b, op] {
        c.shutdown().await;
    }
}

/// A holder with a 1 s lease and a waiter with a 20 s one, each behind its own proxy, and two
/// plain clients. [`Stalled::stall`] silences both proxies once the waiter is in line: the
/// holder's lease runs out, the waiter stays in line (its liveness deadline is its own TTL) but
/// cannot ask again, so the key is free with a live waiter in line.
struct Stalled {
    holder: LockClient,
    waiter: LockClient,
    others: [LockClient; 2],
    proxies: [Proxy; 2],
}

impl Stalled {
    async fn start(ns: &str) -> Self {
        let handoff = Duration::from_millis(300);
        let proxies = [
            Proxy::start(shared_redis().port()),
            Proxy::start(shared_redis().port()),
        ];
        let via = |p: &Proxy| format!("redis://127.0.0.1:{}/", p.port());
        let holder = client(&via(&proxies[0]), ns, Duration::from_secs(1), handoff, true).await;
        let waiter = client(
            &via(&proxies[1]),
            ns,
            Duration::from_secs(20),
            handoff,
            true,
        )
        .await;
        let url = shared_redis().url();
        let others = [
            client(&url, ns, Duration::from_secs(5), handoff, true).await,
            client(&url, ns, Duration::from_secs(5), handoff, true).await,
        ];
        Self {
            holder,
            waiter,
            others,
            proxies,
        }
    }

    async fn stall(&self, ns: &str, key: &str) {
        crate::support::redis::until_queued(&shared_redis().url(), ns, key, 1).await;
        for p in &self.proxies {
            p.blackhole();
        }
        sleep(Duration::from_millis(1500)).await;
    }

    async fn shutdown(self) {
        for c in [self.holder, self.waiter] {
            c.shutdown().await;
        }
        for c in self.others {
            c.shutdown().await;
        }
    }
}

/// A free election key while a candidate waits (its leader's lease ran out, the candidate has
/// not asked again yet): a mutex `lock()` on that key must be refused as a kind mismatch, as
/// it is while the election has a leader, not handed the key over the waiting candidate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mutex_does_not_take_a_free_election_with_a_candidate_waiting() {
    let ns = test_namespace!();
    let st = Stalled::start(&ns).await;
    let leading = st.holder.election("e").campaign("a").await.unwrap();
    let election = st.waiter.election("e");
    let waiting = tokio::spawn(async move { election.campaign("b").await });
    st.stall(&ns, "e").await;
    let got = timeout(Duration::from_secs(5), st.others[0].mutex("e").lock()).await;
    let outcome = match &got {
        Ok(Ok(_)) => "granted".to_owned(),
        Ok(Err(e)) => format!("refused: {e} ({:?})", e.kind()),
        Err(_) => "still waiting after 5 s".to_owned(),
    };
    println!("mutex lock() on the free election key with a candidate in line: {outcome}");
    st.proxies[1].heal();
    let b_outcome = timeout(Duration::from_secs(10), waiting).await;
    println!("the candidate's campaign: {b_outcome:?}");
    assert!(
        !outcome.starts_with("granted"),
        "a mutex was granted on an election's key while a candidate waited"
    );
    match got {
        Ok(Ok(g)) => drop(g),
        Ok(Err(e)) => assert_eq!(e.kind(), ErrorKind::KindMismatch, "{e}"),
        Err(_) => panic!("the mutex lock() was neither refused nor granted in 5 s"),
    }
    // The key went to the candidate in line, which leads.
    let b = b_outcome
        .expect("the candidate's campaign never ended")
        .expect("the candidate's campaign panicked")
        .expect("the candidate's campaign failed");
    assert!(b.term() > leading.term());
    drop(b);
    drop(leading);
    st.shutdown().await;
}

/// The mirror case: a free mutex key while a waiter is in line (its holder's lease ran out, the
/// waiter has not asked again yet). A campaign there must be refused as a kind mismatch, and the
/// mutex's own users must not be: yet the campaign hands the waiter an election's provisional
/// hold, so the waiter holds its mutex as an "election", and the next `try_lock` is told the key
/// is an election.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_campaign_does_not_turn_a_free_mutex_with_waiters_into_an_election() {
    let ns = test_namespace!();
    let st = Stalled::start(&ns).await;
    let held = st.holder.mutex("m").lock().await.unwrap();
    let waiting = tokio::spawn(st.waiter.mutex("m").lock());
    st.stall(&ns, "m").await;
    let campaign = timeout(
        Duration::from_millis(500),
        st.others[0].election("m").try_campaign("c"),
    )
    .await;
    let campaign = match campaign {
        Ok(Ok(_)) => "granted".to_owned(),
        Ok(Err(e)) => format!("refused: {e} ({:?})", e.kind()),
        Err(_) => "still waiting".to_owned(),
    };
    println!("try_campaign on the free mutex key with a waiter in line: {campaign}");
    st.proxies[1].heal();
    let got = timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the mutex waiter never got its lock")
        .unwrap()
        .expect("the mutex waiter's lock() failed");
    let other = st.others[1].mutex("m").try_lock().await;
    let other = match &other {
        Ok(_) => "granted".to_owned(),
        Err(e) => format!("{e} ({:?})", e.kind()),
    };
    println!("another try_lock on the mutex while the waiter holds it: {other}");
    let leader = st.others[1].election("m").leader().await;
    println!("leader() on the mutex key: {leader:?}");
    got.release().await.unwrap();
    drop(held);
    assert!(
        campaign.contains("KindMismatch"),
        "a campaign on a mutex with waiters was not refused: {campaign}"
    );
    assert!(
        !other.contains("KindMismatch"),
        "the mutex's own user was told the key is an election: {other}"
    );
    st.shutdown().await;
}

/// After the observer's primary is gone for good and its replica took over, the observer still
/// follows the election: the leader resigns on the new primary and another leads, and the
/// observer sees the new leader long before the old lease (30 s) would have woken it.
#[cfg(any(feature = "redis-cluster", feature = "redis-sentinel"))]
async fn an_observer_follows_across_a_failover(url: &str, ns: &str, fail_over: impl FnOnce()) {
    let ttl = Duration::from_secs(30);
    let connect = || crate::support::failover::client_for(url, ns, ttl);
    let (a, b, watcher) = (connect().await, connect().await, connect().await);
    let (mut rx, task) = observer(&watcher, "k");
    until(&mut rx, Duration::from_secs(5), "nobody", Option::is_none).await;
    let leading = a.election("k").campaign("a").await.unwrap();
    until(&mut rx, Duration::from_secs(5), "a", Option::is_some).await;
    // Let the hold reach the replica.
    sleep(Duration::from_millis(500)).await;
    tokio::task::block_in_place(fail_over);
    let promoted = Instant::now();
    // The leader renews against the new primary; then it resigns there and B leads.
    let _ = leading.resign().await;
    let next = timeout(Duration::from_secs(20), b.election("k").campaign("b"))
        .await
        .expect("nobody led after the failover")
        .unwrap();
    let led = Instant::now();
    let (at, _) = until(&mut rx, Duration::from_secs(25), "b", |l| {
        l.as_ref().and_then(Leader::value_str) == Some("b")
    })
    .await;
    println!(
        "after the failover: b led {:?} after the promotion, the observer saw it {:?} after that",
        led - promoted,
        at.saturating_duration_since(led)
    );
    assert!(
        at.saturating_duration_since(led) < Duration::from_secs(5),
        "the observer saw the new leader {:?} late",
        at - led
    );
    let _ = next.resign().await;
    task.abort();
    for c in [a, b, watcher] {
        c.shutdown().await;
    }
}

#[cfg(feature = "redis-cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_follows_a_cluster_primary_killed_for_good() {
    let ns = test_namespace!();
    let mut cluster = crate::support::server::cluster::RedisCluster::start();
    let url = cluster.url();
    let primary = cluster.primary_for("k", 0);
    let replica = cluster.replica_of(primary);
    an_observer_follows_across_a_failover(&url, &ns, || {
        cluster.kill_primary_for_good(primary, replica)
    })
    .await;
}

#[cfg(feature = "redis-sentinel")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_follows_a_sentinel_failover() {
    let ns = test_namespace!();
    let mut setup = crate::support::server::sentinel::SentinelSetup::start();
    let url = setup.url();
    an_observer_follows_across_a_failover(&url, &ns, || setup.kill_primary()).await;
}

/// Keys that look like another key's names (`}`, `{`, `:e`, `:c:`) are elections of their own:
/// each leads at once beside the others, its observers hear only its own changes, and a
/// binary value (NUL, newlines, the hold's own syntax) round-trips.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_keys_and_values_stay_apart() {
    let ns = test_namespace!();
    let url = shared_redis().url();
    let ttl = Duration::from_secs(5);
    let a = client(&url, &ns, ttl, Duration::from_millis(300), true).await;
    let keys = ["a", "a}:e", "{a}", "a}", "a}:c:x", "a\n=b", ":e"];
    let value: &[u8] = b"\0\n=m 1 1 owner\n?\r\n";
    let mut observers: Vec<_> = keys.iter().map(|k| observer(&a, k)).collect();
    for (rx, _) in &mut observers {
        until(rx, Duration::from_secs(3), "nobody", Option::is_none).await;
    }
    let mut held = Vec::new();
    for k in keys {
        let leading = timeout(Duration::from_secs(3), a.election(k).try_campaign(value))
            .await
            .unwrap_or_else(|_| panic!("{k:?} waited"))
            .unwrap_or_else(|e| panic!("{k:?}: {e}"));
        held.push(leading);
    }
    for (k, (rx, _)) in keys.iter().zip(&mut observers) {
        let (_, seen) = until(rx, Duration::from_secs(3), k, Option::is_some).await;
        assert_eq!(seen.unwrap().value(), value, "{k:?}");
    }
    // One proclaims: only its observers hear of it.
    held[0].proclaim("only a").await.unwrap();
    let (_, seen) = until(&mut observers[0].0, Duration::from_secs(3), "only a", |l| {
        l.as_ref().and_then(Leader::value_str) == Some("only a")
    })
    .await;
    assert_eq!(seen.unwrap().term(), held[0].term());
    sleep(Duration::from_millis(300)).await;
    for (k, (rx, _)) in keys.iter().zip(&mut observers).skip(1) {
        while let Ok((_, item)) = rx.try_recv() {
            let l = item.unwrap();
            assert_eq!(l.map(|l| l.value().to_vec()), Some(value.to_vec()), "{k:?}");
        }
    }
    for (k, l) in keys.iter().zip(&held) {
        let now = a.election(*k).leader().await.unwrap().unwrap();
        assert_eq!(now.term(), l.term(), "{k:?}");
    }
    for l in held {
        l.resign().await.unwrap();
    }
    for (_, t) in observers {
        t.abort();
    }
    crate::support::redis::until_only_fences(&url, &ns).await;
    a.shutdown().await;
}

/// What an observer does when the key is (for now) a mutex: it yields the kind mismatch, and
/// then? The docs say the stream goes on after an error and ends when the client shuts down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_goes_on_after_a_kind_mismatch_as_documented() {
    let ns = test_namespace!();
    let url = shared_redis().url();
    let ttl = Duration::from_secs(5);
    let a = client(&url, &ns, ttl, Duration::from_millis(300), true).await;
    let held = a.mutex("k").lock().await.unwrap();
    let mut changes = Box::pin(a.election("k").observe());
    let first = timeout(Duration::from_secs(3), changes.next())
        .await
        .unwrap();
    println!("first item: {first:?}");
    held.release().await.unwrap();
    let leading = a.election("k").campaign("a").await.unwrap();
    // It goes on, and sees the leader (an item or two in between, at most: nobody, or the
    // mismatch read again before the release).
    let seen = timeout(Duration::from_secs(3), async {
        loop {
            match changes.next().await {
                Some(Ok(Some(leader))) if leader.value_str() == Some("a") => return Some(leader),
                Some(item) => println!("then: {item:?}"),
                None => return None,
            }
        }
    })
    .await;
    println!("after the mutex was released and a leader campaigned: {seen:?}");
    let term = leading.term();
    leading.resign().await.unwrap();
    a.shutdown().await;
    let seen = seen
        .expect("the observer never saw the new leader")
        .expect("the stream ended after a kind mismatch, though the client is open");
    assert_eq!(seen.term(), term);
}

/// Two replicas run `lead()` through their own proxies; the leader's network goes silent past
/// its lease, three times in turn. The work of one term never runs beside another term's
/// (ticks every 5 ms while polled), terms grow in the order the work started, and the cut-off
/// replica does not hammer the server meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lead_never_runs_two_terms_at_once_under_blackholes() {
    use std::sync::{Arc, Mutex as StdMutex};
    let ns = test_namespace!();
    let url = shared_redis().url();
    let (ttl, handoff) = (Duration::from_millis(1500), Duration::from_millis(300));
    let proxies = [
        Proxy::start(shared_redis().port()),
        Proxy::start(shared_redis().port()),
    ];
    let ticks: Arc<StdMutex<Vec<(usize, u64, std::time::Instant)>>> = Arc::default();
    let mut clients = Vec::new();
    let mut tasks = Vec::new();
    for (i, p) in proxies.iter().enumerate() {
        let c = client(
            &format!("redis://127.0.0.1:{}/", p.port()),
            &ns,
            ttl,
            handoff,
            true,
        )
        .await;
        let (election, ticks) = (c.election("e"), ticks.clone());
        tasks.push(tokio::spawn(async move {
            election
                .lead(format!("replica {i}"), move |term| {
                    let ticks = ticks.clone();
                    async move {
                        loop {
                            ticks
                                .lock()
                                .unwrap()
                                .push((i, term, std::time::Instant::now()));
                            sleep(Duration::from_millis(5)).await;
                        }
                    }
                })
                .await
        }));
        clients.push(c);
    }
    let watcher = client(&url, &ns, ttl, handoff, true).await;
    for round in 0..4 {
        // Whoever leads now goes silent past its lease.
        let now = timeout(Duration::from_secs(10), async {
            loop {
                if let Some(l) = watcher.election("e").leader().await.unwrap() {
                    return l;
                }
                sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("nobody led");
        let who: usize = now.value_str().unwrap()["replica ".len()..]
            .parse()
            .unwrap();
        println!("round {round}: replica {who} leads, term {}", now.term());
        let before = total_commands(&url).await;
        proxies[who].blackhole();
        sleep(ttl * 3).await;
        let during = total_commands(&url).await - before;
        println!(
            "  {during} commands reached the server in {:?} with replica {who} cut off",
            ttl * 3
        );
        proxies[who].heal();
        sleep(Duration::from_millis(500)).await;
    }
    for t in &tasks {
        t.abort();
    }
    let ticks = ticks.lock().unwrap().clone();
    // Per term: who ran it and from when to when.
    let mut terms: Vec<(u64, usize, std::time::Instant, std::time::Instant)> = Vec::new();
    for (i, term, at) in ticks {
        match terms.iter_mut().find(|t| t.0 == term) {
            Some(t) => {
                assert_eq!(t.1, i, "two replicas ran term {term}");
                t.3 = t.3.max(at);
            }
            None => terms.push((term, i, at, at)),
        }
    }
    terms.sort_by_key(|t| t.2);
    for w in terms.windows(2) {
        println!(
            "term {} (replica {}) ran {:?}",
            w[0].0,
            w[0].1,
            w[0].3 - w[0].2
        );
        assert!(w[0].0 < w[1].0, "terms out of order: {terms:?}");
        assert!(
            w[0].3 < w[1].2,
            "term {} (replica {}) ran {:?} past the start of term {} (replica {})",
            w[0].0,
            w[0].1,
            w[0].3 - w[1].2,
            w[1].0,
            w[1].1
        );
    }
    assert!(terms.len() >= 4, "{} terms", terms.len());
    for c in clients {
        c.shutdown().await;
    }
    watcher.shutdown().await;
}

/// Churn: a leader resigns again and again while candidates on other clients give up at every
/// moment (timeouts from 0 to 2 ms, aborted tasks, `lead()` dropped), so grants land on
/// campaigns being cancelled. Afterwards nothing but fencing counters is left, each with a TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_campaigns_under_churn_leave_only_fences() {
    let ns = test_namespace!();
    let url = shared_redis().url();
    let (ttl, handoff) = (Duration::from_secs(3), Duration::from_millis(300));
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(client(&url, &ns, ttl, handoff, true).await);
    }
    let rounds = 150;
    for round in 0..rounds {
        let leader = clients[0].election("e").campaign("leader").await.unwrap();
        let mut tries = Vec::new();
        for (j, c) in clients.iter().enumerate().skip(1) {
            let e = c.election("e");
            let micros = (round * 37 + j * 101) as u64 % 2000;
            tries.push(tokio::spawn(async move {
                match j {
                    1 => {
                        let _ = e.campaign_timeout("t", Duration::from_micros(micros)).await;
                    }
                    2 => {
                        let _ = timeout(
                            Duration::from_micros(micros),
                            e.lead("l", |_| std::future::pending::<()>()),
                        )
                        .await;
                    }
                    _ => {
                        let _ = timeout(Duration::from_micros(micros), e.campaign("a")).await;
                    }
                }
            }));
        }
        sleep(Duration::from_micros((round as u64 * 53) % 1500)).await;
        leader.resign().await.unwrap();
        for t in tries {
            t.await.unwrap();
        }
    }
    for c in clients {
        c.shutdown().await;
    }
    crate::support::redis::until_only_fences(&url, &ns).await;
    let mut conn = connection(&url).await;
    for k in crate::support::redis::keys_in(&url, &ns).await {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(&k)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(ttl > 0, "{k} has no TTL ({ttl})");
    }
}

/// The threads this test's runtime runs on: they, and only they, carry this name.
const SPIN_CHECK: &str = "spin-check";

/// CPU time (user + system) so far of this process's threads named [`SPIN_CHECK`]: the test's
/// own runtime, not the tests running beside it in the same process. Panics if there are none.
fn cpu_time() -> Duration {
    let (mut ticks, mut threads) = (0u64, 0);
    for task in std::fs::read_dir("/proc/self/task").unwrap() {
        let dir = task.unwrap().path();
        let (Ok(comm), Ok(stat)) = (
            std::fs::read_to_string(dir.join("comm")),
            std::fs::read_to_string(dir.join("stat")),
        ) else {
            continue; // the thread ended meanwhile
        };
        if comm.trim_end() != SPIN_CHECK {
            continue;
        }
        threads += 1;
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        let fields: Vec<&str> = after.split(' ').collect();
        // utime and stime are fields 14 and 15 of the whole line, 12 and 13 after the name.
        ticks += fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    }
    assert!(
        threads > 0,
        "no thread named {SPIN_CHECK}: the runtime's CPU is not counted"
    );
    Duration::from_millis(ticks * 10)
}

/// The server is down for 5 s under a `lead()` that leads, one waiting to, and two observers:
/// nobody spins (CPU of the test's own runtime threads, where every client's background work
/// runs), and afterwards one leads again and the observers see it.
#[test]
fn nobody_spins_while_the_server_is_down() {
    let ns = test_namespace!();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(SPIN_CHECK)
        .enable_all()
        .build()
        .unwrap()
        .block_on(nobody_spins(ns));
}

async fn nobody_spins(ns: String) {
    let mut server = RedisServer::start();
    let url = server.url();
    let (ttl, handoff) = (Duration::from_secs(2), Duration::from_millis(300));
    let (a, b, watcher) = (
        client(&url, &ns, ttl, handoff, true).await,
        client(&url, &ns, ttl, handoff, true).await,
        client(&url, &ns, ttl, handoff, true).await,
    );
    let mut leads = Vec::new();
    for (i, c) in [&a, &b].into_iter().enumerate() {
        let e = c.election("e");
        leads.push(tokio::spawn(async move {
            e.lead(format!("r{i}"), |_| std::future::pending::<()>())
                .await
        }));
    }
    let (mut rx1, t1) = observer(&watcher, "e");
    let (mut rx2, t2) = observer(&watcher, "e");
    for rx in [&mut rx1, &mut rx2] {
        until(rx, Duration::from_secs(5), "a leader", Option::is_some).await;
    }
    let mut used = Duration::ZERO;
    tokio::task::block_in_place(|| {
        server.restart_after(|| {
            let before = cpu_time();
            std::thread::sleep(Duration::from_secs(5));
            used = cpu_time() - before;
        })
    });
    println!("CPU used by the test's runtime in 5 s with the server down: {used:?}");
    let (mut errors, mut items) = (0, 0);
    while let Ok((_, item)) = rx1.try_recv() {
        items += 1;
        errors += usize::from(item.is_err());
    }
    println!("observer 1 yielded {items} items, {errors} errors, during the outage");
    let (_, seen) = until(
        &mut rx1,
        Duration::from_secs(10),
        "a leader again",
        Option::is_some,
    )
    .await;
    println!("after the restart: {seen:?}");
    until(
        &mut rx2,
        Duration::from_secs(10),
        "a leader again",
        Option::is_some,
    )
    .await;
    assert!(used < Duration::from_millis(1000), "{used:?} of CPU in 5 s");
    for t in leads {
        t.abort();
    }
    t1.abort();
    t2.abort();
    for c in [a, b, watcher] {
        c.shutdown().await;
    }
}

/// The election's slot migrates to another shard under a leader and an observer (the server
/// ends the observer's shard-channel subscription): the observer goes on following the
/// election there.
#[cfg(feature = "redis-cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_follows_a_slot_migration() {
    let ns = test_namespace!();
    let cluster = std::sync::Arc::new(crate::support::server::cluster::RedisCluster::start());
    let url = cluster.url();
    an_observer_follows_across_a_failover(&url, &ns, || {
        let to = cluster.migrate_slot_of("k");
        println!("the slot of k moved to node {to}");
    })
    .await;
}
