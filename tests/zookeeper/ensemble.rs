//! The ZooKeeper backend against three-server ensembles of their own, under faults: the leader
//! killed while locks are held and waiters queued, a client's server killed under it, and a
//! waiter pushed toward a lagging follower. The behaviour suite every backend runs is in
//! `tests/contract/matrix.rs` (`matrix::zookeeper_ensemble::`), on an ensemble shared by that binary with
//! clients spread over its members.
#![cfg(feature = "zookeeper")]

use std::time::Duration;

use crate::support::contract::granted;
use crate::support::proxy::Proxy;
use crate::support::server::ensemble::ZkEnsemble;
use crate::support::zk::{assert_no_znodes, client_at, raw, until_contenders};
use distlock::LockClient;
use tokio::time::{sleep, Instant};
use zookeeper_client::{Acls, CreateMode};

/// A lock client on `connect`, and the member it connected to (the client picks a server at
/// random): the one whose connection count went up.
async fn client_on(
    ensemble: &ZkEnsemble,
    connect: &str,
    ns: &str,
    session: Duration,
) -> (LockClient, usize) {
    let before: Vec<Option<u64>> = (0..3).map(|i| ensemble.connections(i)).collect();
    let c = client_at(connect, ns, session).await;
    let after: Vec<Option<u64>> = (0..3).map(|i| ensemble.connections(i)).collect();
    let moved: Vec<usize> = (0..3)
        .filter(|&i| matches!((before[i], after[i]), (Some(b), Some(a)) if a > b))
        .collect();
    assert_eq!(
        moved.len(),
        1,
        "cannot tell where the client connected: {before:?} -> {after:?}"
    );
    (c, moved[0])
}

/// The leader dies while a holder holds and two waiters queue (one of them connected to the
/// leader itself). The sessions outlive the election: the holder keeps its lock (never told
/// lost), no waiter is granted meanwhile, and the waiters are then served in their order with
/// increasing tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leader_keeps_holders_and_serves_waiters_in_order() {
    let ns = test_namespace!();
    let mut ensemble = ZkEnsemble::start(4);
    let leader = ensemble.leader();
    let followers: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
    let session = Duration::from_secs(8);
    let holder = client_at(&ensemble.member(followers[0]), &ns, session).await;
    // Knows the leader first; can move to a follower.
    let on_leader = format!(
        "{},{}",
        ensemble.member(leader),
        ensemble.member(followers[1])
    );
    let (first, at) = client_on(&ensemble, &on_leader, &ns, session).await;
    let second = client_at(&ensemble.member(followers[1]), &ns, session).await;
    let zk = raw(&ensemble.member(followers[1])).await;
    let path = format!("/{ns}/k");

    let held = holder.mutex("k").lock().await.unwrap();
    let w1 = tokio::spawn({
        let m = first.mutex("k");
        async move { m.lock().await }
    });
    until_contenders(&zk, &path, 2).await;
    let w2 = tokio::spawn({
        let m = second.mutex("k");
        async move { m.lock().await }
    });
    until_contenders(&zk, &path, 3).await;

    ensemble.kill(leader);
    let killed = Instant::now();
    // Until a new leader serves, and a while after: nothing changes hands.
    let new_leader = loop {
        if let Some(l) =
            (0..3).find(|i| *i != leader && ensemble.mode(*i).as_deref() == Some("leader"))
        {
            break l;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(30),
            "no new leader; logs:\n{}",
            ensemble.logs()
        );
        sleep(Duration::from_millis(50)).await;
    };
    println!(
        "leader {leader} killed, {new_leader} leads after {:?} (first waiter was on {at})",
        killed.elapsed()
    );
    sleep(Duration::from_secs(3)).await;
    assert!(
        !held.is_lost(),
        "the holder lost its lock to a leader election"
    );
    assert!(
        !w1.is_finished() && !w2.is_finished(),
        "a waiter was granted while the lock was held"
    );

    let token = held.fencing_token();
    held.release().await.unwrap();
    let g1 = granted(w1, Duration::from_secs(10), "the first waiter").await;
    sleep(Duration::from_millis(200)).await;
    assert!(!w2.is_finished(), "the second waiter jumped the queue");
    assert!(g1.fencing_token() > token);
    let t1 = g1.fencing_token();
    g1.release().await.unwrap();
    let g2 = granted(w2, Duration::from_secs(10), "the second waiter").await;
    assert!(g2.fencing_token() > t1);
    g2.release().await.unwrap();
    for c in [holder, first, second] {
        c.shutdown().await;
    }
    ensemble.restart(leader);
    assert_no_znodes(&zk, &ns).await;
}

