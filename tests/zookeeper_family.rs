//! Read-write locks, semaphores and multi-locks on a real ZooKeeper (one per test binary, a
//! namespace per test): the family checks every backend runs (tests/support/family.rs), the
//! node layouts, and interop with Curator 5's `InterProcessReadWriteLock`,
//! `InterProcessSemaphoreV2` and `InterProcessSemaphoreMutex` in a Java child process.
#![cfg(feature = "zookeeper")]

mod support;

use std::time::Duration;

use distlock::LockClient;
use support::contract::{granted, torture_family};
use support::curator::Curator;
use support::family::{
    inspect_sees_the_family, kinds_do_not_mix, rw_exclusion, rw_fifo, semaphore_bound,
    semaphore_head_is_not_overtaken,
};
use support::server::zookeeper::shared_zookeeper;
use support::zk::{assert_no_znodes, children, clients_at, queued, raw, until_contenders};
use tokio::time::{sleep, timeout};

const SESSION: Duration = Duration::from_secs(4);
const PLAN: [bool; 8] = [false, false, true, false, false, true, true, false];

fn connect() -> String {
    shared_zookeeper().connect_string()
}

async fn clients(ns: &str, n: usize) -> Vec<LockClient> {
    clients_at(&connect(), ns, SESSION, n).await
}

