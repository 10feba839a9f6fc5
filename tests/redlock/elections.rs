//! Elections on Redlock under faults, on real `redis-server` nodes: the checks every
//! election backend shares (`crate::support::election`: a crashed leader replaced within its lease, an
//! observer cut off catching up, a dead candidate never reported), with every node of the
//! faulty client behind its own proxy; and nodes down: with one of three down elections work,
//! with two down campaigns and reads refuse, and no minority's leader is ever reported.
#![cfg(feature = "redlock")]

use std::time::Duration;

use crate::support::server::redlock::{service, Nodes};
use distlock::LockClient;
use futures::StreamExt;
use tokio::time::{sleep, timeout, Instant};

/// The most a call may take when some nodes do not answer: the node timeout (300 ms in the
/// test clients) and some scheduling slack.
const BOUND: Duration = Duration::from_secs(2);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_cut_off_catches_up() {
    crate::support::election::an_observer_cut_off_catches_up(&service(), &test_namespace!()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_leader_is_replaced_within_its_lease() {
    crate::support::election::a_crashed_leader_is_replaced_within_its_lease(
        &service(),
        &test_namespace!(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_candidate_is_never_reported_as_leader() {
    crate::support::election::a_dead_candidate_is_never_reported_as_leader(
        &service(),
        &test_namespace!(),
    )
    .await;
}

/// A value as large as a node holds (1 MiB) round-trips; a larger one is refused before I/O.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_values() {
    let ns = test_namespace!();
    let a = crate::support::server::redlock::shared_nodes()
        .client(&ns)
        .await;
    let leading = crate::support::election::a_large_value_round_trips(&a, 1 << 20).await;
    crate::support::election::a_too_large_value_is_refused_before_io(&a, &leading, (1 << 20) + 1)
        .await;
    leading.resign().await.unwrap();
    assert!(a.election("big").leader().await.unwrap().is_none());
    a.shutdown().await;
}

/// `client` reads `value` leading the election `e` under `term`.
async fn reads_leader(client: &LockClient, term: u64, value: &str) {
    let seen = client
        .election("e")
        .leader()
        .await
        .unwrap()
        .expect("nobody leads");
    assert_eq!((seen.term(), seen.value_str()), (term, Some(value)));
}

/// One node of three down: a campaign leads, `leader()` and an observer see it and its
/// proclaim, a waiting candidate takes over on resignation with a higher term, and renewal
/// keeps it leading. Then a second node down: the leader loses, `leader()` and campaigns
/// refuse in bounded time (never a leader read off one node), and once the nodes are back a
/// campaign leads again with a higher term.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_node_of_three_down_elects_two_down_refuse() {
    let ns = test_namespace!();
    let nodes = Nodes::start(3);
    let ttl = Duration::from_millis(900);
    let a = nodes.client_with(&ns, ttl, Duration::ZERO).await;
    let b = nodes.client_with(&ns, ttl, Duration::ZERO).await;
    nodes.proxies[0].cut();

    let mut changes = Box::pin(b.election("e").observe());
    let first = timeout(BOUND, changes.next()).await.expect("observe hung");
    assert!(first.unwrap().unwrap().is_none());
    let leading = timeout(BOUND, a.election("e").campaign("a"))
        .await
        .expect("a campaign with one node down hung")
        .unwrap();
    reads_leader(&b, leading.term(), "a").await;
    let heard = timeout(BOUND, changes.next())
        .await
        .expect("the observer missed a");
    assert_eq!(heard.unwrap().unwrap().unwrap().value_str(), Some("a"));
    leading.proclaim("a, later").await.unwrap();
    let heard = timeout(BOUND, changes.next())
        .await
        .expect("the observer missed the proclaim");
    assert_eq!(
        heard.unwrap().unwrap().unwrap().value_str(),
        Some("a, later")
    );

    let election = b.election("e");
    let waiting = tokio::spawn(async move { election.campaign("b").await });
    nodes.until_queued(&ns, "e", 1).await;
    let first_term = leading.term();
    leading.resign().await.unwrap();
    let b_leads = timeout(BOUND, waiting)
        .await
        .expect("the candidate never led")
        .unwrap()
        .unwrap();
    assert!(b_leads.term() > first_term);
    // Several leases with one node down: still leading.
    sleep(ttl * 3).await;
    assert!(!b_leads.is_lost());
    reads_leader(&a, b_leads.term(), "b").await;

    // Two of three down: b's renewals find no quorum; nobody is reported from one node.
    nodes.proxies[1].cut();
    timeout(ttl * 3, b_leads.lost())
        .await
        .expect("a leader without a quorum was never told");
    for _ in 0..5 {
        let started = Instant::now();
        let err = a.election("e").leader().await.unwrap_err();
        assert!(err.to_string().contains("quorum"), "{err}");
        assert!(err.is_transient(), "{err}");
        let err = a.election("e").try_campaign("a").await.unwrap_err();
        assert!(err.to_string().contains("quorum"), "{err}");
        let err = a.election("e").campaign("a").await.unwrap_err();
        assert!(err.to_string().contains("quorum"), "{err}");
        assert!(
            started.elapsed() < BOUND * 2,
            "took {:?}",
            started.elapsed()
        );
        sleep(Duration::from_millis(100)).await;
    }
    let last_term = b_leads.term();
    drop(b_leads);

    for p in &nodes.proxies {
        p.pass();
    }
    let again = timeout(BOUND * 5, a.election("e").campaign("a, again"))
        .await
        .expect("no leader once the nodes are back")
        .unwrap();
    assert!(again.term() > last_term);
    reads_leader(&b, again.term(), "a, again").await;
    again.resign().await.unwrap();
    drop(changes);
    a.shutdown().await;
    b.shutdown().await;
}

/// A free election key while a candidate waits on every node (its leader's lease ran out, the
/// candidate, cut off, has not asked again): a mutex `lock()` there is refused as a kind
/// mismatch, and the candidate, back, leads; it is never handed a mutex's hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mutex_does_not_take_a_free_election_with_a_candidate_waiting() {
    use crate::support::proxy::Proxies;
    let ns = test_namespace!();
    let nodes = crate::support::server::redlock::shared_nodes();
    let direct: Vec<u16> = nodes
        .direct_urls()
        .iter()
        .map(|u| {
            u.trim_end_matches('/')
                .rsplit(':')
                .next()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    let urls = |p: &Proxies| -> Vec<String> {
        p.ports()
            .iter()
            .map(|port| format!("redis://127.0.0.1:{port}/"))
            .collect()
    };
    let (leader_net, candidate_net) = (Proxies::start(&direct), Proxies::start(&direct));
    let client_on = crate::support::server::redlock::client_on;
    let leader = client_on(
        urls(&leader_net),
        &ns,
        Duration::from_secs(1),
        Duration::ZERO,
    )
    .await;
    let candidate = client_on(
        urls(&candidate_net),
        &ns,
        Duration::from_secs(20),
        Duration::ZERO,
    )
    .await;
    let other = client_on(
        nodes.direct_urls(),
        &ns,
        Duration::from_secs(5),
        Duration::ZERO,
    )
    .await;
    let leading = leader.election("e").campaign("a").await.unwrap();
    let election = candidate.election("e");
    let waiting = tokio::spawn(async move { election.campaign("b").await });
    nodes.until_queued(&ns, "e", 1).await;
    leader_net.blackhole();
    candidate_net.blackhole();
    // The leader's lease (1 s) runs out; the key is free with the candidate in line.
    sleep(Duration::from_millis(1500)).await;
    let got = timeout(Duration::from_secs(5), other.mutex("e").lock()).await;
    candidate_net.heal();
    match got {
        Ok(Ok(_)) => panic!("a mutex was granted on an election's key while a candidate waited"),
        Ok(Err(e)) => assert_eq!(e.kind(), distlock::ErrorKind::KindMismatch, "{e}"),
        Err(_) => panic!("the mutex lock() was neither refused nor granted in 5 s"),
    }
    let b = timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the candidate's campaign never ended")
        .unwrap()
        .expect("the candidate's campaign failed");
    assert!(b.term() > leading.term());
    reads_leader(&other, b.term(), "b").await;
    drop(b);
    drop(leading);
    for c in [leader, candidate, other] {
        c.shutdown().await;
    }
}

/// Nodes sitting out their rejoin delay (just started) with a candidate queued: a mutex asked
/// for on the election's key is refused, and no node hands the key to the candidate for it
/// before its delay is over (a node that forgot its grants must not vote, whoever asks).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_mutex_ask_hands_nothing_on_during_the_rejoin_delay() {
    let ns = test_namespace!();
    let nodes = Nodes::start(3);
    let started = Instant::now();
    let rejoin = Duration::from_secs(4);
    let ttl = Duration::from_secs(2);
    let a = nodes.client_with(&ns, ttl, rejoin).await;
    let b = nodes.client_with(&ns, ttl, rejoin).await;
    let election = a.election("e");
    let campaign = tokio::spawn(async move { election.campaign("a").await.map(|l| l.term()) });
    nodes.until_queued(&ns, "e", 1).await;
    let mutex = b.mutex("e").try_lock().await;
    assert!(
        mutex.as_ref().is_err_and(distlock::Error::is_kind_mismatch),
        "a mutex on an election's key: {:?}",
        mutex.map(|g| g.fencing_token())
    );
    sleep(Duration::from_millis(300)).await;
    assert!(
        !campaign.is_finished(),
        "the candidate led {:?} after the nodes started, inside their {rejoin:?} rejoin delay",
        started.elapsed()
    );
    let term = timeout(rejoin * 3, campaign)
        .await
        .expect("the candidate never led")
        .unwrap()
        .unwrap();
    assert!(
        started.elapsed() >= Duration::from_secs(3),
        "led at {:?}",
        started.elapsed()
    );
    assert!(term > 0);
    a.shutdown().await;
    b.shutdown().await;
}
