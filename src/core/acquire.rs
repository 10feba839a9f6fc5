//! The acquisition loop every lock type shares: ask, wait for a notification, ask again.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use tokio::runtime::Handle;
use tracing::Instrument;

use super::held::Held;
use super::lease::Lease;
use super::rules::{deadline_after, validate_key, validate_kind, validate_ttl};
use super::Core;
use crate::backend::{Attempt, Claim, DynBackend, Grant, LockKind};
use crate::error::{Error, Result};

/// A named lock as a primitive sees it: the client's core, the key, and a lease length of its
/// own if it has one. Cheap to clone; no I/O until acquired.
#[derive(Clone)]
pub(crate) struct Target {
    pub(crate) core: Arc<Core>,
    pub(crate) key: Arc<str>,
    pub(crate) ttl: Option<Duration>,
    /// What a leadership claim proclaims ([`LockKind::Leader`]).
    pub(crate) value: Option<Arc<[u8]>>,
}

impl Target {
    pub(crate) fn new(core: Arc<Core>, key: impl Into<Arc<str>>) -> Self {
        Self {
            core,
            key: key.into(),
            ttl: None,
            value: None,
        }
    }

    /// The same target, for a claim that proclaims `value`.
    pub(crate) fn with_value(&self, value: Arc<[u8]>) -> Self {
        Self {
            value: Some(value),
            ..self.clone()
        }
    }

    /// The lease length: the target's own, or the client's.
    pub(crate) fn ttl(&self) -> Duration {
        self.ttl.unwrap_or(self.core.config.ttl)
    }

    /// Acquires the lock as `kind`, waiting or not as `mode` says.
    pub(crate) fn acquire(
        &self,
        kind: LockKind,
        mode: Mode,
    ) -> impl Future<Output = Result<Held>> + Send + 'static {
        self.acquire_until(kind, mode, None)
    }

    /// Acquires the lock as `kind`, waiting at most `timeout`.
    pub(crate) fn acquire_timeout(
        &self,
        kind: LockKind,
        timeout: Duration,
    ) -> impl Future<Output = Result<Held>> + Send + 'static {
        self.acquire_until(kind, Mode::Wait, deadline_after(timeout))
    }

    /// Acquires the lock as `kind`, as `mode` says, giving up with a timeout error at
    /// `deadline` if one is set.
    pub(crate) fn acquire_until(
        &self,
        kind: LockKind,
        mode: Mode,
        deadline: Option<tokio::time::Instant>,
    ) -> impl Future<Output = Result<Held>> + Send + 'static {
        let (core, key) = (self.core.clone(), self.key.clone());
        let (ttl, value) = (self.ttl(), self.value.clone());
        // The kind in the metrics' words (`mutex`, `read`, …), not LockKind's Debug.
        let label = super::metrics::kind_label(kind);
        let span = tracing::debug_span!("distlock.acquire", key = %key, kind = label);
        async move {
            let started = std::time::Instant::now();
            // Made here, not captured: a future captured, then awaited, is stored twice.
            let acquire = acquire(core.clone(), key.clone(), ttl, (kind, value), mode);
            let outcome = match deadline {
                Some(at) => tokio::time::timeout_at(at, acquire)
                    .await
                    .unwrap_or_else(|_| Err(Error::timeout(&key))),
                None => acquire.await,
            };
            let waited = started.elapsed();
            super::metrics::acquired(&core.metrics, kind, waited, outcome.as_ref().err());
            match &outcome {
                Ok(held) => {
                    tracing::debug!(fence = held.fencing_token(), ?waited, "lock granted");
                }
                Err(e) => tracing::debug!(error = %e, ?waited, "lock not granted"),
            }
            outcome
        }
        .instrument(span)
    }
}

/// The first and the longest pause between re-checks while the backend is unreachable.
const MIN_OUTAGE_PAUSE: Duration = Duration::from_millis(50);
const MAX_OUTAGE_PAUSE: Duration = Duration::from_secs(2);

/// Whether to queue for the lock or give up if it is not free now.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Wait,
    Try,
}