async fn assert_clean(ns: &str) {
    assert_no_znodes(&raw(&connect()).await, ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rw_exclusion_and_tokens() {
    let ns = test_namespace!();
    rw_exclusion(clients(&ns, 5).await, "rw", 12, 4).await;
    assert_clean(&ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rw_fifo_with_readers_together() {
    let ns = test_namespace!();
    let c = clients(&ns, PLAN.len() + 1).await;
    rw_fifo(c, "rw", &PLAN, &queued(&connect(), &ns, "rw")).await;
    assert_clean(&ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_never_exceeds_its_permits() {
    let ns = test_namespace!();
    semaphore_bound(clients(&ns, 5).await, "sem", 3, 12).await;
    assert_clean(&ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_head_is_not_overtaken() {
    let ns = test_namespace!();
    let c: [LockClient; 3] = clients(&ns, 3).await.try_into().unwrap();
    semaphore_head_is_not_overtaken(c, "sem", &queued(&connect(), &ns, "sem")).await;
    assert_clean(&ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downgrade_keeps_queued_writers_out() {
    let ns = test_namespace!();
    let c: [LockClient; 3] = clients(&ns, 3).await.try_into().unwrap();
    support::family::downgrade_keeps_queued_writers_out(c, "rw", &queued(&connect(), &ns, "rw"))
        .await;
    assert_clean(&ns).await;
}

/// ZooKeeper keeps no record of a semaphore's size (Curator does not either), so only the
/// family is checked, from the node names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kinds_do_not_mix_on_one_path() {
    let ns = test_namespace!();
    let c: [LockClient; 2] = clients(&ns, 2).await.try_into().unwrap();
    kinds_do_not_mix(c, "k", false).await;
    assert_clean(&ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_family_futures_leave_no_znodes() {
    let ns = test_namespace!();
    torture_family(|n| clients(&ns, n), 12, 50).await;
    assert_clean(&ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_sees_the_family_in_curators_layout() {
    let ns = test_namespace!();
    let c: [LockClient; 3] = clients(&ns, 3).await.try_into().unwrap();
    let (q_rw, q_sem) = (
        queued(&connect(), &ns, "k:rw"),
        queued(&connect(), &ns, "k:sem"),
    );
    inspect_sees_the_family(c, "k", false, &q_rw, &q_sem).await;
    assert_clean(&ns).await;
}

/// The names Curator's recipes would write: protected, with its lock names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_are_laid_out_as_curator_lays_them_out() {
    let ns = test_namespace!();
    let zk = raw(&connect()).await;
    let [a, b]: [LockClient; 2] = clients(&ns, 2).await.try_into().unwrap();
    let w = a.rw_lock("rw").write().await.unwrap();
    let r = tokio::spawn({
        let rw = b.rw_lock("rw");
        async move { rw.read().await }
    });
    until_contenders(&zk, &format!("/{ns}/rw"), 2).await;
    let mut kids = children(&zk, &format!("/{ns}/rw")).await;
    kids.sort_by_key(|k| k[k.len() - 10..].to_owned());
    assert!(
        kids[0].starts_with("_c_") && kids[0][39..].starts_with("-__WRIT__"),
        "{kids:?}"
    );
    assert!(kids[1][39..].starts_with("-__READ__"), "{kids:?}");
    // The downgrade: a plain read node with the write node's sequence, the write node gone.
    let seq = kids[0][kids[0].len() - 10..].to_owned();
    let down = w.downgrade().await.unwrap();
    let r = timeout(Duration::from_secs(5), r)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let kids = children(&zk, &format!("/{ns}/rw")).await;
    assert_eq!(kids.len(), 2, "{kids:?}");
    assert!(
        kids.iter()
            .any(|k| k.ends_with(&format!("-__READ__{seq}")) && k.starts_with("_c_")),
        "{kids:?}"
    );
    drop((down, r));

    let p = a.semaphore("sem", 3).acquire_many(2).await.unwrap();
    let leases = children(&zk, &format!("/{ns}/sem/leases")).await;
    assert_eq!(leases.len(), 2, "{leases:?}");
    for l in &leases {
        assert!(
            l.starts_with("_c_") && l[39..].starts_with("-lease-"),
            "{l}"
        );
    }
    // The admission node went with the grant.
    assert!(children(&zk, &format!("/{ns}/sem/locks")).await.is_empty());
    p.release().await.unwrap();
    a.shutdown().await;
    b.shutdown().await;
    assert_clean(&ns).await;
}

/// Blocking calls to the Java child, off the async workers.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// Java and Rust readers and writers queue in one FIFO order on one path: readers queued
/// together hold together, a writer waits for every reader ahead of it, and no one jumps the
/// queue, whichever language holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_and_rust_readers_and_writers_share_one_queue() {
    let ns = test_namespace!();
    let path = format!("/{ns}/rw");
    let zk = raw(&connect()).await;
    let [a, b, c]: [LockClient; 3] = clients(&ns, 3).await.try_into().unwrap();
    let mut java = blocking(|| Curator::start_family(&connect(), &path, "rw"));

    // Rust writes; a Java reader, a Rust reader, then a Java... writer queue behind.
    let w = a.rw_lock("rw").write().await.unwrap();
    assert_eq!(blocking(|| java.ask("tryread 200")), "BUSY");
    blocking(|| java.send("read"));
    until_contenders(&zk, &path, 2).await;
    let rust_reader = tokio::spawn({
        let rw = b.rw_lock("rw");
        async move { rw.read().await }
    });
    until_contenders(&zk, &path, 3).await;
    let rust_writer = tokio::spawn({
        let rw = c.rw_lock("rw");
        async move { rw.write().await }
    });
    until_contenders(&zk, &path, 4).await;
    assert_eq!(blocking(|| java.reply(Duration::from_millis(300))), None);
    w.release().await.unwrap();
    // Both readers in together, the writer behind them out.
    assert_eq!(
        blocking(|| java.reply(Duration::from_secs(10))).as_deref(),
        Some("GOT")
    );
    let r = granted(rust_reader, Duration::from_secs(10), "the Rust reader").await;
    sleep(Duration::from_millis(200)).await;
    assert!(!rust_writer.is_finished(), "a writer got in with readers");
    r.release().await.unwrap();
    sleep(Duration::from_millis(200)).await;
    assert!(
        !rust_writer.is_finished(),
        "a Rust writer got in while a Java reader held"
    );
    assert_eq!(blocking(|| java.ask("unread")), "RELEASED");
    let w = granted(rust_writer, Duration::from_secs(10), "the Rust writer").await;

    // Now the Java writer waits behind the Rust writer, and a Rust reader behind it.
    assert_eq!(blocking(|| java.ask("trywrite 200")), "BUSY");
    blocking(|| java.send("write"));
    until_contenders(&zk, &path, 2).await;
    let rust_reader = tokio::spawn({
        let rw = b.rw_lock("rw");
        async move { rw.read().await }
    });
    until_contenders(&zk, &path, 3).await;
    w.release().await.unwrap();
    assert_eq!(
        blocking(|| java.reply(Duration::from_secs(10))).as_deref(),
        Some("GOT")
    );
    sleep(Duration::from_millis(200)).await;
    assert!(
        !rust_reader.is_finished(),
        "a Rust reader got in while a Java writer held"
    );
    assert_eq!(blocking(|| java.ask("unwrite")), "RELEASED");
    drop(granted(rust_reader, Duration::from_secs(10), "the Rust reader").await);
    assert_eq!(blocking(|| java.ask("quit")), "BYE");
    for c in [a, b, c] {
        c.shutdown().await;
    }
    assert_clean(&ns).await;
}

/// A Rust downgrade does not let a queued Java writer in; the layout Curator 5.5 writes for a
/// Java downgrade does not let a queued Rust writer in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downgrades_keep_the_other_languages_writers_out() {
    let ns = test_namespace!();
    let path = format!("/{ns}/rw");
    let zk = raw(&connect()).await;
    let [a, b]: [LockClient; 2] = clients(&ns, 2).await.try_into().unwrap();
    let mut java = blocking(|| Curator::start_family(&connect(), &path, "rw"));

    let w = a.rw_lock("rw").write().await.unwrap();
    blocking(|| java.send("write"));
    until_contenders(&zk, &path, 2).await;
    let r = w.downgrade().await.unwrap();
    assert_eq!(
        blocking(|| java.reply(Duration::from_millis(500))),
        None,
        "a Java writer got in past a Rust downgrade"
    );
    r.release().await.unwrap();
    assert_eq!(
        blocking(|| java.reply(Duration::from_secs(10))).as_deref(),
        Some("GOT")
    );

    let rust_writer = tokio::spawn({
        let rw = b.rw_lock("rw");
        async move { rw.write().await }
    });
    until_contenders(&zk, &path, 2).await;
    assert_eq!(blocking(|| java.ask("downgrade55")), "DOWNGRADED");
    sleep(Duration::from_millis(500)).await;
    assert!(
        !rust_writer.is_finished(),
        "a Rust writer got in past a Java downgrade"
    );
    assert_eq!(blocking(|| java.ask("undowngrade")), "RELEASED");
    drop(granted(rust_writer, Duration::from_secs(10), "the Rust writer").await);
    assert_eq!(blocking(|| java.ask("quit")), "BYE");
    a.shutdown().await;
    b.shutdown().await;
    assert_clean(&ns).await;
}

/// Java `InterProcessSemaphoreV2(path, 3)` and Rust `semaphore(k, 3)` never hold more than
/// three leases together, and a waiter of either language is let in when the other releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_and_rust_semaphores_share_the_permits() {
    let ns = test_namespace!();
    let path = format!("/{ns}/sem");
    let zk = raw(&connect()).await;
    let [a, b]: [LockClient; 2] = clients(&ns, 2).await.try_into().unwrap();
    let mut java = blocking(|| Curator::start_family(&connect(), &path, "sem 3"));

    assert_eq!(blocking(|| java.ask("acquire 2")), "GOT");
    let one = a.semaphore("sem", 3).acquire().await.unwrap();
    let err = b.semaphore("sem", 3).try_acquire().await.unwrap_err();
    assert!(err.is_would_block(), "a fourth lease of three: {err:?}");
    assert_eq!(children(&zk, &format!("{path}/leases")).await.len(), 3);
    // A Rust request for two queues; the Java one behind it waits too.
    let two = tokio::spawn({
        let sem = b.semaphore("sem", 3);
        async move { sem.acquire_many(2).await }
    });
    until_contenders(&zk, &format!("{path}/locks"), 1).await;
    assert_eq!(blocking(|| java.ask("try 1 300")), "BUSY");
    one.release().await.unwrap();
    sleep(Duration::from_millis(300)).await;
    assert!(!two.is_finished(), "two permits granted with one free");
    assert_eq!(blocking(|| java.ask("release")), "RELEASED");
    let two = granted(two, Duration::from_secs(10), "the two-permit Rust request").await;
    assert_eq!(two.count(), 2);
    assert_eq!(blocking(|| java.ask("try 1 5000")), "GOT");
    assert_eq!(blocking(|| java.ask("try 1 300")), "BUSY");
    assert_eq!(children(&zk, &format!("{path}/leases")).await.len(), 3);
    two.release().await.unwrap();
    assert_eq!(blocking(|| java.ask("release")), "RELEASED");
    assert_eq!(blocking(|| java.ask("quit")), "BYE");
    a.shutdown().await;
    b.shutdown().await;
    assert_clean(&ns).await;
}

/// Curator's `InterProcessSemaphoreMutex` and a Rust one-permit semaphore exclude each other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_semaphore_mutex_excludes_a_one_permit_semaphore() {
    let ns = test_namespace!();
    let path = format!("/{ns}/m");
    let zk = raw(&connect()).await;
    let [a]: [LockClient; 1] = clients(&ns, 1).await.try_into().unwrap();
    let mut java = blocking(|| Curator::start_family(&connect(), &path, "semmutex"));
    assert_eq!(blocking(|| java.ask("lock")), "GOT");
    let err = a.semaphore("m", 1).try_acquire().await.unwrap_err();
    assert!(err.is_would_block(), "{err:?}");
    let rust = tokio::spawn({
        let sem = a.semaphore("m", 1);
        async move { sem.acquire().await }
    });
    until_contenders(&zk, &format!("{path}/locks"), 1).await;
    sleep(Duration::from_millis(200)).await;
    assert!(!rust.is_finished());
    assert_eq!(blocking(|| java.ask("release")), "RELEASED");
    let p = granted(rust, Duration::from_secs(10), "the Rust semaphore").await;
    assert_eq!(blocking(|| java.ask("try 300")), "BUSY");
    p.release().await.unwrap();
    assert_eq!(blocking(|| java.ask("try 5000")), "GOT");
    assert_eq!(blocking(|| java.ask("release")), "RELEASED");
    assert_eq!(blocking(|| java.ask("quit")), "BYE");
    a.shutdown().await;
    assert_clean(&ns).await;
}

/// No herd: with four claims queued on a one-permit semaphore, the server holds exactly the
/// watches the recipe needs: each waiter's on the admission node just ahead of it (3), the
/// admission head's on the lease list (1), and the guard watch on each lease node (2). A herd
/// on the lease list would add one per waiter. Its own server, as `zk_watch_count` is global.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_admission_head_watches_the_leases() {
    let ns = test_namespace!();
    let server = support::server::zookeeper::ZkServer::start();
    let zk = raw(&server.connect_string()).await;
    let c = clients_at(&server.connect_string(), &ns, SESSION, 5).await;
    let held = c[0].semaphore("sem", 1).acquire().await.unwrap();
    let mut waiters = Vec::new();
    for (i, client) in c.iter().enumerate().skip(1) {
        let sem = client.semaphore("sem", 1);
        waiters.push(tokio::spawn(async move { sem.acquire().await }));
        until_contenders(&zk, &format!("/{ns}/sem/locks"), i).await;
    }
    let watches = || {
        server
            .four_letter("mntr")
            .lines()
            .find_map(|l| l.strip_prefix("zk_watch_count"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .expect("mntr reports zk_watch_count")
    };
    // Watches are set just after the nodes appear: wait for them to settle at 6.
    let settled = timeout(Duration::from_secs(5), async {
        while watches() != 6 {
            sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(
        settled.is_ok(),
        "expected 6 watches, the server has {}:\n{}",
        watches(),
        server.four_letter("wchp")
    );
    sleep(Duration::from_millis(200)).await;
    assert_eq!(watches(), 6, "{}", server.four_letter("wchp"));
    drop(held);
    for w in waiters {
        drop(granted(w, Duration::from_secs(10), "a queued claim").await);
    }
    for client in c {
        client.shutdown().await;
    }
    assert_no_znodes(&zk, &ns).await;
}
