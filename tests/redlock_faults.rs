//! Redlock under faults, on five real `redis-server` nodes per test, each behind a proxy:
//! nodes cut off, blackholed, their connections closed mid-call, and SIGKILLed and restarted
//! without their data. The lock stays exclusive, available while a majority answers, fails
//! clearly (never hangs) when it cannot, and its fencing tokens keep increasing.
#![cfg(feature = "redlock")]

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use support::contract::contend;
use support::redlock::{client_on, client_tuned, Nodes};
use tokio::time::{sleep, timeout, Instant};

/// The most an acquisition may take when some nodes do not answer: the node timeout (300 ms in
/// the test clients) and some scheduling slack.
const BOUND: Duration = Duration::from_secs(2);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_one_or_two_nodes_down_the_lock_stays_held_exclusive_and_available() {
    let ns = test_namespace!();
    let nodes = Nodes::start(5);
    let ttl = Duration::from_millis(900);
    let h = nodes.client_with(&ns, ttl, Duration::ZERO).await;
    let w = nodes.client_with(&ns, ttl, Duration::ZERO).await;
    let held = h.mutex("k").lock().await.unwrap();
    nodes.proxies[0].cut();
    sleep(ttl).await;
    nodes.proxies[1].cut();
    // Several renewal rounds with two of five nodes gone: still held, still exclusive.
    sleep(ttl * 3).await;
    assert!(!held.is_lost(), "a quorum still holds the lock");
    let started = Instant::now();
    let err = w.mutex("k").try_lock().await.unwrap_err();
    assert!(err.is_would_block(), "{err}");
    assert!(started.elapsed() < BOUND, "took {:?}", started.elapsed());

    let waiter = {
        let w = w.clone();
        tokio::spawn(async move { w.mutex("k").lock().await })
    };
    sleep(Duration::from_millis(300)).await;
    let first = held.fencing_token();
    // Inspection reads the three nodes that answer: a majority, so it sees holder and waiter
    // (once the waiter has queued: its subscription waits out the cut nodes first).
    let seen = timeout(BOUND, async {
        loop {
            let seen = w.inspect("k").await.unwrap();
            if !seen.waiters.is_empty() {
                return seen;
            }
            sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the waiter shows up in the inspection");
    assert_eq!(seen.holders.len(), 1, "{seen:?}");
    assert_eq!(seen.holders[0].fencing_token, Some(first), "{seen:?}");
    assert_eq!(seen.waiters.len(), 1, "{seen:?}");
    let released = Instant::now();
    held.release().await.unwrap();
    let next = timeout(BOUND, waiter).await.unwrap().unwrap().unwrap();
    assert!(released.elapsed() < BOUND);
    assert!(next.fencing_token() > first);
    next.release().await.unwrap();

    // Three of five down: no quorum, a clear error in bounded time, for waits and tries alike.
    nodes.proxies[2].cut();
    for attempt in 0..2 {
        let started = Instant::now();
        let err = if attempt == 0 {
            w.mutex("k").lock().await.unwrap_err()
        } else {
            w.mutex("k").try_lock().await.unwrap_err()
        };
        assert!(err.is_backend(), "{err}");
        assert!(err.to_string().contains("quorum"), "{err}");
        assert!(started.elapsed() < BOUND, "took {:?}", started.elapsed());
    }
    // A minority's view could miss the holder: inspection refuses rather than say "free".
    let err = w.inspect("k").await.unwrap_err();
    assert!(err.to_string().contains("quorum"), "{err}");
    for p in &nodes.proxies {
        p.pass();
    }
    let back = timeout(BOUND * 5, w.mutex("k").lock())
        .await
        .unwrap()
        .unwrap();
    back.release().await.unwrap();
    h.shutdown().await;
    w.shutdown().await;
}

/// Two blackholed nodes (bytes swallowed, connections open) cost each call at most the node
/// timeout, and the lock stays exclusive with increasing tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blackholed_nodes_cost_at_most_the_node_timeout() {
    let ns = test_namespace!();
    let nodes = Nodes::start(5);
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(nodes.client(&ns).await);
    }
    // Connections are open (the probe), then two nodes go silent.
    nodes.proxies[3].blackhole();
    nodes.proxies[4].blackhole();
    let started = Instant::now();
    let g = clients[0].mutex("solo").lock().await.unwrap();
    assert!(started.elapsed() < BOUND, "took {:?}", started.elapsed());
    g.release().await.unwrap();
    contend(clients, "hot", 4, Duration::from_millis(2)).await;
}

/// Connections closed in the middle of calls (node-redlock hung on this) never hang an
/// acquisition or a release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_closed_mid_call_never_hang() {
    let ns = test_namespace!();
    let nodes = Arc::new(Nodes::start(5));
    let a = nodes.client(&ns).await;
    let b = nodes.client(&ns).await;
    let stop = Arc::new(AtomicBool::new(false));
    let cutter = {
        let (nodes, stop) = (nodes.clone(), stop.clone());
        tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let p = &nodes.proxies[i % 2];
                p.cut();
                sleep(Duration::from_millis(15)).await;
                p.pass();
                sleep(Duration::from_millis(35)).await;
                i += 1;
            }
        })
    };
    let mut last = 0;
    for round in 0..30 {
        let client = if round % 2 == 0 { &a } else { &b };
        let started = Instant::now();
        let g = timeout(BOUND * 2, client.mutex("k").lock())
            .await
            .expect("an acquisition hung")
            .unwrap();
        assert!(g.fencing_token() > last);
        last = g.fencing_token();
        timeout(BOUND * 2, g.release())
            .await
            .expect("a release hung")
            .unwrap();
        assert!(started.elapsed() < BOUND * 2);
    }
    stop.store(true, Ordering::Relaxed);
    cutter.await.unwrap();
}

