//! Faults against a real PostgreSQL: a holder partitioned from the server, replies delayed or
//! swallowed on its statement connections, a half-open LISTEN connection, a waiter that dies
//! holding a handoff, and the server crashing and coming back. Each test checks the promise that
//! matters: no stale holder believes it holds once another client is granted, tokens only grow,
//! and no key is blocked longer than the lease that blocks it.
#![cfg(feature = "postgres")]

use std::sync::Arc;
use std::time::Duration;

use crate::support::contract::{partition_then_handover, spawn_timed, spawn_timed_lock};
use crate::support::counting::Counting;
use crate::support::faults::{self, grant_elsewhere, stays_lost};
use crate::support::pg::{client, until_queued};
use crate::support::proxy::{Proxy, Which};
use crate::support::server::postgres::{shared_postgres, PgServer};
use tokio::time::{sleep, timeout, Instant};

fn via(proxy: &Proxy) -> String {
    format!("postgres://postgres@127.0.0.1:{}/postgres", proxy.port())
}

/// A holder cut off from the server (a blackhole: its packets vanish, nothing is reset) is
/// told it lost the lock before the waiter behind it is granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_holder_is_told_before_another_is_granted() {
    let ns = test_namespace!();
    let url = shared_postgres().url();
    let proxy = Proxy::start(shared_postgres().port());
    let ttl = Duration::from_millis(1500);
    let h = client(&via(&proxy), &ns, ttl, Duration::from_secs(2)).await;
    let w = client(&url, &ns, ttl, Duration::from_secs(2)).await;
    let held = h.mutex("k").lock().await.unwrap();
    let waiter = spawn_timed_lock(w.mutex("k"));
    until_queued(&url, &ns, "k", 1).await;
    let (guard, lost_after, granted_after) =
        partition_then_handover(|| proxy.blackhole(), &held, waiter, ttl * 4).await;
    assert!(guard.fencing_token() > held.fencing_token());
    assert!(
        granted_after <= ttl + Duration::from_millis(500),
        "{granted_after:?}"
    );
    println!("holder told {lost_after:?}, waiter granted {granted_after:?} after the cut");
    proxy.heal();
    drop(guard);
    w.shutdown().await;
}

/// Replies to a holder's statements arrive 2×TTL late: its renewals are judged by when they
/// were sent, so it reports lost before anyone else is granted, and a late "extended" reply
/// does not bring it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_renewal_replies_do_not_stretch_a_lease() {
    let ns = test_namespace!();
    let url = shared_postgres().url();
    let proxy = Proxy::start(shared_postgres().port());
    let ttl = Duration::from_millis(900);
    let h = client(&via(&proxy), &ns, ttl, Duration::from_secs(2)).await;
    let other = client(&url, &ns, ttl, Duration::from_secs(2)).await;
    let held = h.mutex("k").lock().await.unwrap();
    proxy.delay_replies(Which::Commands, ttl * 2);
    let (guard, _) = grant_elsewhere(&other, "k", &held, ttl * 6)
        .await
        .expect("the lock never passed on");
    // The delayed replies land now; the stale guard stays lost.
    stays_lost(&held, ttl * 3).await;
    assert!(guard.fencing_token() > held.fencing_token());
    guard.release().await.unwrap();
    proxy.pass();
    other.shutdown().await;
}

/// A lock handed to a waiter that died just before passes to the next waiter when the
/// handoff's provisional lease ends, not at the dead waiter's liveness deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handoff_to_a_dead_waiter_passes_on_when_its_lease_ends() {
    faults::handoff_to_a_dead_waiter_passes_on(
        &crate::support::pg::service(),
        &test_namespace!(),
        false,
    )
    .await;
}

/// The same, the dead waiter second in a chain of handoffs: the waiter behind it queued while
/// the first holder's long lease ran, and still hears when the dead one's short lease ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_handoff_to_a_dead_waiter_passes_on_when_its_lease_ends() {
    faults::handoff_to_a_dead_waiter_passes_on(
        &crate::support::pg::service(),
        &test_namespace!(),
        true,
    )
    .await;
}

