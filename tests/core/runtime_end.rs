//! Attacks on a client that outlives the runtime its tasks ran on: the ZooKeeper session gone
//! with its runtime (revived at the next use from a live one), the Redis backend's own
//! connection replaced when a call through it panics, and a Redlock node marked down by a
//! runtime that then ended. Real servers, public API only.
#![cfg(all(feature = "redis", feature = "zookeeper"))]

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::support::server::zookeeper::shared_zookeeper;
use crate::support::zk::{assert_no_znodes, client_at, raw};
use tokio::runtime::Runtime;
use tokio::time::{sleep, timeout, Instant};

/// A client built in runtime A, kept there; in B it holds a lock (`$acquire`), and a *second
/// client* (its own session, as another process) waits for the key (`$wait`). No other call
/// of the first client is made. Then A shuts down, taking the session's task with it: the
/// server expires the session after its 4 s timeout (or the revived hub deletes its nodes) and
/// grants the second client. Checked: the holder is told its lock is lost before (or when) the
/// other client is granted, the tokens increase, nothing is left after shutdown.
macro_rules! holder_alone_is_told {
    ($name:ident, $key:expr, $acquire:expr, $wait:expr) => {
        #[test]
        fn $name() {
            let connect = shared_zookeeper().connect_string();
            let ns = test_namespace!();
            let key: &'static str = $key;
            let path = format!("/{ns}/{key}");
            let first = Runtime::new().unwrap();
            let c = first.block_on(client_at(&connect, &ns, Duration::from_secs(4)));
            let second = Runtime::new().unwrap();
            let (held, other, waiting) = second.block_on(async {
                let held = Arc::new(
                    timeout(Duration::from_secs(10), ($acquire)(c.clone(), key))
                        .await
                        .unwrap()
                        .unwrap(),
                );
                let other = client_at(&connect, &ns, Duration::from_secs(4)).await;
                let o = other.clone();
                let h = held.clone();
                let waiting = waits_noting(move || h.is_lost(), async move {
                    timeout(Duration::from_secs(15), ($wait)(o, key)).await
                });
                let zk = raw(&connect).await;
                until_queued(&zk, &path).await;
                (held, other, waiting)
            });
            let token = held.fencing_token();
            drop(first);
            second.block_on(async {
                let began = Instant::now();
                let (g, at, told) = waiting.await.unwrap();
                let g = g
                    .expect("the other client was not granted within 15 s")
                    .expect("the other client's lock failed");
                assert_told_first(told, held.is_lost(), at, began);
                assert!(g.fencing_token() > token, "tokens did not increase");
                g.release().await.unwrap();
                drop(held);
                timeout(Duration::from_secs(5), c.shutdown())
                    .await
                    .expect("shutdown of the orphaned client did not end");
                other.shutdown().await;
                assert_no_znodes(&raw(&connect).await, &ns).await;
            });
        }
    };
}

/// Waits until something waits on the lock node at `path` (two nodes under it, or under its
/// admission node for a semaphore).
async fn until_queued(zk: &zookeeper_client::Client, path: &str) {
    timeout(Duration::from_secs(10), async {
        while crate::support::zk::waiting(zk, path).await < 1 {
            sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("nothing queued under {path}"));
}

holder_alone_is_told!(
    zk_mutex_holder_alone_on_its_client_is_told_before_another_process_is_granted,
    "held-alone",
    |c: distlock::LockClient, k: &'static str| async move { c.mutex(k).lock().await },
    |c: distlock::LockClient, k: &'static str| async move { c.mutex(k).lock().await }
);

holder_alone_is_told!(
    zk_permit_holder_alone_on_its_client_is_told_before_another_process_is_granted,
    "permit-alone",
    |c: distlock::LockClient, k: &'static str| async move { c.semaphore(k, 1).acquire().await },
    |c: distlock::LockClient, k: &'static str| async move { c.semaphore(k, 1).acquire().await }
);

holder_alone_is_told!(
    zk_reader_alone_on_its_client_is_told_before_a_writer_elsewhere_is_granted,
    "reader-alone",
    |c: distlock::LockClient, k: &'static str| async move { c.rw_lock(k).read().await },
    |c: distlock::LockClient, k: &'static str| async move { c.rw_lock(k).write().await }
);

/// A lock taken in runtime A (a static client and a guard kept across `#[tokio::test]`s), A
/// then shut down; in B a second client (its own session) waits for the key, reading the
/// guard the moment it is granted. Nothing else uses the first client. Checked: the holder is
/// told before (or when) the other client is granted; the server expires the orphaned session
/// after 4 s.
#[test]
fn zk_guard_taken_in_an_ended_runtime_is_told_before_another_process_is_granted() {
    let connect = shared_zookeeper().connect_string();
    let ns = test_namespace!();
    let key = "guard-from-a";
    let path = format!("/{ns}/{key}");
    let first = Runtime::new().unwrap();
    let (c, held) = first.block_on(async {
        let c = client_at(&connect, &ns, Duration::from_secs(4)).await;
        let held = c
            .mutex(key)
            .lock_timeout(Duration::from_secs(10))
            .await
            .unwrap();
        (c, held)
    });
    let token = held.fencing_token();
    let held = Arc::new(held);
    drop(first);
    let second = Runtime::new().unwrap();
    second.block_on(async {
        let began = Instant::now();
        let other = client_at(&connect, &ns, Duration::from_secs(4)).await;
        told_before_granted(&held, &other, key, began, token).await;
        drop(held);
        timeout(Duration::from_secs(5), c.shutdown())
            .await
            .expect("shutdown of the orphaned client did not end");
        other.shutdown().await;
        let _ = &path;
        assert_no_znodes(&raw(&connect).await, &ns).await;
    });
}

/// A warmed-up ZooKeeper client orphaned (its runtime ended); its server is unreachable
/// (blackholed by a proxy) when runtime B first uses it, so the revive's new session cannot
/// open; the link heals 3 s later (under the 4 s session). Checked: B's lock, asked for while
/// the server was unreachable, is granted within 5 s of the heal, a second lock of the key
/// then waits and is granted within 1 s of the release with a higher token, nothing is left.
#[test]
fn zk_revive_while_the_server_is_unreachable_is_served_once_it_is_back() {
    let zk_port = shared_zookeeper().port();
    let proxy = crate::support::proxy::Proxy::start(zk_port);
    let via = format!("127.0.0.1:{}", proxy.port());
    let direct = shared_zookeeper().connect_string();
    let ns = test_namespace!();
    let key = "revive-blackholed";
    let c = crate::support::orphan::orphan(|| client_at(&via, &ns, Duration::from_secs(4)), true);
    proxy.blackhole();
    let second = Runtime::new().unwrap();
    second.block_on(async {
        let asked = Instant::now();
        let m = c.mutex(key);
        let first_lock = tokio::spawn(async move { m.lock_timeout(Duration::from_secs(15)).await });
        sleep(Duration::from_secs(3)).await;
        proxy.heal();
        let healed = Instant::now();
        let g = timeout(Duration::from_secs(5), first_lock)
            .await
            .expect("the lock was not granted within 5 s of the heal")
            .unwrap()
            .expect("the lock failed");
        println!(
            "granted {:?} after the heal ({:?} after asking)",
            healed.elapsed(),
            asked.elapsed()
        );
        let m = c.mutex(key);
        let waiting = tokio::spawn(async move {
            let g = m.lock_timeout(Duration::from_secs(10)).await;
            (g, Instant::now())
        });
        crate::support::zk::until_contenders(&raw(&direct).await, &format!("/{ns}/{key}"), 2).await;
        let token = g.fencing_token();
        g.release().await.unwrap();
        let released = Instant::now();
        let (g2, at) = timeout(Duration::from_secs(5), waiting)
            .await
            .unwrap()
            .unwrap();
        let g2 = g2.unwrap();
        assert!(
            at - released < Duration::from_secs(1),
            "granted {:?} after",
            at - released
        );
        assert!(g2.fencing_token() > token);
        g2.release().await.unwrap();
        timeout(Duration::from_secs(5), c.shutdown())
            .await
            .expect("shutdown did not end");
        assert_no_znodes(&raw(&direct).await, &ns).await;
    });
}

/// A warmed-up ZooKeeper client orphaned; eight threads, each with its own current-thread
/// runtime, use it at once (each reviving, or racing the revive), each taking the same key
/// five times; every runtime is kept driven until all are done (the revived session runs on
/// one of them). Checked: never two holders at once (overlap counter), every token higher
/// than the one before, each thread done within 15 s, nothing left after a use and shutdown
/// from a last runtime.
#[test]
fn zk_eight_runtimes_reviving_at_once_never_overlap() {
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
    use std::sync::Arc;
    let connect = shared_zookeeper().connect_string();
    let ns = test_namespace!();
    let c =
        crate::support::orphan::orphan(|| client_at(&connect, &ns, Duration::from_secs(4)), true);
    let inside = Arc::new(AtomicUsize::new(0));
    let last = Arc::new(AtomicU64::new(0));
    let all_done = Arc::new(tokio::sync::Barrier::new(8));
    let threads: Vec<_> = (0..8)
        .map(|i| {
            let (c, inside, last) = (c.clone(), inside.clone(), last.clone());
            let all_done = all_done.clone();
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async {
                    for round in 0..5 {
                        let g = c
                            .mutex("shared-key")
                            .lock_timeout(Duration::from_secs(15))
                            .await
                            .unwrap_or_else(|e| panic!("thread {i} round {round}: {e}"));
                        assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                        let t = g.fencing_token();
                        let before = last.swap(t, Ordering::SeqCst);
                        assert!(t > before, "token {t} after {before}");
                        sleep(Duration::from_millis(5)).await;
                        inside.fetch_sub(1, Ordering::SeqCst);
                        g.release()
                            .await
                            .unwrap_or_else(|e| panic!("thread {i} round {round}: {e}"));
                    }
                    all_done.wait().await;
                });
            })
        })
        .collect();
    let began = std::time::Instant::now();
    for t in threads {
        t.join().expect("a thread panicked");
    }
    assert!(
        began.elapsed() < Duration::from_secs(15),
        "took {:?}",
        began.elapsed()
    );
    let rt = Runtime::new().unwrap();
    rt.block_on(async {
        // A use first: the session comes up on this runtime (see the shutdown tests below).
        let g = c.mutex("shared-key").lock().await.unwrap();
        g.release().await.unwrap();
        timeout(Duration::from_secs(5), c.shutdown())
            .await
            .expect("shutdown did not end");
        assert_no_znodes(&raw(&connect).await, &ns).await;
    });
}

