//! Attacks on the coalescing lanes' hold (`src/backend/redis/coalesce.rs`): calls
//! queued behind a call out wait for it at most 250 ms, then go as a batch of their own, so
//! several batches of one lane may be out at once on one connection. Against a real
//! `redis-server` behind the fault proxy: replies delayed around the hold (and changing while
//! batches are out) with one client's acquires and releases both coalescing, the connection cut
//! with batches out, and acquires whose replies are lost while the locks' callers give up.
//! Each checks: one holder at a time (tokens strictly increase), every lock granted in bounded
//! time, no key left without an expiry, no lock held for no one.
#![cfg(feature = "redis")]

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::proxy::{Proxy, Which};
use crate::support::redis::{client, commandstats, connection};
use crate::support::release::{hold_of, key_names, nothing_left, short, via};
use crate::support::server::redis::RedisServer;
use tokio::time::{sleep, timeout, Instant};

/// What the workers saw: who holds each key now, the last token granted on it, what went wrong.
struct Book {
    keys: Vec<String>,
    held: Vec<AtomicU32>,
    last: Mutex<Vec<u64>>,
    bad: Mutex<Vec<String>>,
    grants: AtomicU64,
    longest_wait_ms: AtomicU64,
}

impl Book {
    fn new(keys: Vec<String>) -> Self {
        Self {
            held: keys.iter().map(|_| AtomicU32::new(0)).collect(),
            last: Mutex::new(vec![0; keys.len()]),
            bad: Mutex::default(),
            grants: AtomicU64::new(0),
            longest_wait_ms: AtomicU64::new(0),
            keys,
        }
    }

    fn bad(&self, what: String) {
        self.bad.lock().unwrap().push(what);
    }

    fn enter(&self, i: usize, token: u64, waited: Duration) {
        self.grants.fetch_add(1, Ordering::SeqCst);
        let ms = u64::try_from(waited.as_millis()).unwrap_or(u64::MAX);
        self.longest_wait_ms.fetch_max(ms, Ordering::SeqCst);
        if self.held[i].fetch_add(1, Ordering::SeqCst) != 0 {
            self.bad(format!("{}: two holders at once", short(&self.keys[i])));
        }
        let mut last = self.last.lock().unwrap();
        if token <= last[i] {
            self.bad(format!(
                "{}: token {token} after {}",
                short(&self.keys[i]),
                last[i]
            ));
        }
        last[i] = token;
    }

    fn leave(&self, i: usize) {
        self.held[i].fetch_sub(1, Ordering::SeqCst);
    }
}

fn fcalls(stats: Vec<(String, u64)>) -> u64 {
    stats
        .into_iter()
        .find(|(n, _)| n == "fcall")
        .map_or(0, |(_, c)| c)
}

/// `workers` tasks of `client`, each locking (waiting at most `patience`) and releasing a key
/// of `book` `rounds` times, key `(first + w + r) % keys`.
fn work(
    client: &distlock::LockClient,
    book: &Arc<Book>,
    first: usize,
    workers: usize,
    rounds: usize,
    patience: Duration,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..workers)
        .map(|w| {
            let (client, book) = (client.clone(), book.clone());
            tokio::spawn(async move {
                for r in 0..rounds {
                    let i = (first + w + r) % book.keys.len();
                    let mutex = client.mutex(book.keys[i].clone());
                    let asked = Instant::now();
                    match timeout(patience, mutex.lock()).await {
                        Ok(Ok(g)) => {
                            book.enter(i, g.fencing_token(), asked.elapsed());
                            sleep(Duration::from_millis(2)).await;
                            book.leave(i);
                            if let Err(e) = g.release().await {
                                // A release that failed leaves the hold to its TTL: the
                                // workers behind it time out, and say so.
                                println!("{}: release failed: {e}", short(&book.keys[i]));
                            }
                        }
                        Ok(Err(e)) => book.bad(format!("{}: lock {e}", short(&book.keys[i]))),
                        Err(_) => book.bad(format!(
                            "{}: not granted within {patience:?}",
                            short(&book.keys[i])
                        )),
                    }
                }
            })
        })
        .collect()
}

