//! Faults against real ZooKeeper servers: a session timeout the server caps, a server down
//! longer than the sessions (then back on its data directory, reviving them), a holder's node
//! deleted behind its back, and for elections a leader, an observer or a candidate in line cut
//! off. The promises checked: a stale holder (or leader) is told before anyone else is granted,
//! no key stays blocked longer than a session timeout after the server returns or its holder
//! goes silent, and observers catch up once their link is back.
#![cfg(feature = "zookeeper")]

use std::time::Duration;

use crate::support::contract::{partition_then_handover, spawn_timed, spawn_timed_lock};
use crate::support::proxy::Proxy;
use crate::support::server::ensemble::ZkEnsemble;
use crate::support::server::zookeeper::{shared_zookeeper, ZkServer};
use crate::support::zk::{backend, client_at as client, raw, until_contenders};
use distlock::{Leader, LockClient};
use futures::StreamExt;
use tokio::time::{sleep, timeout, Instant};

/// Item 3: the server grants a shorter session than asked for; the holder's lease must follow
/// the granted one, so a partitioned holder learns it lost the lock before anyone else gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_the_server_caps_bounds_the_lease() {
    let ns = test_namespace!();
    let server = ZkServer::start_with(&[("maxSessionTimeout", "2000")]);
    let granted = Duration::from_secs(2);
    let proxy = Proxy::start(server.port());
    let behind = backend(
        &format!("127.0.0.1:{}", proxy.port()),
        Duration::from_secs(6),
    )
    .await;
    let reported = behind.session_timeout();
    let holder = LockClient::builder(behind)
        .namespace(&ns)
        .ttl(Duration::from_secs(6))
        .build()
        .unwrap();
    let direct = client(&server.connect_string(), &ns, granted).await;
    let zk = raw(&server.connect_string()).await;

    let held = holder.mutex("k").lock().await.unwrap();
    let waiter = spawn_timed_lock(direct.mutex("k"));
    until_contenders(&zk, &format!("/{ns}/k"), 2).await;

    let (guard, lost, granted_after) =
        partition_then_handover(|| proxy.blackhole(), &held, waiter, Duration::from_secs(15)).await;
    println!("partition: holder lost at {lost:?}, waiter granted at {granted_after:?}");
    assert_eq!(
        reported, granted,
        "the backend must report the granted session timeout"
    );
    proxy.heal();
    drop(held);
    guard.release().await.unwrap();
    direct.shutdown().await;
    holder.shutdown().await;
}

/// Item 4: a server down longer than the sessions, then restarted on its data directory (which
/// revives the old sessions): locks abandoned during the outage must not block their keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_revived_by_a_restart_do_not_block_keys() {
    let ns = test_namespace!();
    let mut server = ZkServer::start();
    let connect = server.connect_string();
    let session = Duration::from_secs(4);
    let c1 = client(&connect, &ns, session).await;
    let c2 = client(&connect, &ns, session).await;
    let c3 = client(&connect, &ns, session).await;
    let c4 = client(&connect, &ns, session).await;
    let zk = raw(&connect).await;

    let a = c1.mutex("a").lock().await.unwrap();
    let b = c2.mutex("b").lock().await.unwrap();
    let b_waiter = tokio::spawn(c3.mutex("b").lock());
    let a_waiter = tokio::spawn(c4.mutex("a").lock());
    until_contenders(&zk, &format!("/{ns}/a"), 2).await;
    until_contenders(&zk, &format!("/{ns}/b"), 2).await;
    drop(zk);
    // Let both waiters finish queueing (list, watch): a first attempt cut short by the outage
    // would report it, where a queued waiter rides it out.
    sleep(Duration::from_millis(300)).await;

    // Down for 6.8 s, well past the 4 s sessions; back on the same data.
    let restart = tokio::task::spawn_blocking(move || {
        server.restart_after(|| std::thread::sleep(Duration::from_millis(6800)));
        (server, Instant::now())
    });
    sleep(Duration::from_millis(500)).await;
    // During the outage: a holder gives up its lock, another drops its guard, a waiter is
    // cancelled. None of their nodes can be deleted now.
    drop(a);
    drop(b);
    a_waiter.abort();
    let (_server, back) = restart.await.unwrap();

    let c5 = client(&connect, &ns, session).await;
    let fresh = c5
        .mutex("a")
        .lock_timeout(session + Duration::from_secs(3))
        .await
        .expect("a key abandoned during the outage stayed blocked after the server returned");
    let a_free = back.elapsed();
    let b_guard = timeout(session + Duration::from_secs(3), b_waiter)
        .await
        .expect("the waiter on the other key never got it")
        .unwrap()
        .unwrap();
    let b_free = back.elapsed();
    println!("server back: key a free after {a_free:?}, key b after {b_free:?}");
    assert!(
        a_free <= session + Duration::from_secs(1) && b_free <= session + Duration::from_secs(1),
        "keys free {a_free:?} / {b_free:?} after the server returned (session {session:?})"
    );
    drop((fresh, b_guard));
    for c in [c1, c2, c3, c4, c5] {
        c.shutdown().await;
    }
}

