//! Redlock's own tests over five real, independent `redis-server` nodes (shared by this binary,
//! a namespace per test): what it refuses, how its kinds mix, pooled nodes, inspection merged
//! over the nodes, URLs and settings. Contenders use separate `LockClient`s, with their own
//! connections, as separate processes would. The behaviour suite every backend runs is in
//! `tests/contract/matrix.rs` (`matrix::redlock::`; semaphores under `redlock::skipped::`).
#![cfg(feature = "redlock")]

use std::time::Duration;

use crate::support::contract::contend;
use crate::support::family::rw_exclusion;
use crate::support::server::redlock::shared_nodes;
use distlock::backend::RedlockBackend;
use distlock::LockClient;
use tokio::time::{sleep, timeout, Instant};

async fn clients(ns: &str, n: usize) -> Vec<LockClient> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(shared_nodes().client(ns).await);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_and_timeout_on_a_held_lock_leave_nothing() {
    let ns = test_namespace!();
    let a = shared_nodes().client(&ns).await;
    let b = shared_nodes().client(&ns).await;
    let held = a.mutex("k").lock().await.unwrap();
    let err = b.mutex("k").try_lock().await.unwrap_err();
    assert!(err.is_would_block(), "{err}");
    let started = Instant::now();
    let err = b
        .mutex("k")
        .lock_timeout(Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(err.is_timeout(), "{err}");
    assert!(started.elapsed() < Duration::from_secs(2));
    sleep(Duration::from_millis(100)).await;
    assert!(!held.is_lost());
    held.release().await.unwrap();
    let again = b.mutex("k").try_lock().await.unwrap();
    again.release().await.unwrap();
    shared_nodes().until_clean(&ns).await;
}

/// Leases are renewed on a quorum: a lock held for several TTLs is still held, and excludes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_keeps_a_lock_past_its_ttl() {
    let ns = test_namespace!();
    let nodes = shared_nodes();
    let a = nodes
        .client_with(&ns, Duration::from_millis(600), Duration::ZERO)
        .await;
    let b = nodes.client(&ns).await;
    let held = a.mutex("long").lock().await.unwrap();
    sleep(Duration::from_millis(2000)).await;
    assert!(!held.is_lost());
    assert!(b
        .mutex("long")
        .try_lock()
        .await
        .unwrap_err()
        .is_would_block());
    held.release().await.unwrap();
    nodes.until_clean(&ns).await;
}

#[tokio::test]
async fn semaphores_are_refused_before_any_io() {
    let ns = test_namespace!();
    let c = shared_nodes().client(&ns).await;
    let err = c.semaphore("s", 2).acquire().await.unwrap_err();
    assert_eq!(err.kind(), distlock::ErrorKind::Unsupported, "{err}");
    // A multi-lock is mutexes: it works.
    let both = c.multi_lock(["x", "y"]).lock().await.unwrap();
    both.release().await.unwrap();
    shared_nodes().until_clean(&ns).await;
}

/// A key is a mutex or a read-write lock, not both, held or only waited for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutexes_and_rw_locks_do_not_mix() {
    use distlock::backend::{Family, LockKind};

    let ns = test_namespace!();
    let [a, b, c]: [LockClient; 3] = clients(&ns, 3).await.try_into().unwrap();
    let m = a.mutex("m").lock().await.unwrap();
    let r = a.rw_lock("r").read().await.unwrap();
    let mismatch = |e: distlock::Error| assert!(e.is_kind_mismatch(), "{e:?}");
    mismatch(b.rw_lock("m").try_read().await.unwrap_err());
    mismatch(
        b.rw_lock("m")
            .write_timeout(Duration::from_secs(1))
            .await
            .unwrap_err(),
    );
    mismatch(b.mutex("r").try_lock().await.unwrap_err());
    mismatch(
        b.mutex("r")
            .lock_timeout(Duration::from_secs(1))
            .await
            .unwrap_err(),
    );
    // Two readers hold, a writer waits: inspection sees all three, as what they are.
    let r2 = b.rw_lock("r").read().await.unwrap();
    let w = tokio::spawn({
        let rw = c.rw_lock("r");
        async move { rw.write().await }
    });
    shared_nodes().until_queued(&ns, "r", 1).await;
    let seen = a.inspect("r").await.unwrap();
    assert_eq!(seen.family, Some(Family::RwLock), "{seen:?}");
    let mut tokens: Vec<Option<u64>> = seen.holders.iter().map(|h| h.fencing_token).collect();
    tokens.sort();
    let mut expected = vec![Some(r.fencing_token()), Some(r2.fencing_token())];
    expected.sort();
    assert_eq!(tokens, expected, "{seen:?}");
    assert!(seen.holders.iter().all(|h| h.kind == LockKind::Read));
    assert_eq!(seen.waiters.len(), 1, "{seen:?}");
    assert_eq!(seen.waiters[0].kind, LockKind::Write);
    // A mutex asked for while the writer waits (the queue alone says what the key is).
    drop((r, r2));
    let w = crate::support::contract::granted(w, Duration::from_secs(10), "the writer").await;
    mismatch(b.mutex("r").try_lock().await.unwrap_err());
    drop((m, w));
    // Once free, a key may become the other kind.
    sleep(Duration::from_millis(100)).await;
    drop(b.rw_lock("m").write().await.unwrap());
    drop(b.mutex("r").lock().await.unwrap());
    for client in [a, b, c] {
        client.shutdown().await;
    }
    shared_nodes().until_clean(&ns).await;
}

