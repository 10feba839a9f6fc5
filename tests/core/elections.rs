//! Elections under faults, through the public API, on the memory backend and a real
//! PostgreSQL: a leader paused past its lease (a SIGSTOP, a long GC pause, a VM migration),
//! many observers on one client, observers of a client that shuts down, proclaiming after a
//! loss, large values, bad input, and a campaign timed out with its grant in flight.
#![cfg(all(feature = "memory", feature = "postgres"))]

use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant as StdInstant};

use crate::support::server::postgres::shared_postgres;
use distlock::backend::MemoryBackend;
use distlock::{ErrorKind, LockClient};
use futures::future::BoxFuture;
use futures::StreamExt;
use tokio::time::{sleep, timeout};

/// Makes a client inside the runtime that calls it (its background tasks run there).
type MakeClient = Arc<dyn Fn() -> BoxFuture<'static, LockClient> + Send + Sync>;

fn memory_clients(ns: String) -> MakeClient {
    let backend = MemoryBackend::new();
    Arc::new(move || {
        let client = LockClient::builder(backend.clone())
            .namespace(ns.clone())
            .ttl(Duration::from_millis(300))
            .build()
            .unwrap();
        Box::pin(std::future::ready(client))
    })
}

fn pg_clients(ns: String) -> MakeClient {
    Arc::new(move || {
        let ns = ns.clone();
        Box::pin(async move {
            crate::support::pg::client(
                &shared_postgres().url(),
                &ns,
                Duration::from_millis(300),
                Duration::from_millis(200),
            )
            .await
        })
    })
}