/// Two `#[tokio::test]`s running in parallel (two threads, each its own current-thread
/// runtime) share a static ZooKeeper client orphaned by an earlier test. A uses it first
/// (reviving the session onto its runtime) and ends while B holds a lock; a second client
/// (its own session) waits for B's key. Checked: B's holder is told before (or when) the
/// other client is granted; B's next lock is granted within 5 s.
#[test]
fn zk_parallel_tests_one_ending_while_the_other_holds() {
    let connect = shared_zookeeper().connect_string();
    let ns = test_namespace!();
    let key = "parallel";
    let path = format!("/{ns}/{key}");
    let c =
        crate::support::orphan::orphan(|| client_at(&connect, &ns, Duration::from_secs(4)), true);
    let (revived_tx, revived_rx) = std::sync::mpsc::channel::<()>();
    let (end_tx, end_rx) = std::sync::mpsc::channel::<()>();
    let a = {
        let c = c.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let g = c
                    .mutex("a-key")
                    .lock_timeout(Duration::from_secs(10))
                    .await
                    .unwrap();
                g.release().await.unwrap();
                revived_tx.send(()).unwrap();
                tokio::task::spawn_blocking(move || end_rx.recv())
                    .await
                    .unwrap()
                    .unwrap();
            });
            drop(rt);
        })
    };
    revived_rx.recv().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let held = Arc::new(
            c.mutex(key)
                .lock_timeout(Duration::from_secs(10))
                .await
                .unwrap(),
        );
        let token = held.fencing_token();
        let other = client_at(&connect, &ns, Duration::from_secs(4)).await;
        let waiting = waits_for(&held, &other, key);
        crate::support::zk::until_contenders(&raw(&connect).await, &path, 2).await;
        end_tx.send(()).unwrap();
        let began = Instant::now();
        let (g, at, told) = waiting.await.unwrap();
        let g = g.expect("the other client was not granted within 15 s");
        assert_told_first(told, held.is_lost(), at, began);
        assert!(g.fencing_token() > token);
        g.release().await.unwrap();
        drop(held);
        let again = Instant::now();
        let g = timeout(Duration::from_secs(5), c.mutex(key).lock())
            .await
            .expect("B's next lock was not granted within 5 s")
            .unwrap();
        println!("B's next lock after {:?}", again.elapsed());
        g.release().await.unwrap();
        timeout(Duration::from_secs(5), c.shutdown())
            .await
            .expect("shutdown did not end");
        other.shutdown().await;
        assert_no_znodes(&raw(&connect).await, &ns).await;
    });
    a.join().unwrap();
}

/// A ZooKeeper client warmed up (a key locked and released) in runtime A, which ends; the
/// client is then shut down from runtime B without any other call (a static client's last
/// test only shuts it down). Checked: no znode is left under the namespace within 5 s of the
/// shutdown (the idle lock node's lingering delete was due on A's cleanup task).
#[test]
fn zk_shutdown_from_a_live_runtime_after_the_sessions_ended_leaves_no_znodes() {
    let connect = shared_zookeeper().connect_string();
    let ns = test_namespace!();
    let c =
        crate::support::orphan::orphan(|| client_at(&connect, &ns, Duration::from_secs(4)), true);
    let rt = Runtime::new().unwrap();
    rt.block_on(async {
        timeout(Duration::from_secs(5), c.shutdown())
            .await
            .expect("shutdown did not end");
        assert_no_znodes(&raw(&connect).await, &ns).await;
    });
}

