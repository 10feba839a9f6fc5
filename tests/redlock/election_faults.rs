//! Attacks on Redlock elections, on real `redis-server` nodes behind
//! fault proxies, on what a leader is read as: a proclaim that reached a majority read back
//! through another majority, an undecided read and what it says, a lead left provisional on
//! one node, an operator's unlock of a Redlock election (library and CLI), empty values and
//! odd keys, a mutex and an election on one key. Nodes killed, restarted or cut off under
//! leaders, candidates and observers: `tests/redlock/election_outages.rs`.
#![cfg(feature = "redlock")]

use std::time::Duration;

use crate::support::observed::led_within;
use crate::support::redis::connection;
use crate::support::server::redlock::{shared_nodes, Nodes};
use crate::support::shut_down;
use distlock::{ErrorKind, Leader};
use tokio::time::{sleep, timeout, Instant};

/// Five nodes, a leader with a long lease. Its `proclaim("new")` reaches nodes 0, 1, 2 (a
/// majority: it returns `Ok`) while 3 and 4 are cut off and keep "old". Then 0 and 1 go away
/// and 3, 4 come back: every majority of nodes shares a node with the proclaim's, so a reader
/// must report "new" (the leader was told its proclaim took), or that it cannot tell, never
/// "old". Reported before the fix: the value most of the answering nodes hold, "old": a
/// successful proclaim read back as undone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proclaim_on_a_majority_is_read_back_through_any_majority() {
    let ns = test_namespace!();
    let nodes = Nodes::start(5);
    let ttl = Duration::from_secs(30);
    let [leader, reader] = nodes.clients(&ns, ttl).await;
    let leading = leader.election("e").campaign("old").await.unwrap();
    nodes.proxies[3].cut();
    nodes.proxies[4].cut();
    leading
        .proclaim("new")
        .await
        .expect("a proclaim on three nodes of five");
    let all = reader.election("e").leader().await;
    println!("nodes 3, 4 cut: leader() = {all:?}");
    nodes.proxies[3].pass();
    nodes.proxies[4].pass();
    nodes.proxies[0].cut();
    nodes.proxies[1].cut();
    // The reader reconnects to 3 and 4 on its own back-off. For 3 s every read says "new" or
    // that it cannot tell (transient); never "old".
    let until = Instant::now() + Duration::from_secs(3);
    let (mut new, mut unsure) = (0, 0);
    while Instant::now() < until {
        match reader.election("e").leader().await {
            Ok(seen) => {
                let seen = seen.expect("nobody leads");
                assert_eq!(seen.term(), leading.term());
                assert_eq!(
                    seen.value_str(),
                    Some("new"),
                    "a proclaim that returned Ok was read back as undone"
                );
                new += 1;
            }
            Err(e) => {
                assert!(e.is_transient(), "leader(): {e}");
                unsure += 1;
            }
        }
        sleep(Duration::from_millis(100)).await;
    }
    println!("nodes 0, 1 cut: {new} reads said \"new\", {unsure} could not tell");
    assert!(!leading.is_lost());
    for p in &nodes.proxies {
        p.pass();
    }
    // Every node back: the read decides, and says "new".
    let deadline = Instant::now() + Duration::from_secs(10);
    let seen = loop {
        match reader.election("e").leader().await {
            Ok(seen) => break seen.expect("nobody leads"),
            Err(e) if Instant::now() < deadline => {
                println!("leader() (going on): {e}");
                sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("no read within 10 s of every node back: {e}"),
        }
    };
    assert_eq!(seen.value_str(), Some("new"));
    leading.resign().await.unwrap();
    shut_down([leader, reader]).await;
}