/// Nodes whose commands go through the application's pools (deadpool on two nodes, bb8 on two,
/// an own connection on the fifth): the contract holds, and the pools carried the commands.
#[cfg(all(feature = "redis-deadpool", feature = "redis-bb8"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_may_send_their_commands_through_pools() {
    use distlock::backend::RedlockNode;

    let ns = test_namespace!();
    let nodes = shared_nodes();
    let mut clients = Vec::new();
    let mut deadpools = Vec::new();
    let mut bb8s = Vec::new();
    for _ in 0..3 {
        let mut per_node = Vec::new();
        for (i, url) in nodes.urls().into_iter().enumerate() {
            per_node.push(match i {
                0 | 1 => {
                    let pool = deadpool_redis::Config::from_url(url.clone())
                        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
                        .unwrap();
                    deadpools.push(pool.clone());
                    RedlockNode::deadpool(url, pool)
                }
                2 | 3 => {
                    let manager = bb8_redis::RedisConnectionManager::new(url.clone()).unwrap();
                    let pool = bb8::Pool::builder().build_unchecked(manager);
                    bb8s.push(pool.clone());
                    RedlockNode::bb8(url, pool)
                }
                _ => RedlockNode::new(url),
            });
        }
        let backend = RedlockBackend::builder(per_node)
            .rejoin_delay(Duration::ZERO)
            .build()
            .await
            .unwrap();
        clients.push(
            LockClient::builder(backend)
                .namespace(ns.as_str())
                .ttl(Duration::from_secs(2))
                .build()
                .unwrap(),
        );
    }
    contend(clients, "pooled", 15, Duration::from_micros(300)).await;
    for pool in &deadpools {
        assert!(pool.status().size >= 1, "a deadpool pool was never used");
    }
    for pool in &bb8s {
        assert!(pool.state().connections >= 1, "a bb8 pool was never used");
    }
    nodes.until_clean(&ns).await;
}

/// Inspection merges the nodes: the claim holding a majority, with its token and lease, and
/// the waiters in the order they will be served, with how long each has waited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_shows_the_majority_holder_and_the_queue_in_order() {
    use distlock::backend::{Family, LockKind};

    let ns = test_namespace!();
    let nodes = shared_nodes();
    let a = nodes.client(&ns).await;
    assert!(a.inspect("k").await.unwrap().is_free());
    let held = a.mutex("k").lock().await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..3 {
        let c = nodes.client(&ns).await;
        tasks.push(tokio::spawn(async move {
            let g = c.mutex("k").lock().await.unwrap();
            g.release().await.unwrap();
            c.shutdown().await;
        }));
        nodes.until_queued(&ns, "k", i + 1).await;
        sleep(Duration::from_millis(20)).await;
    }
    let seen = a.inspect("k").await.unwrap();
    assert_eq!(seen.family, Some(Family::Mutex), "{seen:?}");
    assert_eq!(seen.holders.len(), 1, "{seen:?}");
    assert_eq!(seen.holders[0].kind, LockKind::Exclusive);
    assert_eq!(seen.holders[0].fencing_token, Some(held.fencing_token()));
    let left = seen.holders[0].lease_left.unwrap();
    assert!(
        left > Duration::ZERO && left <= Duration::from_secs(2),
        "{left:?}"
    );
    assert_eq!(seen.waiters.len(), 3, "{seen:?}");
    let waited: Vec<Duration> = seen.waiters.iter().map(|w| w.waited.unwrap()).collect();
    assert!(
        waited.windows(2).all(|w| w[0] > w[1]),
        "first in line has waited longest: {waited:?}"
    );
    held.release().await.unwrap();
    for t in tasks {
        timeout(Duration::from_secs(10), t).await.unwrap().unwrap();
    }
    assert!(a.inspect("k").await.unwrap().is_free());
    a.shutdown().await;
    nodes.until_clean(&ns).await;
}

