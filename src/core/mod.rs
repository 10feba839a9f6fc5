//! The acquisition core, written once for every primitive: the wait loop ([`acquire`]), leases
//! ([`lease`]), what a guard holds and the count of releases in flight ([`held`]), the renewal
//! engine ([`renewal`]), release on drop (here), and the rules every input is checked against
//! before any I/O ([`rules`]).
//!
//! Dependencies run one way: the client makes primitives, primitives call into this core, and
//! the core calls the backend. Nothing here knows the client or the primitives.

pub(crate) mod acquire;
pub(crate) mod follow;
pub(crate) mod guard;
pub(crate) mod held;
pub(crate) mod home;
pub(crate) mod lease;
pub(crate) mod metrics;
pub(crate) mod renewal;
pub(crate) mod rules;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::{oneshot, watch};

use crate::backend::{DynBackend, Owners};
use crate::error::{Error, Result};

use self::acquire::AcquireCall;
use self::held::Pending;
use self::lease::{Lease, LeaseIds};
use self::renewal::{Engine, EngineConfig};

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

/// What every lock of one client shares: the backend, the settings, the renewal engine, the
/// releases still running, and whether the client was shut down.
pub(crate) struct Core {
    pub(crate) backend: Arc<dyn DynBackend>,
    pub(crate) config: Config,
    /// The renewal engine, running on the client's runtime from the first lock on: once it is
    /// gone, so is that runtime, and the client with it.
    engine: OnceLock<Engine>,
    pending: Arc<Pending>,
    closed: watch::Sender<bool>,
    pub(crate) ids: LeaseIds,
    /// The owner tokens of this client's claims.
    pub(crate) owners: Owners,
    /// The keys of the metrics recorded at every lock.
    pub(crate) metrics: metrics::Keys,
    /// The runtime the client belongs to, where its tasks run and blocking calls block.
    pub(crate) home: home::Home,
    /// The elections observed through this client, each read once for all its observers.
    pub(crate) followed: follow::Followed,
}

impl Core {
    pub(crate) fn new(backend: Arc<dyn DynBackend>, config: Config) -> Self {
        let metrics = metrics::Keys::new(backend.name());
        let core = Self {
            backend,
            config,
            engine: OnceLock::new(),
            pending: Arc::default(),
            closed: watch::Sender::new(false),
            ids: LeaseIds::default(),
            owners: Owners::default(),
            metrics,
            home: home::Home::capture(),
            followed: follow::Followed::default(),
        };
        // Started now on the runtime the client is built in, so that the client knows when
        // that runtime ends whatever it was used for. (A client built outside any runtime
        // starts its own at its first lock.)
        if core.home.is_built_in() {
            let _ = core.engine();
        }
        core
    }

    /// Refuses calls once the client was shut down or its runtime is gone.
    pub(crate) fn check_open(&self) -> Result<()> {
        if *self.closed.borrow() {
            return Err(Error::closed());
        }
        if self.engine.get().is_some_and(|e| !e.is_running()) {
            return Err(Error::runtime_gone());
        }
        Ok(())
    }

    pub(crate) fn is_closed(&self) -> bool {
        *self.closed.borrow()
    }

    pub(crate) fn closed(&self) -> watch::Receiver<bool> {
        self.closed.subscribe()
    }

    /// The renewal engine, started on the client's runtime at the first call that needs it.
    pub(crate) fn engine(&self) -> Result<&Engine> {
        self.check_open()?;
        let engine = match self.engine.get() {
            Some(engine) => engine,
            None => {
                let handle = self.home.handle()?;
                self.engine.get_or_init(|| {
                    let config = EngineConfig {
                        auto_renew: self.config.auto_renew,
                    };
                    Engine::start(&handle, self.backend.clone(), config)
                })
            }
        };
        // A runtime that has shut down drops the task it is given at once.
        if !engine.is_running() {
            return Err(Error::runtime_gone());
        }
        Ok(engine)
    }

    /// The engine, if it runs.
    fn running_engine(&self) -> Option<&Engine> {
        self.engine.get().filter(|e| e.is_running())
    }

