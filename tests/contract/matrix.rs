//! The test matrix: the behaviour suite (`support/suite.rs`) on every backend and topology,
//! one module each (`memory`, `redis`, `redis_cluster`, `redis_sentinel`, `redlock`,
//! `zookeeper`, `zookeeper_ensemble`, `postgres`, `pgbouncer`), each on its fixture
//! (`support/server/`): one server set shared by the binary, a namespace per test. Filter by
//! backend (`cargo test --test contract -- matrix::redlock::`) or by case (`-- rw_fifo`).
//!
//! A backend runs the case groups it supports (`mutex`, `rw`, `semaphore`, `lease`,
//! `election`). A group it lacks is listed after `skip`: its cases run as
//! `<backend>::skipped::<case>`, which check that the library refuses the primitive there (the
//! backend's `supports`, `Unsupported` before any I/O), say on stderr that the case was
//! skipped, and fail once the backend has it.

use std::time::Duration;

use crate::support::server;
use crate::support::suite::{self, Sizes, Torture, PLAN};

/// One test per case, on `$env`'s fixture with `$sizes`.
macro_rules! cases {
    ($env:path, $sizes:ident: $($case:ident),+) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $case() {
            let env = $env(test_namespace!()).await;
            suite::$case(&env, &$sizes).await;
        }
    )+};
}

/// One test per case of `$group`, which the backend lacks: see [`suite::skipped`].
#[cfg(any(feature = "redlock", feature = "zookeeper"))]
macro_rules! skipped_cases {
    ($env:path, $group:ident: $($case:ident),+) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $case() {
            let env = $env(test_namespace!()).await;
            suite::skipped(&env, stringify!($group), stringify!($case)).await;
        }
    )+};
}

/// The cases of a group, through `$how` (`cases` or `skipped_cases`).
macro_rules! group {
    ($how:ident, $env:path, $arg:ident, mutex) => {
        $how!($env, $arg: mutual_exclusion_and_increasing_fences,
            waiters_are_served_in_arrival_order,
            cancelled_lock_futures_leave_nothing_behind,
            lock_futures_dropped_anywhere_leave_nothing_behind,
            cancelled_multi_lock_futures_leave_nothing_behind,
            force_release_drops_every_holder_and_hands_on);
    };
    ($how:ident, $env:path, $arg:ident, rw) => {
        $how!($env, $arg: rw_exclusion_and_tokens,
            rw_fifo_with_readers_together,
            downgrade_keeps_queued_writers_out,
            cancelled_write_futures_leave_nothing_behind);
    };
    ($how:ident, $env:path, $arg:ident, semaphore) => {
        $how!($env, $arg: semaphore_never_exceeds_its_permits,
            semaphore_head_is_not_overtaken,
            cancelled_permit_futures_leave_nothing_behind,
            kinds_do_not_mix,
            inspect_sees_the_family);
    };
    ($how:ident, $env:path, $arg:ident, lease) => {
        $how!($env, $arg: lease_control_fixed_extended_and_shorter_leases);
    };
    ($how:ident, $env:path, $arg:ident, election) => {
        $how!($env, $arg: election_one_leader_at_a_time,
            election_candidates_lead_in_arrival_order,
            election_observers_see_the_latest_leader,
            election_dead_leader_is_replaced_within_its_lease,
            election_cancelled_campaigns_leave_nothing_behind,
            election_and_locks_do_not_mix,
            election_a_refused_proclaim_keeps_the_accepted_value,
            election_lead_stops_the_work_when_leadership_is_lost);
    };
}

/// A module per row: the groups the backend supports, and those it lacks under `skipped`.
macro_rules! matrix {
    ($(
        $(#[$attr:meta])*
        $name:ident: $env:path, $sizes:expr, [$($group:ident),+] $(skip [$($skip:ident),+])?;
    )+) => {$(
        $(#[$attr])*
        mod $name {
            use super::*;

            const SIZES: Sizes = $sizes;

            $(group!(cases, $env, SIZES, $group);)+

            $(
                /// Cases of groups this backend lacks, skipped by the library's own rule.
                mod skipped {
                    use super::*;
                    $(group!(skipped_cases, $env, $skip, $skip);)+
                }
            )?
        }
    )+};
}

/// What most backends take; each row below changes what differs.
const BASE: Sizes = Sizes {
    contend: (8, 25, Duration::from_micros(300)),
    fifo: 16,
    torture: Torture {
        holders: 2,
        cancellers: 4,
        holder_rounds: 40,
        cancel_rounds: 120,
        unit: Duration::from_micros(3),
    },
    drops: Torture {
        holders: 3,
        cancellers: 6,
        holder_rounds: 0,
        cancel_rounds: 300,
        unit: Duration::from_millis(2),
    },
    family_torture: Torture {
        holders: 2,
        cancellers: 4,
        holder_rounds: 20,
        cancel_rounds: 60,
        unit: Duration::from_micros(4),
    },
    rw_exclusion: (6, 20, 4),
    rw_plan: &PLAN,
    semaphore_bound: (6, 3, 20),
    lease_ttl: Duration::from_millis(800),
    force_ttl: Some(Duration::from_millis(900)),
};

/// A Redis topology with a replica or a shard more to go through.
#[cfg(any(
    feature = "redis-cluster",
    feature = "redis-sentinel",
    feature = "redlock"
))]
const REPLICATED: Sizes = Sizes {
    contend: (4, 15, Duration::from_micros(300)),
    fifo: 6,
    torture: Torture {
        holders: 3,
        cancellers: 3,
        holder_rounds: 25,
        cancel_rounds: 80,
        unit: Duration::from_micros(20),
    },
    drops: Torture {
        cancel_rounds: 150,
        ..BASE.drops
    },
    family_torture: Torture {
        holder_rounds: 15,
        ..BASE.family_torture
    },
    rw_exclusion: (6, 15, 4),
    semaphore_bound: (6, 3, 15),
    // A lease case's shorter TTL (half of this) is renewed every third of it, through a
    // replica or a shard more: 600 ms leaves each renewal 400 ms on a loaded machine.
    lease_ttl: Duration::from_millis(1200),
    ..BASE
};