/// Item 10: a holder whose node is deleted behind its back is told at once, not at its next
/// renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_holder_node_is_noticed_at_once() {
    let ns = test_namespace!();
    let connect = shared_zookeeper().connect_string();
    let c = client(&connect, &ns, Duration::from_secs(6)).await;
    let zk = raw(&connect).await;
    let guard = c.mutex("k").lock().await.unwrap();
    let path = format!("/{ns}/k");
    let node = zk.list_children(&path).await.unwrap().remove(0);
    let deleted = Instant::now();
    zk.delete(&format!("{path}/{node}"), None).await.unwrap();
    timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("lost() never resolved");
    // The first renewal is a third of the 6 s session away.
    assert!(
        deleted.elapsed() < Duration::from_millis(500),
        "noticed {:?} after the delete",
        deleted.elapsed()
    );
    drop(guard);
    c.shutdown().await;
}

/// Item 10: on an ensemble, a lease must not be renewed by a follower cut off from the leader.
/// Such a follower goes on answering reads (until `syncLimit` runs out) while the leader,
/// hearing nothing of the session, expires it and grants the lock to someone else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_cut_off_from_the_leader_cannot_renew_a_lease() {
    let ns = test_namespace!();
    // The cut-off follower serves on for 20 ticks (10 s), far past the 2 s session.
    let ensemble = ZkEnsemble::start(20);
    let leader = ensemble.leader();
    let follower = (0..3).find(|i| *i != leader).unwrap();
    let other = (0..3).find(|i| *i != leader && *i != follower).unwrap();
    let session = Duration::from_secs(2);
    // The holder knows only the follower; the waiter only the other follower.
    let holder = client(&ensemble.member(follower), &ns, session).await;
    let direct = client(&ensemble.member(other), &ns, session).await;
    let zk = raw(&ensemble.member(leader)).await;

    let held = holder.mutex("k").lock().await.unwrap();
    let waiter = spawn_timed_lock(direct.mutex("k"));
    until_contenders(&zk, &format!("/{ns}/k"), 2).await;

    let (guard, lost, granted_after) = partition_then_handover(
        || ensemble.partition(follower, leader),
        &held,
        waiter,
        Duration::from_secs(20),
    )
    .await;
    println!("follower cut off: holder lost at {lost:?}, waiter granted at {granted_after:?}");
    ensemble.heal(follower, leader);
    drop(held);
    guard.release().await.unwrap();
    direct.shutdown().await;
    holder.shutdown().await;
}

