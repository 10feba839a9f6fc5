//! Elections on ZooKeeper against Curator 5's `LeaderLatch` in a Java child process
//! (`tests/java/CuratorLatch.java`), on a real server: the node layout, turns taken both
//! ways with each side reading the other's id as the leader's, and never two leaders over
//! many concurrent turns. The election suite every backend runs is in `tests/contract/matrix.rs`
//! (`zookeeper::election_*`).
#![cfg(feature = "zookeeper")]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::support::curator::Curator;
use crate::support::server::zookeeper::shared_zookeeper;
use crate::support::zk::{assert_no_znodes, children, client_at, raw, until_contenders};
use distlock::LockClient;
use futures::StreamExt;
use tokio::time::{sleep, timeout};
use zookeeper_client::Client as ZooKeeper;

const SESSION: Duration = Duration::from_secs(4);

fn connect() -> String {
    shared_zookeeper().connect_string()
}

async fn client(ns: &str) -> LockClient {
    client_at(&connect(), ns, SESSION).await
}

/// Blocking calls to the Java child, off the async workers.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// The latch nodes under `path`, in sequence order.
async fn latch_nodes(zk: &ZooKeeper, path: &str) -> Vec<String> {
    let mut kids = children(zk, path).await;
    kids.sort_by_key(|k| k[k.len().saturating_sub(10)..].to_owned());
    kids
}

/// `_c_<36-character uuid>-latch-<10 digits>`, as Curator's protected `LeaderLatch` names it.
fn assert_latch_name(name: &str) {
    let (prefix, seq) = name.split_at(name.len() - 10);
    assert!(seq.bytes().all(|b| b.is_ascii_digit()), "{name}");
    let uuid = prefix
        .strip_prefix("_c_")
        .and_then(|p| p.strip_suffix("-latch-"))
        .unwrap_or_else(|| panic!("not a protected LeaderLatch node: {name}"));
    assert_eq!(uuid.len(), 36, "{name}");
}

/// Microseconds since the epoch, the clock the Java side stamps its turns with.
fn micros() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros()
}

/// A campaign makes the node a `LeaderLatch` makes, holding the value as the participant id,
/// and a proclaimed value replaces it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_campaign_is_a_latch_participant() {
    let ns = test_namespace!();
    let zk = raw(&connect()).await;
    let path = format!("/{ns}/leader");
    let c = client(&ns).await;
    let leading = c.election("leader").campaign("rust-1").await.unwrap();
    let kids = latch_nodes(&zk, &path).await;
    assert_eq!(kids.len(), 1, "{kids:?}");
    assert_latch_name(&kids[0]);
    let node = format!("{path}/{}", kids[0]);
    let (data, stat) = zk.get_data(&node).await.unwrap();
    assert_eq!(data, b"rust-1");
    assert!(stat.ephemeral_owner != 0, "not ephemeral");
    // The term is the node's czxid.
    assert_eq!(leading.term(), u64::try_from(stat.czxid).unwrap());
    leading.proclaim("rust-1, ready").await.unwrap();
    assert_eq!(zk.get_data(&node).await.unwrap().0, b"rust-1, ready");
    leading.resign().await.unwrap();
    c.shutdown().await;
    assert_no_znodes(&zk, &ns).await;
}