/// As above, but runtime B first takes and releases a key (reviving the session onto B) and
/// ends; runtime C then only shuts the client down. Checked: no znode is left within 5 s.
#[test]
fn zk_shutdown_after_the_revived_sessions_runtime_ended_leaves_no_znodes() {
    let connect = shared_zookeeper().connect_string();
    let ns = test_namespace!();
    let c =
        crate::support::orphan::orphan(|| client_at(&connect, &ns, Duration::from_secs(4)), true);
    let b = Runtime::new().unwrap();
    b.block_on(async {
        let g = c
            .mutex("in-b")
            .lock_timeout(Duration::from_secs(10))
            .await
            .unwrap();
        g.release().await.unwrap();
    });
    drop(b);
    let rt = Runtime::new().unwrap();
    rt.block_on(async {
        timeout(Duration::from_secs(5), c.shutdown())
            .await
            .expect("shutdown did not end");
        assert_no_znodes(&raw(&connect).await, &ns).await;
    });
}

/// A ZooKeeper client orphaned (its runtime ended) and then only shut down from runtime B
/// (a static client's last test), on a private server; B stays up 3 s more. Checked: no
/// connection of the client is open on the server afterwards (`cons`): the shutdown's revive
/// must not leave a new session behind.
#[test]
fn zk_shutdown_of_an_orphan_leaves_no_session_open() {
    let server = crate::support::server::zookeeper::ZkServer::start();
    let connect = server.connect_string();
    let ns = test_namespace!();
    let c =
        crate::support::orphan::orphan(|| client_at(&connect, &ns, Duration::from_secs(4)), true);
    let rt = Runtime::new().unwrap();
    rt.block_on(async {
        timeout(Duration::from_secs(5), c.shutdown())
            .await
            .expect("shutdown did not end");
        sleep(Duration::from_secs(3)).await;
    });
    let cons = server.four_letter("cons");
    // The `cons` request itself shows as a connection that sent one packet.
    let open: Vec<&str> = cons
        .lines()
        .filter(|l| l.contains("/127.0.0.1:") && !l.contains("queued=0,recved=1,sent=0"))
        .collect();
    println!("{cons}");
    assert!(open.is_empty(), "connections left open: {open:?}");
}

/// Spawns a lock of `key` on the current runtime, reporting a panic as the `JoinError` a user
/// would see.
fn spawn_lock(
    c: &distlock::LockClient,
    key: &str,
    within: Duration,
) -> tokio::task::JoinHandle<distlock::Result<distlock::MutexGuard>> {
    let m = c.mutex(key);
    tokio::spawn(async move { m.lock_timeout(within).await })
}

/// A static Redis client (reached through a proxy) used by one test runtime after another,
/// alternating current-thread and multi-thread. In each: the proxy cuts every connection and
/// refuses new ones, a lock is started (the connection manager starts its shared reconnect,
/// on this runtime's timers) and the runtime shuts down 300 ms later, mid-reconnect; the
/// proxy then passes again. The next runtime locks and releases first. Checked, each round:
/// the lock neither panics (a `JoinError` from the task running `lock()`) nor fails, and is
/// granted within 5 s; tokens increase; nothing is left after shutdown.
#[test]
fn redis_runtimes_ended_mid_reconnect_one_after_another() {
    let redis = crate::support::server::redis::shared_redis();
    let proxy = crate::support::proxy::Proxy::start(redis.port());
    let url = format!("redis://127.0.0.1:{}", proxy.port());
    let ns = test_namespace!();
    let c = crate::support::redis::orphaned_client(&url, &ns, Duration::from_secs(3));
    let mut last = 0;
    for round in 0..6 {
        let rt = if round % 2 == 0 {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
        } else {
            Runtime::new().unwrap()
        };
        rt.block_on(async {
            let began = Instant::now();
            let g = spawn_lock(&c, "reconnects", Duration::from_secs(5))
                .await
                .unwrap_or_else(|e| panic!("round {round}: lock() panicked: {e}"))
                .unwrap_or_else(|e| panic!("round {round}: lock() failed: {e}"));
            assert!(
                g.fencing_token() > last,
                "round {round}: token did not increase"
            );
            last = g.fencing_token();
            println!("round {round}: granted after {:?}", began.elapsed());
            g.release().await.unwrap();
            proxy.cut();
            let _mid = spawn_lock(&c, "reconnects", Duration::from_secs(5));
            sleep(Duration::from_millis(300)).await;
        });
        drop(rt);
        proxy.pass();
    }
    let rt = Runtime::new().unwrap();
    rt.block_on(async {
        let g = spawn_lock(&c, "reconnects", Duration::from_secs(5))
            .await
            .expect("the last lock() panicked")
            .expect("the last lock() failed");
        g.release().await.unwrap();
        timeout(Duration::from_secs(5), c.shutdown())
            .await
            .expect("shutdown did not end");
        crate::support::redis::until_only_fences(&redis.url(), &ns).await;
    });
}