/// CURATOR-595's case: a holder of a permit and of a read lock loses its session (cut off
/// longer than it). Both guards report lost before the waiters, a permit and a writer, are let
/// in: the permit goes back to the others with the session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_session_frees_permits_and_read_locks_only_after_telling_the_holder() {
    let ns = test_namespace!();
    let server = shared_zookeeper();
    let proxy = Proxy::start(server.port());
    let session = Duration::from_secs(2);
    let behind = client(&format!("127.0.0.1:{}", proxy.port()), &ns, session).await;
    let direct = client(&server.connect_string(), &ns, session).await;
    let zk = raw(&server.connect_string()).await;

    let permit = behind.semaphore("sem", 1).acquire().await.unwrap();
    let read = behind.rw_lock("rw").read().await.unwrap();
    let want_permit = crate::support::contract::spawn_timed(direct.semaphore("sem", 1).acquire());
    let want_write = crate::support::contract::spawn_timed(direct.rw_lock("rw").write());
    until_contenders(&zk, &format!("/{ns}/sem/locks"), 1).await;
    until_contenders(&zk, &format!("/{ns}/rw"), 2).await;

    let read_lost = async {
        read.lost().await;
        Instant::now()
    };
    let ((p, lost, granted), read_lost_at) = tokio::join!(
        partition_then_handover(|| proxy.blackhole(), &permit, want_permit, session * 5),
        read_lost
    );
    println!("permit: holder told at {lost:?}, waiter granted at {granted:?}");
    let (write_at, w) = timeout(session * 5, want_write)
        .await
        .expect("the writer never got in")
        .unwrap();
    let w = w.unwrap();
    assert!(
        read_lost_at <= write_at,
        "a writer got in {:?} before the reader was told",
        read_lost_at - write_at
    );
    assert!(p.fencing_token() > permit.fencing_token());
    assert!(w.fencing_token() > read.fencing_token());
    proxy.heal();
    drop((p, w, permit, read));
    behind.shutdown().await;
    direct.shutdown().await;
}

