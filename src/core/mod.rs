//! The acquisition core, written once for every primitive: the wait loop ([`acquire`]), leases
//! ([`lease`]), what a guard holds and the count of releases in flight ([`held`]), the renewal
//! engine ([`renewal`]), release on drop (here), and the rules every input is checked against
//! before any I/O ([`rules`]).
//!
//! Dependencies run one way: the client makes primitives, primitives call into this core, and
//! the core calls the backend. Nothing here knows the client or the primitives.

pub(crate) mod acquire;
pub(crate) mod blocking;
pub(crate) mod follow;
pub(crate) mod guard;
pub(crate) mod held;
pub(crate) mod lease;
pub(crate) mod metrics;
pub(crate) mod renewal;
pub(crate) mod rules;

use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use tokio::runtime::{Handle, Id as RuntimeId, RuntimeFlavor};
use tokio::sync::{oneshot, watch};

use crate::backend::{DynBackend, Owners};
use crate::error::{Error, Result};

use self::acquire::AcquireCall;
use self::held::Pending;
use self::lease::{Lease, LeaseIds};
use self::renewal::{Engine, EngineConfig};
use crate::sync::LockExt;

/// The least and the most time a release waits for the acquire call it follows.
const IN_FLIGHT_MIN: Duration = Duration::from_secs(5);
const IN_FLIGHT_MAX: Duration = Duration::from_secs(60);

/// Settings shared by every lock of a client.
#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) namespace: Arc<str>,
    pub(crate) ttl: Duration,
    pub(crate) auto_renew: bool,
    pub(crate) drift: fn(Duration) -> Duration,
}

/// What every lock of one client shares: the backend, the settings, the renewal engines, the
/// releases still running, and whether the client was shut down.
pub(crate) struct Core {
    pub(crate) backend: Arc<dyn DynBackend>,
    pub(crate) config: Config,
    /// The renewal engines, each running on its runtime: one per multi-thread runtime that
    /// took a lease, so a runtime that shuts down takes no other runtime's leases with it (see
    /// [`engine`](Self::engine) for current-thread runtimes).
    engines: StdMutex<Vec<OnRuntime>>,
    pending: Arc<Pending>,
    closed: watch::Sender<bool>,
    pub(crate) ids: LeaseIds,
    /// The owner tokens of this client's claims.
    pub(crate) owners: Owners,
    /// The keys of the metrics recorded at every lock.
    pub(crate) metrics: metrics::Keys,
    /// Where blocking calls run.
    pub(crate) blocking: blocking::Blocking,
    /// Leases whose release task went, unrun, with its runtime, where no other runtime was at
    /// hand to run it: released at shutdown (or their leases end).
    unreleased: StdMutex<Vec<Arc<Lease>>>,
    /// The elections observed through this client, each read once for all its observers.
    pub(crate) followed: follow::Followed,
}

/// A renewal engine and the runtime it runs on.
struct OnRuntime {
    runtime: RuntimeId,
    flavor: RuntimeFlavor,
    engine: Engine,
}

impl Core {
    pub(crate) fn new(backend: Arc<dyn DynBackend>, config: Config) -> Self {
        let metrics = metrics::Keys::new(backend.name());
        Self {
            backend,
            config,
            engines: StdMutex::default(),
            pending: Arc::default(),
            closed: watch::Sender::new(false),
            ids: LeaseIds::default(),
            owners: Owners::default(),
            metrics,
            blocking: blocking::Blocking::capture(),
            unreleased: StdMutex::default(),
            followed: follow::Followed::default(),
        }
    }

    pub(crate) fn check_open(&self) -> Result<()> {
        if *self.closed.borrow() {
            return Err(Error::closed());
        }
        Ok(())
    }

    pub(crate) fn is_closed(&self) -> bool {
        *self.closed.borrow()
    }

    pub(crate) fn closed(&self) -> watch::Receiver<bool> {
        self.closed.subscribe()
    }

    /// The renewal task for a lease taken on `handle`'s runtime, and the runtime it runs on:
    /// that runtime's own (started on first use, and again if it ended) if it is multi-thread;
    /// for a current-thread runtime, which runs tasks only while a thread drives it, a
    /// multi-thread runtime's if the client has one, else its own.
    pub(crate) fn engine(&self, handle: &Handle) -> Result<(RuntimeId, Engine)> {
        let mut engines = self.engines.locked();
        self.check_open()?;
        // Those of runtimes that shut down are gone with their tasks.
        engines.retain(|e| e.engine.is_running());
        let id = handle.id();
        let flavor = handle.runtime_flavor();
        let mine = engines.iter().find(|e| e.runtime == id);
        let found = if flavor == RuntimeFlavor::CurrentThread {
            engines
                .iter()
                .find(|e| e.flavor != RuntimeFlavor::CurrentThread)
                .or(mine)
        } else {
            mine
        };
        if let Some(e) = found {
            return Ok((e.runtime, e.engine.clone()));
        }
        let engine = Engine::start(
            handle,
            self.backend.clone(),
            EngineConfig {
                auto_renew: self.config.auto_renew,
            },
        );
        engines.push(OnRuntime {
            runtime: id,
            flavor,
            engine: engine.clone(),
        });
        Ok((id, engine))
    }