/// A Redis client (through a proxy) shared by seven threads, each with its own runtime (six
/// current-thread, one multi-thread), locking keys of their own in a loop. The proxy cuts
/// every connection, then thread 0's runtime shuts down 200 ms into the reconnect (while the
/// others' calls may share that reconnect: one of them then panics in it, and the shared
/// future wakes none of the others), and the proxy passes again. Checked: no lock() panics in
/// the other threads (`JoinError`), and each of them locks again within 3 s of the proxy
/// passing (a call left asleep on the reconnect would wait out its 5 s call timeout).
#[test]
fn redis_one_of_seven_runtimes_ends_mid_reconnect() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, OnceLock};
    let redis = crate::support::server::redis::shared_redis();
    let proxy = Arc::new(crate::support::proxy::Proxy::start(redis.port()));
    let url = format!("redis://127.0.0.1:{}", proxy.port());
    let ns = test_namespace!();
    let first = Runtime::new().unwrap();
    let c = first.block_on(crate::support::redis::client(
        &url,
        &ns,
        Duration::from_secs(3),
        Duration::from_secs(2),
        true,
    ));
    let stop = Arc::new(AtomicBool::new(false));
    let passed = Arc::new(OnceLock::<Instant>::new());
    let (cut_tx, cut_rx) = std::sync::mpsc::channel::<()>();
    let (ended_tx, ended_rx) = std::sync::mpsc::channel::<()>();
    let ender = {
        let c = c.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let g = c.mutex("t0").lock().await.unwrap();
                g.release().await.unwrap();
                tokio::task::spawn_blocking(move || cut_rx.recv())
                    .await
                    .unwrap()
                    .unwrap();
                for _ in 0..4 {
                    drop(spawn_lock(&c, "t0", Duration::from_secs(5)));
                }
                sleep(Duration::from_millis(200)).await;
            });
            drop(rt);
            ended_tx.send(()).unwrap();
        })
    };
    let workers: Vec<_> = (1..=6)
        .map(|i| {
            let (c, stop, passed) = (c.clone(), stop.clone(), passed.clone());
            std::thread::spawn(move || {
                let rt = if i < 6 {
                    tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .unwrap()
                } else {
                    Runtime::new().unwrap()
                };
                rt.block_on(async {
                    let key = format!("t{i}");
                    let mut locked_again = None;
                    while !stop.load(Ordering::SeqCst) {
                        match spawn_lock(&c, &key, Duration::from_secs(5)).await {
                            Err(e) => panic!("thread {i}: lock() panicked: {e}"),
                            Ok(Ok(g)) => {
                                let _ = g.release().await;
                                if let (None, Some(p)) = (locked_again, passed.get()) {
                                    locked_again = Some(p.elapsed());
                                }
                            }
                            Ok(Err(_)) => {}
                        }
                        sleep(Duration::from_millis(20)).await;
                    }
                    locked_again
                })
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    proxy.cut();
    cut_tx.send(()).unwrap();
    ended_rx.recv().unwrap();
    proxy.pass();
    passed.set(Instant::now()).unwrap();
    std::thread::sleep(Duration::from_secs(6));
    stop.store(true, Ordering::SeqCst);
    ender.join().unwrap();
    let after: Vec<_> = workers
        .into_iter()
        .enumerate()
        .map(|(i, w)| {
            w.join()
                .unwrap_or_else(|_| panic!("worker {} panicked", i + 1))
        })
        .collect();
    for (i, locked_again) in after.iter().enumerate() {
        assert!(
            locked_again.is_some_and(|d| d < Duration::from_secs(3)),
            "worker {} locked again {locked_again:?} after the proxy passed (all: {after:?})",
            i + 1
        );
    }
    first.block_on(async {
        timeout(Duration::from_secs(5), c.shutdown())
            .await
            .expect("shutdown did not end");
        crate::support::redis::until_only_fences(&redis.url(), &ns).await;
    });
}

/// A Redis lock (TTL 3 s, renewed) taken in runtime A with a client kept in a static, A then
/// shut down (its renewals went with it); in B a second client waits for the key, reading the
/// guard the moment it is granted. Checked: the holder is told before (or when) the other
/// client is granted, with a higher token.
#[test]
fn redis_guard_taken_in_an_ended_runtime_is_told_before_another_client_is_granted() {
    let url = crate::support::server::redis::shared_redis().url();
    let ns = test_namespace!();
    let key = "guard-from-a";
    let first = Runtime::new().unwrap();
    let (c, held) = first.block_on(async {
        let c = crate::support::redis::client(
            &url,
            &ns,
            Duration::from_secs(3),
            Duration::from_secs(2),
            true,
        )
        .await;
        let held = c.mutex(key).lock().await.unwrap();
        (c, held)
    });
    let token = held.fencing_token();
    let held = Arc::new(held);
    drop(first);
    let second = Runtime::new().unwrap();
    second.block_on(async {
        let began = Instant::now();
        let other = crate::support::redis::client(
            &url,
            &ns,
            Duration::from_secs(3),
            Duration::from_secs(2),
            true,
        )
        .await;
        told_before_granted(&held, &other, key, began, token).await;
        drop(held);
        timeout(Duration::from_secs(5), c.shutdown())
            .await
            .expect("shutdown of the orphaned client did not end");
        other.shutdown().await;
        crate::support::redis::until_only_fences(&url, &ns).await;
    });
}

/// A Redis client of a private server, used by one runtime after another (alternating
/// current-thread and multi-thread). In each: a lock is held, a second lock of the key waits,
/// the holder releases, the waiter is granted; then the server is paused (SIGSTOP), a lock is
/// started (its call waits for a reply) and the runtime shuts down 300 ms later, mid-call;
/// the server resumes (SIGCONT). Checked, each round: no lock() panics (`JoinError`) or
/// fails; the first lock is granted within 5 s, the waiter within 1 s of the release, tokens
/// increase; nothing is left after shutdown.
#[test]
fn redis_runtimes_ended_mid_call_to_a_paused_server() {
    use crate::support::server::redis::RedisServer;
    let server = RedisServer::start();
    let url = server.url();
    let pid = server.pid();
    let ns = test_namespace!();
    let c = crate::support::redis::orphaned_client(&url, &ns, Duration::from_secs(3));
    let mut last = 0;
    for round in 0..4 {
        let rt = if round % 2 == 0 {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
        } else {
            Runtime::new().unwrap()
        };
        rt.block_on(async {
            let began = Instant::now();
            let g = spawn_lock(&c, "paused", Duration::from_secs(5))
                .await
                .unwrap_or_else(|e| panic!("round {round}: lock() panicked: {e}"))
                .unwrap_or_else(|e| panic!("round {round}: lock() failed: {e}"));
            println!("round {round}: granted after {:?}", began.elapsed());
            assert!(g.fencing_token() > last, "round {round}: token");
            let waiting = spawn_lock(&c, "paused", Duration::from_secs(5));
            crate::support::redis::until_queued(&url, &ns, "paused", 1).await;
            let token = g.fencing_token();
            g.release().await.unwrap();
            let released = Instant::now();
            let g2 = timeout(Duration::from_secs(5), waiting)
                .await
                .unwrap_or_else(|_| panic!("round {round}: waiter not granted within 5 s"))
                .unwrap_or_else(|e| panic!("round {round}: the waiter panicked: {e}"))
                .unwrap_or_else(|e| panic!("round {round}: the waiter failed: {e}"));
            let waited = released.elapsed();
            assert!(g2.fencing_token() > token);
            last = g2.fencing_token();
            g2.release().await.unwrap();
            assert!(
                waited < Duration::from_secs(1),
                "round {round}: waiter granted {waited:?} after the release"
            );
            RedisServer::signal(pid, "STOP");
            let _mid = spawn_lock(&c, "paused", Duration::from_secs(5));
            sleep(Duration::from_millis(300)).await;
        });
        drop(rt);
        RedisServer::signal(pid, "CONT");
    }
    let rt = Runtime::new().unwrap();
    rt.block_on(async {
        timeout(Duration::from_secs(5), c.shutdown())
            .await
            .expect("shutdown did not end");
        crate::support::redis::until_only_fences(&url, &ns).await;
    });
}

/// A static ZooKeeper client used by one short runtime after another (alternating
/// current-thread and multi-thread). Each runtime first locks and releases a key (the lock
/// that revives the session there), then starts two more locks of it and shuts down 0-40 ms
/// later: mid-revive, mid-connect, mid-create or holding. Checked, each round: the first lock
/// neither panics (`JoinError`) nor fails and is granted within 5 s; never two holders
/// (the tokens increase); nothing is left after a last use and shutdown.
#[test]
fn zk_runtimes_ended_mid_revive_one_after_another() {
    let connect = shared_zookeeper().connect_string();
    let ns = test_namespace!();
    let c =
        crate::support::orphan::orphan(|| client_at(&connect, &ns, Duration::from_secs(4)), true);
    let mut last = 0;
    let began_all = Instant::now();
    for round in 0..10u64 {
        let rt = if round % 2 == 0 {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
        } else {
            Runtime::new().unwrap()
        };
        rt.block_on(async {
            let began = Instant::now();
            let g = spawn_lock(&c, "revives", Duration::from_secs(5))
                .await
                .unwrap_or_else(|e| panic!("round {round}: lock() panicked: {e}"))
                .unwrap_or_else(|e| panic!("round {round}: lock() failed: {e}"));
            println!("round {round}: granted after {:?}", began.elapsed());
            assert!(
                g.fencing_token() > last,
                "round {round}: token {} after {last}",
                g.fencing_token()
            );
            last = g.fencing_token();
            g.release().await.unwrap();
            let _a = spawn_lock(&c, "revives", Duration::from_secs(5));
            let _b = spawn_lock(&c, "revives", Duration::from_secs(5));
            sleep(Duration::from_millis(round * 4)).await;
        });
        drop(rt);
    }
    println!("all rounds {:?}", began_all.elapsed());
    let rt = Runtime::new().unwrap();
    rt.block_on(async {
        let g = timeout(Duration::from_secs(10), c.mutex("revives").lock())
            .await
            .expect("the last lock was not granted within 10 s")
            .unwrap();
        assert!(g.fencing_token() > last);
        g.release().await.unwrap();
        timeout(Duration::from_secs(5), c.shutdown())
            .await
            .expect("shutdown did not end");
        assert_no_znodes(&raw(&connect).await, &ns).await;
    });
}

holder_alone_is_told!(
    zk_leader_alone_on_its_client_is_told_before_another_process_leads,
    "leader-alone",
    |c: distlock::LockClient, k: &'static str| async move { c.election(k).campaign("a").await },
    |c: distlock::LockClient, k: &'static str| async move { c.election(k).campaign("b").await }
);

/// A private ZooKeeper server; a client built in runtime A holds a lock taken in B, and a
/// second client (its own session) waits in B. The server is killed, A shuts down while it
/// is down, and the server comes back 2 s later on its data directory (the old session
/// revived there, with nothing left to keep it alive). Checked: the holder is told before (or
/// when) the other client is granted, within 15 s; the tokens increase; the orphaned client's
/// next lock is granted and its shutdown ends.
#[test]
fn zk_runtime_ends_while_the_server_is_down_then_it_restarts() {
    let mut server = crate::support::server::zookeeper::ZkServer::start();
    let connect = server.connect_string();
    let ns = test_namespace!();
    let key = "restart";
    let path = format!("/{ns}/{key}");
    let first = Runtime::new().unwrap();
    let c = first.block_on(client_at(&connect, &ns, Duration::from_secs(4)));
    let second = Runtime::new().unwrap();
    let (held, other, waiting) = second.block_on(async {
        let held = Arc::new(
            c.mutex(key)
                .lock_timeout(Duration::from_secs(10))
                .await
                .unwrap(),
        );
        let other = client_at(&connect, &ns, Duration::from_secs(4)).await;
        let waiting = waits_for(&held, &other, key);
        crate::support::zk::until_contenders(&raw(&connect).await, &path, 2).await;
        (held, other, waiting)
    });
    let token = held.fencing_token();
    let began = Instant::now();
    server.restart_after(|| {
        drop(first);
        std::thread::sleep(Duration::from_secs(2));
    });
    second.block_on(async {
        // The waiting task judged the grant when it came: this thread was restarting the
        // server meanwhile, and looks only now.
        let (g, at, told) = waiting.await.unwrap();
        let g = g.expect("the other client was not granted within 15 s");
        assert_told_first(told, held.is_lost(), at, began);
        assert!(g.fencing_token() > token);
        g.release().await.unwrap();
        drop(held);
        let g = timeout(Duration::from_secs(5), c.mutex(key).lock())
            .await
            .expect("the orphaned client's next lock was not granted within 5 s")
            .unwrap();
        g.release().await.unwrap();
        timeout(Duration::from_secs(5), c.shutdown())
            .await
            .expect("shutdown did not end");
        other.shutdown().await;
    });
}

/// The pid of the process listening on `port` (from `ss`).
fn listener_pid(port: u16) -> u32 {
    let out = std::process::Command::new("ss")
        .args(["-ltnpH", &format!("sport = :{port}")])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    text.split("pid=")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no listener pid for port {port}: {text}"))
}

/// A private ZooKeeper server; a client built in runtime A (kept there) holds a lock taken in
/// B and a second lock of the same client waits in B. The server is paused (SIGSTOP), A shuts
/// down (the session's task gone), and 2 s later the server resumes (SIGCONT): the revive in B
/// opens its new session against a paused server. Checked: the holder is told within 3 s of
/// the resume, the waiter is granted within 8 s of it and only after the holder was told, with
/// a higher token; the client's shutdown ends and no znode is left.
#[test]
fn zk_runtime_ends_while_the_server_is_paused() {
    use crate::support::server::redis::RedisServer;
    let server = crate::support::server::zookeeper::ZkServer::start();
    let connect = server.connect_string();
    let pid = listener_pid(server.port());
    let ns = test_namespace!();
    let key = "paused";
    let path = format!("/{ns}/{key}");
    let first = Runtime::new().unwrap();
    let c = first.block_on(client_at(&connect, &ns, Duration::from_secs(4)));
    let second = Runtime::new().unwrap();
    let (held, waiting) = second.block_on(async {
        let held = Arc::new(
            c.mutex(key)
                .lock_timeout(Duration::from_secs(10))
                .await
                .unwrap(),
        );
        let (m, h) = (c.mutex(key), held.clone());
        let waiting = waits_noting(move || h.is_lost(), async move {
            m.lock_timeout(Duration::from_secs(20)).await
        });
        crate::support::zk::until_contenders(&raw(&connect).await, &path, 2).await;
        (held, waiting)
    });
    let token = held.fencing_token();
    RedisServer::signal(pid, "STOP");
    drop(first);
    std::thread::sleep(Duration::from_secs(2));
    RedisServer::signal(pid, "CONT");
    let resumed = Instant::now();
    second.block_on(async {
        let mut told_at = None;
        let mut waiting = waiting;
        let (g, at, told) = loop {
            tokio::select! {
                biased;
                _ = held.lost(), if told_at.is_none() => told_at = Some(Instant::now()),
                r = &mut waiting => break r.unwrap(),
            }
        };
        let told_at = told_at.or_else(|| held.is_lost().then(Instant::now));
        println!(
            "waiter: {:?} after {:?}, holder told after {:?}",
            g.as_ref().map(|g| g.fencing_token()),
            at.saturating_duration_since(resumed),
            told_at.map(|t| t.saturating_duration_since(resumed))
        );
        let g = g.expect("the waiter failed");
        assert_told_first(told, held.is_lost(), at, resumed);
        let told_after = told_at.map(|t| t.saturating_duration_since(resumed));
        assert!(
            told_after.is_some_and(|d| d < Duration::from_secs(3)),
            "the holder was told {told_after:?} after the resume"
        );
        assert!(at.saturating_duration_since(resumed) < Duration::from_secs(8));
        assert!(g.fencing_token() > token);
        g.release().await.unwrap();
        drop(held);
        timeout(Duration::from_secs(5), c.shutdown())
            .await
            .expect("shutdown did not end");
        assert_no_znodes(&raw(&connect).await, &ns).await;
    });
}

/// A ZooKeeper client (through a proxy to a private server) orphaned; the proxy blackholes,
/// runtime B starts a lock (reviving the session: its connect hangs) and shuts the client
/// down 300 ms later; the proxy heals 1 s after that and B stays up 5 s more. Checked: the
/// shutdown ends within 5 s, the lock ends (it is not left waiting), and afterwards no
/// connection of the client is open on the server (the revive's reconnect did not open a
/// session after the shutdown).
#[test]
fn zk_shutdown_while_the_revive_connects_to_an_unreachable_server() {
    let server = crate::support::server::zookeeper::ZkServer::start();
    let proxy = crate::support::proxy::Proxy::start(server.port());
    let via = format!("127.0.0.1:{}", proxy.port());
    let ns = test_namespace!();
    let c = crate::support::orphan::orphan(|| client_at(&via, &ns, Duration::from_secs(4)), true);
    proxy.blackhole();
    let rt = Runtime::new().unwrap();
    rt.block_on(async {
        let lock = spawn_lock(&c, "k", Duration::from_secs(15));
        sleep(Duration::from_millis(300)).await;
        timeout(Duration::from_secs(5), c.shutdown())
            .await
            .expect("shutdown did not end within 5 s");
        sleep(Duration::from_secs(1)).await;
        proxy.heal();
        let r = timeout(Duration::from_secs(5), lock)
            .await
            .expect("the lock did not end within 6 s of the shutdown")
            .expect("lock() panicked");
        println!(
            "lock after shutdown: {:?}",
            r.as_ref().map(|g| g.fencing_token())
        );
        assert!(r.is_err(), "a lock was granted after the shutdown");
        sleep(Duration::from_secs(4)).await;
    });
    let cons = server.four_letter("cons");
    println!("{cons}");
    // The `cons` request itself shows as a connection that sent one packet.
    let open: Vec<&str> = cons
        .lines()
        .filter(|l| l.contains("/127.0.0.1:") && !l.contains("queued=0,recved=1,sent=0"))
        .collect();
    assert!(open.is_empty(), "connections left open: {open:?}");
}

/// A Redis lock (TTL 30 s) taken in runtime A by a client kept in a static; A shuts down; the
/// guard is dropped on a plain thread (no runtime: a static guard dropped at exit, say); the
/// client is then shut down from runtime B. Checked: within 5 s of the shutdown only fencing
/// counters are left in the namespace (not the lock's key, for its 30 s TTL), and a second
/// client then gets the key at once.
#[test]
fn redis_guard_dropped_outside_any_runtime_then_shutdown_leaves_no_key() {
    let url = crate::support::server::redis::shared_redis().url();
    let ns = test_namespace!();
    let first = Runtime::new().unwrap();
    let (c, held) = first.block_on(async {
        let c = crate::support::redis::client(
            &url,
            &ns,
            Duration::from_secs(30),
            Duration::from_secs(2),
            true,
        )
        .await;
        let held = c.mutex("dropped").lock().await.unwrap();
        (c, held)
    });
    drop(first);
    drop(held);
    let rt = Runtime::new().unwrap();
    rt.block_on(async {
        timeout(Duration::from_secs(5), c.shutdown())
            .await
            .expect("shutdown did not end");
        crate::support::redis::until_only_fences(&url, &ns).await;
        let other = crate::support::redis::client(
            &url,
            &ns,
            Duration::from_secs(30),
            Duration::from_secs(2),
            true,
        )
        .await;
        let g = timeout(Duration::from_secs(1), other.mutex("dropped").try_lock())
            .await
            .unwrap()
            .expect("the key was still held");
        g.release().await.unwrap();
        other.shutdown().await;
    });
}

/// The ZooKeeper form: a lock taken in runtime A, A shut down, the guard dropped on a plain
/// thread, the client shut down from runtime B. Checked: a second client gets the key within
/// 5 s (the orphaned session's node goes at its 4 s expiry at the latest).
#[test]
fn zk_guard_dropped_outside_any_runtime_then_shutdown_frees_the_key() {
    let connect = shared_zookeeper().connect_string();
    let ns = test_namespace!();
    let first = Runtime::new().unwrap();
    let (c, held) = first.block_on(async {
        let c = client_at(&connect, &ns, Duration::from_secs(4)).await;
        let held = c.mutex("dropped").lock().await.unwrap();
        (c, held)
    });
    drop(first);
    drop(held);
    let rt = Runtime::new().unwrap();
    rt.block_on(async {
        timeout(Duration::from_secs(5), c.shutdown())
            .await
            .expect("shutdown did not end");
        let began = Instant::now();
        let other = client_at(&connect, &ns, Duration::from_secs(4)).await;
        let g = timeout(Duration::from_secs(5), other.mutex("dropped").lock())
            .await
            .expect("the key was not free within 5 s")
            .unwrap();
        println!("granted after {:?}", began.elapsed());
        g.release().await.unwrap();
        other.shutdown().await;
    });
}

/// A Redis lock (TTL 30 s) taken in runtime A (a test) by a client kept in a static, the guard
/// kept too; A shuts down; the next test's runtime B uses the client (a lock of another key)
/// and then drops the guard inside B. Checked: a second client gets the key within 2 s of the
/// drop (not at the 30 s TTL), and within 5 s of the client's shutdown only fencing counters
/// are left.
#[test]
fn redis_guard_from_an_ended_runtime_dropped_in_a_live_one_is_released() {
    let url = crate::support::server::redis::shared_redis().url();
    let ns = test_namespace!();
    let first = Runtime::new().unwrap();
    let (c, held) = first.block_on(async {
        let c = crate::support::redis::client(
            &url,
            &ns,
            Duration::from_secs(30),
            Duration::from_secs(2),
            true,
        )
        .await;
        let held = c.mutex("kept").lock().await.unwrap();
        (c, held)
    });
    drop(first);
    let rt = Runtime::new().unwrap();
    rt.block_on(async {
        let g = c.mutex("other-key").lock().await.unwrap();
        g.release().await.unwrap();
        let other = crate::support::redis::client(
            &url,
            &ns,
            Duration::from_secs(30),
            Duration::from_secs(2),
            true,
        )
        .await;
        drop(held);
        let dropped = Instant::now();
        let g = timeout(Duration::from_secs(2), other.mutex("kept").lock())
            .await
            .expect("the dropped guard's key was not free within 2 s")
            .unwrap();
        println!("granted {:?} after the drop", dropped.elapsed());
        g.release().await.unwrap();
        timeout(Duration::from_secs(5), c.shutdown())
            .await
            .expect("shutdown did not end");
        other.shutdown().await;
        crate::support::redis::until_only_fences(&url, &ns).await;
    });
}

/// A Redis client orphaned (its runtime ended after a lock), used from three current-thread
/// runtimes in turn: in each a semaphore permit (1 of 1) is held and a second waits, then a
/// write lock is held and a read waits. Checked: each waiter is granted within 1 s of the
/// release (the pub/sub task runs again), tokens increase; nothing is left after shutdown.
#[test]
fn redis_orphan_semaphore_and_rw_waiters_hear_their_grants() {
    let url = crate::support::server::redis::shared_redis().url();
    let ns = test_namespace!();
    let c = crate::support::redis::orphaned_client(&url, &ns, Duration::from_secs(10));
    for round in 0..3 {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let sem = c.semaphore("sem", 1);
            let p = sem.acquire().await.unwrap();
            let s2 = sem.clone();
            let waiting =
                tokio::spawn(async move { s2.acquire_timeout(Duration::from_secs(15)).await });
            sleep(Duration::from_millis(300)).await;
            let t = p.fencing_token();
            p.release().await.unwrap();
            let released = Instant::now();
            let p2 = timeout(Duration::from_secs(5), waiting)
                .await
                .unwrap_or_else(|_| panic!("round {round}: permit waiter not granted in 5 s"))
                .unwrap()
                .unwrap();
            let waited = released.elapsed();
            assert!(p2.fencing_token() > t);
            p2.release().await.unwrap();
            assert!(
                waited < Duration::from_secs(1),
                "round {round}: permit after {waited:?}"
            );
            let rw = c.rw_lock("rw");
            let w = rw.write().await.unwrap();
            let r2 = rw.clone();
            let reading = tokio::spawn(async move {
                tokio::time::timeout(Duration::from_secs(15), r2.read()).await
            });
            sleep(Duration::from_millis(300)).await;
            w.release().await.unwrap();
            let released = Instant::now();
            let r = timeout(Duration::from_secs(5), reading)
                .await
                .unwrap_or_else(|_| panic!("round {round}: reader not granted in 5 s"))
                .unwrap()
                .unwrap()
                .unwrap();
            let waited = released.elapsed();
            r.release().await.unwrap();
            assert!(
                waited < Duration::from_secs(1),
                "round {round}: read after {waited:?}"
            );
        });
    }
    let rt = Runtime::new().unwrap();
    rt.block_on(async {
        timeout(Duration::from_secs(5), c.shutdown())
            .await
            .expect("shutdown did not end");
        crate::support::redis::until_only_fences(&url, &ns).await;
    });
}

/// The control of the dropped guard above: a Redis lock (TTL 30 s) taken in runtime A, A
/// shut down, the guard *released* (`release().await`) in runtime B. Checked: the release
/// succeeds and a second client gets the key within 2 s.
#[test]
fn redis_guard_from_an_ended_runtime_released_in_a_live_one_frees_the_key() {
    let url = crate::support::server::redis::shared_redis().url();
    let ns = test_namespace!();
    let first = Runtime::new().unwrap();
    let (c, held) = first.block_on(async {
        let c = crate::support::redis::client(
            &url,
            &ns,
            Duration::from_secs(30),
            Duration::from_secs(2),
            true,
        )
        .await;
        let held = c.mutex("kept").lock().await.unwrap();
        (c, held)
    });
    drop(first);
    let rt = Runtime::new().unwrap();
    rt.block_on(async {
        let other = crate::support::redis::client(
            &url,
            &ns,
            Duration::from_secs(30),
            Duration::from_secs(2),
            true,
        )
        .await;
        timeout(Duration::from_secs(5), held.release())
            .await
            .expect("release did not end")
            .expect("release failed");
        let g = timeout(Duration::from_secs(2), other.mutex("kept").lock())
            .await
            .expect("the released key was not free within 2 s")
            .unwrap();
        g.release().await.unwrap();
        timeout(Duration::from_secs(5), c.shutdown())
            .await
            .expect("shutdown did not end");
        other.shutdown().await;
        crate::support::redis::until_only_fences(&url, &ns).await;
    });
}

/// A task waiting for a key another holds: what it got, when, and whether the holder's guard
/// read lost at that moment (see [`waits_noting`]).
type Waiting<G> = tokio::task::JoinHandle<(G, Instant, bool)>;

/// Starts `wait` in a task that reads `told` (whether the holder's guard is lost) the moment
/// it returns. A grant is so judged against the holder when it happens, in the runtime both
/// run in, not when the test's thread looks (it may be busy restarting a server, or woken
/// late, with both outcomes ready by then).
fn waits_noting<G: Send + 'static>(
    told: impl Fn() -> bool + Send + 'static,
    wait: impl Future<Output = G> + Send + 'static,
) -> Waiting<G> {
    tokio::spawn(async move {
        let g = wait.await;
        let told = told();
        (g, Instant::now(), told)
    })
}

