//! Leases: the shared renewal task, the lost signal, and release on drop.
//!
//! Every claim that is held (or queued, on backends whose queue entries expire) is scheduled in
//! one task per client. The task sleeps until the earliest renewal is due, gathers every claim
//! due soon after it, and renews them in one backend call. An authoritative "not owner" marks the
//! claim lost at once; a failed call is retried until the local lease deadline, then the claim
//! is lost.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::mpsc;
use tokio::time::{sleep_until, Instant};

use crate::backend::{AnyTicket, Claim, DynBackend, Grant, Renewal};
use crate::client::ClientInner;
use crate::error::{Error, ErrorKind, Result};

/// The smallest pause before retrying a failed renewal.
const MIN_RETRY: Duration = Duration::from_millis(10);

/// One claim as the lease engine and its guard share it.
pub(crate) struct Lease {
    id: u64,
    pub(crate) claim: Claim,
    pub(crate) ticket: AnyTicket,
    schedule: StdMutex<Schedule>,
    /// Set once the claim is being released: renewal stops for good.
    done: AtomicBool,
}

#[derive(Clone, Copy)]
struct Schedule {
    held: Option<Grant>,
    /// When the engine should look at this lease next.
    next: Instant,
}

impl Lease {
    pub(crate) fn new(id: u64, claim: Claim, ticket: AnyTicket) -> Self {
        let next = Instant::now() + claim.ttl() / 3;
        Self {
            id,
            claim,
            ticket,
            schedule: StdMutex::new(Schedule { held: None, next }),
            done: AtomicBool::new(false),
        }
    }

    fn schedule(&self) -> std::sync::MutexGuard<'_, Schedule> {
        self.schedule
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records the grant and schedules the first renewal at a third of the lease.
    pub(crate) fn set_held(&self, grant: Grant) {
        let now = Instant::now();
        let mut s = self.schedule();
        s.held = Some(grant);
        s.next = renew_at(now, grant.valid_until);
    }

    pub(crate) fn fence(&self) -> u64 {
        self.schedule().held.map_or(0, |g| g.fence)
    }

    /// Stops renewal. Returns `false` if it was already stopped.
    pub(crate) fn finish(&self) -> bool {
        !self.done.swap(true, Ordering::AcqRel)
    }

    fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    /// Lost if a backend or the engine said so, or if the local deadline has passed (even when
    /// the engine has not run yet).
    pub(crate) fn is_lost(&self, drift: Duration) -> bool {
        self.claim.is_lost()
            || self
                .schedule()
                .held
                .is_some_and(|g| Instant::now() + drift >= g.valid_until)
    }
}

fn renew_at(now: Instant, valid_until: Instant) -> Instant {
    now + valid_until.saturating_duration_since(now) / 3
}

/// Handle to the shared renewal task of one client.
#[derive(Clone)]
pub(crate) struct Engine {
    tx: mpsc::UnboundedSender<Cmd>,
}

enum Cmd {
    /// Schedule the lease (again) from its current schedule.
    Track(Arc<Lease>),
    /// The lease is released: drop it from the schedule.
    Forget(u64),
    /// Stop, handing back every lease still scheduled.
    Shutdown(tokio::sync::oneshot::Sender<Vec<Arc<Lease>>>),
}

/// How the engine treats leases.
#[derive(Clone, Copy)]
pub(crate) struct EngineConfig {
    pub(crate) auto_renew: bool,
    pub(crate) drift: fn(Duration) -> Duration,
}

impl Engine {
    pub(crate) fn start(
        handle: &Handle,
        backend: Arc<dyn DynBackend>,
        config: EngineConfig,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        handle.spawn(run(backend, config, rx));
        Self { tx }
    }

    pub(crate) fn is_running(&self) -> bool {
        !self.tx.is_closed()
    }

    /// Schedules the lease (again) with its current schedule.
    pub(crate) fn track(&self, lease: &Arc<Lease>) {
        // If the task is gone (its runtime shut down), the local deadline still makes the
        // guard report lost through `Lease::is_lost`.
        let _ = self.tx.send(Cmd::Track(lease.clone()));
    }

    /// Stops the task; `tx` receives the leases it still tracked.
    pub(crate) fn shutdown(&self, tx: tokio::sync::oneshot::Sender<Vec<Arc<Lease>>>) {
        let _ = self.tx.send(Cmd::Shutdown(tx));
    }

    pub(crate) fn forget(&self, lease: &Lease) {
        let _ = self.tx.send(Cmd::Forget(lease.id));
    }
}

