//! The behaviour suite: every check that holds on every backend (the mutex contract and its
//! cancellation tortures, the read-write lock, semaphore and multi-lock checks, lease control
//! and the operator's unlock), each a case run on one fixture's [`Env`] with that backend's
//! [`Sizes`]. `tests/contract/matrix.rs` instantiates it for every backend and topology; a backend's
//! own file keeps what only it has (faults, failover, Curator interop, TLS, its layout on the
//! server).
//!
//! The checks themselves are in `contract.rs`, `family.rs` and `cancellation.rs`; a case here
//! picks its clients and keys, runs the check, and fails if anything of the namespace is left
//! on the server once its clients are shut down.

use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use distlock::ErrorKind;
use tokio::time::timeout;

use super::cancellation;
use super::contract::{
    self, contend, take_multi, take_permit, take_write, torture, torture_with, ForceFamilies, Take,
};
use super::election;
use super::family;
use super::server::Env;

/// A cancellation torture's size: `holders` take the key `holder_rounds` times each while
/// `cancellers` start `cancel_rounds` acquisitions each and drop most of them, at random points
/// measured in `unit`s.
#[derive(Clone, Copy, Debug)]
pub struct Torture {
    pub holders: usize,
    pub cancellers: usize,
    pub holder_rounds: u64,
    pub cancel_rounds: u64,
    pub unit: Duration,
}

/// How hard a backend's cases push: a fast in-process backend takes more rounds than five
/// Redis nodes or a ZooKeeper ensemble in the same time.
#[derive(Clone, Copy, Debug)]
pub struct Sizes {
    /// Mutual exclusion: clients, rounds each, the hold of every third round.
    pub contend: (usize, usize, Duration),
    /// Waiters queued one after another behind a holder.
    pub fifo: usize,
    /// Mutex `lock()` futures cancelled by timeouts and aborts.
    pub torture: Torture,
    /// `lock()` futures dropped at random points, also after a few polls
    /// ([`cancellation::torture`]; `holder_rounds` is not used: holders take a quarter of
    /// `cancel_rounds`).
    pub drops: Torture,
    /// Write, permit and multi-lock futures cancelled by timeouts and aborts.
    pub family_torture: Torture,
    /// Read-write exclusion: clients, rounds each, one write in `every` rounds.
    pub rw_exclusion: (usize, usize, usize),
    /// Readers (`false`) and writers (`true`) queued in this order behind a writer.
    pub rw_plan: &'static [bool],
    /// The semaphore bound: clients, permits, rounds each.
    pub semaphore_bound: (usize, u32, usize),
    /// The lease the lease-control case gives its locks.
    pub lease_ttl: Duration,
    /// The lease the force-release case gives its locks (`None`: the fixture's own).
    pub force_ttl: Option<Duration>,
}

/// A reader-writer plan: `true` is a writer.
pub const PLAN: [bool; 8] = [false, false, true, false, false, true, true, false];

/// Mutual exclusion and strictly increasing fencing tokens under contention.
pub async fn mutual_exclusion_and_increasing_fences(env: &Env, s: &Sizes) {
    let (clients, rounds, hold) = s.contend;
    contend(env.clients(clients).await, "hot", rounds, hold).await;
    env.assert_clean().await;
}

/// `s.fifo` clients (a fleet's replicas, each with its own connections) queue on one key, one
/// at a time: they are served in arrival order, with strictly increasing fencing tokens.
pub async fn waiters_are_served_in_arrival_order(env: &Env, s: &Sizes) {
    let n = s.fifo;
    let ttl = Some(Duration::from_secs(30));
    let first = env.client_with_ttl(ttl).await;
    let holder = first.mutex("fifo").lock().await.unwrap();
    let grants = Arc::new(StdMutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..n {
        let c = env.client_with_ttl(ttl).await;
        let grants = grants.clone();
        tasks.push(tokio::spawn(async move {
            let guard = c.mutex("fifo").lock().await.unwrap();
            grants.lock().unwrap().push((i, guard.fencing_token()));
            guard.release().await.unwrap();
            c.shutdown().await;
        }));
        env.until_queued("fifo", i + 1).await;
    }
    let first_fence = holder.fencing_token();
    holder.release().await.unwrap();
    for t in tasks {
        timeout(Duration::from_secs(30), t).await.unwrap().unwrap();
    }
    let grants = grants.lock().unwrap().clone();
    let order: Vec<usize> = grants.iter().map(|(i, _)| *i).collect();
    assert_eq!(order, (0..n).collect::<Vec<_>>(), "served out of order");
    let fences: Vec<u64> = std::iter::once(first_fence)
        .chain(grants.iter().map(|(_, f)| *f))
        .collect();
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "{fences:?}");
    first.shutdown().await;
    env.assert_clean().await;
}