/// CURATOR-315's case: the reply to a semaphore's lease create is lost (it comes later than
/// the call deadline), though the server made the node. The claim finds that node by its
/// protection prefix instead of making a second one: once granted it holds exactly its one
/// lease, and nothing is left after release. An orphaned lease would count against the
/// semaphore forever and keep this claim waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_create_whose_reply_is_lost_leaves_no_orphan() {
    let ns = test_namespace!();
    let server = shared_zookeeper();
    let proxy = Proxy::start(server.port());
    let session = Duration::from_secs(8);
    // Calls give up after 2 s (crate::support::zk::backend); replies will come 2.5 s late.
    let behind = client(&format!("127.0.0.1:{}", proxy.port()), &ns, session).await;
    let [full, next]: [LockClient; 2] = [
        client(&server.connect_string(), &ns, session).await,
        client(&server.connect_string(), &ns, session).await,
    ];
    let zk = raw(&server.connect_string()).await;
    let (locks, leases) = (format!("/{ns}/sem/locks"), format!("/{ns}/sem/leases"));

    // Both permits taken; `next` waits at the head of the admission queue (its lease made),
    // and our claim queues behind it.
    let all = full.semaphore("sem", 2).acquire_many(2).await.unwrap();
    let head = tokio::spawn({
        let sem = next.semaphore("sem", 2);
        async move { sem.acquire().await }
    });
    until_contenders(&zk, &leases, 3).await;
    let ours = tokio::spawn({
        let sem = behind.semaphore("sem", 2);
        async move { sem.acquire().await }
    });
    until_contenders(&zk, &locks, 2).await;
    // Our claim is queued once it watches the head's admission node (the server lists the
    // watch): only then may replies start coming late.
    let mut queue = crate::support::zk::children(&zk, &locks).await;
    queue.sort_by_key(|n| n[n.len() - 10..].to_owned());
    let watched = format!("{locks}/{}", queue[0]);
    timeout(Duration::from_secs(10), async {
        while !server.four_letter("wchp").contains(&watched) {
            sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("our claim never watched the admission head");
    // ...and the reply to that watch has reached it (a first attempt that cannot finish
    // within a session timeout is an error, not a wait).
    sleep(Duration::from_millis(200)).await;

    // From now on our client hears everything 2.5 s late: its admission, then its lease
    // create's reply, which it gives up on.
    proxy.delay_replies(
        crate::support::proxy::Which::All,
        Duration::from_millis(2500),
    );
    all.release().await.unwrap();
    let head = timeout(Duration::from_secs(10), head)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    // Our lease node exists on the server...
    until_contenders(&zk, &leases, 2).await;
    // ...and our client has given up on the reply and looks for it.
    sleep(Duration::from_secs(3)).await;
    proxy.pass();
    let permit = timeout(Duration::from_secs(20), ours)
        .await
        .expect("the claim never got its permit (an orphaned lease?)")
        .unwrap()
        .unwrap();
    let kids = crate::support::zk::children(&zk, &leases).await;
    assert_eq!(kids.len(), 2, "one lease each, no orphan: {kids:?}");
    drop((permit, head));
    for c in [behind, full, next] {
        c.shutdown().await;
    }
    crate::support::zk::assert_no_znodes(&zk, &ns).await;
}

/// a waiter whose node is in the queue when the server goes down for longer
/// than its session (its first acquire call still under way) rides the outage out: once the
/// server is back it queues again in a new session and is granted within its own deadline,
/// instead of returning "not connected".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_wait_rides_out_an_outage_past_its_session() {
    let ns = test_namespace!();
    let mut server = ZkServer::start();
    let connect = server.connect_string();
    let session = Duration::from_secs(4);
    let holder = client(&connect, &ns, session).await;
    let waiter = client(&connect, &ns, session).await;
    let zk = raw(&connect).await;
    let held = holder.mutex("k").lock().await.unwrap();
    let wait = tokio::spawn(waiter.mutex("k").lock_timeout(Duration::from_secs(40)));
    until_contenders(&zk, &format!("/{ns}/k"), 2).await;
    drop(zk);
    // At once: the waiter may still be listing and watching when the server goes.
    let restart = tokio::task::spawn_blocking(move || {
        server.restart_after(|| std::thread::sleep(Duration::from_millis(6700)));
        (server, Instant::now())
    });
    let (_server, back) = restart.await.unwrap();
    drop(held);
    let guard = timeout(Duration::from_secs(40), wait)
        .await
        .expect("the wait outlived its own timeout")
        .unwrap()
        .unwrap_or_else(|e| panic!("a queued wait gave up with time left: {e}"));
    println!("granted {:?} after the server returned", back.elapsed());
    assert!(back.elapsed() < session * 3);
    drop(guard);
    holder.shutdown().await;
    waiter.shutdown().await;
}

/// A session timeout for the election faults, and what ZooKeeper adds to it before a dead
/// session's nodes go: the server expires sessions in buckets of a tick (500 ms), and the new
/// leader proves its own session fresh before it is told.
const ELECTION_SESSION: Duration = Duration::from_secs(2);
const EXPIRY_SLACK: Duration = Duration::from_millis(1500);

/// The leader's client is cut off past its session (its link swallows every byte): the
/// candidate behind it leads within the session timeout and some slack, with a higher term,
/// and the old leader's guard reported the loss before that; `leader()` names the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_past_its_session_is_replaced_after_it_is_told() {
    let ns = test_namespace!();
    let server = shared_zookeeper();
    let proxy = Proxy::start(server.port());
    let old = client(
        &format!("127.0.0.1:{}", proxy.port()),
        &ns,
        ELECTION_SESSION,
    )
    .await;
    let next = client(&server.connect_string(), &ns, ELECTION_SESSION).await;
    let zk = raw(&server.connect_string()).await;

    let leading = old.election("e").campaign("old").await.unwrap();
    let waiting = spawn_timed(next.election("e").campaign("next"));
    until_contenders(&zk, &format!("/{ns}/e"), 2).await;

    let (new, lost, granted) = partition_then_handover(
        || proxy.blackhole(),
        &leading,
        waiting,
        Duration::from_secs(15),
    )
    .await;
    println!("leader cut off: told at {lost:?}, the next one led at {granted:?}");
    assert!(
        granted < ELECTION_SESSION + EXPIRY_SLACK,
        "the next leader led {granted:?} after the cut (session {ELECTION_SESSION:?})"
    );
    assert!(new.term() > leading.term());
    let seen = next
        .election("e")
        .leader()
        .await
        .unwrap()
        .expect("nobody leads");
    assert_eq!((seen.value_str(), seen.term()), (Some("next"), new.term()));
    new.resign().await.unwrap();
    drop(leading);
    next.shutdown().await;
    old.shutdown().await;
}