/// The operator's unlock of a Redlock election, by `LockClient::force_release` and by the CLI
/// (`distlock inspect` / `unlock --force` on a `redlock://` URL): the leader is dropped, the
/// candidate in line leads with a higher term within bounded time, observers hear of it, the
/// old leader's guard turns lost and its proclaim is refused.
// The `distlock` binary is built with the `cli` feature only.
#[cfg(feature = "cli")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_of_a_redlock_election() {
    use crate::support::observed::{observer, until_value, value_of};
    let ns = test_namespace!();
    let nodes = shared_nodes();
    let ttl = Duration::from_secs(3);
    let [a, b, op] = nodes.clients(&ns, ttl).await;
    let (mut rx, task) = observer(&op, "e");
    let leading = a.election("e").campaign("a").await.unwrap();
    until_value(&mut rx, "a").await;
    let waiting = nodes.in_line(&b, &ns, "e", "b", 1).await;
    println!("inspect before: {:?}", op.inspect("e").await.unwrap());
    let hosts: Vec<String> = nodes
        .urls()
        .iter()
        .map(|u| {
            u.trim_start_matches("redis://")
                .trim_end_matches('/')
                .to_owned()
        })
        .collect();
    let url = format!("redlock://{}", hosts.join(","));
    let cli = |args: &[&str]| crate::support::cli::distlock(&url, &ns, args);
    cli(&["inspect", "e"]);
    let released = op.force_release("e").await.unwrap();
    println!("force_release: {released:?}");
    let next = led_within(
        waiting,
        Duration::from_secs(3),
        "the candidate in line never led after force_release",
    )
    .await;
    assert!(next.term() > leading.term());
    until_value(&mut rx, "b").await;
    timeout(ttl * 2, leading.lost())
        .await
        .expect("the unlocked leader never learnt it");
    let err = leading.proclaim("a, again").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
    assert_eq!(
        value_of(&op.election("e").leader().await.unwrap()),
        Some("b")
    );

    // Again through the CLI, with a third candidate in line.
    let waiting = nodes.in_line(&a, &ns, "e", "c", 1).await;
    cli(&["inspect", "e"]);
    assert_eq!(cli(&["unlock", "e", "--force"]), Some(0));
    let third = led_within(
        waiting,
        Duration::from_secs(3),
        "the candidate in line never led after `distlock unlock --force`",
    )
    .await;
    assert!(third.term() > next.term());
    timeout(ttl * 2, next.lost())
        .await
        .expect("the CLI-unlocked leader never learnt it");
    until_value(&mut rx, "c").await;
    cli(&["inspect", "e"]);
    third.resign().await.unwrap();
    task.abort();
    drop((leading, next));
    shut_down([a, b, op]).await;
    nodes.until_clean(&ns).await;
}

/// Empty values and keys made of the separators a key's names are built from: every election
/// is its own (a lead, a handoff, the leader read back with its empty value, not as nobody),
/// and nothing is left on any node after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_values_and_odd_keys() {
    let ns = test_namespace!();
    let nodes = shared_nodes();
    let ttl = Duration::from_secs(2);
    let [a, b] = nodes.clients(&ns, ttl).await;
    let keys = [":", "{", "}", "{}", "a{b}c", "e:e", "e}:e", ""];
    let mut leads = Vec::new();
    for key in keys {
        let leading = match timeout(Duration::from_secs(3), a.election(key).campaign("")).await {
            Ok(Ok(l)) => l,
            Ok(Err(e)) => {
                println!("key {key:?}: campaign refused: {e}");
                continue;
            }
            Err(_) => panic!("key {key:?}: campaign hung"),
        };
        let seen = b.election(key).leader().await.unwrap();
        assert_eq!(
            seen.as_ref().map(|l| (l.term(), l.value().to_vec())),
            Some((leading.term(), Vec::new())),
            "key {key:?}"
        );
        leads.push((key, leading));
    }
    // A mutex on a key named like an election's channel does not meet the election.
    let m = timeout(Duration::from_secs(3), b.mutex("e").lock()).await;
    println!(
        "mutex on \"e\" beside the elections: {:?}",
        m.as_ref().map(|r| r.is_ok())
    );
    for (key, leading) in leads {
        let waiting = nodes.in_line(&b, &ns, key, "", 1).await;
        let old = leading.term();
        leading.resign().await.unwrap();
        let next = led_within(
            waiting,
            Duration::from_secs(3),
            &format!("key {key:?}: the candidate never led"),
        )
        .await;
        assert!(next.term() > old);
        let seen = a.election(key).leader().await.unwrap();
        assert_eq!(
            seen.as_ref().map(|l| (l.term(), l.value().to_vec())),
            Some((next.term(), Vec::new())),
            "key {key:?}: a handed-over lead with an empty value"
        );
        next.resign().await.unwrap();
    }
    drop(m);
    shut_down([a, b]).await;
    nodes.until_clean(&ns).await;
}

/// A mutex and an election on one key, both ways: each is refused as a kind mismatch while
/// the other holds the key (`leader()` too, never "nobody"), and takes it once it is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mutex_and_an_election_on_one_key() {
    let ns = test_namespace!();
    let nodes = shared_nodes();
    let ttl = Duration::from_secs(2);
    let [a, b] = nodes.clients(&ns, ttl).await;
    let held = a.mutex("k").lock().await.unwrap();
    let err = timeout(Duration::from_secs(3), b.election("k").campaign("b"))
        .await
        .expect("a campaign on a held mutex hung")
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::KindMismatch, "{err}");
    let read = b.election("k").leader().await;
    println!("leader() on a held mutex: {read:?}");
    assert_eq!(
        read.as_ref().map_err(distlock::Error::kind).err(),
        Some(ErrorKind::KindMismatch),
        "{read:?}"
    );
    held.release().await.unwrap();
    let leading = timeout(Duration::from_secs(3), b.election("k").campaign("b"))
        .await
        .expect("a campaign on a released mutex's key hung")
        .unwrap();
    let err = timeout(Duration::from_secs(3), a.mutex("k").lock())
        .await
        .expect("a mutex lock() on a led election hung")
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::KindMismatch, "{err}");
    let err = a.mutex("k").try_lock().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::KindMismatch, "{err}");
    leading.resign().await.unwrap();
    let again = timeout(Duration::from_secs(3), a.mutex("k").lock())
        .await
        .expect("a mutex on a resigned election's key hung")
        .unwrap();
    again.release().await.unwrap();
    shut_down([a, b]).await;
    nodes.until_clean(&ns).await;
}