/// A holder with exactly a quorum {0, 1, 2}; its path to node 2 then goes silent and node 2 is
/// SIGKILLed and restarted without its data. Nodes 3 and 4 are free, so with node 2 counting
/// at once a second client (talking to the nodes directly) would have a quorum {2, 3, 4} while
/// the first still believes it holds: its renewals reach only nodes 0 and 1, which is not a
/// refusal, so it believes until its lease runs out. The restarted node sits out its rejoin
/// delay, so nobody is granted before the first holder is told it lost the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_without_its_data_lets_no_second_holder_in() {
    restarted_node_scenario(Duration::from_secs(3), Kind::Mutex).await;
}

/// The same with a reader holding exactly a quorum and a writer trying: no writer beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_without_its_data_lets_no_writer_in_beside_a_reader() {
    restarted_node_scenario(Duration::from_secs(3), Kind::ReadThenWrite).await;
}

/// What the first holder and the second contender take.
#[derive(Clone, Copy)]
enum Kind {
    Mutex,
    /// Writers only.
    Write,
    /// The first holder reads, the second contender writes.
    ReadThenWrite,
}

/// Holds `key` as the first holder of `kind`.
async fn take_first(c: &distlock::LockClient, kind: Kind) -> Box<dyn Guard> {
    take(c, kind).await
}

/// Tries `key` as the second contender of `kind`.
async fn try_second(c: &distlock::LockClient, kind: Kind) -> distlock::Result<Box<dyn Guard>> {
    Ok(match kind {
        Kind::Mutex => Box::new(c.mutex("k").try_lock().await?),
        Kind::Write | Kind::ReadThenWrite => Box::new(c.rw_lock("k").try_write().await?),
    })
}

/// What the scenario asks of a guard, whatever its kind.
trait Guard: Send {
    fn token(&self) -> u64;
    fn lost(&self) -> bool;
}

impl Guard for distlock::MutexGuard {
    fn token(&self) -> u64 {
        self.fencing_token()
    }
    fn lost(&self) -> bool {
        self.is_lost()
    }
}

impl Guard for distlock::RwLockReadGuard {
    fn token(&self) -> u64 {
        self.fencing_token()
    }
    fn lost(&self) -> bool {
        self.is_lost()
    }
}

impl Guard for distlock::RwLockWriteGuard {
    fn token(&self) -> u64 {
        self.fencing_token()
    }
    fn lost(&self) -> bool {
        self.is_lost()
    }
}

async fn restarted_node_scenario(rejoin: Duration, kind: Kind) {
    let ns = test_namespace!();
    let mut nodes = Nodes::start(5);
    let ttl = Duration::from_millis(1500);
    let h = nodes.client_with(&ns, ttl, rejoin).await;
    let w = client_on(nodes.direct_urls(), &ns, ttl, rejoin).await;
    // The nodes are fresh: let them count for this namespace first.
    let warm = timeout(rejoin * 2 + Duration::from_secs(5), w.mutex("warm").lock())
        .await
        .unwrap()
        .unwrap();
    warm.release().await.unwrap();

    nodes.proxies[3].blackhole();
    nodes.proxies[4].blackhole();
    let held = take_first(&h, kind).await;
    nodes.proxies[3].heal();
    nodes.proxies[4].heal();
    nodes.proxies[2].blackhole();
    nodes.servers[2].restart_after(|| {});

    let started = Instant::now();
    let mut granted = None;
    while started.elapsed() < rejoin + ttl * 4 {
        match try_second(&w, kind).await {
            Ok(g) => {
                assert!(
                    held.lost(),
                    "a second holder was granted while the first still believed it held"
                );
                granted = Some(g);
                break;
            }
            Err(e) => assert!(e.is_would_block(), "{e}"),
        }
        sleep(Duration::from_millis(20)).await;
    }
    let second = granted.expect("the lock never became available again");
    assert!(second.token() > held.token());
    drop((held, second));
    h.shutdown().await;
    w.shutdown().await;
}