/// A LISTEN connection gone half-open (bytes vanish, no reset) is found out by its ping and
/// replaced, and the waiter whose grant it swallowed gets the lock within seconds, not at the
/// holder's 10 s TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_open_listen_connection_does_not_lose_a_grant() {
    faults::half_open_message_connection_loses_no_grant(
        &crate::support::pg::service(),
        &test_namespace!(),
    )
    .await;
}

/// A release whose reply was lost, sent again on a new connection (finding nothing), is not
/// reported as a lost lock, and the lock is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_whose_reply_was_lost_is_not_reported_lost() {
    faults::release_with_a_lost_reply_is_not_lost(
        &crate::support::pg::service(),
        &test_namespace!(),
    )
    .await;
}

/// PostgreSQL crashes (SIGKILL) and comes back on its data within the TTL: the holder keeps its
/// lock (its row survived), nobody else gets it meanwhile, the queued waiter is served when it
/// is released, with a larger token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_crash_keeps_holders_and_queues() {
    let ns = "crash";
    let mut server = PgServer::start();
    let ttl = Duration::from_secs(6);
    let holder = client(&server.url(), ns, ttl, Duration::from_secs(2)).await;
    let waiter = client(&server.url(), ns, ttl, Duration::from_secs(2)).await;
    let held = holder.mutex("k").lock().await.unwrap();
    let wait = spawn_timed(waiter.mutex("k").lock());
    until_queued(&server.url(), ns, "k", 1).await;

    tokio::task::block_in_place(|| server.restart_after(|| {}));
    // Past a renewal on the new server.
    sleep(ttl / 2).await;
    assert!(
        !held.is_lost(),
        "a crash shorter than the lease lost the lock"
    );
    assert!(!wait.is_finished(), "the waiter was granted a held lock");
    let other = client(&server.url(), ns, ttl, Duration::from_secs(2)).await;
    assert!(other
        .mutex("k")
        .try_lock()
        .await
        .unwrap_err()
        .is_would_block());
    let fence = held.fencing_token();
    held.release().await.unwrap();
    let (_, granted) = timeout(Duration::from_secs(10), wait)
        .await
        .expect("the queued waiter was never served")
        .unwrap();
    let guard = granted.unwrap();
    assert!(guard.fencing_token() > fence);
    guard.release().await.unwrap();
    for c in [holder, waiter, other] {
        c.shutdown().await;
    }
}

/// PostgreSQL is down for longer than the lease: the holder is told it lost the lock before
/// the waiter is granted on the restarted server, and the new token is larger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_longer_than_the_lease_loses_the_lock_before_anyone_gets_it() {
    let ns = "outage";
    let mut server = PgServer::start();
    let ttl = Duration::from_millis(1500);
    let holder = client(&server.url(), ns, ttl, Duration::from_secs(2)).await;
    let waiter = client(&server.url(), ns, ttl, Duration::from_secs(2)).await;
    let held = Arc::new(holder.mutex("k").lock().await.unwrap());
    // Noted by a task of its own: the test's thread is blocked while the server restarts.
    let lost = {
        let held = held.clone();
        tokio::spawn(async move {
            held.lost().await;
            Instant::now()
        })
    };
    let wait = spawn_timed(waiter.mutex("k").lock_timeout(Duration::from_secs(30)));
    until_queued(&server.url(), ns, "k", 1).await;

    tokio::task::block_in_place(|| server.restart_after(|| std::thread::sleep(ttl * 2)));
    let (granted_at, guard) = timeout(Duration::from_secs(20), wait)
        .await
        .expect("the waiter was never granted")
        .unwrap();
    let guard = guard.unwrap();
    let lost_at = lost.await.unwrap();
    assert!(
        lost_at <= granted_at,
        "the old holder believed it held {:?} past the new grant",
        lost_at - granted_at
    );
    assert!(guard.fencing_token() > held.fencing_token());
    guard.release().await.unwrap();
    holder.shutdown().await;
    waiter.shutdown().await;
}