#[tokio::test]
async fn bad_settings_are_clear_errors() {
    let urls = shared_nodes().urls();
    let err = RedlockBackend::builder(urls[..2].to_vec())
        .build()
        .await
        .unwrap_err();
    assert!(err.is_invalid_config(), "{err}");
    assert!(err.to_string().contains("at least 3"), "{err}");
    let same = vec![urls[0].clone(), urls[0].clone(), urls[1].clone()];
    let err = RedlockBackend::builder(same).build().await.unwrap_err();
    assert!(err.is_invalid_config(), "{err}");
    let err = RedlockBackend::builder(["nonsense", "x", "y"])
        .build()
        .await
        .unwrap_err();
    assert!(err.is_invalid_config(), "{err}");
    // Nothing listens on these: a quorum cannot answer.
    let dead: Vec<String> = (0..3)
        .map(|_| format!("redis://127.0.0.1:{}/", crate::support::free_port()))
        .collect();
    let started = Instant::now();
    let err = RedlockBackend::builder(dead).build().await.unwrap_err();
    assert!(err.is_backend(), "{err}");
    assert!(err.to_string().contains("quorum"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(3));
}

/// `redlock://host:port,host:port,...` through `LockClient::connect` reaches every node.
#[tokio::test]
async fn a_redlock_url_names_every_node() {
    let ns = test_namespace!();
    let nodes = shared_nodes();
    let hosts: Vec<String> = nodes
        .proxies
        .iter()
        .map(|p| format!("127.0.0.1:{}", p.port()))
        .collect();
    let url = format!("redlock://{}/", hosts.join(","));
    // The URL client keeps the default rejoin delay (30 s), and these nodes started moments
    // ago: mark them as remembering this namespace since long ago, as nodes up for a while do.
    for s in &nodes.servers {
        let mut conn = crate::support::redis::connection(&s.url()).await;
        let _: () = redis::cmd("SET")
            .arg(format!("{ns}:born"))
            .arg(0)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let client = LockClient::builder_for(&url)
        .await
        .unwrap()
        .namespace(ns.as_str())
        .build()
        .unwrap();
    let guard = client.mutex("via-url").lock().await.unwrap();
    let mut holding = 0;
    for s in &nodes.servers {
        let keys = crate::support::redis::keys_in(&s.url(), &ns).await;
        holding += usize::from(keys.iter().any(|k| k == &format!("{ns}:{{via-url}}")));
    }
    assert!(holding >= 3, "held on {holding} of 5 nodes");
    guard.release().await.unwrap();
    nodes.until_clean(&ns).await;
}

/// Each node keeps the scripts as one function library, loaded when the backend first reaches
/// it; a node that lost it (restarted without its data, flushed: deleted here on two nodes of
/// three) gets it again at the next call, and every script (acquire, settle, renewal,
/// downgrade, release) still works. Nodes of their own: nobody else loads the library between.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_holds_the_function_library_and_gets_it_back() {
    let ns = test_namespace!();
    let nodes = crate::support::server::redlock::Nodes::start(3);
    let c = nodes
        .client_with(&ns, Duration::from_millis(600), Duration::ZERO)
        .await;
    let urls = nodes.direct_urls();
    let library = crate::support::redis::libraries(&urls[0]).await;
    let [library] = library.as_slice() else {
        panic!("expected one function library, found {library:?}");
    };
    assert!(library.starts_with("distlock_"), "{library}");
    for url in &urls {
        assert_eq!(
            crate::support::redis::libraries(url).await,
            vec![library.clone()]
        );
    }
    let flush = || async {
        for url in &urls[1..] {
            let _: () = redis::cmd("FUNCTION")
                .arg("FLUSH")
                .query_async(&mut crate::support::redis::connection(url).await)
                .await
                .unwrap();
        }
    };
    flush().await;
    let guard = c.mutex("k").lock().await.unwrap();
    let token = guard.fencing_token();
    flush().await;
    // Renewed (at TTL/3) well past its TTL of 600 ms.
    sleep(Duration::from_millis(1200)).await;
    assert!(!guard.is_lost());
    flush().await;
    guard.release().await.unwrap();
    flush().await;
    let write = c.rw_lock("k2").write().await.unwrap();
    assert!(write.fencing_token() > 0);
    flush().await;
    let read = write.downgrade().await.unwrap();
    flush().await;
    read.release().await.unwrap();
    let again = c.mutex("k").lock().await.unwrap();
    assert!(again.fencing_token() > token);
    again.release().await.unwrap();
    for url in &urls {
        assert_eq!(
            crate::support::redis::libraries(url).await,
            vec![library.clone()]
        );
    }
    c.shutdown().await;
    nodes.until_clean(&ns).await;
}

/// Nodes whose user may not call or load functions (or servers without them) run the same
/// scripts by `EVALSHA`: locks exclude, queue and fence as ever, and no node holds a library.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_that_refuse_functions_get_the_scripts_by_evalsha() {
    let ns = test_namespace!();
    let nodes = crate::support::server::redlock::Nodes::start(3);
    let mut urls = Vec::new();
    for server in &nodes.servers {
        let _: () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg("nofn")
            .arg("reset")
            .arg("on")
            .arg(">s3cret")
            .arg("~*")
            .arg("&*")
            .arg("+@all")
            .arg("-function")
            .arg("-fcall")
            .arg("-fcall_ro")
            .query_async(&mut crate::support::redis::connection(&server.url()).await)
            .await
            .unwrap();
        urls.push(format!("redis://nofn:s3cret@127.0.0.1:{}/", server.port()));
    }
    let clients = async || {
        let mut out = Vec::new();
        for _ in 0..3 {
            out.push(
                crate::support::server::redlock::client_on(
                    urls.clone(),
                    &ns,
                    Duration::from_secs(2),
                    Duration::ZERO,
                )
                .await,
            );
        }
        out
    };
    contend(clients().await, "hot", 10, Duration::from_micros(300)).await;
    rw_exclusion(clients().await, "rw", 10, 3).await;
    for url in nodes.direct_urls() {
        assert!(crate::support::redis::libraries(&url).await.is_empty());
    }
    nodes.until_clean(&ns).await;
}