/// The clock-drift margin subtracted from every lease: 1% of the TTL plus 2 ms (Redlock's
/// figures).
pub(crate) fn default_drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

struct Tracked {
    lease: Arc<Lease>,
    at: Instant,
}

async fn run(
    backend: Arc<dyn DynBackend>,
    config: EngineConfig,
    mut rx: mpsc::UnboundedReceiver<Cmd>,
) {
    let mut leases: HashMap<u64, Tracked> = HashMap::new();
    let mut due: BTreeSet<(Instant, u64)> = BTreeSet::new();
    loop {
        let next = due.first().map(|(at, _)| *at);
        tokio::select! {
            msg = rx.recv() => {
                match msg {
                    None => break,
                    Some(Cmd::Track(lease)) if !lease.is_done() => {
                        reschedule(&mut leases, &mut due, lease, config);
                    }
                    Some(Cmd::Track(_)) => {}
                    Some(Cmd::Shutdown(tx)) => {
                        let _ = tx.send(leases.into_values().map(|t| t.lease).collect());
                        break;
                    }
                    Some(Cmd::Forget(id)) => {
                        if let Some(old) = leases.remove(&id) {
                            due.remove(&(old.at, id));
                        }
                    }
                }
            }
            () = sleep_until(next.unwrap_or_else(Instant::now)), if next.is_some() => {
                round(&*backend, config, &mut leases, &mut due).await;
            }
        }
    }
}

/// When the engine must next look at a lease: its renewal time, or, without renewal, the
/// moment its lease (less the drift margin) runs out.
fn wake_at(lease: &Lease, config: EngineConfig) -> Instant {
    let s = *lease.schedule();
    match s.held {
        Some(g) if !config.auto_renew => g
            .valid_until
            .checked_sub((config.drift)(lease.claim.ttl()))
            .unwrap_or(g.valid_until),
        _ => s.next,
    }
}

async fn round(
    backend: &dyn DynBackend,
    config: EngineConfig,
    leases: &mut HashMap<u64, Tracked>,
    due: &mut BTreeSet<(Instant, u64)>,
) {
    let now = Instant::now();
    // Gather everything due now, and whatever falls due within a sixth of its TTL: one round
    // trip for many locks.
    let mut batch: Vec<Arc<Lease>> = Vec::new();
    while let Some(&(at, id)) = due.first() {
        let Some(t) = leases.get(&id) else {
            due.pop_first();
            continue;
        };
        if at > now + t.lease.claim.ttl() / 6 {
            break;
        }
        due.pop_first();
        if let Some(t) = leases.remove(&id) {
            batch.push(t.lease);
        }
    }

    let mut to_renew = Vec::new();
    for lease in batch {
        if lease.is_done() {
            continue;
        }
        if lease.schedule().held.is_some() {
            if lost_at(&lease, config).is_some_and(|at| now >= at) {
                tracing::warn!(
                    key = lease.claim.key(),
                    "lease expired before it could be renewed"
                );
                lease.claim.mark_lost();
                continue;
            }
            if !config.auto_renew {
                reschedule(leases, due, lease, config);
                continue;
            }
        }
        to_renew.push(lease);
    }
    if to_renew.is_empty() {
        return;
    }

    let sent = Instant::now();
    let pairs: Vec<(&Claim, &AnyTicket)> = to_renew.iter().map(|l| (&l.claim, &l.ticket)).collect();
    // A renewal stuck on a dead connection must not hold back the lost signal: stop waiting
    // for it when the first lease of the batch runs out.
    let first_expiry = to_renew.iter().filter_map(|l| lost_at(l, config)).min();
    let results = match first_expiry {
        Some(at) => tokio::time::timeout_at(at, backend.renew(&pairs))
            .await
            .unwrap_or_else(|_| {
                let stuck =
                    Error::new(ErrorKind::Backend, "renewal got no reply in time").transient();
                vec![Renewal::Failed(stuck); pairs.len()]
            }),
        None => backend.renew(&pairs).await,
    };
    drop(pairs);
    for (lease, result) in to_renew.into_iter().zip(results) {
        if lease.is_done() {
            continue;
        }
        let held = lease.schedule().held.is_some();
        match result {
            Renewal::Extended(valid_until) => {
                let mut s = lease.schedule();
                if let Some(g) = s.held.as_mut() {
                    g.valid_until = valid_until;
                }
                s.next = renew_at(sent, valid_until);
            }
            Renewal::NotOwner if held => {
                tracing::warn!(
                    key = lease.claim.key(),
                    "lock lost: the server no longer lists us as owner"
                );
                lease.claim.mark_lost();
                continue;
            }
            // A queue entry that vanished: the waiter re-checks and re-queues on its own.
            Renewal::NotOwner => {
                lease.schedule().next = sent + lease.claim.ttl() / 3;
            }
            Renewal::Failed(err)
                if lost_at(&lease, config).is_some_and(|at| Instant::now() >= at) =>
            {
                tracing::warn!(key = lease.claim.key(), error = %err, "lock lost: no renewal before the lease ran out");
                lease.claim.mark_lost();
                continue;
            }
            Renewal::Failed(err) => {
                tracing::debug!(key = lease.claim.key(), error = %err, "renewal failed, retrying");
                let mut s = lease.schedule();
                let until = s.held.map_or(sent + lease.claim.ttl(), |g| g.valid_until);
                let pause = (until.saturating_duration_since(Instant::now()) / 4)
                    .min(lease.claim.ttl() / 10)
                    .max(MIN_RETRY);
                s.next = Instant::now() + pause;
            }
        }
        reschedule(leases, due, lease, config);
    }
}