/// An observer's link is cut while the leadership changes hands and the new leader proclaims:
/// once the link is back (the same session after a short cut, a new one after a cut longer
/// than the session), `observe()` yields the latest leader and value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_cut_off_catches_up_with_the_latest_leader() {
    let ns = test_namespace!();
    let server = shared_zookeeper();
    let proxy = Proxy::start(server.port());
    let watcher = client(
        &format!("127.0.0.1:{}", proxy.port()),
        &ns,
        ELECTION_SESSION,
    )
    .await;
    let (a, b) = (
        client(&server.connect_string(), &ns, ELECTION_SESSION).await,
        client(&server.connect_string(), &ns, ELECTION_SESSION).await,
    );
    let (tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let observing = tokio::spawn({
        let changes = watcher.election("e").observe();
        async move {
            let mut changes = Box::pin(changes);
            while let Some(item) = changes.next().await {
                // Errors while the link is down are expected; the stream goes on.
                if let Ok(leader) = item {
                    if tx.send(leader).is_err() {
                        return;
                    }
                }
            }
        }
    });
    let mut leading = a.election("e").campaign("a").await.unwrap();
    until_seen("a", &mut seen).await;
    for (cut_for, round) in [
        (Duration::from_millis(800), "short"),
        (ELECTION_SESSION * 2, "long"),
    ] {
        proxy.cut();
        // While the observer hears nothing: the leadership changes hands, and the new leader
        // proclaims.
        let next_client = if round == "short" { &b } else { &a };
        let waiting = tokio::spawn(next_client.election("e").campaign(format!("{round}-next")));
        until_contenders(&raw(&server.connect_string()).await, &format!("/{ns}/e"), 2).await;
        leading.resign().await.unwrap();
        let next = timeout(Duration::from_secs(5), waiting)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        next.proclaim(format!("{round}-next, ready")).await.unwrap();
        sleep(cut_for).await;
        let healed = Instant::now();
        proxy.heal();
        let want: &'static str = if round == "short" {
            "short-next, ready"
        } else {
            "long-next, ready"
        };
        let caught = until_seen(want, &mut seen).await.expect("a leader");
        println!(
            "{round} cut of {cut_for:?}: the observer caught up {:?} after the link came back",
            healed.elapsed()
        );
        assert_eq!(caught.term(), next.term());
        leading = next;
    }
    leading.resign().await.unwrap();
    observing.abort();
    for c in [a, b, watcher] {
        c.shutdown().await;
    }
}

/// The first leader an observer's items (from a task, errors left out) name with value
/// `want`, within a few session timeouts.
async fn until_seen(
    want: &str,
    seen: &mut tokio::sync::mpsc::UnboundedReceiver<Option<Leader>>,
) -> Option<Leader> {
    let mut last = None;
    let deadline = Instant::now() + ELECTION_SESSION * 4;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match timeout(left, seen.recv()).await {
            Ok(Some(item)) => {
                let value = item.as_ref().and_then(|l| l.value_str().map(str::to_owned));
                if value.as_deref() == Some(want) {
                    return item;
                }
                last = Some(value);
            }
            _ => panic!("the observer never saw {want:?} (last: {last:?})"),
        }
    }
}