/// Every node refusing to grant (each one's fencing counter set past 2^53 by hand, where the
/// scripts cannot count exactly) is an error that counts the nodes that failed as failed and
/// gives the counter as its cause; it does not say the nodes were silent (before: "only 0 of 5
/// nodes answered", although all five answered, each with the counter's error). Nothing is left
/// held, and once the counters are gone the lock is granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_refusing_is_reported_as_failed_with_its_cause() {
    let ns = test_namespace!();
    let nodes = shared_nodes();
    let fence = format!("{ns}:{{k}}:fence");
    let set_all = |value: Option<&'static str>| {
        let (urls, fence) = (nodes.direct_urls(), fence.clone());
        async move {
            for url in urls {
                let mut conn = crate::support::redis::connection(&url).await;
                let mut cmd = redis::cmd(if value.is_some() { "SET" } else { "DEL" });
                cmd.arg(&fence);
                if let Some(v) = value {
                    cmd.arg(v);
                }
                let _: () = cmd.query_async(&mut conn).await.unwrap();
            }
        }
    };
    set_all(Some("9007199254740993")).await;
    let c = nodes.client(&ns).await;
    let err = c.mutex("k").try_lock().await.unwrap_err();
    let mut text = err.to_string();
    let mut cause = std::error::Error::source(&err);
    while let Some(c) = cause {
        text.push_str(&format!(": {c}"));
        cause = c.source();
    }
    assert!(err.is_backend(), "{text}");
    assert!(
        text.starts_with("redlock acquire: 0 of 5 nodes succeeded, a quorum needs 3"),
        "{text}"
    );
    assert!(!text.contains("answered"), "{text}");
    assert!(text.contains("fencing counter"), "{text}");
    set_all(None).await;
    let guard = timeout(Duration::from_secs(3), c.mutex("k").lock())
        .await
        .expect("granted once the counters are deleted")
        .unwrap();
    guard.release().await.unwrap();
    nodes.until_clean(&ns).await;
}