/// Node 0's counter is far ahead of the others; the first grant's token is therefore large, and
/// raised on every node the holder held. Then node 0 is SIGKILLed and restarted without its
/// data, and so on round the nodes: every later token is still larger than every earlier one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_keep_increasing_when_nodes_forget_their_counters() {
    let ns = test_namespace!();
    let mut nodes = Nodes::start(5);
    let ttl = Duration::from_millis(800);
    let rejoin = Duration::from_millis(900);
    let far_ahead: u64 = 9_000_000_000_000_000;
    let mut conn = support::redis::connection(&nodes.servers[0].url()).await;
    let _: () = redis::cmd("SET")
        .arg(format!("{ns}:{{k}}:fence"))
        .arg(far_ahead)
        .query_async(&mut conn)
        .await
        .unwrap();
    // The nodes are fresh: let every one of them count for this namespace first, so that node
    // 0 is part of the first grant.
    let warm = nodes.client_with(&ns, ttl, rejoin).await;
    let g = timeout(Duration::from_secs(10), warm.mutex("warm").lock())
        .await
        .expect("no grant")
        .unwrap();
    g.release().await.unwrap();
    warm.shutdown().await;
    sleep(Duration::from_millis(100)).await;
    let mut tokens = Vec::new();
    for round in 0..8 {
        let c = nodes.client_with(&ns, ttl, rejoin).await;
        let g = timeout(Duration::from_secs(10), c.mutex("k").lock())
            .await
            .expect("no grant")
            .unwrap();
        tokens.push(g.fencing_token());
        g.release().await.unwrap();
        c.shutdown().await;
        nodes.servers[round % 5].restart_after(|| {});
    }
    assert!(tokens[0] > far_ahead, "{tokens:?}");
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens went backwards: {tokens:?}"
    );
}

/// Queue entries lost on some nodes (the calls that made them were slow, or the node briefly
/// away) split a release three ways: node 0 hands the lock to the first waiter, node 1 (which
/// lost the first) to the second, node 2 (which lost both) to the third. Nobody has a quorum.
/// The waiters notice within moments, queue again where they were missing, and hand their
/// minority grants on to the better-placed waiter: the lock is served at once, not after the
/// handoff lease (5 s here) runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_split_between_waiters_is_resolved_at_once() {
    split_scenario(Kind::Mutex).await;
}

/// The same with a writer releasing to three queued writers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_release_split_between_writers_is_resolved_at_once() {
    split_scenario(Kind::Write).await;
}

/// Takes `k` as `kind`, waiting.
async fn take(c: &distlock::LockClient, kind: Kind) -> Box<dyn Guard> {
    match kind {
        Kind::Mutex => Box::new(c.mutex("k").lock().await.unwrap()),
        Kind::Write => Box::new(c.rw_lock("k").write().await.unwrap()),
        Kind::ReadThenWrite => Box::new(c.rw_lock("k").read().await.unwrap()),
    }
}

async fn split_scenario(kind: Kind) {
    let ns = test_namespace!();
    let nodes = Nodes::start(3);
    let handoff = Duration::from_secs(5);
    let ttl = Duration::from_secs(3);
    let holder = client_tuned(nodes.direct_urls(), &ns, ttl, Duration::ZERO, handoff).await;
    let held = take(&holder, kind).await;
    let served = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..3 {
        let c = client_tuned(nodes.direct_urls(), &ns, ttl, Duration::ZERO, handoff).await;
        let served = served.clone();
        tasks.push(tokio::spawn(async move {
            let g = take(&c, kind).await;
            served.lock().unwrap().push((i, Instant::now(), g.token()));
            sleep(Duration::from_millis(20)).await;
            drop(g);
            c.shutdown().await;
        }));
        nodes.until_queued(&ns, "k", i + 1).await;
    }
    // Node 1 forgets the first waiter; node 2 the first two.
    for (node, lost) in [(1, 1), (2, 2)] {
        let mut conn = support::redis::connection(&nodes.servers[node].url()).await;
        let queue = format!("{ns}:{{k}}:rq");
        let first: Vec<String> = redis::cmd("ZRANGE")
            .arg(&queue)
            .arg(0)
            .arg(lost - 1)
            .query_async(&mut conn)
            .await
            .unwrap();
        for entry in first {
            // A mutex's entry is the owner; a read-write lock's `<r|w>:<owner>`.
            let owner = entry.split_once(':').map_or(entry.as_str(), |(_, o)| o);
            let _: () = redis::pipe()
                .cmd("ZREM")
                .arg(&queue)
                .arg(&entry)
                .cmd("ZREM")
                .arg(format!("{ns}:{{k}}:rw"))
                .arg(owner)
                .query_async(&mut conn)
                .await
                .unwrap();
        }
    }
    let released = Instant::now();
    let first_token = held.token();
    drop(held);
    for t in tasks {
        timeout(Duration::from_secs(20), t).await.unwrap().unwrap();
    }
    let served = served.lock().unwrap().clone();
    let first = served.iter().map(|(_, at, _)| *at).min().unwrap();
    assert!(
        first - released < Duration::from_secs(2),
        "the split lock waited {:?} (the handoff lease is {handoff:?})",
        first - released
    );
    let mut last = first_token;
    for (_, _, token) in &served {
        assert!(*token > last, "{served:?}");
        last = *token;
    }
    holder.shutdown().await;
}