/// A client reached through a fault proxy whose tasks lock and release a few keys (so its
/// acquires AND its releases coalesce, and its own tasks queue behind each other on the
/// server), and another client's tasks contending for the same keys.
struct Scene {
    server: RedisServer,
    proxy: Proxy,
    url: String,
    ns: String,
    busy: distlock::LockClient,
    other: distlock::LockClient,
    book: Arc<Book>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    rounds: usize,
    fcalls_before: u64,
    started: Instant,
}

impl Scene {
    /// 18 tasks of the busy client and 6 of the other, `rounds` locks each, the busy client's
    /// replies `late`, leases of `ttl`.
    async fn start(ns: String, late: Duration, rounds: usize, ttl: Duration) -> Self {
        let server = RedisServer::start();
        let url = server.url();
        let proxy = Proxy::start(server.port());
        let busy = client(&via(&proxy), &ns, ttl, Duration::from_millis(300), true).await;
        let other = client(&url, &ns, ttl, Duration::from_millis(300), true).await;
        let book = Arc::new(Book::new(key_names(6)));
        let fcalls_before = fcalls(commandstats(&mut connection(&url).await).await);
        proxy.delay_replies(Which::Commands, late);
        let patience = Duration::from_secs(15);
        let mut tasks = work(&busy, &book, 0, 18, rounds, patience);
        tasks.extend(work(&other, &book, 3, 6, rounds, patience));
        Self {
            server,
            proxy,
            url,
            ns,
            busy,
            other,
            book,
            tasks,
            rounds,
            fcalls_before,
            started: Instant::now(),
        }
    }

    /// Waits for every task, then checks: one holder at a time, tokens strictly increase per
    /// key, every lock granted within 15 s (under the 20 s TTL), no more than a few function
    /// calls per lock (counted from the start, or since a restart), nothing left without an
    /// expiry.
    async fn finish(mut self, restarted: bool) {
        for d in futures::future::join_all(std::mem::take(&mut self.tasks)).await {
            if let Err(e) = d {
                self.book.bad(format!("worker panicked: {e}"));
            }
        }
        self.proxy.pass();
        let now = fcalls(commandstats(&mut connection(&self.url).await).await);
        let spent = if restarted {
            now
        } else {
            now - self.fcalls_before
        };
        let grants = self.book.grants.load(Ordering::SeqCst);
        println!(
            "{grants} locks granted in {:?}, longest wait {} ms, {spent} function calls{}",
            self.started.elapsed(),
            self.book.longest_wait_ms.load(Ordering::SeqCst),
            if restarted { " since the restart" } else { "" },
        );
        self.busy.shutdown().await;
        self.other.shutdown().await;
        let bad = self.book.bad.lock().unwrap().clone();
        assert!(bad.is_empty(), "{bad:#?}");
        assert_eq!(grants, u64::try_from(24 * self.rounds).unwrap());
        assert!(
            spent <= grants * 8,
            "{spent} function calls for {grants} locks: a hot loop"
        );
        nothing_left(&self.url, &self.ns).await;
    }
}

/// The busy client's replies are delayed by 150 to 400 ms, around the hold, the delay changing
/// while batches are out, and its connection is cut once with batches out (see
/// [`Scene::finish`] for what is checked).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_and_release_batches_overlapping_around_the_hold_grant_one_holder_at_a_time() {
    let ttl = Duration::from_secs(20);
    let scene = Scene::start(test_namespace!(), Duration::from_millis(150), 4, ttl).await;
    for (n, ms) in [400, 250, 300, 180, 400, 260].into_iter().enumerate() {
        sleep(Duration::from_millis(450)).await;
        if n == 3 {
            // Cut with batches out (replies 300 ms late, the hold 250 ms).
            scene.proxy.cut();
            sleep(Duration::from_millis(50)).await;
            scene.proxy.heal();
        }
        scene
            .proxy
            .delay_replies(Which::Commands, Duration::from_millis(ms));
    }
    scene.finish(false).await;
}