/// The server a holder is connected to dies: the client reconnects to another member within
/// its session, keeps its read lock and its permits (no lost signal, renewals go on), and a
/// writer queued behind gets in only when the holder releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_server_dies_moves_and_keeps_its_locks() {
    let ns = test_namespace!();
    let mut ensemble = ZkEnsemble::start(4);
    let session = Duration::from_secs(6);
    let (holder, at) = client_on(&ensemble, &ensemble.connect_string(), &ns, session).await;
    let others: Vec<usize> = (0..3).filter(|i| *i != at).collect();
    let writer = client_at(&ensemble.member(others[0]), &ns, session).await;
    let zk = raw(&ensemble.member(others[1])).await;

    let r = holder.rw_lock("rw").read().await.unwrap();
    let p = holder.semaphore("sem", 1).acquire().await.unwrap();
    let w = tokio::spawn({
        let rw = writer.rw_lock("rw");
        async move { rw.write().await }
    });
    let s = tokio::spawn({
        let sem = writer.semaphore("sem", 1);
        async move { sem.acquire().await }
    });
    until_contenders(&zk, &format!("/{ns}/rw"), 2).await;
    until_contenders(&zk, &format!("/{ns}/sem/locks"), 1).await;

    ensemble.kill(at);
    // Past two session timeouts: only renewals through the new server keep these alive.
    sleep(session * 2).await;
    assert!(
        !r.is_lost() && !p.is_lost(),
        "the holder lost its locks when its server died"
    );
    assert!(
        !w.is_finished() && !s.is_finished(),
        "a waiter got in while the holder held"
    );
    let (rt, pt) = (r.fencing_token(), p.fencing_token());
    r.release().await.unwrap();
    p.release().await.unwrap();
    let w = granted(w, Duration::from_secs(10), "the writer").await;
    let s = granted(s, Duration::from_secs(10), "the permit").await;
    assert!(w.fencing_token() > rt && s.fencing_token() > pt);
    drop((w, s));
    holder.shutdown().await;
    writer.shutdown().await;
    ensemble.restart(at);
    assert_no_znodes(&zk, &ns).await;
}

/// A follower is cut off from the other two (it goes on serving reads for 10 s: a long
/// `syncLimit`). A holder takes the lock through the leader; a waiter queues behind it through
/// the healthy follower, and then loses that server: the only other one it knows is the
/// lagging follower, which has seen neither node and would list the lock as free. That server
/// must refuse the session (the client has seen a newer zxid), and the waiter must not be
/// granted until the holder has released and the waiter is back on a server that is current.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_pushed_toward_a_lagging_follower_is_not_granted_early() {
    let ns = test_namespace!();
    let ensemble = ZkEnsemble::start(20);
    let leader = ensemble.leader();
    let followers: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
    let (healthy, lagging) = (followers[0], followers[1]);
    let session = Duration::from_secs(8);
    let to_healthy = Proxy::start(ensemble.client_port(healthy));
    let to_lagging = Proxy::start(ensemble.client_port(lagging));
    // The waiter knows the two followers and starts on the healthy one.
    to_lagging.cut();
    let waiter = client_at(
        &format!(
            "127.0.0.1:{},127.0.0.1:{}",
            to_healthy.port(),
            to_lagging.port()
        ),
        &ns,
        session,
    )
    .await;
    to_lagging.pass();
    let holder = client_at(&ensemble.member(leader), &ns, session).await;
    let zk = raw(&ensemble.member(leader)).await;

    ensemble.partition(lagging, leader);
    ensemble.partition(lagging, healthy);
    let held = holder.mutex("k").lock().await.unwrap();
    let w = tokio::spawn({
        let m = waiter.mutex("k");
        async move { m.lock().await }
    });
    until_contenders(&zk, &format!("/{ns}/k"), 2).await;
    // The waiter's server is gone for it: only the lagging follower is left to try.
    let tried = to_lagging.connections();
    to_healthy.cut();
    sleep(Duration::from_secs(3)).await;
    assert!(
        to_lagging.connections() > tried,
        "the waiter never tried the lagging follower"
    );
    assert!(
        !w.is_finished(),
        "the waiter was granted from a stale view while the lock was held"
    );
    assert!(!held.is_lost());
    let token = held.fencing_token();
    held.release().await.unwrap();
    to_healthy.pass();
    let g = granted(w, Duration::from_secs(15), "the waiter").await;
    assert!(g.fencing_token() > token);
    g.release().await.unwrap();
    ensemble.heal(lagging, leader);
    ensemble.heal(lagging, healthy);
    holder.shutdown().await;
    waiter.shutdown().await;
    assert_no_znodes(&zk, &ns).await;
}

/// What one round of the cut-off-follower check saw.
struct Overlap {
    /// A's grant, A known lost (`lost()` resolved), B's grant: instants.
    a_granted: Instant,
    a_lost: Instant,
    b_granted: Instant,
}