/// When a held lease must be taken as lost: its deadline less the drift margin.
fn lost_at(lease: &Lease, config: EngineConfig) -> Option<Instant> {
    let held = lease.schedule().held?;
    let drift = (config.drift)(lease.claim.ttl());
    Some(
        held.valid_until
            .checked_sub(drift)
            .unwrap_or(held.valid_until),
    )
}

fn reschedule(
    leases: &mut HashMap<u64, Tracked>,
    due: &mut BTreeSet<(Instant, u64)>,
    lease: Arc<Lease>,
    config: EngineConfig,
) {
    let at = wake_at(&lease, config);
    let id = lease.id;
    if let Some(old) = leases.insert(id, Tracked { lease, at }) {
        due.remove(&(old.at, id));
    }
    due.insert((at, id));
}

/// A held lease with its RAII release: the part every guard type shares.
pub(crate) struct Held {
    client: Arc<ClientInner>,
    lease: Arc<Lease>,
    handle: Handle,
    fence: u64,
    armed: bool,
}

impl Held {
    pub(crate) fn new(client: Arc<ClientInner>, lease: Arc<Lease>, handle: Handle) -> Self {
        let fence = lease.fence();
        Self {
            client,
            lease,
            handle,
            fence,
            armed: true,
        }
    }

    pub(crate) fn key(&self) -> &str {
        self.lease.claim.key()
    }

    pub(crate) fn fencing_token(&self) -> u64 {
        self.fence
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.lease
            .is_lost((self.client.config.drift)(self.lease.claim.ttl()))
    }

    pub(crate) async fn lost(&self) {
        self.lease.claim.lost_signal().wait().await;
    }

    pub(crate) async fn release(mut self) -> Result<()> {
        self.armed = false;
        let was_lost = self.is_lost();
        if !self.client.stop(&self.lease) {
            // Shutdown released it already.
            return Err(Error::lost(self.key()));
        }
        let held = self.client.release_now(&self.handle, &self.lease).await?;
        if was_lost || !held {
            return Err(Error::lost(self.key()));
        }
        Ok(())
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.armed {
            // The result is logged by the task; nobody is left to receive it.
            self.client.spawn_release(&self.handle, self.lease.clone());
        }
    }
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard")
            .field("key", &self.key())
            .field("fencing_token", &self.fence)
            .field("lost", &self.is_lost())
            .finish()
    }
}

/// Counts spawned releases so `shutdown` can wait for them.
#[derive(Default)]
pub(crate) struct Pending {
    count: StdMutex<usize>,
    idle: tokio::sync::Notify,
}

impl Pending {
    pub(crate) fn start(self: &Arc<Self>) -> PendingToken {
        *self.count.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        PendingToken(self.clone())
    }

    pub(crate) async fn idle(&self) {
        loop {
            let notified = self.idle.notified();
            if *self.count.lock().unwrap_or_else(|p| p.into_inner()) == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// Decrements the pending count when dropped, even if its task never ran.
pub(crate) struct PendingToken(Arc<Pending>);

impl Drop for PendingToken {
    fn drop(&mut self) {
        let mut count = self.0.count.lock().unwrap_or_else(|p| p.into_inner());
        *count = count.saturating_sub(1);
        if *count == 0 {
            self.0.idle.notify_waiters();
        }
    }
}

/// Allocates lease ids for one client.
#[derive(Default)]
pub(crate) struct LeaseIds(AtomicU64);

impl LeaseIds {
    pub(crate) fn next(&self) -> u64 {
        self.0.fetch_add(1, Ordering::Relaxed)
    }
}