/// Acquires `key` for `client`, waiting (in FIFO order, on notifications) if `mode` says so.
///
/// Cancel safety: from the moment the claim exists until the `Held` is built, a drop guard owns
/// the claim; dropping this future anywhere spawns a release that removes its queue entry and
/// any grant that raced with the drop. Dropped during an acquire call, the call is not dropped
/// with it: the spawned task drives it to its end (reply or failure) before the release is
/// sent, so the release is ordered after the acquire on the server whatever connection each
/// goes out on (a pool hands the release another connection).
pub(crate) async fn acquire(
    client: Arc<Core>,
    key: Arc<str>,
    ttl: Duration,
    (kind, value): (LockKind, Option<Arc<[u8]>>),
    mode: Mode,
) -> Result<Held> {
    client.check_open()?;
    validate_key(&key)?;
    client.backend.validate_key(&key)?;
    validate_ttl(ttl)?;
    validate_kind(kind)?;
    if !client.backend.supports(kind) {
        return Err(Error::unsupported(format_args!(
            "this backend does not support {} (asked for `{key}`)",
            kind.family()
        )));
    }
    // The wait's timers are the caller's runtime's.
    Handle::try_current().map_err(|_| Error::no_runtime())?;
    let engine = client.engine()?.clone();
    let backend = client.backend.clone();
    let mut closed = client.closed();

    let mut claim = Claim::new(
        client.config.namespace.clone(),
        key,
        ttl,
        kind,
        client.backend.name(),
        client.owners.next(),
    );
    if let Some(value) = value {
        claim = claim.with_value(value);
    }
    let lease = Arc::new(Lease::new(
        client.ids.next(),
        claim,
        backend.new_ticket(),
        client.config.drift,
    ));
    let wait = mode == Mode::Wait;
    if wait && backend.renews_waiters() {
        engine.track(&lease);
    }

    // Until disarmed, dropping this (on cancellation or on an error return) releases the claim,
    // once the backend call still out for it, if any, has ended.
    let mut cleanup = scopeguard::guard(
        Unsettled {
            lease: lease.clone(),
            in_flight: None,
        },
        |unsettled| {
            client.spawn_release_after(unsettled.lease, unsettled.in_flight);
        },
    );

    let mut outage = Duration::ZERO;
    let mut attempt = match call(&mut cleanup.in_flight, acquire_call(&backend, &lease, wait)).await
    {
        Ok(attempt) => attempt,
        // Only a first contact that finds no server fails at once; a claim that reached the
        // queue before the outage cut its first call short rides it out like a queued one.
        Err(e) if wait && e.is_transient() && backend.has_queued(&lease.ticket) => {
            outage = MIN_OUTAGE_PAUSE;
            tracing::warn!(key = lease.claim.key(), error = %e, pause = ?outage, "lock wait: backend unavailable, retrying");
            Attempt::Queued {
                recheck_at: Some(tokio::time::Instant::now() + outage),
            }
        }
        Err(e) => return Err(e),
    };
    let grant = loop {
        match attempt {
            Attempt::Granted(grant) if !nearly_over(&grant, ttl, client.config.drift) => {
                break grant
            }
            // A reply that came too late to trust (its lease, counted from when the call was
            // sent, is nearly over): ask again, as for a late notification. The server
            // confirms a grant still ours with a fresh lease, or queues the claim (a try is
            // told the lock is busy) behind whoever took the key once that lease ended.
            Attempt::Granted(_) => {
                tracing::debug!(
                    key = lease.claim.key(),
                    "a grant came back too late to trust; asking again"
                );
                let next = call(&mut cleanup.in_flight, acquire_call(&backend, &lease, wait)).await;
                attempt = ride_out(next, wait, &mut outage, lease.claim.key())?;
            }
            Attempt::Queued { .. } if !wait => {
                // A try that found the lock busy leaves nothing behind: no release needed.
                scopeguard::ScopeGuard::into_inner(cleanup).lease.finish();
                return Err(Error::would_block(lease.claim.key()));
            }
            Attempt::Queued { recheck_at } => {
                // Boxed: most locks never wait, and this would make every lock's future larger.
                let woke = Box::pin(async { tokio::select! {
                    woke = backend.wait(&lease.claim, &lease.ticket, recheck_at) => woke,
                    // A queue renewal found the claim holding the lock (its grant message was
                    // lost): ask the server, which confirms it.
                    () = lease.granted_by_renewal() => {
                        tracing::debug!(key = lease.claim.key(), "a renewal found the claim granted");
                        Ok(None)
                    }
                    _ = closed.wait_for(|closed| *closed) => Err(Error::closed()),
                    () = engine.gone() => Err(if client.is_closed() { Error::closed() } else { Error::runtime_gone() }),
                }}).await;
                let next = match woke {
                    Ok(Some(grant)) if !nearly_over(&grant, ttl, client.config.drift) => {
                        Ok(Attempt::Granted(grant))
                    }
                    // Announced too late to trust (or no notification proved a grant): ask the
                    // server, which confirms a grant that is ours with a fresh lease.
                    Ok(_) => {
                        call(&mut cleanup.in_flight, acquire_call(&backend, &lease, true)).await
                    }
                    Err(e) => Err(e),
                };
                attempt = ride_out(next, wait, &mut outage, lease.claim.key())?;
            }
        }
    };

    lease.set_held(grant);
    engine.track(&lease);
    let lease = scopeguard::ScopeGuard::into_inner(cleanup).lease;
    Ok(Held::new(client, lease))
}