/// Turns taken both ways, each side first in turn: whoever leads, the other waits for it
/// and leads once it steps down, and each reads the other's id as the leader's (distlock's
/// `leader()` the Java participant's, Curator's `getLeader().getId()` ours). Terms increase.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_latch_and_a_campaign_take_turns_both_ways() {
    let ns = test_namespace!();
    let connect = connect();
    let path = format!("/{ns}/leader");
    let zk = raw(&connect).await;
    let c = client(&ns).await;
    let election = c.election("leader");
    let mut java = blocking(|| Curator::start_latch(&connect, &path, "java"));
    let mut terms = Vec::new();
    for turn in 0..3 {
        let me = format!("rust-{turn}");

        // Java first: it leads, Rust waits behind it and reads its id.
        assert_eq!(blocking(|| java.ask("start")), "STARTED");
        assert_eq!(blocking(|| java.ask("await 5000")), "LEADER");
        let leader = election.leader().await.unwrap().expect("nobody leads");
        assert_eq!(leader.value_str(), Some("java"));
        terms.push(leader.term());
        let waiting = tokio::spawn({
            let (e, me) = (election.clone(), me.clone());
            async move { e.campaign(me).await }
        });
        until_contenders(&zk, &path, 2).await;
        for name in latch_nodes(&zk, &path).await {
            assert_latch_name(&name);
        }
        sleep(Duration::from_millis(200)).await;
        assert!(!waiting.is_finished(), "Rust led while Java's latch did");
        assert_eq!(blocking(|| java.ask("leader")), "LEADER java");
        assert_eq!(blocking(|| java.ask("close")), "CLOSED");
        let leading = timeout(Duration::from_secs(5), waiting)
            .await
            .expect("Rust did not lead once Java's latch closed")
            .unwrap()
            .unwrap();
        terms.push(leading.term());

        // Rust first: Java's latch waits behind it and reads our id, the proclaimed one too.
        // (Proclaimed before Java queues: Curator 5's `LeaderLatch` right behind a node whose
        // data changes stops watching it; see `src/backend/zookeeper/election.rs`.)
        assert_eq!(blocking(|| java.ask("leader")), format!("LEADER {me}"));
        leading.proclaim(format!("{me}, proclaimed")).await.unwrap();
        assert_eq!(blocking(|| java.ask("start")), "STARTED");
        until_contenders(&zk, &path, 2).await;
        assert_eq!(blocking(|| java.ask("await 300")), "FOLLOWER");
        assert_eq!(blocking(|| java.ask("leading")), "NO");
        assert_eq!(
            blocking(|| java.ask("leader")),
            format!("LEADER {me}, proclaimed")
        );
        leading.resign().await.unwrap();
        assert_eq!(
            blocking(|| java.ask("await 5000")),
            "LEADER",
            "Java did not lead once Rust resigned"
        );
        let leader = election.leader().await.unwrap().expect("nobody leads");
        assert_eq!(leader.value_str(), Some("java"));
        terms.push(leader.term());
        // And now Rust is the one kept out.
        let err = election.try_campaign(&me).await.unwrap_err();
        assert!(err.is_would_block(), "{err}");
        assert_eq!(blocking(|| java.ask("close")), "CLOSED");
        assert!(election.leader().await.unwrap().is_none());
        assert_eq!(blocking(|| java.ask("leader")), "NONE");
    }
    assert!(
        terms.windows(2).all(|w| w[0] < w[1]),
        "terms out of order: {terms:?}"
    );
    assert_eq!(blocking(|| java.ask("quit")), "BYE");
    c.shutdown().await;
    assert_no_znodes(&zk, &ns).await;
}

/// Java's `LeaderLatch` and two Rust candidates campaign on one path in loops at once: no
/// Java turn overlaps a Rust one (both stamped on the wall clock of this machine), and the
/// Rust terms increase.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_latch_and_campaigns_never_both_lead() {
    const TURNS: usize = 25;
    let ns = test_namespace!();
    let connect = connect();
    let path = format!("/{ns}/leader");
    let mut java = blocking(|| Curator::start_latch(&connect, &path, "java"));
    let clients = [client(&ns).await, client(&ns).await];
    blocking(|| java.send(&format!("cycle {TURNS} 2")));
    let mut tasks = Vec::new();
    for (i, c) in clients.into_iter().enumerate() {
        tasks.push(tokio::spawn(async move {
            let election = c.election("leader");
            let mut held = Vec::new();
            for turn in 0..TURNS {
                let leading = election.campaign(format!("rust-{i}-{turn}")).await.unwrap();
                let from = micros();
                if turn % 2 == 0 {
                    sleep(Duration::from_millis(2)).await;
                }
                assert!(!leading.is_lost());
                let to = micros();
                held.push((from, to, leading.term()));
                leading.resign().await.unwrap();
            }
            c.shutdown().await;
            held
        }));
    }
    let mut rust = Vec::new();
    for t in tasks {
        let held = timeout(Duration::from_secs(120), t).await.unwrap().unwrap();
        assert!(
            held.windows(2).all(|w| w[0].2 < w[1].2),
            "terms out of order: {held:?}"
        );
        rust.extend(held.into_iter().map(|(from, to, _)| (from, to)));
    }
    let mut java_turns = Vec::new();
    loop {
        let line = blocking(|| java.reply(Duration::from_secs(60)))
            .expect("the Java latch stopped taking turns");
        if line == "DONE" {
            break;
        }
        let mut parts = line.split(' ');
        assert_eq!(parts.next(), Some("HELD"), "{line}");
        let mut stamp = || parts.next().and_then(|v| v.parse::<u128>().ok()).unwrap();
        java_turns.push((stamp(), stamp()));
    }
    assert_eq!(java_turns.len(), TURNS);
    rust.sort_unstable();
    for (jf, jt) in &java_turns {
        for (rf, rt) in &rust {
            assert!(
                jt < rf || rt < jf,
                "Java led {jf}..{jt} while Rust led {rf}..{rt}"
            );
        }
    }
    // Both sides led while the other campaigned: the turns interleave.
    let (first_java, last_java) = (java_turns[0].0, java_turns[TURNS - 1].1);
    assert!(
        rust.iter().any(|(f, _)| *f > first_java && *f < last_java),
        "no Rust turn between Java's first and last"
    );
    assert_eq!(blocking(|| java.ask("quit")), "BYE");
    // Every participant's node is gone (the latch path itself is a container the server
    // reaps when Curator made it last).
    assert!(children(&raw(&connect).await, &path).await.is_empty());
}