/// The busy client's replies 300 ms late (batches of both lanes out at once, past the hold),
/// while the server restarts without its data under the batches out (see [`Scene::finish`]
/// for what is checked).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lane_batches_out_across_a_restart_without_data_still_grant_every_lock() {
    // A 4 s lease: both clients saw the restart, so they grant nothing until a lease after it.
    let ttl = Duration::from_secs(4);
    let mut scene = Scene::start(test_namespace!(), Duration::from_millis(300), 10, ttl).await;
    sleep(Duration::from_millis(500)).await;
    tokio::task::block_in_place(|| {
        (scene.server).restart_after(|| std::thread::sleep(Duration::from_millis(100)));
    });
    println!("restarted at {:?}", scene.started.elapsed());
    sleep(Duration::from_millis(200)).await;
    scene
        .proxy
        .delay_replies(Which::Commands, Duration::from_millis(300));
    scene.finish(true).await;
}

/// An acquire queued in the acquire lane behind a call whose reply is late (6 s, past the 5 s
/// call timeout; the requests run at once, the keys busy, so each lock goes by the acquire
/// script): past the hold, it goes as a batch of its own, sent by the lane's task. Its caller
/// gives up at once (`lock_timeout` 100 ms); the cleanup waits for the acquire call at most the
/// claim's TTL (5 s here), then releases. The batch, though, is not the caller's future: the
/// lane's task sent it again after each call timeout (at ~5.3 s and ~10.3 s), after the
/// release, and took the lock for no one each time (a fresh client waited 4.1 s); now each
/// attempt carries only the claims still wanted. Checked once the holder let the keys go and the cleanups released (6 s): no key is
/// held, and a fresh client gets every one of those keys at once (not once a lease taken for
/// no one runs out); and once the fresh client let them go and the batch's last attempt is
/// past (11 s): none is held again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquires_given_up_behind_a_late_reply_take_no_lock_for_no_one() {
    given_up_behind_a_late_reply(test_namespace!(), 1).await;
}

/// The same, with one claim still wanted (its caller waits on) in the batch of the claims given
/// up: the batch goes on for it, and its attempts after the others' releases took their locks
/// for no one while a batch was one call, sent again whole (a fresh client waited 4.1 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquires_given_up_in_a_batch_still_wanted_take_no_lock_for_no_one() {
    given_up_behind_a_late_reply(test_namespace!(), 2).await;
}

