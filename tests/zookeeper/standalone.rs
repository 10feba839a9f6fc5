//! ZooKeeper's own tests against a real server (one per test binary, a namespace per test):
//! its node layout and watches, sessions, ACLs and chroots, faults of the link, and interop
//! with Curator 5's `InterProcessMutex`, `InterProcessReadWriteLock`,
//! `InterProcessSemaphoreV2` and `InterProcessSemaphoreMutex` in a Java child process.
//! Contenders use separate `LockClient`s with their own sessions, as separate processes would.
//! The behaviour suite every backend runs is in `tests/contract/matrix.rs` (`matrix::zookeeper::`).
#![cfg(feature = "zookeeper")]

use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use crate::support::contract::{granted, partition_then_handover, spawn_timed_lock};
use crate::support::curator::Curator;
use crate::support::proxy::{Proxy, Which};
use crate::support::server::zookeeper::{shared_zookeeper, ZkServer};
use crate::support::zk::{
    assert_no_znodes, children, client_at, clients_at, raw, raw_as, until_contenders,
};
use distlock::backend::{ZkAcl, ZkBackend};
use distlock::LockClient;
use tokio::time::{sleep, timeout};

const SESSION: Duration = Duration::from_secs(4);

async fn client(ns: &str) -> LockClient {
    client_at(&shared_zookeeper().connect_string(), ns, SESSION).await
}

fn connect() -> String {
    shared_zookeeper().connect_string()
}

async fn clients(ns: &str, n: usize) -> Vec<LockClient> {
    clients_at(&connect(), ns, SESSION, n).await
}

async fn assert_clean(ns: &str) {
    assert_no_znodes(&raw(&connect()).await, ns).await;
}

/// A lock lives as long as the session: a client that would not renew is refused when it is
/// built (a guard's `set_auto_renew(false)` is refused too: the matrix's `skipped::lease`),
/// since its guards would report lost while their nodes still held the locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_would_not_renew_is_refused() {
    let backend = crate::support::zk::backend(&connect(), SESSION).await;
    let err = LockClient::builder(backend)
        .auto_renew(false)
        .build()
        .unwrap_err();
    assert!(err.is_unsupported(), "{err:?}");
    assert!(err.to_string().contains("session"), "{err}");
}

/// A waiter third in line also watches the node two ahead of it. When that node goes without
/// ever holding (a waiter cancelled while the holder holds), and then the waiter just ahead
/// goes the same way, nobody is promoted beside the holder; the waiter is served once the
/// holder releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_waiters_ahead_promote_nobody() {
    let ns = test_namespace!();
    let zk = raw(&shared_zookeeper().connect_string()).await;
    let path = format!("/{ns}/k");
    let holder = client(&ns).await.mutex("k").lock().await.unwrap();
    let mut cancelled = Vec::new();
    for i in 0..2 {
        let m = client(&ns).await.mutex("k");
        cancelled.push(tokio::spawn(async move { m.lock().await }));
        until_contenders(&zk, &path, 2 + i).await;
    }
    let waiter = tokio::spawn({
        let m = client(&ns).await.mutex("k");
        async move { m.lock().await.unwrap() }
    });
    until_contenders(&zk, &path, 4).await;
    // Its watches are set just after its node appears.
    sleep(Duration::from_millis(300)).await;
    // First the node two ahead of the waiter goes (the waiter lists again), then the one just
    // ahead of it.
    for (i, c) in cancelled.into_iter().enumerate() {
        c.abort();
        until_contenders(&zk, &path, 3 - i).await;
        sleep(Duration::from_millis(300)).await;
    }
    assert!(!waiter.is_finished(), "granted beside the holder");
    assert!(!holder.is_lost());
    holder.release().await.unwrap();
    let guard = timeout(Duration::from_secs(10), waiter)
        .await
        .unwrap()
        .unwrap();
    guard.release().await.unwrap();
    assert_no_znodes(&zk, &ns).await;
}

/// A client shut down while one of its `lock()` futures is still queued (not yet polled again
/// to see the shutdown), after every other client on the key has gone: its node and the lock
/// node both go. (Before, the shutdown skipped a lock node with a claim still counted, and the
/// queued node went only with the session's close, after the other clients' deletes of the lock
/// node had failed on it: an empty lock node stayed.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_with_a_queued_lock_future_leaves_no_lock_node() {
    let ns = test_namespace!();
    let zk = raw(&shared_zookeeper().connect_string()).await;
    let path = format!("/{ns}/k");
    let a = client(&ns).await;
    let w = client(&ns).await;
    let held = a.mutex("k").lock().await.unwrap();
    let mut queued = Box::pin(w.mutex("k").lock());
    assert!(
        timeout(Duration::from_millis(300), &mut queued)
            .await
            .is_err(),
        "granted beside the holder"
    );
    until_contenders(&zk, &path, 2).await;
    // The holder goes first (its delete of the lock node fails: the waiter's node is there);
    // the queued future is not polled again.
    drop(held);
    a.shutdown().await;
    w.shutdown().await;
    drop(queued);
    assert_no_znodes(&zk, &ns).await;
}

