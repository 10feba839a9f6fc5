//! Attacks on Redlock elections, on real `redis-server` nodes behind
//! fault proxies, with nodes killed, restarted without their data or cut off: cancelled
//! campaigns leaving nothing behind, observers that must not poll while a node is down and
//! must follow a restarted one, never two leaders after a restart, a candidate dead in line,
//! and `lead()` cut off from a majority. What a leader is read as:
//! `tests/redlock/election_faults.rs`.
#![cfg(feature = "redlock")]

use std::time::Duration;

use crate::support::observed::{led_within, observer, until, until_value, value_of};
use crate::support::redis::{commands, commands_since, total_commands_on};
use crate::support::server::redlock::{shared_nodes, Nodes};
use crate::support::shut_down;
use tokio::time::{sleep, timeout, Instant};

/// Candidates cancelled while waiting in line (dropped campaign futures), under a leader that
/// then resigns: nothing of theirs is left on any node once the TTLs ran out (SCAN every
/// node), and a later campaign leads at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_campaigns_leave_nothing_on_any_node() {
    let ns = test_namespace!();
    let nodes = shared_nodes();
    let ttl = Duration::from_secs(1);
    let [a, b] = nodes.clients(&ns, ttl).await;
    let leading = a.election("e").campaign("a").await.unwrap();
    for round in 0..6 {
        let waiting = nodes.in_line(&b, &ns, "e", format!("b{round}"), 1).await;
        // Cancelled at various points of its wait.
        sleep(Duration::from_millis(37 * round)).await;
        waiting.abort();
        let _ = waiting.await;
    }
    leading.resign().await.unwrap();
    let started = Instant::now();
    let next = timeout(Duration::from_secs(1), b.election("e").campaign("c"))
        .await
        .expect("a campaign after cancelled ones was held up")
        .unwrap();
    println!("led {:?} after the resignation", started.elapsed());
    next.resign().await.unwrap();
    sleep(ttl * 2).await;
    let left = nodes.leftovers(&ns).await;
    assert!(left.is_empty(), "left behind: {left:?}");
    shut_down([a, b]).await;
}

/// One node of three killed for good under a leader renewing and an observer: the observer
/// still hears a new leader, and the live nodes run no more than the renewals need (it does
/// not poll or spin on the dead node's behalf).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_does_not_spin_with_a_node_dead_for_good() {
    let ns = test_namespace!();
    let mut nodes = Nodes::start(3);
    let ttl = Duration::from_secs(3);
    let [a, watcher] = nodes.clients(&ns, ttl).await;
    let (mut rx, task) = observer(&watcher, "e");
    until(&mut rx, Duration::from_secs(3), "nobody", Option::is_none).await;
    nodes.servers[2].kill();
    sleep(Duration::from_millis(500)).await;
    let live: Vec<String> = nodes.direct_urls()[..2].to_vec();
    let count = || total_commands_on(&live);
    let before = count().await;
    sleep(Duration::from_secs(3)).await;
    let quiet = count().await - before;
    println!("commands on the two live nodes in 3 s, nobody leading, one observer: {quiet}");
    let leading = timeout(Duration::from_secs(2), a.election("e").campaign("a"))
        .await
        .expect("no campaign with one node of three dead")
        .unwrap();
    until_value(&mut rx, "a").await;
    sleep(Duration::from_millis(500)).await;
    let before = count().await;
    sleep(Duration::from_secs(3)).await;
    let leading_cost = count().await - before;
    println!(
        "commands on the two live nodes in 3 s, a leader renewing, one observer: {leading_cost}"
    );
    leading.resign().await.unwrap();
    until(&mut rx, Duration::from_secs(3), "nobody", Option::is_none).await;
    task.abort();
    shut_down([a, watcher]).await;
    assert!(quiet < 30, "the observer polled: {quiet} commands in 3 s");
    assert!(leading_cost < 60, "{leading_cost} commands in 3 s");
}