/// `other`'s lock of `key`, waiting (15 s at most) while `held` holds it (see
/// [`waits_noting`]).
fn waits_for(
    held: &Arc<distlock::MutexGuard>,
    other: &distlock::LockClient,
    key: &str,
) -> Waiting<distlock::Result<distlock::MutexGuard>> {
    let m = other.mutex(key);
    let h = held.clone();
    waits_noting(move || h.is_lost(), async move {
        m.lock_timeout(Duration::from_secs(15)).await
    })
}

/// The holder must have been told by the time the other client was granted (at `at`): `told`
/// is what the waiting task read then, `lost_now` what the guard reads now (to tell a holder
/// told too late from one never told). Printed against `began`.
fn assert_told_first(told: bool, lost_now: bool, at: Instant, began: Instant) {
    println!(
        "other granted after {:?}; holder told by then: {told}, lost now: {lost_now}",
        at - began
    );
    assert!(
        told || lost_now,
        "two holders: the other client was granted {:?} after the runtime ended, and the \
         holder was never told",
        at - began
    );
    assert!(told, "granted before the holder was told");
}

/// `other` waits for `key` while `held` (another client's lock of it, whose runtime ended at
/// `began`) goes lost. Checked: `other` is granted within 15 s, not before the holder was told,
/// with a higher token than `token`; then it releases.
async fn told_before_granted(
    held: &Arc<distlock::MutexGuard>,
    other: &distlock::LockClient,
    key: &str,
    began: Instant,
    token: u64,
) {
    let (g, at, told) = waits_for(held, other, key).await.unwrap();
    let g = g.expect("the other client was not granted within 15 s");
    assert_told_first(told, held.is_lost(), at, began);
    assert!(g.fencing_token() > token);
    g.release().await.unwrap();
}