/// A lead handed to B on every node (A resigns, its handoff lease long), B cut off from node 2
/// when it settles: B leads, confirmed on nodes 0 and 1, its hold on node 2 still
/// provisional; back on node 2, B's renewals extended that provisional hold like any other
/// (before the fix in redlock `renew.lua`). Then node 0 dies for good. Either B is told lost,
/// or it still leads and then `leader()` must report it and its proclaim must take (seen
/// failing: B believed it led on nodes 1 and 2, node 2's hold provisional, while `leader()`
/// said "only 2 of 3 nodes answered, a quorum needs 2", and its proclaim too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lead_left_provisional_on_one_node_is_still_reported() {
    let ns = test_namespace!();
    let mut nodes = Nodes::start(3);
    let direct = nodes.direct_urls();
    let (b_net, b_urls) = nodes.own_network();
    let ttl = Duration::from_secs(2);
    let client_tuned = crate::support::server::redlock::client_tuned;
    let a = client_tuned(direct.clone(), &ns, ttl, Duration::ZERO, ttl * 3).await;
    let b = crate::support::server::redlock::client_on(b_urls, &ns, ttl, Duration::ZERO).await;
    let reader =
        crate::support::server::redlock::client_on(direct.clone(), &ns, ttl, Duration::ZERO).await;
    let leading = a.election("e").campaign("a").await.unwrap();
    let waiting = nodes.in_line(&b, &ns, "e", "b", 1).await;
    b_net[2].cut();
    leading.resign().await.unwrap();
    let b_leads = led_within(waiting, Duration::from_secs(5), "B never led").await;
    b_net[2].pass();
    // B's renewals reach node 2 again.
    sleep(ttl * 2).await;
    let mut raw = Vec::new();
    for u in &direct {
        let v: Option<String> = redis::cmd("GET")
            .arg(format!("{ns}:{{e}}"))
            .query_async(&mut connection(u).await)
            .await
            .unwrap();
        raw.push(v);
    }
    println!("the lead's hold on each node: {raw:?}");
    let all = reader.election("e").leader().await;
    println!("every node up: leader() = {all:?}");
    assert!(!b_leads.is_lost());
    nodes.servers[0].kill();
    sleep(ttl * 2).await;
    let still = !b_leads.is_lost();
    let seen = reader.election("e").leader().await;
    let proclaimed = b_leads.proclaim("b, later").await;
    println!("node 0 dead: B believes it leads: {still}; leader() = {seen:?}; B's proclaim = {proclaimed:?}");
    drop(b_leads);
    shut_down([a, b, reader]).await;
    if still {
        assert_eq!(
            seen.ok().flatten().as_ref().and_then(Leader::value_str),
            Some("b"),
            "B leads on a majority, but leader() does not say so"
        );
        proclaimed.expect("B leads on a majority, but its proclaim was refused");
    }
}

/// B leads on nodes 0 and 1 (node 2 was cut off from it when it campaigned); a reader cut off
/// from node 0 hears B on node 1 and nobody on node 2: it cannot tell, and says so as a
/// transient error. The error must not claim that fewer nodes answered than a quorum (seen:
/// "only 2 of 3 nodes answered, a quorum needs 2").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecided_leader_read_says_why() {
    let ns = test_namespace!();
    let nodes = Nodes::start(3);
    let (b_net, b_urls) = nodes.own_network();
    let ttl = Duration::from_secs(5);
    let b = crate::support::server::redlock::client_on(b_urls, &ns, ttl, Duration::ZERO).await;
    let reader = nodes.client_with(&ns, ttl, Duration::ZERO).await;
    b_net[2].cut();
    let leading = b.election("e").campaign("b").await.unwrap();
    nodes.proxies[0].cut();
    let err = reader.election("e").leader().await.unwrap_err();
    println!("{err}");
    assert!(err.is_transient(), "{err}");
    assert!(err.to_string().contains("quorum"), "{err}");
    assert!(
        !err.to_string().contains("only 2 of 3 nodes answered"),
        "two of three nodes answered, a quorum: {err}"
    );
    nodes.proxies[0].pass();
    b_net[2].pass();
    leading.resign().await.unwrap();
    shut_down([b, reader]).await;
}
