//! Metrics through the `metrics` crate facade (feature `metrics`; without it every call here
//! compiles to nothing). Labels are the backend (`memory`, `redis`, `zookeeper`, ...) and the
//! kind of hold (`mutex`, `read`, `write`, `leader`, `permits`), never the key: keys are
//! unbounded. The one exception is `distlock_leading`, labelled by the election's name:
//! elections are few and named by the operator, and "who leads `scheduler`" is what operators
//! alert on. Tracing events name the kind with the same words ([`kind_label`]).
//!
//! | name | type | labels | what |
//! |---|---|---|---|
//! | `distlock_acquisitions_total` | counter | backend, kind, outcome | every acquisition that ended: `granted`, `would_block`, `timeout`, `error` |
//! | `distlock_wait_seconds` | histogram | backend, kind | from the call to the grant, granted ones only |
//! | `distlock_hold_seconds` | histogram | backend, kind | from the grant to the release (explicit, `Drop` or shutdown) |
//! | `distlock_lost_total` | counter | backend, kind | claims marked lost (the server said so, the lease ran out, the session ended) |
//! | `distlock_renewal_seconds` | histogram | backend | one renewal call (a batch of leases) |
//! | `distlock_renewal_failures_total` | counter | backend | leases whose renewal call failed (retried until the lease runs out) |
//! | `distlock_locks_held` | gauge | backend, kind | guards that hold their lock now: up at the grant, down at the release or the loss |
//! | `distlock_leading` | gauge | backend, election | 1 while this process leads the election, 0 once it resigned or lost the lead |

use std::time::Duration;

use crate::backend::{Claim, LockKind};
use crate::error::Error;

/// Each metric's name, type, unit and description: the `# HELP` and unit an exporter shows.
#[cfg(feature = "metrics")]
pub(crate) fn describe() {
    use metrics::Unit;
    metrics::describe_counter!(
        "distlock_acquisitions_total",
        Unit::Count,
        "Acquisitions that ended, by outcome: granted, would_block, timeout or error."
    );
    metrics::describe_histogram!(
        "distlock_wait_seconds",
        Unit::Seconds,
        "Time from the call to the grant, for granted acquisitions."
    );
    metrics::describe_histogram!(
        "distlock_hold_seconds",
        Unit::Seconds,
        "Time from the grant to the release; a downgraded write hold counts its write part as write and the rest as read."
    );
    metrics::describe_counter!(
        "distlock_lost_total",
        Unit::Count,
        "Claims marked lost: renewal refused, lease run out, or session ended."
    );
    metrics::describe_histogram!(
        "distlock_renewal_seconds",
        Unit::Seconds,
        "Duration of one renewal call (a batch of leases)."
    );
    metrics::describe_counter!(
        "distlock_renewal_failures_total",
        Unit::Count,
        "Leases whose renewal call failed (retried until the lease runs out)."
    );
    metrics::describe_gauge!(
        "distlock_locks_held",
        Unit::Count,
        "Locks held now by this process's guards, by backend and kind; a lost lock no longer counts."
    );
    metrics::describe_gauge!(
        "distlock_leading",
        Unit::Count,
        "1 while this process leads the election (labelled by its name), 0 once it resigned or lost the lead."
    );
}

/// [`describe`] once per process, when the first client is made.
pub(crate) fn describe_once() {
    #[cfg(feature = "metrics")]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(describe);
    }
}

/// The kinds of hold in the `kind` label, in the order of [`kind_index`].
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
const KINDS: [&str; 5] = ["mutex", "read", "write", "leader", "permits"];

/// The outcomes of an acquisition in the `outcome` label, in the order of [`outcome_index`].
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
const OUTCOMES: [&str; 4] = ["granted", "would_block", "timeout", "error"];

/// Where `kind`'s label is in [`KINDS`].
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
fn kind_index(kind: LockKind) -> usize {
    match kind {
        LockKind::Exclusive => 0,
        LockKind::Read => 1,
        LockKind::Write => 2,
        LockKind::Leader => 3,
        _ => 4,
    }
}

/// The `kind` label, and how tracing events name a kind of hold.
pub(crate) fn kind_label(kind: LockKind) -> &'static str {
    KINDS.get(kind_index(kind)).copied().unwrap_or("permits")
}

/// Where the `outcome` label of an acquisition that ended with `error` (none: granted) is in
/// [`OUTCOMES`].
#[cfg(feature = "metrics")]
fn outcome_index(error: Option<&Error>) -> usize {
    match error {
        None => 0,
        Some(e) if e.is_would_block() => 1,
        Some(e) if e.is_timeout() => 2,
        Some(_) => 3,
    }
}

/// What the macros' call sites would say of our metrics (their target and level).
#[cfg(feature = "metrics")]
static METADATA: metrics::Metadata<'static> =
    metrics::Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));

/// One client's keys of the metrics recorded at every lock, made once: building a key (its
/// labels and their hash) at each call cost about 1,100 instructions a lock. They
/// are registered with the recorder in use at each call, as the macros do, so a recorder
/// installed after the client was built (or one set for a scope) still gets every value.
pub(crate) struct Keys {
    #[cfg(feature = "metrics")]
    backend: &'static str,
    #[cfg(feature = "metrics")]
    acquisitions: Vec<metrics::Key>,
    #[cfg(feature = "metrics")]
    waits: Vec<metrics::Key>,
    #[cfg(feature = "metrics")]
    holds: Vec<metrics::Key>,
    /// `distlock_locks_held`, by kind.
    #[cfg(feature = "metrics")]
    held: Vec<metrics::Key>,
}