/// Redlock over three private nodes (each behind a proxy), the client built in a runtime that
/// stays up. Runtime A cuts node 0 off and locks a key a few times (node 0's calls fail: it is
/// marked down, and the task that probes it until it answers is spawned on A), then A ends
/// while node 0 is still cut off; node 0's proxy passes again. Runtime B then locks and
/// releases a key in a loop for 4 s. Checked: node 0 counts again (holds B's lock key while B
/// holds it) within 3 s of passing: a node that is reachable is not left out for good
/// because the runtime whose call marked it down ended.
#[test]
#[cfg(feature = "redlock")]
fn redlock_node_marked_down_from_an_ended_runtime_counts_again_once_back() {
    let nodes = crate::support::server::redlock::Nodes::start(3);
    let ns = test_namespace!();
    let (first, c) = node0_marked_down_from_an_ended_runtime(&nodes, &ns);
    let passed = std::time::Instant::now();
    let node0 = nodes.servers[0].url();
    let b = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let back = b.block_on(async {
        while passed.elapsed() < Duration::from_secs(4) {
            let g = c
                .mutex("in-b")
                .lock_timeout(Duration::from_secs(5))
                .await
                .unwrap();
            let on0 = crate::support::redis::keys_in(&node0, &ns)
                .await
                .into_iter()
                .any(|k| k.contains("in-b") && !k.ends_with(":fence"));
            g.release().await.unwrap();
            if on0 {
                return Some(passed.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
    });
    // B ends, as a test's runtime does: a current-thread runtime kept but no longer driven
    // would hold up the calls of connections made on it (redis-rs runs them in its tasks).
    drop(b);
    println!("node 0 held B's lock {back:?} after its proxy passed");
    assert!(
        back.is_some_and(|d| d < Duration::from_secs(3)),
        "node 0 did not hold B's lock within 3 s of being reachable again ({back:?})"
    );
    shut_down_clean(&first, &c, &nodes, &ns);
}

/// As above (node 0 marked down from runtime A, which ends while node 0 is cut off; node 0
/// then reachable again), then runtime B (multi-thread, live) takes a lock with a 3 s lease
/// and holds it while node 1 alone is cut off for 3 s: two of three nodes (0 and 2) answer
/// throughout. Checked: the holder keeps its lock (a quorum of reachable nodes could renew
/// it, had node 0 been counted again when it came back).
#[test]
#[cfg(feature = "redlock")]
fn redlock_holder_keeps_its_lock_through_one_node_cut_after_a_runtime_ended() {
    let nodes = crate::support::server::redlock::Nodes::start(3);
    let ns = test_namespace!();
    let (first, c) = node0_marked_down_from_an_ended_runtime(&nodes, &ns);
    let b = tokio::runtime::Runtime::new().unwrap();
    b.block_on(async {
        // Node 0 has been reachable for 1.5 s before the lock is taken.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let g = c
            .mutex("held")
            .lock_timeout(Duration::from_secs(5))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        nodes.proxies[1].cut();
        tokio::time::sleep(Duration::from_secs(3)).await;
        let lost = g.is_lost();
        nodes.proxies[1].pass();
        assert!(
            !lost,
            "the holder lost its lock while nodes 0 and 2 (a quorum) were reachable"
        );
        let _ = g.release().await;
    });
    shut_down_clean(&first, &c, &nodes, &ns);
}

/// A Redis client (1 s leases, renewed) built in runtime H, kept to the end. Runtime A takes
/// the client's first lock (its renewals then ran on A). Runtime B takes a lock and holds it,
/// and one of its locks waits, queued, for a key another client holds; then A shuts down. For
/// 3 s (three leases) nothing else happens. Checked: B's lock is not lost, B's waiter keeps its
/// place in the queue, and once the other client releases, B's waiter is granted within 1 s,
/// with a higher token.
///
/// Before, the client ran one renewal task, on the runtime of its first lock;
/// when that runtime ended, the leases of every other runtime went unrenewed and were lost one
/// lease later, and queued waiters dropped out of their queues.
#[test]
fn redis_leases_of_a_live_runtime_outlive_the_runtime_of_the_clients_first_lock() {
    let redis = crate::support::server::redis::shared_redis();
    let url = redis.url();
    let ns = test_namespace!();
    let ttl = Duration::from_secs(1);
    let h = Runtime::new().unwrap();
    let c = h.block_on(crate::support::redis::client(&url, &ns, ttl, ttl, true));
    let other = h.block_on(crate::support::redis::client(&url, &ns, ttl, ttl, true));
    let busy = h.block_on(async { other.mutex("busy").lock().await.unwrap() });
    let a = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    a.block_on(async {
        let g = c.mutex("on-a").lock().await.unwrap();
        g.release().await.unwrap();
    });
    let b = Runtime::new().unwrap();
    let (held, waiting) = b.block_on(async {
        let held = c.mutex("held-on-b").lock().await.unwrap();
        let waiter = c.mutex("busy");
        let waiting =
            tokio::spawn(async move { waiter.lock_timeout(Duration::from_secs(20)).await });
        crate::support::redis::until_queued(&url, &ns, "busy", 1).await;
        (held, waiting)
    });
    drop(a);
    let (lost_after, queued) = b.block_on(async {
        let began = Instant::now();
        let mut lost_after = None;
        while lost_after.is_none() && began.elapsed() < Duration::from_secs(3) {
            if held.is_lost() {
                lost_after = Some(began.elapsed());
            }
            sleep(Duration::from_millis(20)).await;
        }
        (
            lost_after,
            crate::support::redis::queue_len(&url, &ns, "busy").await,
        )
    });
    let token = busy.fencing_token();
    h.block_on(busy.release()).unwrap();
    let released = Instant::now();
    let (granted, waited) = b.block_on(async {
        let granted = timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the waiter was not granted within 5 s of the release")
            .unwrap();
        (granted, released.elapsed())
    });
    let granted = granted.unwrap_or_else(|e| panic!("B's waiter: {e}"));
    assert!(granted.fencing_token() > token, "B's waiter's token");
    b.block_on(async {
        granted.release().await.unwrap();
        let _ = held.release().await;
    });
    h.block_on(async {
        timeout(Duration::from_secs(5), c.shutdown())
            .await
            .expect("shutdown did not end");
        timeout(Duration::from_secs(5), other.shutdown())
            .await
            .expect("shutdown did not end");
        crate::support::redis::until_only_fences(&redis.url(), &ns).await;
    });
    assert_eq!(
        lost_after, None,
        "B's lock was lost after A ended, the server up"
    );
    assert_eq!(queued, 1, "B's waiter left the queue after A ended");
    assert!(
        waited < Duration::from_secs(1),
        "B's waiter was granted {waited:?} after the release"
    );
}

/// A Redlock client (3 s leases) of `nodes`, built in a runtime returned with it; runtime A
/// cuts node 0 off and locks a key a few times (node 0's calls fail: it is marked down, and
/// the task that probes it is spawned on A), then A ends while node 0 is still cut off, and
/// node 0's proxy passes again.
#[cfg(feature = "redlock")]
fn node0_marked_down_from_an_ended_runtime(
    nodes: &crate::support::server::redlock::Nodes,
    ns: &str,
) -> (Runtime, distlock::LockClient) {
    let first = tokio::runtime::Runtime::new().unwrap();
    let c = first.block_on(crate::support::server::redlock::client_on(
        nodes.urls(),
        ns,
        Duration::from_secs(3),
        Duration::ZERO,
    ));
    let a = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    a.block_on(async {
        let g = c.mutex("warm").lock().await.unwrap();
        g.release().await.unwrap();
        nodes.proxies[0].cut();
        for _ in 0..3 {
            let g = c
                .mutex("in-a")
                .lock_timeout(Duration::from_secs(5))
                .await
                .expect("a quorum (nodes 1 and 2) answers");
            g.release().await.unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    drop(a);
    nodes.proxies[0].pass();
    (first, c)
}

/// Shuts `c` down from `first`, then waits until `nodes` hold nothing of `ns`.
#[cfg(feature = "redlock")]
fn shut_down_clean(
    first: &Runtime,
    c: &distlock::LockClient,
    nodes: &crate::support::server::redlock::Nodes,
    ns: &str,
) {
    first.block_on(async {
        tokio::time::timeout(Duration::from_secs(5), c.shutdown())
            .await
            .expect("shutdown did not end");
        nodes.until_clean(ns).await;
    });
}