/// A candidate in line dies (its link swallows every byte) while the leader leads; the leader
/// resigns: the live candidate behind the dead one leads within the dead one's session timeout
/// (and some slack) of its death, not later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_candidate_in_line_delays_the_next_by_its_session_at_most() {
    let ns = test_namespace!();
    let server = shared_zookeeper();
    let proxy = Proxy::start(server.port());
    let connect = server.connect_string();
    let dead = client(
        &format!("127.0.0.1:{}", proxy.port()),
        &ns,
        ELECTION_SESSION,
    )
    .await;
    let (a, live) = (
        client(&connect, &ns, ELECTION_SESSION).await,
        client(&connect, &ns, ELECTION_SESSION).await,
    );
    let zk = raw(&connect).await;
    let path = format!("/{ns}/e");

    let leading = a.election("e").campaign("a").await.unwrap();
    let doomed = tokio::spawn(dead.election("e").campaign("dead"));
    until_contenders(&zk, &path, 2).await;
    let waiting = spawn_timed(live.election("e").campaign("live"));
    until_contenders(&zk, &path, 3).await;

    proxy.blackhole();
    let died = Instant::now();
    sleep(Duration::from_millis(200)).await;
    leading.resign().await.unwrap();
    let (at, next) = timeout(ELECTION_SESSION * 5, waiting)
        .await
        .expect("the live candidate never led")
        .unwrap();
    let next = next.unwrap();
    let waited = at - died;
    println!("a dead candidate in line: the live one led {waited:?} after its death");
    assert!(
        waited < ELECTION_SESSION + EXPIRY_SLACK,
        "the live candidate led {waited:?} after the one ahead died (session {ELECTION_SESSION:?})"
    );
    // The dead one never led.
    assert!(!doomed.is_finished() || doomed.await.unwrap().is_err());
    next.resign().await.unwrap();
    for c in [a, live, dead] {
        c.shutdown().await;
    }
}

/// A client (session 2 s) built in runtime A on a thread of its own; in runtime B it holds a
/// lock and four more of the same key wait; then A ends. Checked, three rounds: every waiter
/// ends with `Closed` within 1 s of A's end. Before: the session hub stayed "up" with its
/// session's task gone, and a waiter woken by the dead session's watches asked again and
/// waited out a call timeout for an answer that could not come (2 s, 3 waiters in 12).
#[test]
fn waiters_end_at_once_when_their_clients_runtime_ends() {
    let connect = shared_zookeeper().connect_string();
    let b = tokio::runtime::Runtime::new().unwrap();
    for round in 0..3 {
        let ns = format!("{}.{round}", test_namespace!());
        let (built, client_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let home = {
            let (connect, ns) = (connect.clone(), ns.clone());
            std::thread::spawn(move || {
                let a = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .enable_all()
                    .build()
                    .unwrap();
                a.block_on(async move {
                    built
                        .send(client(&connect, &ns, Duration::from_secs(2)).await)
                        .unwrap();
                    let _ = stopped.await;
                });
                drop(a);
                std::time::Instant::now()
            })
        };
        let c = client_rx.recv().unwrap();
        let (held, waiters) = b.block_on(async {
            let held = c.mutex("k").lock().await.unwrap();
            let waiters: Vec<_> = (0..4)
                .map(|_| {
                    let m = c.mutex("k");
                    tokio::spawn(async move {
                        let r = m.lock().await.map(|_| ()).map_err(|e| e.kind());
                        (std::time::Instant::now(), r)
                    })
                })
                .collect();
            let zk = raw(&connect).await;
            until_contenders(&zk, &format!("/{ns}/k"), 5).await;
            (held, waiters)
        });
        stop.send(()).unwrap();
        let ended = home.join().unwrap();
        let outcomes = b.block_on(async {
            timeout(Duration::from_secs(5), futures::future::join_all(waiters))
                .await
                .unwrap_or_else(|_| panic!("round {round}: a waiter did not end within 5 s"))
        });
        for outcome in outcomes {
            let (at, r) = outcome.unwrap();
            let after = at.saturating_duration_since(ended);
            assert_eq!(r, Err(distlock::ErrorKind::Closed), "round {round}");
            assert!(
                after < Duration::from_secs(1),
                "round {round}: ended {after:?} after"
            );
        }
        drop(held);
        b.block_on(async {
            timeout(Duration::from_secs(5), c.shutdown())
                .await
                .expect("shutdown did not end");
        });
    }
}