/// `lock()` futures cancelled by tiny timeouts and aborted tasks among real holders.
pub async fn cancelled_lock_futures_leave_nothing_behind(env: &Env, s: &Sizes) {
    let t = s.torture;
    torture(
        env.clients(t.holders).await,
        env.clients(t.cancellers).await,
        "torture",
        t.holder_rounds,
        t.cancel_rounds,
        t.unit,
    )
    .await;
    env.assert_clean().await;
}

/// `lock()` futures dropped anywhere: by a tiny timeout, after a few polls, or with their
/// aborted task ([`cancellation::torture`]).
pub async fn lock_futures_dropped_anywhere_leave_nothing_behind(env: &Env, s: &Sizes) {
    let t = s.drops;
    cancellation::torture(env, t.holders, t.cancellers, t.cancel_rounds, t.unit).await;
}

/// [`torture_with`] on one kind of claim, with the family torture's size.
async fn family_torture(env: &Env, s: &Sizes, take: Take, key: &str) {
    let t = s.family_torture;
    torture_with(
        take,
        env.clients(t.holders).await,
        env.clients(t.cancellers).await,
        key,
        t.holder_rounds,
        t.cancel_rounds,
        t.unit,
    )
    .await;
    env.assert_clean().await;
}

pub async fn cancelled_write_futures_leave_nothing_behind(env: &Env, s: &Sizes) {
    family_torture(env, s, take_write(), "torture-write").await;
}

pub async fn cancelled_permit_futures_leave_nothing_behind(env: &Env, s: &Sizes) {
    family_torture(env, s, take_permit(), "torture-permit").await;
}

pub async fn cancelled_multi_lock_futures_leave_nothing_behind(env: &Env, s: &Sizes) {
    family_torture(env, s, take_multi(), "torture-multi").await;
}

/// The operator's unlock: every holder of a mutex (and of a read-write lock and a semaphore,
/// where the backend has them) dropped, the waiter granted at once with a greater token, the
/// dropped guards told at their next renewal; another namespace untouched. Families the
/// backend lacks are refused before any I/O.
pub async fn force_release_drops_every_holder_and_hands_on(env: &Env, s: &Sizes) {
    let [a, b, op]: [distlock::LockClient; 3] =
        match env.clients_with_ttl(3, s.force_ttl).await.try_into() {
            Ok(clients) => clients,
            Err(_) => unreachable!("three clients"),
        };
    let outsider = env.client_elsewhere("other", s.force_ttl).await;
    let families = ForceFamilies {
        rw: env.supports.rw,
        semaphore: env.supports.semaphore,
    };
    contract::force_release(&a, &b, &op, &outsider, a.ttl(), families).await;
    if !families.semaphore {
        let err = op
            .semaphore("force-sem", 2)
            .try_acquire()
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    }
    for c in [a, b, op, outsider] {
        c.shutdown().await;
    }
    env.assert_clean().await;
}

/// Lease control (`lease_left`, a fixed lease, `extend` longer and shorter) as the server sees
/// it.
pub async fn lease_control_fixed_extended_and_shorter_leases(env: &Env, s: &Sizes) {
    let ttl = s.lease_ttl;
    let (a, b) = (
        env.client_with_ttl(Some(ttl)).await,
        env.client_with_ttl(Some(ttl)).await,
    );
    contract::lease_control(&a, &b, ttl).await;
    a.shutdown().await;
    b.shutdown().await;
    env.assert_clean().await;
}

/// Readers together, writers alone; write tokens increase.
pub async fn rw_exclusion_and_tokens(env: &Env, s: &Sizes) {
    let (clients, rounds, every) = s.rw_exclusion;
    family::rw_exclusion(env.clients(clients).await, "rw", rounds, every).await;
    env.assert_clean().await;
}

pub async fn rw_fifo_with_readers_together(env: &Env, s: &Sizes) {
    let clients = env.clients(s.rw_plan.len() + 1).await;
    family::rw_fifo(clients, "rw", s.rw_plan, &env.queued("rw")).await;
    env.assert_clean().await;
}

pub async fn downgrade_keeps_queued_writers_out(env: &Env, _: &Sizes) {
    let clients = env.client_array().await;
    family::downgrade_keeps_queued_writers_out(clients, "rw", &env.queued("rw")).await;
    env.assert_clean().await;
}

pub async fn semaphore_never_exceeds_its_permits(env: &Env, s: &Sizes) {
    let (clients, max, rounds) = s.semaphore_bound;
    family::semaphore_bound(env.clients(clients).await, "sem", max, rounds).await;
    env.assert_clean().await;
}