/// Three nodes with a rejoin delay as long as the TTL. A leads on nodes 0 and 1 (2 was cut off
/// when it campaigned); node 1 restarts without its data. B campaigns: node 2 is free, node 1
/// forgot A. Never two leaders believing at once: B may lead only after A's guard says lost,
/// and with a higher term.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_without_data_never_makes_two_leaders() {
    let ns = test_namespace!();
    let mut nodes = Nodes::start(3);
    let ttl = Duration::from_secs(2);
    let a = nodes.client_with(&ns, ttl, ttl).await;
    let b = nodes.client_with(&ns, ttl, ttl).await;
    // Fresh nodes sit out their rejoin delay first.
    sleep(ttl + Duration::from_millis(200)).await;
    nodes.proxies[2].cut();
    let leading = timeout(Duration::from_secs(5), a.election("e").campaign("a"))
        .await
        .expect("no lead on two nodes of three")
        .unwrap();
    nodes.proxies[2].pass();
    nodes.servers[1].restart_after(|| std::thread::sleep(Duration::from_millis(100)));
    let restarted = Instant::now();
    let election = b.election("e");
    let waiting = tokio::spawn(async move {
        let led = election.campaign("b").await;
        (Instant::now(), led)
    });
    let mut believed = Instant::now();
    while !waiting.is_finished() {
        if !leading.is_lost() {
            believed = Instant::now();
        }
        if restarted.elapsed() > Duration::from_secs(15) {
            panic!("B never led");
        }
        sleep(Duration::from_millis(2)).await;
    }
    let (led_at, led) = waiting.await.unwrap();
    let next = led.unwrap();
    println!(
        "A believed until {:?} after the restart, B led at {:?}; terms {} then {}",
        believed - restarted,
        led_at - restarted,
        leading.term(),
        next.term()
    );
    assert!(leading.is_lost());
    assert!(
        believed < led_at,
        "A believed it led {:?} after B led",
        believed - led_at
    );
    assert!(next.term() > leading.term());
    assert_eq!(
        value_of(&b.election("e").leader().await.unwrap()),
        Some("b")
    );
    next.resign().await.unwrap();
    drop(leading);
    shut_down([a, b]).await;
}

/// One node of three restarted without its data under a leader and an observer: the leader
/// still leads on the other two and is still reported; its resignation and the next leader
/// (who may lead on the restarted node) are heard; the observer does not poll meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_follows_a_node_restarted_without_data() {
    let ns = test_namespace!();
    let mut nodes = Nodes::start(3);
    let ttl = Duration::from_secs(3);
    let [a, b, watcher] = nodes.clients(&ns, ttl).await;
    let (mut rx, task) = observer(&watcher, "e");
    until(&mut rx, Duration::from_secs(3), "nobody", Option::is_none).await;
    let leading = a.election("e").campaign("a").await.unwrap();
    until_value(&mut rx, "a").await;
    nodes.servers[1].restart_after(|| std::thread::sleep(Duration::from_millis(300)));
    sleep(Duration::from_secs(1)).await;
    assert!(!leading.is_lost());
    let seen = b.election("e").leader().await.unwrap();
    assert_eq!(
        seen.as_ref().map(|l| (l.term(), l.value_str())),
        Some((leading.term(), Some("a")))
    );
    let live = nodes.direct_urls();
    let count = || total_commands_on(&live);
    let before = count().await;
    sleep(Duration::from_secs(3)).await;
    let spent = count().await - before;
    println!("commands on the three nodes in 3 s, a leader renewing, one observer: {spent}");
    nodes.proxies[0].cut();
    let first_term = leading.term();
    leading.resign().await.unwrap();
    let resigned = Instant::now();
    until(&mut rx, Duration::from_secs(3), "nobody", Option::is_none).await;
    println!("heard the resignation after {:?}", resigned.elapsed());
    let next = timeout(Duration::from_secs(3), b.election("e").campaign("b"))
        .await
        .expect("no leader on the restarted node and another")
        .unwrap();
    let (at, _) = until_value(&mut rx, "b").await;
    println!("heard b {:?} after the resignation", at - resigned);
    assert!(next.term() > first_term);
    assert!(spent < 120, "{spent} commands in 3 s");
    next.resign().await.unwrap();
    task.abort();
    shut_down([a, b, watcher]).await;
}