impl Keys {
    /// The keys of `backend`'s metrics.
    pub(crate) fn new(backend: &'static str) -> Self {
        #[cfg(feature = "metrics")]
        {
            use metrics::{Key, Label};
            let labels =
                |kind: &'static str| vec![Label::new("backend", backend), Label::new("kind", kind)];
            let acquisitions = (KINDS.iter())
                .flat_map(|kind| OUTCOMES.iter().map(move |outcome| (kind, outcome)))
                .map(|(kind, outcome)| {
                    let mut labels = labels(kind);
                    labels.push(Label::new("outcome", *outcome));
                    Key::from_parts("distlock_acquisitions_total", labels)
                })
                .collect();
            let each_kind = |name: &'static str| {
                (KINDS.iter())
                    .map(|kind| Key::from_parts(name, labels(kind)))
                    .collect()
            };
            Self {
                backend,
                acquisitions,
                waits: each_kind("distlock_wait_seconds"),
                holds: each_kind("distlock_hold_seconds"),
                held: each_kind("distlock_locks_held"),
            }
        }
        #[cfg(not(feature = "metrics"))]
        {
            let _ = backend;
            Self {}
        }
    }
}

/// An acquisition ended: granted after `waited`, or failed with `error`.
pub(crate) fn acquired(keys: &Keys, kind: LockKind, waited: Duration, error: Option<&Error>) {
    #[cfg(feature = "metrics")]
    {
        let kind = kind_index(kind);
        let counted = keys
            .acquisitions
            .get(kind * OUTCOMES.len() + outcome_index(error));
        let wait = keys.waits.get(kind).filter(|_| error.is_none());
        metrics::with_recorder(|recorder| {
            if let Some(key) = counted {
                recorder.register_counter(key, &METADATA).increment(1);
            }
            if let Some(key) = wait {
                recorder
                    .register_histogram(key, &METADATA)
                    .record(waited.as_secs_f64());
            }
        });
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (keys, kind, waited, error);
}

/// A held lease ended after `held`.
pub(crate) fn released(keys: &Keys, kind: LockKind, held: Duration) {
    #[cfg(feature = "metrics")]
    if let Some(key) = keys.holds.get(kind_index(kind)) {
        metrics::with_recorder(|recorder| {
            recorder
                .register_histogram(key, &METADATA)
                .record(held.as_secs_f64());
        });
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (keys, kind, held);
}

/// A claim was marked lost.
pub(crate) fn lost(backend: &'static str, kind: LockKind) {
    #[cfg(feature = "metrics")]
    metrics::counter!("distlock_lost_total", "backend" => backend, "kind" => kind_label(kind))
        .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (backend, kind);
}

/// A renewal call returned after `took`, with `failed` of its leases not renewed for want of
/// an answer.
pub(crate) fn renewed(backend: &'static str, took: Duration, failed: usize) {
    #[cfg(feature = "metrics")]
    {
        metrics::histogram!("distlock_renewal_seconds", "backend" => backend)
            .record(took.as_secs_f64());
        if failed > 0 {
            metrics::counter!("distlock_renewal_failures_total", "backend" => backend)
                .increment(failed as u64);
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (backend, took, failed);
}

/// The gauges one held claim counts in: the handles its grant incremented, which its release
/// or loss decrements (from whichever thread, into the recorder that got the increment).
#[cfg(feature = "metrics")]
pub(crate) struct Counted {
    /// `distlock_locks_held` of its kind.
    held: metrics::Gauge,
    /// `distlock_leading` of its election, a leader's.
    leading: Option<metrics::Gauge>,
}

/// `claim`'s guard exists: it counts in `distlock_locks_held` (and, a leader's, in
/// `distlock_leading`) until its release or its loss, whichever comes first.
pub(crate) fn held(keys: &Keys, claim: &Claim) {
    #[cfg(feature = "metrics")]
    {
        let Some(key) = keys.held.get(kind_index(claim.kind())) else {
            return;
        };
        let held = metrics::with_recorder(|r| r.register_gauge(key, &METADATA));
        // Labelled by the election's name: elections are few and named by the operator.
        let leading = (claim.kind() == LockKind::Leader).then(|| {
            metrics::gauge!(
                "distlock_leading",
                "backend" => keys.backend,
                "election" => claim.key().to_owned()
            )
        });
        held.increment(1.0);
        if let Some(leading) = &leading {
            leading.increment(1.0);
        }
        *lock(claim.gauges()) = Some(Counted { held, leading });
        // Lost before it was counted: the loss found nothing to take out.
        if claim.is_lost() {
            unheld(claim.gauges());
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (keys, claim);
}

/// A claim holds no more (released, or lost): out of the gauges, if it still counted there.
#[cfg(feature = "metrics")]
pub(crate) fn unheld(gauges: &std::sync::Mutex<Option<Counted>>) {
    let taken = lock(gauges).take();
    if let Some(counted) = taken {
        counted.held.decrement(1.0);
        if let Some(leading) = counted.leading {
            leading.decrement(1.0);
        }
    }
}

/// `claim`, a write hold, became a read hold: it counts as one from now. Under the claim's
/// lock, so that a loss meanwhile takes out one or the other, never a read not yet counted.
pub(crate) fn downgraded(keys: &Keys, claim: &Claim) {
    #[cfg(feature = "metrics")]
    {
        let Some(key) = keys.held.get(kind_index(LockKind::Read)) else {
            return;
        };
        // Still counted (not lost meanwhile): as a read hold from now.
        if let Some(c) = lock(claim.gauges()).as_mut() {
            let read = metrics::with_recorder(|r| r.register_gauge(key, &METADATA));
            read.increment(1.0);
            c.held.decrement(1.0);
            c.held = read;
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (keys, claim);
}

/// The gauges' lock, whatever a panic elsewhere left in it (a count, nothing more).
#[cfg(feature = "metrics")]
fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