/// What a waiting claim makes of its latest call: the attempt (the outage over), or, for a
/// transient failure, a place in the queue to ask from again after a growing pause. A queued
/// claim rides out a passing outage (a restart, a dropped connection): it asks again after the
/// pause, or sooner when the backend wakes it (reconnected); `lock_timeout` bounds the whole
/// wait. A try (`wait` false), and any other failure, ends with the error.
fn ride_out(
    next: Result<Attempt>,
    wait: bool,
    outage: &mut Duration,
    key: &str,
) -> Result<Attempt> {
    match next {
        Ok(attempt) => {
            *outage = Duration::ZERO;
            Ok(attempt)
        }
        Err(e) if wait && e.is_transient() => {
            *outage = (*outage * 2).clamp(MIN_OUTAGE_PAUSE, MAX_OUTAGE_PAUSE);
            tracing::warn!(key, error = %e, pause = ?*outage, "lock wait: backend unavailable, retrying");
            Ok(Attempt::Queued {
                recheck_at: Some(tokio::time::Instant::now() + *outage),
            })
        }
        Err(e) => Err(e),
    }
}

/// One [`Backend::acquire`](crate::backend::Backend::acquire) call, owning what it needs, so it
/// can outlive the acquisition that made it.
pub(crate) type AcquireCall = BoxFuture<'static, Result<Attempt>>;

fn acquire_call(backend: &Arc<dyn DynBackend>, lease: &Arc<Lease>, wait: bool) -> AcquireCall {
    let (backend, lease) = (backend.clone(), lease.clone());
    Box::pin(async move { backend.acquire(&lease.claim, &lease.ticket, wait).await })
}

/// A claim between its first backend call and its `Held`, and the acquire call out for it.
struct Unsettled {
    lease: Arc<Lease>,
    /// The acquire call being awaited, if any. If the acquisition is dropped while one is out,
    /// the release waits for it to end: its request may still be on its way to the server (on
    /// a pooled connection the release would not queue behind, or being retried after a
    /// dropped connection), and a release that overtook it would find nothing, leaving the
    /// late acquire to take the lock for no one until its lease ran out.
    in_flight: Option<AcquireCall>,
}

/// Runs `call` from `slot`, where a cancellation leaves it for the cleanup to finish. A call
/// that panics has ended too: it leaves the slot before the panic goes on, so the cleanup
/// releases the claim at once instead of polling a future that can only panic again.
async fn call(slot: &mut Option<AcquireCall>, call: AcquireCall) -> Result<Attempt> {
    let polled = AssertUnwindSafe(slot.insert(call)).catch_unwind().await;
    *slot = None;
    polled.unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// Whether a grant learned from a notification leaves too little lease to be worth returning:
/// less than a first renewal needs once the drift margin is taken off.
fn nearly_over(grant: &Grant, ttl: Duration, drift: fn(Duration) -> Duration) -> bool {
    let now = tokio::time::Instant::now();
    let span = grant.valid_until.saturating_duration_since(now);
    let usable = span.saturating_sub(drift(span));
    usable < (ttl / 3).min(Duration::from_millis(100))
}