/// Nodes whose `redis-server` has run longer than the rejoin delay (the usual case: a new
/// deployment's nodes that have been up a while, or a new namespace on nodes that have served
/// others for months) vote at once for a namespace none of them has served yet: the delay is
/// for a node that restarted, not for a namespace that is new.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_namespace_on_long_running_nodes_is_served_at_once() {
    let ns = test_namespace!();
    let nodes = Nodes::start(5);
    let rejoin = Duration::from_secs(2);
    // Let every node run past the rejoin delay (uptime is counted in whole seconds).
    sleep(rejoin + Duration::from_millis(1500)).await;
    let c = nodes.client_with(&ns, Duration::from_secs(2), rejoin).await;
    let started = Instant::now();
    let g = timeout(rejoin * 3, c.mutex("first").lock())
        .await
        .expect("no grant within three rejoin delays")
        .unwrap();
    let took = started.elapsed();
    println!("first lock of a new namespace on nodes up {rejoin:?}+: {took:?}");
    assert!(
        took < rejoin / 4,
        "the first lock took {took:?} (rejoin delay {rejoin:?})"
    );
    g.release().await.unwrap();
    c.shutdown().await;
}

/// `n` lock/release pairs in a row on `key`; how long they took.
async fn pairs(c: &distlock::LockClient, key: &str, n: usize) -> Duration {
    let started = Instant::now();
    let mut last = 0;
    for _ in 0..n {
        let g = c.mutex(key).lock().await.unwrap();
        assert!(g.fencing_token() > last);
        last = g.fencing_token();
        g.release().await.unwrap();
    }
    started.elapsed()
}

/// Two of five nodes killed (connections refused) and left down cost nothing on the acquire
/// path: a node known down is skipped (a no vote at once) while it is reconnected in the
/// background. When they come back they vote again: a third node killed then still leaves a
/// quorum.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_down_cost_nothing_and_count_again_when_back() {
    let ns = test_namespace!();
    let mut nodes = Nodes::start(5);
    let ttl = Duration::from_secs(2);
    // Straight to the servers: a killed node refuses connections.
    let c = client_on(nodes.direct_urls(), &ns, ttl, Duration::ZERO).await;
    const N: usize = 50;
    pairs(&c, "k", 5).await;
    let five_up = pairs(&c, "k", N).await;
    nodes.servers[3].kill();
    nodes.servers[4].kill();
    // The first pair finds them down (at most the node timeout), the others skip them.
    let finding = timeout(BOUND * 2, pairs(&c, "k", 1))
        .await
        .expect("the first lock with two nodes down hung");
    let bound = five_up * 2 + Duration::from_millis(250);
    let two_down = timeout(Duration::from_secs(60), pairs(&c, "k", N))
        .await
        .expect("two nodes down: 50 pairs took over a minute");
    println!(
        "{N} lock/release pairs: five nodes up {five_up:?}, two down {two_down:?} \
         (after a first pair of {finding:?})"
    );
    assert!(finding < BOUND, "the first pair took {finding:?}");
    assert!(
        two_down <= bound,
        "two nodes down: {two_down:?} for {N} pairs, five up: {five_up:?}"
    );

    nodes.servers[3].restart_after(|| {});
    nodes.servers[4].restart_after(|| {});
    // They are reconnected in the background (back-off at most 1 s, sooner once their pub/sub
    // connection is back).
    sleep(Duration::from_secs(2)).await;
    nodes.servers[2].kill();
    let finding = timeout(BOUND * 2, pairs(&c, "k", 1))
        .await
        .expect("no quorum with the restarted nodes back");
    let back = timeout(Duration::from_secs(60), pairs(&c, "k", N))
        .await
        .expect("nodes 3 and 4 back, node 2 down: 50 pairs took over a minute");
    println!(
        "{N} pairs with nodes 3 and 4 back and node 2 down: {back:?} \
         (after a first pair of {finding:?})"
    );
    assert!(finding < BOUND, "the first pair took {finding:?}");
    assert!(
        back <= bound,
        "{back:?} for {N} pairs, five up: {five_up:?}"
    );
    c.shutdown().await;
}
