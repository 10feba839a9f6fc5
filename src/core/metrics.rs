//! Metrics through the `metrics` crate facade (feature `metrics`; without it every call here
//! compiles to nothing). Labels are the backend (`memory`, `redis`, `zookeeper`, ...) and the
//! kind of hold (`mutex`, `read`, `write`, `permits`), never the key: keys are unbounded.
//!
//! | name | type | labels | what |
//! |---|---|---|---|
//! | `distlock_acquisitions_total` | counter | backend, kind, outcome | every acquisition that ended: `granted`, `would_block`, `timeout`, `error` |
//! | `distlock_wait_seconds` | histogram | backend, kind | from the call to the grant, granted ones only |
//! | `distlock_hold_seconds` | histogram | backend, kind | from the grant to the release (explicit, `Drop` or shutdown) |
//! | `distlock_lost_total` | counter | backend, kind | claims marked lost (the server said so, the lease ran out, the session ended) |
//! | `distlock_renewal_seconds` | histogram | backend | one renewal call (a batch of leases) |
//! | `distlock_renewal_failures_total` | counter | backend | leases whose renewal call failed (retried until the lease runs out) |

use std::time::Duration;

use crate::backend::LockKind;
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
}

/// [`describe`] once per process, when the first client is made.
pub(crate) fn describe_once() {
    #[cfg(feature = "metrics")]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(describe);
    }
}

/// The `kind` label.
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
fn kind_label(kind: LockKind) -> &'static str {
    match kind {
        LockKind::Exclusive => "mutex",
        LockKind::Read => "read",
        LockKind::Write => "write",
        LockKind::Leader => "leader",
        _ => "permits",
    }
}

/// The `outcome` label of an acquisition that failed.
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
fn outcome_of(error: &Error) -> &'static str {
    if error.is_would_block() {
        "would_block"
    } else if error.is_timeout() {
        "timeout"
    } else {
        "error"
    }
}

/// An acquisition ended: granted after `waited`, or failed with `error`.
pub(crate) fn acquired(
    backend: &'static str,
    kind: LockKind,
    waited: Duration,
    error: Option<&Error>,
) {
    #[cfg(feature = "metrics")]
    {
        let kind = kind_label(kind);
        let outcome = error.map_or("granted", outcome_of);
        metrics::counter!("distlock_acquisitions_total", "backend" => backend, "kind" => kind, "outcome" => outcome)
            .increment(1);
        if error.is_none() {
            metrics::histogram!("distlock_wait_seconds", "backend" => backend, "kind" => kind)
                .record(waited.as_secs_f64());
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (backend, kind, waited, error);
}

/// A held lease ended after `held`.
pub(crate) fn released(backend: &'static str, kind: LockKind, held: Duration) {
    #[cfg(feature = "metrics")]
    metrics::histogram!("distlock_hold_seconds", "backend" => backend, "kind" => kind_label(kind))
        .record(held.as_secs_f64());
    #[cfg(not(feature = "metrics"))]
    let _ = (backend, kind, held);
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