/// Keys `..wanted` stay held by another client and their callers wait on (the first of them is
/// the call out); the others' callers give up at once.
async fn given_up_behind_a_late_reply(ns: String, wanted: usize) {
    let server = RedisServer::start();
    let url = server.url();
    let proxy = Proxy::start(server.port());
    let ttl = Duration::from_secs(5);
    let busy = client(&via(&proxy), &ns, ttl, Duration::from_millis(300), true).await;
    let holder = client(&url, &ns, ttl, Duration::from_millis(300), true).await;
    let fresh = client(&url, &ns, ttl, Duration::from_millis(300), true).await;
    let keys = key_names(6);
    let mut guards = crate::support::release::lock_all(&holder, &keys).await;
    // The busy client waits on each key a moment first: its channels stay subscribed, so its
    // next locks there go by the acquire script (the acquire lane) at once.
    for k in &keys {
        let e = busy
            .mutex(k.clone())
            .lock_timeout(Duration::from_millis(50))
            .await;
        assert!(e.is_err());
    }
    sleep(Duration::from_millis(300)).await;

    proxy.delay_replies(Which::Commands, Duration::from_secs(6));
    let asked = Instant::now();
    // The call out: its caller waits on (its key stays held throughout), and so do those of
    // the other wanted keys, queued behind it.
    let mut waiting = Vec::new();
    for (i, k) in keys[..wanted].iter().enumerate() {
        waiting.push(tokio::spawn(
            busy.mutex(k.clone()).lock_timeout(Duration::from_secs(9)),
        ));
        if i == 0 {
            sleep(Duration::from_millis(10)).await;
        }
    }
    // Queued behind it, each caller gone after 100 ms.
    let given_up = &keys[wanted..];
    let mut locks = Vec::new();
    for k in given_up {
        locks.push(tokio::spawn(
            busy.mutex(k.clone())
                .lock_timeout(Duration::from_millis(100)),
        ));
    }
    for l in locks {
        assert!(l.await.unwrap().is_err_and(|e| e.is_timeout()));
    }
    sleep(Duration::from_secs(2)).await;
    let wanted_guards: Vec<_> = guards.drain(..wanted).collect();
    for g in guards {
        g.release().await.unwrap();
    }
    // Past the cleanups' releases (~5.1 s) and the batch's second attempt (~5.3 s).
    sleep(Duration::from_millis(6000) - asked.elapsed()).await;
    let mut held = Vec::new();
    for k in given_up {
        if hold_of(&url, &ns, k).await.is_some() {
            held.push(short(k));
        }
    }
    println!(
        "{} of {} keys held for no one {:?} after the locks were asked for: {held:?}",
        held.len(),
        given_up.len(),
        asked.elapsed()
    );
    let looked = Instant::now();
    let waits = futures::future::join_all(given_up.iter().map(|k| {
        let mutex = fresh.mutex(k.clone());
        async move {
            let t = Instant::now();
            let g = mutex.lock_timeout(Duration::from_secs(15)).await;
            (t.elapsed(), g)
        }
    }))
    .await;
    let mut slow = Vec::new();
    for (k, (waited, g)) in given_up.iter().zip(waits) {
        match g {
            Ok(g) => {
                if waited > Duration::from_millis(500) {
                    slow.push(format!("{}: {waited:?}", short(k)));
                }
                g.release().await.unwrap();
            }
            Err(e) => slow.push(format!("{}: {e}", short(k))),
        }
    }
    println!(
        "a fresh client got the keys {:?} after the ask, within {:?}; slow: {slow:?}",
        asked.elapsed(),
        looked.elapsed()
    );
    // Past the batch's third attempt (~10.3 s), once the fresh client let the keys go.
    sleep(Duration::from_millis(11_000).saturating_sub(asked.elapsed())).await;
    let mut taken_again = Vec::new();
    for k in given_up {
        if hold_of(&url, &ns, k).await.is_some() {
            taken_again.push(short(k));
        }
    }
    println!(
        "{} of {} keys held for no one {:?} after the ask: {taken_again:?}",
        taken_again.len(),
        given_up.len(),
        asked.elapsed()
    );
    for g in wanted_guards {
        g.release().await.unwrap();
    }
    for w in waiting {
        let w = w.await.unwrap().map(|g| g.fencing_token());
        println!("a wanted key's caller: {w:?}");
    }
    proxy.pass();
    busy.shutdown().await;
    holder.shutdown().await;
    fresh.shutdown().await;
    assert!(held.is_empty(), "keys held for no one: {held:?}");
    assert!(slow.is_empty(), "a fresh client waited: {slow:#?}");
    assert!(
        taken_again.is_empty(),
        "keys taken again for no one: {taken_again:?}"
    );
    nothing_left(&url, &ns).await;
}