/// The whole process of leader `a` stops (its runtime's one thread blocked: what SIGSTOP or a
/// long pause does) for three leases while `lead()` runs its work; `b` campaigns and leads
/// once the lease runs out. When `a` resumes, its work must not take another step: `lead()`
/// promises to poll the work only while leadership lasts, and by then `b` leads.
///
/// Returns how many of `rounds` saw a step of `a`'s work after `b` was granted.
async fn paused_leader_rounds(make: MakeClient, rounds: usize) -> (usize, Vec<String>) {
    let ttl = Duration::from_millis(300);
    let mut overlapping = 0;
    let mut notes = Vec::new();
    let b = make().await;
    for round in 0..rounds {
        let steps: Arc<StdMutex<Vec<(u64, StdInstant)>>> = Arc::default();
        let (led_tx, led_rx) = tokio::sync::oneshot::channel::<()>();
        let (end_tx, end_rx) = std::sync::mpsc::channel::<()>();
        let resumed: Arc<StdMutex<Option<StdInstant>>> = Arc::default();
        let (a_steps, a_make, a_resumed) = (steps.clone(), make.clone(), resumed.clone());
        let a_thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let a = a_make().await;
                let election = a.election("paused");
                let work_steps = a_steps.clone();
                let leading = tokio::spawn(async move {
                    election
                        .lead("a", |term| {
                            let steps = work_steps.clone();
                            async move {
                                loop {
                                    sleep(Duration::from_millis(2)).await;
                                    steps.lock().unwrap().push((term, StdInstant::now()));
                                }
                            }
                        })
                        .await
                });
                while a_steps.lock().unwrap().is_empty() {
                    sleep(Duration::from_millis(1)).await;
                }
                let _ = led_tx.send(());
                // SIGSTOP: nothing of this process runs, renewals included.
                std::thread::sleep(ttl * 3);
                a_resumed.lock().unwrap().replace(StdInstant::now());
                // SIGCONT: give `lead()` time to notice, then stop it.
                sleep(Duration::from_millis(300)).await;
                leading.abort();
                let _ = leading.await;
                let _ = end_rx.recv_timeout(Duration::from_secs(10));
                a.shutdown().await;
            });
        });
        timeout(Duration::from_secs(10), led_rx)
            .await
            .expect("a never led")
            .unwrap();
        let a_term = steps.lock().unwrap()[0].0;
        let b_leads = timeout(Duration::from_secs(10), b.election("paused").campaign("b"))
            .await
            .expect("b never led while a was paused")
            .unwrap();
        let b_granted = StdInstant::now();
        assert!(b_leads.term() > a_term);
        // Wait for a to resume and stop.
        sleep(ttl * 3 + Duration::from_millis(400)).await;
        let late: Vec<Duration> = steps
            .lock()
            .unwrap()
            .iter()
            .filter(|(term, at)| *term == a_term && *at > b_granted)
            .map(|(_, at)| at.duration_since(b_granted))
            .collect();
        if !late.is_empty() {
            overlapping += 1;
            let resumed = resumed.lock().unwrap().expect("a never resumed");
            notes.push(format!(
                "round {round}: a's work (term {a_term}) took {} step(s) after b led (term {}), \
                 the first {:?} after b's campaign returned ({:?} after a resumed)",
                late.len(),
                b_leads.term(),
                late[0],
                (b_granted + late[0]).saturating_duration_since(resumed)
            ));
        }
        // b's own lease is 300 ms: on a loaded machine a renewal may come too late for it, which
        // this test does not judge (a's steps are what it counts).
        match b_leads.resign().await {
            Err(e) if !e.is_lost() => panic!("b's resign: {e}"),
            _ => {}
        }
        let _ = end_tx.send(());
        a_thread.join().unwrap();
    }
    b.shutdown().await;
    (overlapping, notes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_lead_takes_no_step_after_a_pause_past_its_lease() {
    let (overlapping, notes) = paused_leader_rounds(memory_clients(test_namespace!()), 12).await;
    for n in &notes {
        println!("{n}");
    }
    assert_eq!(
        overlapping, 0,
        "two leaders at once in {overlapping} of 12 rounds"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_lead_takes_no_step_after_a_pause_past_its_lease() {
    let (overlapping, notes) = paused_leader_rounds(pg_clients(test_namespace!()), 12).await;
    for n in &notes {
        println!("{n}");
    }
    assert_eq!(
        overlapping, 0,
        "two leaders at once in {overlapping} of 12 rounds"
    );
}

/// Transactions committed on the test server (every statement of the clients is one).
async fn xacts() -> i64 {
    let c = crate::support::pg::connection(&shared_postgres().url()).await;
    // The statistics are flushed to the view at most once a second or so: force it.
    let _ = c.simple_query("SELECT pg_stat_force_next_flush()").await;
    c.query_one(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

/// Many observers of one election on one client, a leader renewing its lease: what do they
/// cost the server while nothing changes, and do they all hear the one change?
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_many_observers_on_one_client() {
    let ns = test_namespace!();
    let url = shared_postgres().url();
    let ttl = Duration::from_secs(3);
    let leader_client =
        crate::support::pg::client(&url, &ns, ttl, Duration::from_millis(300)).await;
    let watcher = crate::support::pg::client(&url, &ns, ttl, Duration::from_millis(300)).await;
    let leading = leader_client
        .election("k:with:colons")
        .campaign("a")
        .await
        .unwrap();
    let window = Duration::from_secs(6);

    let mut per_n = Vec::new();
    for n in [0usize, 1, 200] {
        let seen: Arc<StdMutex<Vec<Option<u64>>>> = Arc::new(StdMutex::new(vec![None; n]));
        let mut tasks = Vec::new();
        for i in 0..n {
            let (seen, mut changes) = (
                seen.clone(),
                Box::pin(watcher.election("k:with:colons").observe()),
            );
            tasks.push(tokio::spawn(async move {
                while let Some(item) = changes.next().await {
                    let term = item.unwrap().map(|l| l.term());
                    seen.lock().unwrap()[i] = term;
                }
            }));
        }
        // Everyone has read once.
        timeout(Duration::from_secs(20), async {
            while seen.lock().unwrap().iter().any(Option::is_none) {
                sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("observers never read the leader");
        let before = xacts().await;
        sleep(window).await;
        let after = xacts().await;
        per_n.push((n, after - before));
        for t in tasks {
            t.abort();
        }
    }
    for (n, x) in &per_n {
        println!("{n} observers: {x} transactions in {window:?} (leader with a {ttl:?} lease)");
    }

    // One change, 300 observers: all hear it.
    let n = 300;
    let seen: Arc<StdMutex<Vec<Option<u64>>>> = Arc::new(StdMutex::new(vec![None; n]));
    let mut tasks = Vec::new();
    for i in 0..n {
        let (seen, mut changes) = (
            seen.clone(),
            Box::pin(watcher.election("k:with:colons").observe()),
        );
        tasks.push(tokio::spawn(async move {
            while let Some(item) = changes.next().await {
                if let Ok(l) = item {
                    seen.lock().unwrap()[i] = Some(l.map_or(0, |l| l.term()));
                }
            }
        }));
    }
    timeout(Duration::from_secs(20), async {
        while seen.lock().unwrap().iter().any(Option::is_none) {
            sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("observers never read the leader");
    let resigned = StdInstant::now();
    leading.resign().await.unwrap();
    let all = timeout(Duration::from_secs(10), async {
        while seen.lock().unwrap().iter().any(|t| *t != Some(0)) {
            sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    let missing = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|t| **t != Some(0))
        .count();
    println!(
        "{n} observers on one client: {} of them saw the resignation within {:?}",
        n - missing,
        resigned.elapsed()
    );
    assert!(
        all.is_ok(),
        "{missing} of {n} observers never saw the resignation"
    );
    for t in tasks {
        t.abort();
    }
    leader_client.shutdown().await;
    watcher.shutdown().await;
}

/// Observers end when their client shuts down, whether they were waiting at the time or made
/// afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_observers_end_when_their_client_shuts_down() {
    let ns = test_namespace!();
    let url = shared_postgres().url();
    let watcher = crate::support::pg::client(
        &url,
        &ns,
        Duration::from_secs(3),
        Duration::from_millis(300),
    )
    .await;
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
    println!("observer waiting at shutdown then got: {ended:?}");
    assert!(ended.is_none(), "{ended:?}");
    let mut after = Box::pin(election.observe());
    let item = timeout(Duration::from_secs(3), after.next())
        .await
        .expect("an observer made after shutdown hung");
    println!(
        "observer made after shutdown: {:?}",
        item.as_ref().map(|r| r.as_ref().map_err(|e| e.kind()))
    );
    assert!(item.is_none() || item.unwrap().is_err());
}

/// A leader removed by an operator cannot proclaim any more, and its value never shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_proclaim_after_loss_is_refused() {
    let ns = test_namespace!();
    let url = shared_postgres().url();
    let (a, op) = (
        crate::support::pg::client(
            &url,
            &ns,
            Duration::from_secs(3),
            Duration::from_millis(300),
        )
        .await,
        crate::support::pg::client(
            &url,
            &ns,
            Duration::from_secs(3),
            Duration::from_millis(300),
        )
        .await,
    );
    let leading = a.election("e").campaign("a").await.unwrap();
    op.force_release("e").await.unwrap();
    let b = op.election("e").campaign("b").await.unwrap();
    let err = leading.proclaim("a is back").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
    assert!(leading.is_lost());
    let now = op.election("e").leader().await.unwrap().unwrap();
    assert_eq!((now.term(), now.value_str()), (b.term(), Some("b")));
    b.resign().await.unwrap();
    a.shutdown().await;
    op.shutdown().await;
}

/// Large values: a 16 MiB value is campaigned with, read, observed and proclaimed over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_large_values() {
    let ns = test_namespace!();
    let url = shared_postgres().url();
    let a = crate::support::pg::client(
        &url,
        &ns,
        Duration::from_secs(3),
        Duration::from_millis(300),
    )
    .await;
    let leading = crate::support::election::a_large_value_round_trips(&a, 16 << 20).await;
    leading.resign().await.unwrap();
    a.shutdown().await;
}

/// Bad input is refused before any I/O, everywhere an election takes a key, and a namespace
/// with ':' (which would make `<ns>:<key>` ambiguous) is refused at build.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused() {
    let ns = test_namespace!();
    let err = LockClient::builder(MemoryBackend::new())
        .namespace("a:b")
        .build()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    let pg = crate::support::pg::client(
        &shared_postgres().url(),
        &ns,
        Duration::from_secs(3),
        Duration::from_millis(300),
    )
    .await;
    let memory = LockClient::builder(MemoryBackend::new())
        .namespace(ns.clone())
        .build()
        .unwrap();
    let long = "k".repeat(513);
    for client in [&pg, &memory] {
        for key in ["", "a\0b", long.as_str()] {
            let e = client.election(key);
            let err = e.try_campaign("v").await.unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidKey, "{key:?}: {err}");
            let err = e.leader().await.unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidKey, "{key:?}: {err}");
            let mut changes = Box::pin(e.observe());
            let first = timeout(Duration::from_secs(3), changes.next())
                .await
                .expect("observe hung on a bad key")
                .expect("observe ended without saying why");
            assert_eq!(first.unwrap_err().kind(), ErrorKind::InvalidKey);
            let after = timeout(Duration::from_secs(3), changes.next())
                .await
                .expect("observe went on after a bad key");
            assert!(after.is_none(), "{after:?}");
            let err = timeout(Duration::from_secs(3), e.lead("v", |t| async move { t }))
                .await
                .expect("lead hung on a bad key")
                .unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidKey, "{key:?}: {err}");
        }
        // Odd but valid keys: colons, spaces, non-ASCII, the longest.
        let longest = "ü".repeat(256);
        for key in ["a:b:c", " x ", "ключ", longest.as_str()] {
            let e = client.election(key);
            let mut changes = Box::pin(e.observe());
            assert!(changes.next().await.unwrap().unwrap().is_none(), "{key:?}");
            let leading = e.campaign(key).await.unwrap();
            let seen = timeout(Duration::from_secs(3), changes.next())
                .await
                .unwrap_or_else(|_| panic!("{key:?}: the observer missed the leader"))
                .unwrap()
                .unwrap()
                .unwrap();
            assert_eq!(seen.value_str(), Some(key));
            leading.resign().await.unwrap();
        }
    }
    pg.shutdown().await;
    memory.shutdown().await;
}

/// A campaign times out while its request has already been granted on the server (the reply
/// is late): nothing may be left leading, and the next candidate leads at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_campaign_timed_out_in_flight_leaves_no_leader() {
    let ns = test_namespace!();
    let url = shared_postgres().url();
    let proxy = crate::support::proxy::Proxy::start(shared_postgres().port());
    let via = format!("postgres://postgres@127.0.0.1:{}/postgres", proxy.port());
    let (ttl, handoff) = (Duration::from_secs(10), Duration::from_millis(300));
    let slow = crate::support::pg::client(&via, &ns, ttl, handoff).await;
    let other = crate::support::pg::client(&url, &ns, ttl, handoff).await;
    // Open every statement connection of the slow client (the fault hits those open now).
    for i in 0..64 {
        slow.election(format!("warm{i}")).leader().await.unwrap();
    }
    // The fault hits the connections open now: try until the campaign went over one.
    let mut timed_out = false;
    for _ in 0..20 {
        proxy.delay_replies(
            crate::support::proxy::Which::Commands,
            Duration::from_millis(800),
        );
        match slow
            .election("e")
            .campaign_timeout("late", Duration::from_millis(300))
            .await
        {
            Ok(leading) => {
                proxy.pass();
                leading.resign().await.unwrap();
                continue;
            }
            Err(err) => assert!(err.is_timeout(), "{err}"),
        }
        timed_out = true;
        let leader = other.election("e").leader().await.unwrap();
        println!(
            "just after the timeout, leader() = {:?}",
            leader.as_ref().map(|l| l.value_str())
        );
        proxy.pass();
        let start = StdInstant::now();
        let next = timeout(Duration::from_secs(5), other.election("e").campaign("next"))
            .await
            .expect("a timed-out campaign kept the election")
            .unwrap();
        println!("the next candidate led after {:?}", start.elapsed());
        next.resign().await.unwrap();
        break;
    }
    assert!(timed_out, "no campaign went over a slow connection");
    slow.shutdown().await;
    other.shutdown().await;
    assert_eq!(crate::support::pg::claims_in(&url, &ns).await, 0);
}

/// A candidate's host dies while it waits in line: it is never reported as the leader (see
/// `crate::support::election::a_dead_candidate_is_never_reported_as_leader`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_dead_candidate_is_never_reported_as_leader() {
    crate::support::election::a_dead_candidate_is_never_reported_as_leader(
        &crate::support::pg::service(),
        &test_namespace!(),
    )
    .await;
}

/// The first observer of an election polled on a current-thread runtime that then stays alive
/// but idle (kept, not driven): an observer on another runtime still sees the next leader at
/// once (the reading task runs on the client's runtime, not on the runtime of the first observer).
#[test]
fn an_observer_is_not_held_up_by_another_runtime_left_idle() {
    use futures::StreamExt;
    let client = distlock::LockClient::memory();
    let idle = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut first = Box::pin(client.election("e").observe());
    let nobody = idle.block_on(async { timeout(Duration::from_secs(3), first.next()).await });
    assert!(matches!(nobody, Ok(Some(Ok(None)))), "{nobody:?}");
    let other = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    other.block_on(async {
        let mut changes = Box::pin(client.election("e").observe());
        let _ = timeout(Duration::from_secs(3), changes.next()).await;
        let leading = client.election("e").campaign("x").await.unwrap();
        let seen = timeout(Duration::from_secs(3), async {
            while let Some(item) = changes.next().await {
                if item.unwrap().is_some_and(|l| l.value_str() == Some("x")) {
                    return;
                }
            }
        })
        .await;
        assert!(seen.is_ok(), "the observer never saw the new leader");
        leading.resign().await.unwrap();
    });
    drop(first);
    drop(idle);
}