impl Overlap {
    /// How long A still believed it held the lock after B was granted (0 if A knew first).
    fn both_held(&self) -> Duration {
        self.a_lost.saturating_duration_since(self.b_granted)
    }
}

/// A, connected to `follower` only, idles `idle` after its session starts and then locks;
/// right after the grant `follower` is cut off from the other two. B, on the majority side,
/// waits for the lock and is granted once the leader expires A's session. The leader expires it
/// a session timeout after the last activity it heard of, which through a follower is not A's
/// create: the follower reports a session's activity in its replies to the leader's pings
/// (every 250 ms here). The lock node is made beforehand, so that A's lock is one create and
/// one listing, and the cut comes before a ping could report them (most of the time).
async fn cut_off_follower_round(
    ensemble: &ZkEnsemble,
    ns: &str,
    key: &str,
    session: Duration,
    idle: Duration,
) -> Overlap {
    let leader = ensemble.leader();
    let followers: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
    let (follower, other) = (followers[0], followers[1]);
    assert_eq!(ensemble.mode(follower).as_deref(), Some("follower"));
    let b = client_at(
        &format!("{},{}", ensemble.member(leader), ensemble.member(other)),
        ns,
        session,
    )
    .await;
    let zk = raw(&ensemble.member(leader)).await;
    let lock_node = format!("/{ns}/{key}");
    zk.mkdir(
        &lock_node,
        &CreateMode::Container.with_acls(Acls::anyone_all()),
    )
    .await
    .unwrap();
    let a = client_at(&ensemble.member(follower), ns, session).await;
    sleep(idle).await;

    let held = a.mutex(key).lock().await.unwrap();
    let a_granted = Instant::now();
    ensemble.partition(follower, leader);
    ensemble.partition(follower, other);

    let waiter = tokio::spawn({
        let m = b.mutex(key);
        async move {
            let g = m.lock_timeout(session * 3).await;
            (g, Instant::now())
        }
    });
    tokio::time::timeout(session * 3, held.lost())
        .await
        .expect("A's guard never reported lost");
    let a_lost = Instant::now();
    let (g, b_granted) = tokio::time::timeout(session * 4, waiter)
        .await
        .expect("B was not granted")
        .expect("B's task");
    let g = g.expect("B's lock");
    let token = held.fencing_token();
    assert!(
        g.fencing_token() > token,
        "tokens must increase: A {token}, B {}",
        g.fencing_token()
    );
    g.release().await.unwrap();
    drop(held);

    ensemble.heal(follower, leader);
    ensemble.heal(follower, other);
    a.shutdown().await;
    b.shutdown().await;
    // Ours, unless a lock client deleted it once it was unused.
    let _ = zk.delete(&lock_node, None).await;
    // The follower rejoins before the next round.
    let deadline = Instant::now() + Duration::from_secs(30);
    while ensemble.mode(follower).as_deref() != Some("follower") {
        assert!(
            Instant::now() < deadline,
            "the follower did not rejoin; logs:\n{}",
            ensemble.logs()
        );
        sleep(Duration::from_millis(100)).await;
    }
    Overlap {
        a_granted,
        a_lost,
        b_granted,
    }
}

/// a holder connected to a follower must know its lock lost no later than
/// the leader can grant it to someone else, however long its session idled before the lock
/// (a write forwarded by a follower does not tell the leader the session is alive). Two
/// rounds: a short idle (less than the client's ping interval, so the leader last heard of A
/// when its session began) and an idle past most of a session timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_on_a_cut_off_follower_is_lost_before_the_next_grant() {
    let ns = test_namespace!();
    let ensemble = ZkEnsemble::start(4);
    let session = Duration::from_secs(6);
    let mut seen = Vec::new();
    // The client pings after 3/20 of the session idle (0.9 s here).
    for (key, idle) in [
        ("short", Duration::from_millis(850)),
        ("long", Duration::from_millis(4500)),
    ] {
        let o = cut_off_follower_round(&ensemble, &ns, key, session, idle).await;
        println!(
            "idle {idle:?}: A lost {:?} after its grant, B granted {:?} after A's grant: both held for {:?}",
            o.a_lost - o.a_granted,
            o.b_granted - o.a_granted,
            o.both_held()
        );
        seen.push((idle, o.both_held()));
    }
    let zk = raw(&ensemble.member(ensemble.leader())).await;
    assert_no_znodes(&zk, &ns).await;
    for (idle, both) in seen {
        assert_eq!(
            both,
            Duration::ZERO,
            "after an idle of {idle:?}, A believed it held the lock {both:?} after B was granted"
        );
    }
}