/// a waiter whose grant message never arrives (its LISTEN connection is cut
/// off and cannot come back) learns of the grant from its next queue renewal, whose reply says
/// it holds the lock. That reply is a grant: the waiter takes the lock within a renewal period
/// of the release, and is not renewed again and again meanwhile (it was about a thousand renew
/// calls a second, and the lock came only at the waiter's own re-check, seconds later).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_seen_by_a_queue_renewal_is_taken_without_a_renewal_storm() {
    let ns = test_namespace!();
    let url = shared_postgres().url();
    let proxy = Proxy::start(shared_postgres().port());
    let holder = client(&url, &ns, Duration::from_secs(10), Duration::from_secs(2)).await;
    // The waiter's statements go straight to the server, its LISTEN connection through the
    // proxy.
    let backend = distlock::backend::PgBackend::builder(url.clone())
        .listen_url(via(&proxy))
        .handoff_ttl(Duration::from_secs(2))
        .build()
        .await
        .unwrap();
    let (backend, renews) = Counting::new(backend);
    faults::a_grant_seen_by_a_queue_renewal_is_taken(
        &crate::support::pg::service(),
        &ns,
        &holder,
        backend,
        &renews,
        &proxy,
    )
    .await;
    holder.shutdown().await;
}

/// Through a `deadpool-postgres` pool: a `lock_timeout` that gives up while
/// its acquire is still on its way (held back 300 ms on one pooled connection) leaves no holder
/// behind; the key was blocked for the whole 10 s TTL when the release overtook the acquire on
/// another pooled connection.
#[cfg(feature = "postgres-deadpool")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_lock_through_a_deadpool_pool_leaves_no_holder() {
    let ns = test_namespace!();
    let url = shared_postgres().url();
    let proxy = Proxy::start(shared_postgres().port());
    let mut cfg = deadpool_postgres::Config::new();
    cfg.url = Some(via(&proxy));
    let pool = cfg
        .create_pool(
            Some(deadpool_postgres::Runtime::Tokio1),
            tokio_postgres::NoTls,
        )
        .unwrap();
    let backend = distlock::backend::PgBackend::builder(url.clone())
        .deadpool(pool.clone())
        .build()
        .await
        .unwrap();
    // Two idle connections, so the release can take another one than the acquire.
    let (a, b) = tokio::join!(pool.get(), pool.get());
    drop((a.unwrap(), b.unwrap()));
    let ttl = Duration::from_secs(10);
    let pooled = distlock::LockClient::builder(backend)
        .namespace(&ns)
        .ttl(ttl)
        .build()
        .unwrap();
    let other = client(&url, &ns, ttl, Duration::from_secs(2)).await;
    faults::a_timed_out_pooled_lock_leaves_no_holder(&pooled, &other, &proxy, b"distlock.acquire(")
        .await;
    assert_eq!(crate::support::pg::claims_in(&url, &ns).await, 0);
    pooled.shutdown().await;
    other.shutdown().await;
}

/// two waiters queued in a row die; the live one behind them
/// is granted within about two handoff leases of the release, not at a TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_dead_waiters_in_a_row_cost_two_handoff_leases() {
    faults::dead_waiters_in_a_row_cost_a_handoff_lease_each(
        &crate::support::pg::service(),
        &test_namespace!(),
        2,
        faults::Death::Closed,
    )
    .await;
}

/// The same with five in a row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_dead_waiters_in_a_row_cost_five_handoff_leases() {
    faults::dead_waiters_in_a_row_cost_a_handoff_lease_each(
        &crate::support::pg::service(),
        &test_namespace!(),
        5,
        faults::Death::Closed,
    )
    .await;
}

/// Three waiters in a row whose hosts crash: their connections stay open on the server's side,
/// so they look alive to the hint that a provisional lease ends. The live waiter behind them
/// is told all the same, and granted within three handoff leases (it used to wait for its own
/// re-check, up to a TTL, on PostgreSQL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_crashed_waiters_in_a_row_cost_three_handoff_leases() {
    faults::dead_waiters_in_a_row_cost_a_handoff_lease_each(
        &crate::support::pg::service(),
        &test_namespace!(),
        3,
        faults::Death::Crashed,
    )
    .await;
}