/// A candidate that dies in line (its host silent) is handed the lead provisionally on every
/// node when the leader resigns: `leader()` reports nobody, and `inspect` says what it shows
/// for that hold (printed); within the handoff lease plus margin the next candidate leads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_candidate_dead_in_line_under_inspect() {
    let ns = test_namespace!();
    let nodes = Nodes::start(3);
    let (dead_net, dead_urls) = nodes.own_network();
    let ttl = Duration::from_secs(5);
    let client_on = crate::support::server::redlock::client_on;
    let a = client_on(nodes.direct_urls(), &ns, ttl, Duration::ZERO).await;
    let dead = client_on(dead_urls, &ns, ttl, Duration::ZERO).await;
    let c = client_on(nodes.direct_urls(), &ns, ttl, Duration::ZERO).await;
    let leading = a.election("e").campaign("a").await.unwrap();
    let _dead_waiting = nodes.in_line(&dead, &ns, "e", "dead", 1).await;
    let waiting = nodes.in_line(&c, &ns, "e", "c", 2).await;
    for p in &dead_net {
        p.blackhole();
    }
    leading.resign().await.unwrap();
    let resigned = Instant::now();
    let seen = a.election("e").leader().await.unwrap();
    let inspected = a.inspect("e").await.unwrap();
    println!("handed to the dead candidate: leader() = {seen:?}\ninspect = {inspected:?}");
    assert!(seen.is_none(), "a provisional lead reported: {seen:?}");
    let next = led_within(
        waiting,
        Duration::from_secs(3),
        "the live candidate never led",
    )
    .await;
    println!(
        "the live candidate led {:?} after the resignation",
        resigned.elapsed()
    );
    // One handoff lease (500 ms), not the dead candidate's TTL (5 s): the bound leaves the
    // two quorum reads above and the grant on three nodes 1.5 s on a loaded machine.
    assert!(
        resigned.elapsed() < Duration::from_millis(500 + 1500),
        "led {:?} after the resignation",
        resigned.elapsed()
    );
    assert_eq!(
        value_of(&a.election("e").leader().await.unwrap()),
        Some("c")
    );
    next.resign().await.unwrap();
    shut_down([a, c]).await;
    drop(dead_net);
    drop(dead);
}

/// Sets the instant it is dropped at (a cancelled or finished piece of work).
struct Ended(std::sync::Arc<std::sync::Mutex<Option<Instant>>>);

impl Drop for Ended {
    fn drop(&mut self) {
        *self.0.lock().unwrap() = Some(Instant::now());
    }
}

/// `lead()` on a client cut off from two nodes of three (blackholed: no closed connection
/// tells it): its work is cancelled before another client leads, that client's term is
/// higher, and meanwhile `lead()` does not hot-loop on the one node it still reaches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lead_stops_its_work_before_another_leads_and_does_not_hot_loop() {
    let ns = test_namespace!();
    let nodes = Nodes::start(3);
    let ttl = Duration::from_secs(1);
    let a = nodes.client_with(&ns, ttl, Duration::ZERO).await;
    let b =
        crate::support::server::redlock::client_on(nodes.direct_urls(), &ns, ttl, Duration::ZERO)
            .await;
    let ended = std::sync::Arc::new(std::sync::Mutex::new(None));
    let (started_tx, mut started) = tokio::sync::mpsc::unbounded_channel();
    let election = a.election("e");
    let worker = {
        let ended = ended.clone();
        tokio::spawn(async move {
            election
                .lead("a", move |term| {
                    let guard = Ended(ended.clone());
                    let started_tx = started_tx.clone();
                    async move {
                        let _guard = guard;
                        let _ = started_tx.send((term, Instant::now()));
                        std::future::pending::<()>().await;
                    }
                })
                .await
        })
    };
    let (a_term, _) = timeout(Duration::from_secs(3), started.recv())
        .await
        .expect("lead() never ran its work")
        .unwrap();
    nodes.proxies[0].blackhole();
    nodes.proxies[1].blackhole();
    let b_leads = timeout(ttl * 5, b.election("e").campaign("b"))
        .await
        .expect("B never led")
        .unwrap();
    let b_at = Instant::now();
    let a_ended = ended
        .lock()
        .unwrap()
        .expect("A's work still ran when B led");
    println!(
        "A's work (term {a_term}) ended {:?} before B led (term {})",
        b_at - a_ended,
        b_leads.term()
    );
    assert!(b_leads.term() > a_term);
    sleep(Duration::from_millis(500)).await;
    let live = &nodes.direct_urls()[2];
    let by_name = || commands(live);
    let before = by_name().await;
    sleep(Duration::from_secs(3)).await;
    let after = by_name().await;
    let spent: u64 =
        after.iter().map(|(_, n)| n).sum::<u64>() - before.iter().map(|(_, n)| n).sum::<u64>();
    let diff = commands_since(&before, &after);
    println!("by command: {diff:?}");
    // INFO commandstats counts what scripts run too: judge by the scripts called.
    let calls: u64 = diff
        .iter()
        .filter(|(name, _)| name == "fcall" || name == "evalsha")
        .map(|(_, n)| n)
        .sum();
    println!(
        "on the node A still reaches in 3 s, A's lead() cut off from a majority, B renewing: \
         {spent} commands, {calls} script calls"
    );
    assert!(
        started.try_recv().is_err(),
        "A's work ran again while B led"
    );
    assert!(calls < 40, "lead() hot-loops: {calls} script calls in 3 s");
    worker.abort();
    b_leads.resign().await.unwrap();
    for p in &nodes.proxies {
        p.heal();
    }
    shut_down([a, b]).await;
}
