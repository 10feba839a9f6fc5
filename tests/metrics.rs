//! The metrics a scripted run records (feature `metrics`), read back from `metrics-util`'s
//! debugging recorder: acquisitions by outcome, wait and hold histograms, losses, renewals.
#![cfg(all(feature = "metrics", feature = "memory"))]

use std::sync::OnceLock;
use std::time::Duration;

use distlock::backend::MemoryBackend;
use distlock::LockClient;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::{CompositeKey, MetricKind};

/// One snapshot, taken once: taking it drains the histograms.
type Seen = Vec<(
    CompositeKey,
    Option<metrics::Unit>,
    Option<metrics::SharedString>,
    DebugValue,
)>;

/// The value of the `kind` metric `name` whose labels include every `labels` pair.
fn find<'a>(
    snap: &'a Seen,
    kind: MetricKind,
    name: &str,
    labels: &[(&str, &str)],
) -> Vec<&'a DebugValue> {
    snap.iter()
        .filter(|(key, ..)| {
            key.kind() == kind
                && key.key().name() == name
                && labels
                    .iter()
                    .all(|(k, v)| key.key().labels().any(|l| l.key() == *k && l.value() == *v))
        })
        .map(|(.., value)| value)
        .collect()
}

fn counter(snap: &Seen, name: &str, labels: &[(&str, &str)]) -> u64 {
    find(snap, MetricKind::Counter, name, labels)
        .into_iter()
        .map(|v| match v {
            DebugValue::Counter(n) => *n,
            other => panic!("{name} is not a counter: {other:?}"),
        })
        .sum()
}

fn samples(snap: &Seen, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
    find(snap, MetricKind::Histogram, name, labels)
        .into_iter()
        .flat_map(|v| match v {
            DebugValue::Histogram(s) => s.iter().map(|x| x.into_inner()).collect::<Vec<_>>(),
            other => panic!("{name} is not a histogram: {other:?}"),
        })
        .collect()
}

/// This test binary's global recorder, installed by whichever test comes first. The metrics'
/// descriptions go once, at the first client built, to the recorder of that thread: a test
/// that sets a recorder for its thread only before its first client would take them from the
/// global one, so they are given to it here too, as an application does after installing an
/// exporter late (`describe_metrics`).
fn global() -> &'static Snapshotter {
    static GLOBAL: OnceLock<Snapshotter> = OnceLock::new();
    GLOBAL.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("the only recorder of this test binary");
        distlock::describe_metrics();
        snapshotter
    })
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_scripted_run_records_what_happened() {
    let snapshotter = global();

    let backend = MemoryBackend::new();
    let client = LockClient::builder(backend.clone())
        .ttl(Duration::from_secs(3))
        .build()
        .unwrap();
    let mutex = client.mutex("k");
    for _ in 0..3 {
        let g = mutex.lock().await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        g.release().await.unwrap();
    }
    // Held past two renewals (every TTL/3).
    let g = mutex.lock().await.unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let other = LockClient::builder(backend.clone()).build().unwrap();
    assert!(other
        .mutex("k")
        .try_lock()
        .await
        .unwrap_err()
        .is_would_block());
    let waited = other
        .mutex("k")
        .lock_timeout(Duration::from_millis(200))
        .await
        .unwrap_err();
    assert!(waited.is_timeout());
    drop(g);
    // A lease nobody renews runs out: lost.
    let stale = LockClient::builder(backend.clone())
        .ttl(Duration::from_millis(300))
        .auto_renew(false)
        .build()
        .unwrap();
    let r = stale.rw_lock("r").read().await.unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(r.is_lost());
    drop(r);
    // A write hold downgraded after 100 ms and released 300 ms later: a write hold of 0.1 s
    // and a read hold of 0.3 s.
    let w = client.rw_lock("d").write().await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let r = w.downgrade().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    r.release().await.unwrap();
    for c in [client, other, stale] {
        c.shutdown().await;
    }

    let snap = snapshotter.snapshot().into_vec();
    let mutex_labels = [("backend", "memory"), ("kind", "mutex")];
    let granted = [
        ("backend", "memory"),
        ("kind", "mutex"),
        ("outcome", "granted"),
    ];
    assert_eq!(counter(&snap, "distlock_acquisitions_total", &granted), 4);
    let busy = [("kind", "mutex"), ("outcome", "would_block")];
    assert_eq!(counter(&snap, "distlock_acquisitions_total", &busy), 1);
    let late = [("kind", "mutex"), ("outcome", "timeout")];
    assert_eq!(counter(&snap, "distlock_acquisitions_total", &late), 1);
    assert_eq!(
        samples(&snap, "distlock_wait_seconds", &mutex_labels).len(),
        4
    );
    let holds = samples(&snap, "distlock_hold_seconds", &mutex_labels);
    assert_eq!(holds.len(), 4, "{holds:?}");
    assert!(
        holds.iter().filter(|h| (0.099..0.2).contains(*h)).count() == 3,
        "{holds:?}"
    );
    assert_eq!(
        counter(&snap, "distlock_lost_total", &[("kind", "read")]),
        1
    );
    assert_eq!(
        counter(&snap, "distlock_lost_total", &[("kind", "mutex")]),
        0
    );
    let writes = samples(&snap, "distlock_hold_seconds", &[("kind", "write")]);
    assert!(
        writes.len() == 1 && (0.099..0.15).contains(&writes[0]),
        "the write part of a downgraded hold: {writes:?}"
    );
    let reads = samples(&snap, "distlock_hold_seconds", &[("kind", "read")]);
    assert!(
        reads.iter().any(|h| (0.299..0.35).contains(h)),
        "the read part of a downgraded hold: {reads:?}"
    );
    // Every metric comes with its unit and help text (an exporter's `# HELP` line).
    for (key, unit, help, _) in &snap {
        let name = key.key().name();
        assert!(help.is_some(), "{name} has no description");
        let want = if name.ends_with("_seconds") {
            metrics::Unit::Seconds
        } else {
            metrics::Unit::Count
        };
        assert_eq!(*unit, Some(want), "{name}");
    }
    let renewals = samples(&snap, "distlock_renewal_seconds", &[("backend", "memory")]);
    assert!(renewals.len() >= 2, "{renewals:?}");
    assert_eq!(counter(&snap, "distlock_renewal_failures_total", &[]), 0);
}