    /// Has the renewal engine (if one runs) time `lease` again from its current schedule.
    pub(crate) fn retrack(&self, lease: &Arc<Lease>) {
        if let Some(engine) = self.running_engine() {
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
        if let Some(engine) = self.running_engine() {
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

    /// Stops renewal of `lease` and releases it in a task on the client's runtime.
    pub(crate) fn spawn_release(self: &Arc<Self>, lease: Arc<Lease>) {
        self.spawn_release_after(lease, None);
    }

    /// Stops renewal of `lease` and releases it in a task on the client's runtime, once
    /// `in_flight` (an acquire call for it that was cut short) has ended.
    pub(crate) fn spawn_release_after(
        self: &Arc<Self>,
        lease: Arc<Lease>,
        in_flight: Option<AcquireCall>,
    ) {
        if self.stop(&lease) {
            self.release_in_task(lease, in_flight);
        }
    }

    /// Releases a stopped lease in a task on the client's runtime (`shutdown` waits for it),
    /// sent only once `in_flight` has ended: a release that overtook an acquire still on its
    /// way (on another pooled connection, or retried on a new one) would find nothing, and the
    /// late acquire would then hold the lock for no one until its lease ran out. The call is
    /// awaited for at most the claim's TTL (within [`IN_FLIGHT_MIN`], [`IN_FLIGHT_MAX`]), then
    /// dropped: it sends no retry after the release (a Redis call may take up to three 5 s
    /// attempts, more than a short TTL), and the claim is marked
    /// [abandoned](crate::backend::Claim::is_abandoned), so a request for it the backend has
    /// not sent yet is not sent. A request already sent may still take the lock after the
    /// release, for at most its lease. Once the client's runtime is gone the task is dropped
    /// unrun, and the lease ends on its own.
    fn release_in_task(self: &Arc<Self>, lease: Arc<Lease>, in_flight: Option<AcquireCall>) {
        let handle = match self.home.handle() {
            Ok(handle) => handle,
            Err(err) => {
                tracing::warn!(key = lease.claim.key(), error = %err, "no runtime to release on; the lease will expire");
                return;
            }
        };
        let token = self.pending.start();
        let backend = self.backend.clone();
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
            lease.claim.abandon();
            if let Err(err) = backend.release(&lease.claim, &lease.ticket).await {
                tracing::warn!(key = lease.claim.key(), error = %err, "release failed; the lease will expire");
            }
            drop(token);
        });
    }

    /// Releases a stopped lease here; if this future is dropped first, the release finishes
    /// in a task on the client's runtime.
    pub(crate) async fn release_now(self: &Arc<Self>, lease: &Arc<Lease>) -> Result<bool> {
        let _token = self.pending.start();
        let backstop = scopeguard::guard(lease.clone(), |lease| self.release_in_task(lease, None));
        let result = self.backend.release(&lease.claim, &lease.ticket).await;
        scopeguard::ScopeGuard::into_inner(backstop);
        result
    }

    /// Closes the core: waiting acquisitions end with `Closed`, held leases are released (and
    /// marked lost), pending releases are flushed, then the backend closes. Idempotent.
    pub(crate) async fn shutdown(&self) {
        // A client whose runtime is gone has no connection left to close: its backend's tasks
        // went with that runtime (a ZooKeeper shutdown would wait out a session for nothing).
        let runtime_gone = self.engine.get().is_some_and(|e| !e.is_running());
        let first = !self.closed.send_replace(true);
        // The task hands back every lease it still tracks; release them here.
        let leases = match self.engine.get() {
            Some(engine) => {
                let (tx, rx) = oneshot::channel();
                engine.shutdown(tx);
                rx.await.unwrap_or_default()
            }
            None => Vec::new(),
        };
        let releases = leases.into_iter().filter(|l| l.finish()).map(|lease| {
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
        self.pending.idle().await;
        if first && !runtime_gone {
            self.backend.shutdown().await;
        }
    }
}