/// Hangs and lost wake-ups: 24 tasks of ONE client lock and release 4
/// keys at random, half the locks given up after 1 to 50 ms (so callers go while queued, while
/// watching the call out, right at the hold, and with the lock granted), the others after 0.2
/// to 1.5 s, some guards dropped
/// instead of released, the client's replies delayed 0 to 400 ms and the delay changing every
/// 150 ms, for 6 s. Checked: every `lock_timeout` and `release` future completes within 3 s (a
/// deadlock in the lanes or a lost wake-up shows as a call that never completes), one holder at
/// a time with tokens increasing, and afterwards a fresh client gets every key at once (none
/// taken for no one, the 20 s TTL not waited out) and no key is left without an expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_given_up_at_every_point_of_the_lanes_never_hang_the_client() {
    let ns = test_namespace!();
    let server = RedisServer::start();
    let url = server.url();
    let proxy = Proxy::start(server.port());
    let ttl = Duration::from_secs(20);
    // A handed-off lock's provisional lease (2 s) above the replies' delay: with 300 ms, a
    // holder's release queued behind 400 ms replies comes after that lease, honestly "lost".
    let handoff = Duration::from_secs(2);
    let busy = client(&via(&proxy), &ns, ttl, handoff, true).await;
    let fresh = client(&url, &ns, ttl, handoff, true).await;
    let book = Arc::new(Book::new(key_names(4)));
    let bound = Duration::from_secs(3);
    let until = Instant::now() + Duration::from_secs(6);
    let (gave_up, dropped, granted) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let tasks: Vec<_> = (0..24u64)
        .map(|w| {
            let (busy, book) = (busy.clone(), book.clone());
            let (gave_up, dropped, granted) = (gave_up.clone(), dropped.clone(), granted.clone());
            tokio::spawn(async move {
                let mut seed = w.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                let mut next = move |n: u64| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed % n
                };
                while Instant::now() < until {
                    let i = usize::try_from(next(4)).unwrap();
                    // Most callers give up at once (1 to 50 ms), the others wait long
                    // enough (to 1.5 s) to be granted past the late replies.
                    let patience = if next(2) == 0 {
                        Duration::from_millis(1 + next(50))
                    } else {
                        Duration::from_millis(200 + next(1300))
                    };
                    let mutex = busy.mutex(book.keys[i].clone());
                    let asked = Instant::now();
                    match timeout(bound, mutex.lock_timeout(patience)).await {
                        Ok(Ok(g)) => {
                            granted.fetch_add(1, Ordering::SeqCst);
                            book.enter(i, g.fencing_token(), asked.elapsed());
                            sleep(Duration::from_millis(next(3))).await;
                            // Left before the release is sent: its server hands the lock on
                            // (the next holder told by a message) before its reply comes.
                            book.leave(i);
                            if next(4) == 0 {
                                dropped.fetch_add(1, Ordering::SeqCst);
                                drop(g);
                            } else {
                                let token = g.fencing_token();
                                match timeout(bound, g.release()).await {
                                    Ok(Ok(())) => {}
                                    Ok(Err(e)) => book.bad(format!(
                                        "release of token {token} granted {:?} ago: {e}; \
                                         last token granted there {}",
                                        asked.elapsed(),
                                        book.last.lock().unwrap()[i]
                                    )),
                                    Err(_) => book.bad(format!(
                                        "{}: release not done within {bound:?}",
                                        short(&book.keys[i])
                                    )),
                                }
                            }
                        }
                        Ok(Err(e)) if e.is_timeout() => {
                            gave_up.fetch_add(1, Ordering::SeqCst);
                        }
                        Ok(Err(e)) => book.bad(format!("lock: {e}")),
                        Err(_) => book.bad(format!(
                            "{}: lock_timeout({patience:?}) not done within {bound:?}",
                            short(&book.keys[i])
                        )),
                    }
                }
            })
        })
        .collect();
    let changing = async {
        let mut seed = 0x2545_F491_4F6C_DD1D_u64;
        while Instant::now() < until {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            proxy.delay_replies(Which::Commands, Duration::from_millis(seed % 401));
            sleep(Duration::from_millis(150)).await;
        }
    };
    let (done, ()) = tokio::join!(futures::future::join_all(tasks), changing);
    for d in done {
        if let Err(e) = d {
            book.bad(format!("worker panicked: {e}"));
        }
    }
    proxy.pass();
    println!(
        "{} granted, {} given up, {} guards dropped unreleased, longest granted wait {} ms",
        granted.load(Ordering::SeqCst),
        gave_up.load(Ordering::SeqCst),
        dropped.load(Ordering::SeqCst),
        book.longest_wait_ms.load(Ordering::SeqCst)
    );
    // The busy client still works, and nothing was taken for no one: every key at once.
    let mut slow = Vec::new();
    for k in &book.keys {
        for (who, c) in [("busy", &busy), ("fresh", &fresh)] {
            let t = Instant::now();
            match c.mutex(k.clone()).lock_timeout(bound).await {
                Ok(g) => {
                    if t.elapsed() > Duration::from_secs(1) {
                        slow.push(format!("{who} {}: {:?}", short(k), t.elapsed()));
                    }
                    g.release().await.unwrap();
                }
                Err(e) => slow.push(format!("{who} {}: {e}", short(k))),
            }
        }
    }
    busy.shutdown().await;
    fresh.shutdown().await;
    let bad = book.bad.lock().unwrap().clone();
    assert!(bad.is_empty(), "{bad:#?}");
    assert!(slow.is_empty(), "keys not free afterwards: {slow:#?}");
    assert!(granted.load(Ordering::SeqCst) > 0 && gave_up.load(Ordering::SeqCst) > 0);
    nothing_left(&url, &ns).await;
}