/// The metrics go to the recorder in use when they are recorded, not to the one in use when the
/// client was built: a recorder set for this thread after the client exists gets every value.
#[tokio::test(flavor = "current_thread")]
async fn a_recorder_set_after_the_client_was_built_gets_its_values() {
    global();
    let client = LockClient::builder(MemoryBackend::new()).build().unwrap();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    for _ in 0..2 {
        client
            .mutex("late")
            .lock()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    let w = client.rw_lock("late-rw").write().await.unwrap();
    w.release().await.unwrap();
    let snap = snapshotter.snapshot().into_vec();
    let granted = [("kind", "mutex"), ("outcome", "granted")];
    assert_eq!(counter(&snap, "distlock_acquisitions_total", &granted), 2);
    let write = [("kind", "write"), ("outcome", "granted")];
    assert_eq!(counter(&snap, "distlock_acquisitions_total", &write), 1);
    let holds = samples(&snap, "distlock_hold_seconds", &[("kind", "mutex")]);
    assert_eq!(holds.len(), 2, "{holds:?}");
    let waits = samples(
        &snap,
        "distlock_wait_seconds",
        &[("backend", "memory"), ("kind", "write")],
    );
    assert_eq!(waits.len(), 1, "{waits:?}");
    drop(_local);
    client.shutdown().await;
}

/// A lease that `shutdown` releases (its guard still alive) ends its hold like any other: one
/// `distlock_hold_seconds` sample per hold, none more once the guard is dropped (before, a hold
/// ended by shutdown was never recorded).
#[tokio::test(flavor = "current_thread")]
async fn a_hold_ended_by_shutdown_is_recorded_once() {
    global();
    let client = LockClient::builder(MemoryBackend::new()).build().unwrap();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let held = client.mutex("kept").lock().await.unwrap();
    let read = client.rw_lock("kept-rw").read().await.unwrap();
    client.shutdown().await;
    assert!(held.is_lost() && read.is_lost());
    drop((held, read));
    tokio::task::yield_now().await;
    let snap = snapshotter.snapshot().into_vec();
    let holds = samples(&snap, "distlock_hold_seconds", &[("kind", "mutex")]);
    assert_eq!(holds.len(), 1, "{holds:?}");
    let reads = samples(&snap, "distlock_hold_seconds", &[("kind", "read")]);
    assert_eq!(reads.len(), 1, "{reads:?}");
}

/// The sum of the gauge `name`'s values whose labels include every `labels` pair.
fn gauge(snap: &Seen, name: &str, labels: &[(&str, &str)]) -> f64 {
    find(snap, MetricKind::Gauge, name, labels)
        .into_iter()
        .map(|v| match v {
            DebugValue::Gauge(g) => g.into_inner(),
            other => panic!("{name} is not a gauge: {other:?}"),
        })
        .sum()
}

/// `distlock_locks_held` counts the guards that hold now, by kind: up at the grant, moved by a
/// downgrade, down at the release and at the loss (before the lost guard is dropped);
/// `distlock_leading` is 1 for the election this process leads and 0 once it resigned.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_held_and_leading_gauges_follow_grants_releases_and_losses() {
    global();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let backend = MemoryBackend::new();
    let client = LockClient::builder(backend.clone()).build().unwrap();
    // A snapshot drains each gauge to zero: the sum of the snapshots is the gauge.
    let seen = std::cell::RefCell::new(Vec::new());
    let value = |name: &str, labels: &[(&str, &str)]| {
        seen.borrow_mut().extend(snapshotter.snapshot().into_vec());
        gauge(&seen.borrow(), name, labels)
    };
    let held = |kind| {
        value(
            "distlock_locks_held",
            &[("backend", "memory"), ("kind", kind)],
        )
    };
    let leading = |name| value("distlock_leading", &[("election", name)]);

    let m = client.mutex("g").lock().await.unwrap();
    let r = client.rw_lock("g-rw").read().await.unwrap();
    assert_eq!((held("mutex"), held("read")), (1.0, 1.0));
    let w = client.rw_lock("g-w").write().await.unwrap();
    assert_eq!(held("write"), 1.0);
    let downgraded = w.downgrade().await.unwrap();
    assert_eq!((held("write"), held("read")), (0.0, 2.0));
    m.release().await.unwrap();
    drop((r, downgraded));
    tokio::task::yield_now().await;
    assert_eq!((held("mutex"), held("read")), (0.0, 0.0));

    // A lease nobody renews runs out: it stops counting when it is lost, not when its guard goes.
    let stale = LockClient::builder(backend.clone())
        .ttl(Duration::from_millis(300))
        .auto_renew(false)
        .build()
        .unwrap();
    let lost = stale.mutex("g-lost").lock().await.unwrap();
    assert_eq!(held("mutex"), 1.0);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(lost.is_lost());
    assert_eq!(held("mutex"), 0.0);
    drop(lost);
    tokio::task::yield_now().await;
    assert_eq!(
        held("mutex"),
        0.0,
        "a lost guard dropped is not taken out twice"
    );

    let leadership = client.election("scheduler").campaign("me").await.unwrap();
    assert_eq!((leading("scheduler"), held("leader")), (1.0, 1.0));
    leadership.resign().await.unwrap();
    assert_eq!((leading("scheduler"), held("leader")), (0.0, 0.0));
    drop(_local);
    for c in [client, stale] {
        c.shutdown().await;
    }
}

/// A hold's gauge goes down in the recorder that counted it up, whichever thread learns of the
/// loss: with a recorder set for the test's thread only, a lease that runs out on a worker
/// thread of the runtime still brings `distlock_locks_held` back to 0 there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loss_seen_on_another_thread_leaves_the_gauge_where_it_was_counted() {
    global();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let client = LockClient::builder(MemoryBackend::new())
        .ttl(Duration::from_millis(200))
        .auto_renew(false)
        .build()
        .unwrap();
    let guard = client.mutex("elsewhere").lock().await.unwrap();
    let counted = snapshotter.snapshot().into_vec();
    let mutex = [("backend", "memory"), ("kind", "mutex")];
    assert_eq!(gauge(&counted, "distlock_locks_held", &mutex), 1.0);
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("the lease never ran out");
    drop(guard);
    client.shutdown().await;
    // A snapshot drains each gauge: this one holds what changed since the last.
    let taken_out = snapshotter.snapshot().into_vec();
    assert_eq!(
        gauge(&taken_out, "distlock_locks_held", &mutex),
        -1.0,
        "the loss went to another recorder than the grant"
    );
}