/// Elections: an observer whose LISTEN connection goes half-open finds it out by
/// itself and catches up with the latest leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_election_observer_cut_off_catches_up() {
    crate::support::election::an_observer_cut_off_catches_up(
        &crate::support::pg::service(),
        &test_namespace!(),
    )
    .await;
}

/// Elections: a leader whose host crashed is told before the next leads, within its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_leader_is_replaced_within_its_lease() {
    crate::support::election::a_crashed_leader_is_replaced_within_its_lease(
        &crate::support::pg::service(),
        &test_namespace!(),
    )
    .await;
}

/// Three waiters whose connections closed, then one whose host crashed (one crashed waiter,
/// well within the README's "up to three crashed ones in a row"): the live one behind them
/// must be granted within four handoff leases, not at a TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_closed_then_one_crashed_waiter_cost_four_handoff_leases() {
    use faults::Death::{Closed, Crashed};
    faults::dead_waiters_in_line_cost_a_handoff_lease_each(
        &crate::support::pg::service(),
        &test_namespace!(),
        &[Closed, Closed, Closed, Crashed],
    )
    .await;
}

/// One crashed waiter at the head, then three whose connections closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_crashed_then_three_closed_waiters_cost_four_handoff_leases() {
    use faults::Death::{Closed, Crashed};
    faults::dead_waiters_in_line_cost_a_handoff_lease_each(
        &crate::support::pg::service(),
        &test_namespace!(),
        &[Crashed, Closed, Closed, Closed],
    )
    .await;
}

/// Two closed, one crashed, two closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_and_crashed_waiters_mixed_cost_a_handoff_lease_each() {
    use faults::Death::{Closed, Crashed};
    faults::dead_waiters_in_line_cost_a_handoff_lease_each(
        &crate::support::pg::service(),
        &test_namespace!(),
        &[Closed, Closed, Crashed, Closed, Closed],
    )
    .await;
}

/// Two crashed, then one closed, then one crashed (three crashed ones, not in a row).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashed_closed_crashed_waiters_cost_a_handoff_lease_each() {
    use faults::Death::{Closed, Crashed};
    faults::dead_waiters_in_line_cost_a_handoff_lease_each(
        &crate::support::pg::service(),
        &test_namespace!(),
        &[Crashed, Crashed, Closed, Crashed],
    )
    .await;
}

/// The holder and the waiter at the head of the line crash together: the live waiter behind
/// them is granted within the holder's lease and a handoff lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_holder_and_a_crashed_head_waiter_cost_a_lease_and_a_handoff_lease() {
    faults::crashed_holder_and_waiters_cost_its_lease_and_a_handoff_lease_each(
        &crate::support::pg::service(),
        &test_namespace!(),
        1,
        None,
    )
    .await;
}

/// The same with three crashed waiters in line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_holder_and_three_crashed_waiters_cost_a_lease_and_three_handoff_leases() {
    faults::crashed_holder_and_waiters_cost_its_lease_and_a_handoff_lease_each(
        &crate::support::pg::service(),
        &test_namespace!(),
        3,
        None,
    )
    .await;
}

/// A one-permit semaphore: crashed holder, two crashed waiters, a live one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_with_a_crashed_holder_and_crashed_waiters_passes_on() {
    faults::crashed_holder_and_waiters_cost_its_lease_and_a_handoff_lease_each(
        &crate::support::pg::service(),
        &test_namespace!(),
        2,
        Some(faults::Shared::Permit),
    )
    .await;
}

/// A read-write lock: crashed writer, two crashed writers queued, a live reader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rw_lock_with_a_crashed_writer_and_crashed_writers_queued_passes_on() {
    faults::crashed_holder_and_waiters_cost_its_lease_and_a_handoff_lease_each(
        &crate::support::pg::service(),
        &test_namespace!(),
        2,
        Some(faults::Shared::WriteThenRead),
    )
    .await;
}