pub async fn semaphore_head_is_not_overtaken(env: &Env, _: &Sizes) {
    let clients = env.client_array().await;
    family::semaphore_head_is_not_overtaken(clients, "sem", &env.queued("sem")).await;
    env.assert_clean().await;
}

pub async fn kinds_do_not_mix(env: &Env, _: &Sizes) {
    let clients = env.client_array().await;
    family::kinds_do_not_mix(clients, "k", env.records_max).await;
    env.assert_clean().await;
}

pub async fn inspect_sees_the_family(env: &Env, _: &Sizes) {
    let clients = env.client_array().await;
    let (rw, sem) = (env.queued("k:rw"), env.queued("k:sem"));
    family::inspect_sees_the_family(clients, "k", env.records_max, &rw, &sem).await;
    env.assert_clean().await;
}

pub async fn election_one_leader_at_a_time(env: &Env, s: &Sizes) {
    let (clients, rounds, hold) = s.contend;
    election::one_leader_at_a_time(env.clients(clients).await, "elect", rounds, hold).await;
    env.assert_clean().await;
}

pub async fn election_candidates_lead_in_arrival_order(env: &Env, s: &Sizes) {
    election::candidates_lead_in_arrival_order(env, "elect", s.fifo).await;
    env.assert_clean().await;
}

pub async fn election_observers_see_the_latest_leader(env: &Env, _: &Sizes) {
    election::observers_see_the_latest_leader(env, "elect").await;
    env.assert_clean().await;
}

pub async fn election_dead_leader_is_replaced_within_its_lease(env: &Env, s: &Sizes) {
    election::a_dead_leader_is_replaced_within_its_lease(env, "elect", s.lease_ttl).await;
    env.assert_clean().await;
}

pub async fn election_cancelled_campaigns_leave_nothing_behind(env: &Env, s: &Sizes) {
    election::cancelled_campaigns_leave_nothing_behind(
        env,
        "elect",
        s.torture.cancel_rounds as usize,
    )
    .await;
    env.assert_clean().await;
}

pub async fn election_and_locks_do_not_mix(env: &Env, _: &Sizes) {
    election::elections_and_locks_do_not_mix(env).await;
    env.assert_clean().await;
}

pub async fn election_a_refused_proclaim_keeps_the_accepted_value(env: &Env, _: &Sizes) {
    election::a_refused_proclaim_keeps_the_accepted_value(env).await;
    env.assert_clean().await;
}

pub async fn election_lead_stops_the_work_when_leadership_is_lost(env: &Env, s: &Sizes) {
    election::lead_stops_the_work_when_leadership_is_lost(env, "elect", s.lease_ttl).await;
    env.assert_clean().await;
}

/// A case of a primitive the backend does not have, skipped by the library's own rule: the
/// backend's `supports` says no, and the library refuses the primitive (`Unsupported`, before
/// any I/O). Says on stderr which case was skipped, and why. Fails once the backend has it, so
/// the case is then run instead.
pub async fn skipped(env: &Env, primitive: &str, case: &str) {
    let c = env.client().await;
    let refused = match primitive {
        "semaphore" => {
            assert!(
                !env.supports.semaphore,
                "{} supports semaphores: run `{case}` on it",
                env.name
            );
            c.semaphore("skipped", 2).try_acquire().await.map(drop)
        }
        "rw" => {
            assert!(
                !env.supports.rw,
                "{} supports read-write locks: run `{case}` on it",
                env.name
            );
            c.rw_lock("skipped").try_read().await.map(drop)
        }
        "election" => {
            assert!(
                !env.supports.election,
                "{} supports elections: run `{case}` on it",
                env.name
            );
            c.election("skipped").try_campaign("x").await.map(drop)
        }
        // A lease that is the session's (ZooKeeper): a guard may not ask for another, nor stop
        // renewing (it would report lost while the session kept the lock).
        "lease" => {
            let g = c.mutex("skipped").lock().await.unwrap();
            let stop = g
                .set_auto_renew(false)
                .expect_err("renewal turned off on a session");
            assert_eq!(stop.kind(), ErrorKind::Unsupported, "{stop}");
            assert!(!g.is_lost());
            let asked = g.extend(c.ttl() * 2).await;
            g.release().await.unwrap();
            asked
        }
        other => panic!("no such primitive: {other}"),
    };
    let err = refused.expect_err("the library did not refuse a primitive the backend lacks");
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    eprintln!(
        "skipped `{case}` on {}: the backend does not support {primitive} ({err})",
        env.name
    );
    c.shutdown().await;
    env.assert_clean().await;
}