/// A distlock candidate right behind a leader that proclaims (the leader's node data changes
/// under its watch) is still served when the leader resigns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proclaim_does_not_strand_a_campaign_right_behind() {
    let ns = test_namespace!();
    let zk = raw(&connect()).await;
    let (a, b) = (client(&ns).await, client(&ns).await);
    let leading = a.election("leader").campaign("a").await.unwrap();
    let waiting = tokio::spawn({
        let e = b.election("leader");
        async move { e.campaign("b").await }
    });
    until_contenders(&zk, &format!("/{ns}/leader"), 2).await;
    for i in 0..5 {
        leading.proclaim(format!("a, step {i}")).await.unwrap();
    }
    sleep(Duration::from_millis(100)).await;
    assert!(!waiting.is_finished(), "b led beside a");
    let first = leading.term();
    leading.resign().await.unwrap();
    let next = timeout(Duration::from_secs(5), waiting)
        .await
        .expect("b was not served after a proclaimed and resigned")
        .unwrap()
        .unwrap();
    assert!(next.term() > first);
    next.resign().await.unwrap();
    a.shutdown().await;
    b.shutdown().await;
    assert_no_znodes(&zk, &ns).await;
}

/// Observers end when their client shuts down, whether they were waiting at the time or made
/// afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observers_end_when_their_client_shuts_down() {
    let ns = test_namespace!();
    let watcher = client(&ns).await;
    let election = watcher.election("e");
    let mut changes = Box::pin(election.observe());
    assert!(changes.next().await.unwrap().unwrap().is_none());
    let waiting =
        tokio::spawn(async move { changes.next().await.map(|r| r.map_err(|e| e.kind())) });
    sleep(Duration::from_millis(200)).await;
    watcher.shutdown().await;
    let ended = timeout(Duration::from_secs(3), waiting)
        .await
        .expect("an observer waiting at shutdown did not end")
        .unwrap();
    assert!(ended.is_none(), "{ended:?}");
    let mut after = Box::pin(election.observe());
    let item = timeout(Duration::from_secs(3), after.next())
        .await
        .expect("an observer made after shutdown hung");
    assert!(item.is_none() || item.unwrap().is_err());
}

/// A leader removed by an operator cannot proclaim any more, and its value never shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proclaim_after_the_loss_is_refused() {
    let ns = test_namespace!();
    let (a, op) = (client(&ns).await, client(&ns).await);
    let leading = a.election("e").campaign("a").await.unwrap();
    op.force_release("e").await.unwrap();
    let b = op.election("e").campaign("b").await.unwrap();
    let err = leading.proclaim("a is back").await.unwrap_err();
    assert_eq!(err.kind(), distlock::ErrorKind::Lost, "{err}");
    timeout(Duration::from_secs(3), leading.lost())
        .await
        .expect("the removed leader was never told");
    let now = op.election("e").leader().await.unwrap().unwrap();
    assert_eq!((now.term(), now.value_str()), (b.term(), Some("b")));
    b.resign().await.unwrap();
    drop(leading);
    a.shutdown().await;
    op.shutdown().await;
}

/// Values as large as a znode holds are campaigned with, read, observed and proclaimed over; a
/// larger one is refused before it reaches the server, and the leadership is unharmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_values() {
    let ns = test_namespace!();
    let a = client(&ns).await;
    let leading = crate::support::election::a_large_value_round_trips(&a, 900 << 10).await;
    // Over what a znode holds: refused at once, not sent (a server drops the connection of a
    // request over its `jute.maxbuffer`, and each retry would cost the session a reconnect).
    crate::support::election::a_too_large_value_is_refused_before_io(&a, &leading, 2 << 20).await;
    let still = a.election("big").leader().await.unwrap().unwrap();
    assert_eq!(still.value(), b"small");
    assert!(!leading.is_lost(), "a refused value cost the leadership");
    leading.resign().await.unwrap();
    a.shutdown().await;
}