/// ZooKeeper: every claim is a node, every wait a watch.
#[cfg(feature = "zookeeper")]
const ZOOKEEPER: Sizes = Sizes {
    contend: (6, 20, Duration::from_micros(300)),
    fifo: 6,
    torture: Torture {
        holder_rounds: 30,
        cancel_rounds: 80,
        unit: Duration::from_micros(4),
        ..BASE.torture
    },
    drops: Torture {
        cancel_rounds: 100,
        unit: Duration::from_millis(20),
        ..BASE.drops
    },
    family_torture: Torture {
        holder_rounds: 12,
        cancel_rounds: 50,
        ..BASE.family_torture
    },
    rw_exclusion: (5, 12, 4),
    semaphore_bound: (5, 3, 12),
    // A lease is the session: at least the servers' `minSessionTimeout` (1 s).
    lease_ttl: Duration::from_secs(2),
    force_ttl: None,
    ..BASE
};

matrix! {
    #[cfg(feature = "memory")]
    memory: server::memory::env, Sizes {
        contend: (16, 50, Duration::from_micros(200)),
        fifo: 10,
        torture: Torture { holder_rounds: 60, ..BASE.torture },
        drops: Torture { cancel_rounds: 400, unit: Duration::from_micros(150), ..BASE.drops },
        family_torture: Torture {
            holder_rounds: 60,
            cancel_rounds: 120,
            unit: Duration::from_micros(3),
            ..BASE.family_torture
        },
        rw_exclusion: (6, 40, 4),
        semaphore_bound: (6, 3, 40),
        lease_ttl: Duration::from_millis(600),
        ..BASE
    }, [mutex, rw, semaphore, lease, election];

    #[cfg(feature = "redis")]
    redis: server::redis::env, Sizes { fifo: 64, ..BASE },
        [mutex, rw, semaphore, lease, election];

    #[cfg(feature = "redis-cluster")]
    redis_cluster: server::cluster::env, Sizes {
        drops: Torture { cancel_rounds: 100, unit: Duration::from_millis(5), ..BASE.drops },
        ..REPLICATED
    }, [mutex, rw, semaphore, lease, election];

    #[cfg(feature = "redis-sentinel")]
    redis_sentinel: server::sentinel::env, Sizes { fifo: 8, ..REPLICATED },
        [mutex, rw, semaphore, lease, election];

    #[cfg(feature = "redlock")]
    redlock: server::redlock::env, Sizes {
        contend: (6, 20, Duration::from_micros(300)),
        fifo: 12,
        torture: Torture { holder_rounds: 15, cancel_rounds: 60, ..REPLICATED.torture },
        drops: Torture { cancel_rounds: 80, unit: Duration::from_millis(10), ..BASE.drops },
        family_torture: Torture {
            holders: 3,
            cancellers: 3,
            holder_rounds: 10,
            cancel_rounds: 60,
            unit: Duration::from_micros(20),
        },
        rw_exclusion: (6, 15, 4),
        lease_ttl: REPLICATED.lease_ttl,
        ..BASE
    }, [mutex, rw, lease, election] skip [semaphore];

    #[cfg(feature = "zookeeper")]
    zookeeper: server::zookeeper::env, ZOOKEEPER, [mutex, rw, semaphore, election] skip [lease];

    #[cfg(feature = "zookeeper")]
    zookeeper_ensemble: server::ensemble::env, Sizes {
        contend: (4, 15, Duration::from_millis(2)),
        torture: Torture { holder_rounds: 12, cancel_rounds: 50, ..ZOOKEEPER.torture },
        drops: Torture { cancel_rounds: 80, ..ZOOKEEPER.drops },
        family_torture: Torture { holder_rounds: 8, cancel_rounds: 40, ..ZOOKEEPER.family_torture },
        rw_exclusion: (4, 10, 3),
        rw_plan: &[false, true, false, false, true, false],
        semaphore_bound: (4, 2, 10),
        ..ZOOKEEPER
    }, [mutex, rw, semaphore, election] skip [lease];

    #[cfg(feature = "postgres")]
    postgres: server::postgres::env, Sizes {
        fifo: 32,
        torture: Torture { unit: Duration::from_micros(20), ..BASE.torture },
        drops: Torture { cancel_rounds: 120, unit: Duration::from_millis(10), ..BASE.drops },
        family_torture: Torture { holder_rounds: 30, cancel_rounds: 100, ..BASE.family_torture },
        ..BASE
    }, [mutex, rw, semaphore, lease, election];

    #[cfg(feature = "postgres")]
    pgbouncer: server::pgbouncer::env, Sizes {
        contend: (6, 15, Duration::from_micros(300)),
        torture: Torture {
            holder_rounds: 20,
            cancel_rounds: 60,
            unit: Duration::from_micros(20),
            ..BASE.torture
        },
        drops: Torture { cancel_rounds: 100, unit: Duration::from_millis(10), ..BASE.drops },
        family_torture: Torture { holder_rounds: 15, ..BASE.family_torture },
        rw_exclusion: (6, 15, 4),
        semaphore_bound: (6, 3, 15),
        ..BASE
    }, [mutex, rw, semaphore, lease, election];
}