    /// The engine that renews `lease`, if it still runs.
    fn engine_of(&self, lease: &Lease) -> Option<Engine> {
        let engines = self.engines.locked();
        engines
            .iter()
            .find(|e| Some(e.runtime) == lease.runtime() && e.engine.is_running())
            .map(|e| e.engine.clone())
    }

    /// Has the renewal engine (if one runs) time `lease` again from its current schedule.
    pub(crate) fn retrack(&self, lease: &Arc<Lease>) {
        if let Some(engine) = self.engine_of(lease) {
            engine.track(lease);
        }
    }

    /// Stops renewal of `lease` for good. Returns `false` if it was already stopped (released
    /// before, or by shutdown).
    pub(crate) fn stop(&self, lease: &Lease) -> bool {
        if !lease.finish() {
            return false;
        }
        self.ended(lease);
        if let Some(engine) = self.engine_of(lease) {
            engine.forget(lease);
        }
        true
    }

    /// Records the end of `lease`'s hold, if it held (its hold time, the "lock released"
    /// event, or "lost lock cleaned up" after the loss was reported): once, by whoever
    /// finished it.
    fn ended(&self, lease: &Lease) {
        // Read under the schedule's lock, then let it go: the event's fields lock it again.
        let (held_since, fence) = {
            let schedule = lease.schedule();
            (schedule.held_since, schedule.held.map_or(0, |g| g.fence))
        };
        if let Some(since) = held_since {
            metrics::released(&self.metrics, lease.claim.kind(), since.elapsed());
            if lease.claim.is_lost() {
                // The WARN "lock lost" came first: this is its guard going, not a release.
                tracing::debug!(key = lease.claim.key(), fence, "lost lock cleaned up");
            } else {
                tracing::debug!(key = lease.claim.key(), fence, "lock released");
            }
        }
        lease.claim.lost_signal().unheld();
    }

    /// Stops renewal of `lease` and releases it in a task on `handle`.
    pub(crate) fn spawn_release(self: &Arc<Self>, handle: &Handle, lease: Arc<Lease>) {
        self.spawn_release_after(handle, lease, None);
    }

    /// Stops renewal of `lease` and releases it in a task on `handle`, once `in_flight` (an
    /// acquire call for it that was cut short) has ended.
    pub(crate) fn spawn_release_after(
        self: &Arc<Self>,
        handle: &Handle,
        lease: Arc<Lease>,
        in_flight: Option<AcquireCall>,
    ) {
        if self.stop(&lease) {
            self.release_in_task_after(handle, lease, in_flight);
        }
    }

    /// Releases a stopped lease in a task on `handle`; `shutdown` waits for it.
    pub(crate) fn release_in_task(self: &Arc<Self>, handle: &Handle, lease: Arc<Lease>) {
        self.release_in_task_after(handle, lease, None);
    }

    /// [`release_in_task`](Self::release_in_task), sent only once `in_flight` has ended: a
    /// release that overtook an acquire still on its way (on another pooled connection, or
    /// retried on a new one) would find nothing, and the late acquire would then hold the lock
    /// for no one until its lease ran out. The call is awaited for at most the claim's TTL
    /// (within [`IN_FLIGHT_MIN`], [`IN_FLIGHT_MAX`]), then dropped: it sends no retry after the
    /// release (a Redis call may take up to three 5 s attempts, more than a short TTL; a
    /// coalesced acquire given up is left out of its batch's next attempt). A request already
    /// sent may still take the lock after the release, for at most its lease.
    fn release_in_task_after(
        self: &Arc<Self>,
        handle: &Handle,
        lease: Arc<Lease>,
        in_flight: Option<AcquireCall>,
    ) {
        self.release_handed_on(handle, lease, in_flight, HAND_ONS);
    }