#[tokio::test]
async fn a_release_wakes_only_the_two_next_waiters() {
    let ns = test_namespace!();
    // A server of its own, and long sessions: the packet count below must not pick up other
    // tests' traffic or idle pings (sent after 15% of a session timeout without requests).
    let server = ZkServer::start();
    let connect = server.connect_string();
    let session = Duration::from_secs(30);
    let zk = raw(&connect).await;
    let path = format!("/{ns}/herd");
    let holder = client_at(&connect, &ns, session)
        .await
        .mutex("herd")
        .lock()
        .await
        .unwrap();
    let (granted_tx, mut granted_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    const WAITERS: usize = 8;
    for i in 0..WAITERS {
        let mutex = client_at(&connect, &ns, session).await.mutex("herd");
        let granted_tx = granted_tx.clone();
        tasks.push(tokio::spawn(async move {
            let guard = mutex.lock().await.unwrap();
            granted_tx.send(i).unwrap();
            // Hold on, so the next handoff does not blur the count.
            sleep(Duration::from_millis(300)).await;
            guard.release().await.unwrap();
        }));
        until_contenders(&zk, &path, i + 2).await;
    }
    sleep(Duration::from_millis(100)).await;
    let before = server.packets_received();
    holder.release().await.unwrap();
    assert_eq!(granted_rx.recv().await, Some(0));
    let after = server.packets_received();
    // The holder's delete, and at most two requests from the waiters: the next one learns it
    // is first from its watch alone; the one behind it, which watches the holder too, lists
    // and watches anew (so its own turn will come from its watch alone); the others are not
    // woken at all. (A herd would be one or more requests per waiter; pings of idle sessions
    // are the only other traffic, rare with 30 s sessions.)
    let spent = after - before;
    assert!(
        spent <= 4,
        "{spent} packets between release and grant with {WAITERS} waiters"
    );
    for t in tasks {
        timeout(Duration::from_secs(20), t).await.unwrap().unwrap();
    }
}

#[tokio::test]
async fn try_lock_and_lock_timeout_leave_no_node() {
    let ns = test_namespace!();
    let zk = raw(&shared_zookeeper().connect_string()).await;
    let path = format!("/{ns}/k");
    let a = client(&ns).await;
    let b = client(&ns).await;
    let held = a.mutex("k").lock().await.unwrap();
    let err = b.mutex("k").try_lock().await.unwrap_err();
    assert!(err.is_would_block(), "{err:?}");
    assert_eq!(children(&zk, &path).await.len(), 1);
    let err = b
        .mutex("k")
        .lock_timeout(Duration::from_millis(200))
        .await
        .unwrap_err();
    assert!(err.is_timeout(), "{err:?}");
    // The timed-out claim's node goes in a spawned task.
    timeout(Duration::from_secs(5), async {
        while children(&zk, &path).await.len() != 1 {
            sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the node of a timed-out lock() stayed");
    held.release().await.unwrap();
    a.shutdown().await;
    b.shutdown().await;
    assert_no_znodes(&zk, &ns).await;
}

#[tokio::test]
async fn an_idle_lock_node_is_deleted_after_release() {
    let ns = test_namespace!();
    let zk = raw(&shared_zookeeper().connect_string()).await;
    let c = client(&ns).await;
    let guard = c.mutex("orders/7").lock().await.unwrap();
    assert!(zk
        .check_stat(&format!("/{ns}/orders/7"))
        .await
        .unwrap()
        .is_some());
    guard.release().await.unwrap();
    // Without shutdown: the lingering delete removes the lock node and its empty parent.
    assert_no_znodes(&zk, &ns).await;
    // And a later lock re-creates them.
    let guard = c.mutex("orders/7").lock().await.unwrap();
    guard.release().await.unwrap();
    c.shutdown().await;
    assert_no_znodes(&zk, &ns).await;
}

#[tokio::test]
async fn bad_keys_are_refused_before_any_io() {
    let ns = test_namespace!();
    let zk = raw(&shared_zookeeper().connect_string()).await;
    let c = client(&ns).await;
    for key in [
        "..",
        "a/../b",
        "/abs",
        "a//b",
        "trail/",
        "nul\0",
        "bell\u{7}",
        "",
    ] {
        let err = c.mutex(key).try_lock().await.unwrap_err();
        assert!(err.is_invalid_key(), "{key:?}: {err:?}");
    }
    let long = "k".repeat(distlock::MAX_KEY_LEN + 1);
    assert!(c.mutex(long).try_lock().await.unwrap_err().is_invalid_key());
    assert!(zk.check_stat(&format!("/{ns}")).await.unwrap().is_none());
    assert!(zk.check_stat("/b").await.unwrap().is_none());
}

#[tokio::test]
async fn another_identity_cannot_delete_our_node() {
    let ns = test_namespace!();
    let connect = shared_zookeeper().connect_string();
    let backend = ZkBackend::builder(connect.clone())
        .digest("alice:wonderland")
        .acl(ZkAcl::CreatorAll)
        .build()
        .await
        .unwrap();
    let c = LockClient::builder(backend).namespace(&ns).build().unwrap();
    let guard = c.mutex("k").lock().await.unwrap();
    let path = format!("/{ns}/k");
    let mallory = raw_as(&connect, Some("mallory:x")).await;
    let kids = children(&mallory, &path).await;
    assert_eq!(kids.len(), 0, "listing needs READ, which mallory lacks");
    assert_eq!(
        mallory.get_acl(&path).await.unwrap_err(),
        zookeeper_client::Error::NoAuth
    );
    // Alice's own second session may see and delete; mallory may not.
    let alice = raw_as(&connect, Some("alice:wonderland")).await;
    let acl = alice.get_acl(&path).await.unwrap().0;
    assert_eq!(acl.len(), 1, "{acl:?}");
    assert_eq!(acl[0].scheme(), "digest");
    let node = format!("{path}/{}", children(&alice, &path).await[0]);
    let err = mallory.delete(&node, None).await.unwrap_err();
    assert_eq!(err, zookeeper_client::Error::NoAuth);
    assert!(!guard.is_lost());
    guard.release().await.unwrap();
    c.shutdown().await;
    assert_no_znodes(&alice, &ns).await;
}

const CHILD_ENV: &str = "DISTLOCK_TEST_ZK_CHILD_HOLDER";
const CHILD_SESSION: Duration = Duration::from_secs(2);

#[tokio::test]
async fn a_holder_killed_with_sigkill_frees_the_lock_within_its_session_timeout() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        // The child: take the lock, say so, and hold it until killed.
        let (connect, ns) = spec.split_once(' ').unwrap();
        let c = client_at(connect, ns, CHILD_SESSION).await;
        let guard = c.mutex("k").lock().await.unwrap();
        crate::support::holder::report_and_hold(guard.fencing_token()).await;
    }
    let ns = test_namespace!();
    let connect = shared_zookeeper().connect_string();
    let zk = raw(&connect).await;
    let (child, child_fence) = crate::support::holder::spawn(
        "standalone::a_holder_killed_with_sigkill_frees_the_lock_within_its_session_timeout",
        CHILD_ENV,
        format!("{connect} {ns}"),
    )
    .await;

    let c = client(&ns).await;
    let waiter = tokio::spawn(c.mutex("k").lock());
    until_contenders(&zk, &format!("/{ns}/k"), 2).await;
    // No close: the session must time out.
    let (guard, waited) =
        crate::support::holder::kill_and_await(child, waiter, CHILD_SESSION * 4).await;
    // The server expires sessions on tick boundaries (500 ms here).
    assert!(
        waited <= CHILD_SESSION + Duration::from_millis(1200),
        "took {waited:?} after the kill, session timeout {CHILD_SESSION:?}"
    );
    assert!(guard.fencing_token() > child_fence);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blip_shorter_than_the_session_keeps_locks_and_wakes_waiters() {
    let ns = test_namespace!();
    let server = shared_zookeeper();
    let proxy = Proxy::start(server.port());
    let behind = client_at(&format!("127.0.0.1:{}", proxy.port()), &ns, SESSION).await;
    let direct = client(&ns).await;
    let zk = raw(&server.connect_string()).await;

    let kept = behind.mutex("kept").lock().await.unwrap();
    let moved = direct.mutex("moved").lock().await.unwrap();
    let waiter = tokio::spawn({
        let m = behind.mutex("moved");
        async move { m.lock().await }
    });
    until_contenders(&zk, &format!("/{ns}/moved"), 2).await;

    proxy.cut();
    // The release's watch event is lost with the connection.
    moved.release().await.unwrap();
    sleep(Duration::from_millis(1000)).await;
    proxy.pass();

    let got = timeout(Duration::from_secs(6), waiter)
        .await
        .expect("a waiter was not woken after the link came back")
        .unwrap()
        .unwrap();
    assert!(
        !kept.is_lost(),
        "a blip shorter than the session lost a lock"
    );
    // The lock is still ours on the server: nobody else gets it.
    assert!(direct
        .mutex("kept")
        .try_lock()
        .await
        .unwrap_err()
        .is_would_block());
    got.release().await.unwrap();
    kept.release().await.unwrap();
    behind.shutdown().await;
    direct.shutdown().await;
    assert_no_znodes(&zk, &ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_longer_than_the_session_loses_the_lock_before_anyone_else_gets_it() {
    let ns = test_namespace!();
    let server = shared_zookeeper();
    let proxy = Proxy::start(server.port());
    let session = Duration::from_secs(2);
    let behind = client_at(&format!("127.0.0.1:{}", proxy.port()), &ns, session).await;
    let direct = client(&ns).await;
    let zk = raw(&server.connect_string()).await;

    let held = behind.mutex("k").lock().await.unwrap();
    let fence = held.fencing_token();
    let waiter = spawn_timed_lock(direct.mutex("k"));
    until_contenders(&zk, &format!("/{ns}/k"), 2).await;

    let (guard, lost, _) = partition_then_handover(
        // Packets vanish; the TCP connection looks alive to both ends.
        || proxy.blackhole(),
        &held,
        waiter,
        session * 4,
    )
    .await;
    assert!(lost <= session + Duration::from_millis(500), "{lost:?}");
    assert!(guard.fencing_token() > fence);
    proxy.heal();
    let err = held.release().await.unwrap_err();
    assert!(err.is_lost(), "{err:?}");
    guard.release().await.unwrap();
    direct.shutdown().await;
    behind.shutdown().await;
    assert_no_znodes(&zk, &ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_resume_after_zookeeper_restarts() {
    let ns = test_namespace!();
    let mut server = ZkServer::start();
    let connect = server.connect_string();
    let session = Duration::from_secs(8);
    let holder_client = client_at(&connect, &ns, session).await;
    let holder = holder_client.mutex("k").lock().await.unwrap();
    let overlap = Arc::new(crate::support::contract::Overlap::default());
    let fences = Arc::new(StdMutex::new(Vec::new()));
    let zk = raw(&connect).await;
    let mut tasks = Vec::new();
    for i in 0..3 {
        let c = client_at(&connect, &ns, session).await;
        let (overlap, fences) = (overlap.clone(), fences.clone());
        tasks.push(tokio::spawn(async move {
            let guard = c.mutex("k").lock().await.unwrap();
            overlap.enter();
            fences.lock().unwrap().push(guard.fencing_token());
            sleep(Duration::from_millis(50)).await;
            overlap.exit();
            guard.release().await.unwrap();
            c.shutdown().await;
        }));
        until_contenders(&zk, &format!("/{ns}/k"), i + 2).await;
    }
    drop(zk);
    // Down and back on the same data directory: sessions and nodes survive.
    let _server = tokio::task::spawn_blocking(move || {
        server.restart_after(|| std::thread::sleep(Duration::from_millis(300)));
        server
    })
    .await
    .unwrap();
    assert!(
        !holder.is_lost(),
        "a restart within the session lost the lock"
    );
    let holder_fence = holder.fencing_token();
    holder.release().await.unwrap();
    for t in tasks {
        timeout(Duration::from_secs(30), t)
            .await
            .expect("a waiter did not resume after the restart")
            .unwrap();
    }
    assert_eq!(overlap.violations(), 0, "double grant");
    let fences = fences.lock().unwrap().clone();
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "{fences:?}");
    assert!(fences.iter().all(|f| *f > holder_fence), "{fences:?}");
    holder_client.shutdown().await;
    let zk = raw(&connect).await;
    assert_no_znodes(&zk, &ns).await;
}

/// Blocking calls to the Java child, off the async workers.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

fn assert_curator_names(names: &[String]) {
    for name in names {
        let (prefix, seq) = name.split_at(name.len() - 10);
        assert!(seq.bytes().all(|b| b.is_ascii_digit()), "{name}");
        let uuid = prefix
            .strip_prefix("_c_")
            .and_then(|p| p.strip_suffix("-lock-"))
            .unwrap_or_else(|| panic!("not a protected Curator lock node: {name}"));
        assert_eq!(uuid.len(), 36, "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_holds_and_rust_waits_its_turn() {
    let ns = test_namespace!();
    let connect = shared_zookeeper().connect_string();
    let path = format!("/{ns}/shared");
    let zk = raw(&connect).await;
    let mut curator = blocking(|| Curator::start(&connect, &path));
    assert_eq!(blocking(|| curator.ask("try 5000")), "GOT");

    let c = client(&ns).await;
    let err = c.mutex("shared").try_lock().await.unwrap_err();
    assert!(
        err.is_would_block(),
        "Rust took a lock Curator holds: {err:?}"
    );
    let waiter = tokio::spawn({
        let m = c.mutex("shared");
        async move { m.lock().await }
    });
    until_contenders(&zk, &path, 2).await;
    assert_curator_names(&children(&zk, &path).await);
    sleep(Duration::from_millis(200)).await;
    assert!(
        !waiter.is_finished(),
        "Rust was granted while Curator held the lock"
    );

    assert_eq!(blocking(|| curator.ask("release")), "RELEASED");
    let guard = timeout(Duration::from_secs(5), waiter)
        .await
        .expect("Rust was not woken when Curator released")
        .unwrap()
        .unwrap();
    // And now Curator is the one kept out.
    assert_eq!(blocking(|| curator.ask("try 200")), "BUSY");
    guard.release().await.unwrap();
    assert_eq!(blocking(|| curator.ask("quit")), "BYE");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_holds_and_curator_queues_in_fifo_order() {
    let ns = test_namespace!();
    let connect = shared_zookeeper().connect_string();
    let path = format!("/{ns}/shared");
    let zk = raw(&connect).await;
    let a = client(&ns).await;
    let b = client(&ns).await;
    let held = a.mutex("shared").lock().await.unwrap();
    let mut curator = blocking(|| Curator::start(&connect, &path));
    assert_eq!(blocking(|| curator.ask("try 300")), "BUSY");

    // Curator queues, then a second Rust client behind it.
    blocking(|| curator.send("lock"));
    until_contenders(&zk, &path, 2).await;
    let rust_waiter = tokio::spawn({
        let m = b.mutex("shared");
        async move { m.lock().await }
    });
    until_contenders(&zk, &path, 3).await;
    assert_curator_names(&children(&zk, &path).await);
    assert_eq!(blocking(|| curator.reply(Duration::from_millis(300))), None);

    held.release().await.unwrap();
    assert_eq!(
        blocking(|| curator.reply(Duration::from_secs(10))).as_deref(),
        Some("GOT"),
        "Curator, next in line, was not granted"
    );
    sleep(Duration::from_millis(200)).await;
    assert!(!rust_waiter.is_finished(), "Rust jumped ahead of Curator");
    assert_eq!(blocking(|| curator.ask("release")), "RELEASED");
    let guard = timeout(Duration::from_secs(5), rust_waiter)
        .await
        .expect("Rust was not woken after Curator released")
        .unwrap()
        .unwrap();
    guard.release().await.unwrap();
    assert_eq!(blocking(|| curator.ask("quit")), "BYE");
    a.shutdown().await;
    b.shutdown().await;
}

/// A connect string with a chroot that does not exist yet (`zk://host/apps` on a fresh server,
/// the README's own form) works: the chroot is made, as Curator makes its namespace, and the
/// locks live under it. Where the client may not create it, the error is a configuration error
/// that names the chroot, not a retryable outage.
#[tokio::test]
async fn a_missing_chroot_is_created_or_named() {
    let ns = test_namespace!();
    let connect = shared_zookeeper().connect_string();
    let chroot = format!("/{ns}.root/apps");
    let a = client_at(&format!("{connect}{chroot}"), &ns, SESSION).await;
    let b = client_at(&format!("{connect}{chroot}"), &ns, SESSION).await;
    let held = a.mutex("k").lock().await.unwrap();
    assert!(b.mutex("k").try_lock().await.unwrap_err().is_would_block());
    let zk = raw(&connect).await;
    assert_eq!(children(&zk, &format!("{chroot}/{ns}/k")).await.len(), 1);
    held.release().await.unwrap();
    a.shutdown().await;
    b.shutdown().await;

    // A parent only readable by anyone: the chroot cannot be made under it.
    let sealed = format!("/{ns}.sealed");
    let read_only = [zookeeper_client::Acl::new_const(
        zookeeper_client::Permission::READ,
        "world",
        "anyone",
    )];
    let options =
        zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::new(&read_only));
    zk.create(&sealed, &[], &options).await.unwrap();
    let err = ZkBackend::builder(format!("{connect}{sealed}/apps"))
        .session_timeout(SESSION)
        .build()
        .await
        .unwrap_err();
    assert!(err.is_invalid_config(), "{err:?}");
    assert!(!err.is_transient(), "{err:?}");
    assert!(err.to_string().contains(&format!("{sealed}/apps")), "{err}");
    // Chroots no retry can make: under an ephemeral node, `..`, ZooKeeper's own tree.
    let ephemeral = format!("/{ns}.ephemeral");
    let options =
        zookeeper_client::CreateMode::Ephemeral.with_acls(zookeeper_client::Acls::anyone_all());
    zk.create(&ephemeral, &[], &options).await.unwrap();
    for bad in [
        format!("{ephemeral}/apps"),
        "/..".to_owned(),
        "/zookeeper/x".to_owned(),
    ] {
        let err = ZkBackend::builder(format!("{connect}{bad}"))
            .session_timeout(SESSION)
            .build()
            .await
            .unwrap_err();
        assert!(
            err.is_invalid_config() && !err.is_transient(),
            "{bad}: {err:?}"
        );
    }

    // The chroot deleted under running clients: the next lock makes it again.
    let a = client_at(&format!("{connect}{chroot}"), &ns, SESSION).await;
    a.mutex("k").lock().await.unwrap().release().await.unwrap();
    a.shutdown().await;
    let a = client_at(&format!("{connect}{chroot}"), &ns, SESSION).await;
    delete_tree(&zk, &format!("/{ns}.root")).await;
    let again = a.mutex("k").lock().await.unwrap();
    assert_eq!(children(&zk, &format!("{chroot}/{ns}/k")).await.len(), 1);
    again.release().await.unwrap();
    a.shutdown().await;
    for path in [sealed] {
        let _ = zk.delete(&path, None).await;
    }
    delete_tree(&zk, &format!("/{ns}.root")).await;
}

/// Deletes `path` and everything under it.
async fn delete_tree(zk: &zookeeper_client::Client, path: &str) {
    let mut stack = vec![path.to_owned()];
    let mut order = Vec::new();
    while let Some(p) = stack.pop() {
        for child in zk.list_children(&p).await.unwrap_or_default() {
            stack.push(format!("{p}/{child}"));
        }
        order.push(p);
    }
    for p in order.iter().rev() {
        let _ = zk.delete(p, None).await;
    }
}

/// A client built on a ZooKeeper backend by hand takes the session the ensemble granted as its
/// TTL, as one made from a `zk://` URL does (it kept the 30 s default, so renewal and the lost
/// deadline followed a lease the server does not keep).
#[tokio::test]
async fn a_client_built_on_a_backend_takes_the_session_as_its_ttl() {
    let connect = shared_zookeeper().connect_string();
    let backend = crate::support::zk::backend(&connect, SESSION).await;
    let session = backend.session_timeout();
    let by_hand = LockClient::builder(backend).build().unwrap();
    assert_eq!(by_hand.ttl(), session);
    let by_url = LockClient::connect(&format!("zk://{connect}"))
        .await
        .unwrap();
    let url_session = by_url.ttl();
    assert!(
        url_session >= distlock::backend::MIN_SESSION_TIMEOUT,
        "{url_session:?}"
    );
    // A TTL set on the builder still wins.
    let backend = crate::support::zk::backend(&connect, SESSION).await;
    let set = LockClient::builder(backend)
        .ttl(Duration::from_secs(7))
        .build()
        .unwrap();
    assert_eq!(set.ttl(), Duration::from_secs(7));
    for c in [by_hand, by_url, set] {
        c.shutdown().await;
    }
}

/// A ZooKeeper lease is its session's: a guard reports what is left of it, renews it with
/// `extend` at the session timeout, and cannot ask for another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_extends_only_to_its_session_timeout() {
    let ns = test_namespace!();
    let client = client(&ns).await;
    let g = client.mutex("lease").lock().await.unwrap();
    let left = g.lease_left();
    assert!(
        left > Duration::ZERO && left <= SESSION,
        "lease_left {left:?}"
    );
    g.extend(SESSION).await.unwrap();
    let err = g.extend(SESSION * 2).await.unwrap_err();
    assert_eq!(err.kind(), distlock::ErrorKind::Unsupported, "{err}");
    assert!(!g.is_lost());
    g.release().await.unwrap();
}

/// The operator's unlock drops a semaphore holder whose session also heads the admission
/// queue (another task of the same service waits for more permits): before, its leases were
/// taken for the waiting head's, nothing was removed, the holder never heard, and the waiter
/// was never granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_drops_a_holder_whose_session_also_waits() {
    let ns = test_namespace!();
    let (a, op) = (client(&ns).await, client(&ns).await);
    let held = a.semaphore("s", 3).acquire_many(2).await.unwrap();
    let token = held.fencing_token();
    let waiting = crate::support::contract::spawn_timed(a.semaphore("s", 3).acquire_many(2));
    sleep(Duration::from_millis(500)).await;
    assert!(!waiting.is_finished());
    let removed = op.force_release("s").await.unwrap();
    assert_eq!(
        removed.removed.len(),
        1,
        "the holder was not dropped: {removed:?}"
    );
    timeout(SESSION + Duration::from_millis(1500), held.lost())
        .await
        .expect("the dropped holder never reported lost");
    let (_, got) = timeout(SESSION + Duration::from_millis(1500), waiting)
        .await
        .expect("the waiter was never granted after the unlock")
        .unwrap();
    assert!(got.unwrap().fencing_token() > token);
}

/// The operator's unlock racing a downgrade drops the hold wherever it stands: the write node
/// the unlock listed may be gone, replaced by the claim's read node. Before, the read hold
/// survived in 3 to 4 of 6 rounds while the unlock reported success.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_racing_a_downgrade_drops_the_read_hold() {
    let ns = test_namespace!();
    let (a, op) = (client(&ns).await, client(&ns).await);
    let mut survived = Vec::new();
    for round in 0..6 {
        let key = format!("dg-{round}");
        let w = a.rw_lock(&key).write().await.unwrap();
        let (downgraded, unlocked) = tokio::join!(w.downgrade(), op.force_release(&key));
        unlocked.unwrap();
        let Ok(r) = downgraded else {
            continue; // the unlock came first: the downgrade found its hold gone
        };
        sleep(SESSION + Duration::from_millis(1500)).await;
        let seen = op.inspect(&key).await.unwrap();
        if !r.is_lost() || !seen.holders.is_empty() {
            survived.push((round, r.is_lost(), seen.holders.len()));
        }
    }
    assert!(
        survived.is_empty(),
        "holds that outlived the unlock (round, lost, holders): {survived:?}"
    );
}

/// The unlock lists a lock's nodes, then reads each one. A downgrade that moves the write hold
/// to its read node in between left it reading a write node gone, dropping nothing and
/// reporting success, while the read hold lived on (the race above, 2 runs in 8 under load).
/// Here the unlock's reads of the write node are held up 300 ms so that the downgrade lands
/// in between, every time: the unlock must find the read node and drop it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_that_listed_a_write_hold_mid_downgrade_drops_its_read_node() {
    let ns = test_namespace!();
    let proxy = Proxy::start(shared_zookeeper().port());
    let a = client(&ns).await;
    let op = client_at(&format!("127.0.0.1:{}", proxy.port()), &ns, SESSION).await;
    let w = a.rw_lock("dg").write().await.unwrap();
    let zk = raw(&connect()).await;
    let [write_node]: [String; 1] = children(&zk, &format!("/{ns}/dg"))
        .await
        .try_into()
        .unwrap();
    let name: &'static [u8] = Box::leak(write_node.into_bytes().into_boxed_slice());
    proxy.delay_requests_containing(Which::All, name, Duration::from_millis(300));
    let unlock = tokio::spawn({
        let op = op.clone();
        async move { op.force_release("dg").await }
    });
    sleep(Duration::from_millis(100)).await;
    let r = w
        .downgrade()
        .await
        .expect("downgraded before the unlock read the write node");
    let removed = unlock.await.unwrap().unwrap();
    proxy.pass();
    timeout(Duration::from_secs(5), r.lost())
        .await
        .expect("the read hold outlived the unlock");
    assert_eq!(removed.removed.len(), 1, "{removed:?}");
    assert!(op.inspect("dg").await.unwrap().holders.is_empty());
    drop(r);
    a.shutdown().await;
    op.shutdown().await;
}

/// The operator's unlock refuses path tricks before any I/O (the unlock itself is in the
/// suite, `tests/contract/matrix.rs`).
#[tokio::test]
async fn force_release_refuses_path_tricks_before_any_io() {
    let ns = test_namespace!();
    let op = client(&ns).await;
    for bad in ["..", "a/../b", "/abs", "a//b"] {
        let err = op.force_release(bad).await.unwrap_err();
        assert!(err.is_invalid_key(), "{bad:?}: {err}");
    }
    op.shutdown().await;
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
    let server = crate::support::server::zookeeper::ZkServer::start();
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

/// A semaphore ask refused on a mutex or a read-write key leaves the semaphore's containers
/// behind, empty: the key is still the other family's to inspect, to unlock and to wait on
/// (it read as a free semaphore, or its containers as two more readers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_semaphore_ask_leaves_the_key_its_familys() {
    use distlock::backend::{Family, LockKind};
    use distlock::ErrorKind;
    let ns = test_namespace!();
    let c = clients(&ns, 2).await;
    let refused = |r: distlock::Result<distlock::SemaphorePermit>| {
        assert_eq!(r.err().map(|e| e.kind()), Some(ErrorKind::KindMismatch));
    };

    let held = c[0].mutex("a").try_lock().await.unwrap();
    refused(c[1].semaphore("a", 2).try_acquire().await);
    let seen = c[1].inspect("a").await.unwrap();
    assert_eq!(seen.family, Some(Family::Mutex), "{seen:?}");
    assert_eq!(seen.holders.len(), 1, "{seen:?}");
    let removed = c[1].force_release("a").await.unwrap();
    assert_eq!(removed.removed.len(), 1, "{removed:?}");
    timeout(SESSION, held.lost())
        .await
        .expect("the holder was never told");

    let write = c[0].rw_lock("b").try_write().await.unwrap();
    refused(c[1].semaphore("b", 2).try_acquire().await);
    let seen = c[1].inspect("b").await.unwrap();
    assert_eq!(seen.family, Some(Family::RwLock), "{seen:?}");
    let kinds: Vec<LockKind> = seen.holders.iter().map(|h| h.kind).collect();
    assert_eq!(kinds, [LockKind::Write], "{seen:?}");
    assert!(seen.waiters.is_empty(), "{seen:?}");
    // A mutex is refused there too, whatever order the key's children are listed in.
    let mutex = c[1].mutex("b").try_lock().await;
    assert_eq!(mutex.err().map(|e| e.kind()), Some(ErrorKind::KindMismatch));
    write.release().await.unwrap();

    let read = c[0].rw_lock("b").try_read().await.unwrap();
    refused(c[1].semaphore("b", 2).try_acquire().await);
    let removed = c[1].force_release("b").await.unwrap();
    assert_eq!(removed.removed.len(), 1, "{removed:?}");
    timeout(SESSION, read.lost())
        .await
        .expect("the reader was never told");
    for client in c {
        client.shutdown().await;
    }
}

/// A key held as a semaphore refuses every other family's ask, though the asker's own node
/// sits beside the semaphore's containers when it looks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_key_refuses_other_families() {
    use distlock::ErrorKind;
    let ns = test_namespace!();
    let c = clients(&ns, 2).await;
    let permits = c[0].semaphore("s", 2).try_acquire_many(2).await.unwrap();
    let mismatch = |kind: Option<ErrorKind>, what: &str| {
        assert_eq!(kind, Some(ErrorKind::KindMismatch), "{what} on a semaphore");
    };
    mismatch(
        c[1].mutex("s").try_lock().await.err().map(|e| e.kind()),
        "a mutex",
    );
    mismatch(
        c[1].rw_lock("s").try_write().await.err().map(|e| e.kind()),
        "a writer",
    );
    mismatch(
        c[1].election("s")
            .try_campaign("x")
            .await
            .err()
            .map(|e| e.kind()),
        "a candidate",
    );
    let seen = c[1].inspect("s").await.unwrap();
    assert_eq!(seen.holders.len(), 1, "{seen:?}");
    permits.release().await.unwrap();
    for client in c {
        client.shutdown().await;
    }
}

/// A writer queued behind a reader while asks of other families are refused on the key, the
/// reader releasing meanwhile: the writer is granted (a refused ask's node, there a moment,
/// turned it away as if the key were a mutex or a semaphore), and every other ask is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_writer_is_not_turned_away_by_refused_asks() {
    use distlock::ErrorKind;
    let ns = test_namespace!();
    let zk = raw(&connect()).await;
    let c = Arc::new(clients(&ns, 6).await);
    let mut bad = Vec::new();
    for round in 0..5 {
        let reader = c[0].rw_lock("r").read().await.unwrap();
        let w = c[1].rw_lock("r");
        let waiter = tokio::spawn(async move { w.write().await });
        until_contenders(&zk, &format!("/{ns}/r"), 2).await;
        let mut asks = Vec::new();
        for i in 0..20 {
            let c = c.clone();
            asks.push(tokio::spawn(async move {
                sleep(Duration::from_millis((i as u64 % 5) * 3)).await;
                let client = &c[2 + i % 4];
                if i % 2 == 0 {
                    client
                        .semaphore("r", 2)
                        .try_acquire()
                        .await
                        .err()
                        .map(|e| e.kind())
                } else {
                    client.mutex("r").try_lock().await.err().map(|e| e.kind())
                }
            }));
        }
        sleep(Duration::from_millis(5)).await;
        reader.release().await.unwrap();
        let got = timeout(Duration::from_secs(10), waiter)
            .await
            .unwrap()
            .unwrap();
        for ask in asks {
            let kind = ask.await.unwrap();
            if kind != Some(ErrorKind::KindMismatch) {
                bad.push(format!(
                    "round {round}: an ask of another family ended {kind:?}"
                ));
            }
        }
        match got {
            Ok(g) => g.release().await.unwrap(),
            Err(e) => bad.push(format!("round {round}: the queued writer was refused: {e}")),
        }
    }
    for client in Arc::try_unwrap(c).ok().unwrap() {
        client.shutdown().await;
    }
    assert_no_znodes(&zk, &ns).await;
    assert!(bad.is_empty(), "{bad:#?}");
}