    /// [`release_in_task_after`](Self::release_in_task_after), handing the release on at most
    /// `hand_ons` more times if the task goes with its runtime before the release is answered.
    fn release_handed_on(
        self: &Arc<Self>,
        handle: &Handle,
        lease: Arc<Lease>,
        in_flight: Option<AcquireCall>,
        hand_ons: u8,
    ) {
        let token = self.pending.start();
        let backend = self.backend.clone();
        // Made before the spawn: a task dropped with its runtime before the release was
        // answered (unrun, or while it drove the acquire call out: the runtime that acquired
        // the lock shut down meanwhile) hands its release on.
        let mut unsent = Unsent {
            core: self.clone(),
            lease: Some(lease.clone()),
            runtime: handle.id(),
            hand_ons,
        };
        handle.spawn(async move {
            if let Some(call) = in_flight {
                let limit = lease.claim.ttl().clamp(IN_FLIGHT_MIN, IN_FLIGHT_MAX);
                // A call that panicked (in the acquisition's task, which died of it, or here)
                // has ended too: polled again it would only panic again, and this task would
                // die before the release, leaving the claim on the service for its lease.
                let call = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(call));
                match tokio::time::timeout(limit, call).await {
                    Err(_) => tracing::warn!(key = lease.claim.key(), ?limit, "a cancelled acquire call did not end; releasing anyway"),
                    Ok(Err(_)) => tracing::warn!(key = lease.claim.key(), "a cancelled acquire call panicked; releasing anyway"),
                    Ok(Ok(_)) => {}
                }
            }
            if let Err(err) = backend.release(&lease.claim, &lease.ticket).await {
                tracing::warn!(key = lease.claim.key(), error = %err, "release failed; the lease will expire");
            }
            unsent.sent();
            drop(token);
        });
    }

    /// Releases a stopped lease here; if this future is dropped first, the release finishes
    /// in a task on `handle`.
    pub(crate) async fn release_now(
        self: &Arc<Self>,
        handle: &Handle,
        lease: &Arc<Lease>,
    ) -> Result<bool> {
        let _token = self.pending.start();
        let backstop =
            scopeguard::guard(lease.clone(), |lease| self.release_in_task(handle, lease));
        let result = self.backend.release(&lease.claim, &lease.ticket).await;
        scopeguard::ScopeGuard::into_inner(backstop);
        result
    }

    /// Closes the core: waiting acquisitions end with `Closed`, held leases are released (and
    /// marked lost), pending releases are flushed, then the backend closes. Idempotent.
    pub(crate) async fn shutdown(&self) {
        let first = !self.closed.send_replace(true);
        let engines = std::mem::take(&mut *self.engines.locked());
        // Each task hands back every lease it still tracks; release them here.
        let handed = engines.into_iter().map(|OnRuntime { engine, .. }| {
            let (tx, rx) = oneshot::channel();
            engine.shutdown(tx);
            async move { rx.await.unwrap_or_default() }
        });
        let leases = futures::future::join_all(handed)
            .await
            .into_iter()
            .flatten();
        let releases = leases.filter(|l| l.finish()).map(|lease| {
            self.ended(&lease);
            let backend = self.backend.clone();
            async move {
                lease.claim.mark_lost();
                if let Err(err) = backend.release(&lease.claim, &lease.ticket).await {
                    tracing::warn!(key = lease.claim.key(), error = %err, "release at shutdown failed");
                }
            }
        });
        futures::future::join_all(releases).await;
        let unreleased = std::mem::take(&mut *self.unreleased.locked());
        let releases = unreleased.into_iter().map(|lease| {
            let backend = self.backend.clone();
            async move {
                if let Err(err) = backend.release(&lease.claim, &lease.ticket).await {
                    tracing::warn!(key = lease.claim.key(), error = %err, "release at shutdown failed");
                }
            }
        });
        futures::future::join_all(releases).await;
        self.pending.idle().await;
        if first {
            self.backend.shutdown().await;
        }
    }
}

/// How many times a release whose task went with its runtime is handed on to another (each
/// runtime it is handed to may be shutting down too).
const HAND_ONS: u8 = 2;

/// A release task's lease until its release was answered. Dropped before (the task went with
/// its runtime, unrun or while it drove a cancelled acquire call: a guard dropped, or an
/// acquisition cancelled, on a runtime that shut down meanwhile), it sends the release from
/// the current runtime if there is another, else from the runtime the client was built in if
/// that is another, or leaves it for `shutdown`. The acquire call it drove went with the task:
/// its request reached the backend's connection, whose tasks run on the client's runtime, or
/// it was never sent.
struct Unsent {
    core: Arc<Core>,
    lease: Option<Arc<Lease>>,
    /// The runtime the task was spawned on.
    runtime: tokio::runtime::Id,
    /// How many more times the release may be handed on.
    hand_ons: u8,
}

impl Unsent {
    /// The release was answered (or failed on its own): nothing to hand on.
    fn sent(&mut self) {
        self.lease = None;
    }
}

impl Drop for Unsent {
    fn drop(&mut self) {
        let Some(lease) = self.lease.take() else {
            return;
        };
        let elsewhere = Handle::try_current()
            .ok()
            .filter(|here| here.id() != self.runtime)
            .or_else(|| {
                (self.core.blocking.built_in())
                    .filter(|home| home.id() != self.runtime)
                    .cloned()
            });
        match elsewhere {
            Some(other) if self.hand_ons > 0 => {
                self.core
                    .release_handed_on(&other, lease, None, self.hand_ons - 1);
            }
            _ => {
                tracing::debug!(
                    key = lease.claim.key(),
                    "a release's runtime shut down; releasing at shutdown"
                );
                self.core.unreleased.locked().push(lease);
            }
        }
    }
}
