//! The renewal engine: one task per client that keeps every held lease (and, on backends whose
//! queue entries expire, every queue entry) alive, and marks each lease lost at its own
//! deadline.
//!
//! The task sleeps until the earliest timer of any lease: its renewal time or its deadline.
//! Renewals due at about the same time go out together in one backend call, and calls run
//! concurrently with the timers, so a call stuck on a dead link delays nothing else: every
//! lease is marked lost when its deadline passes, whatever the server does. Replies are judged
//! by [`Lease`]'s rules (a reply speaks only for the state the claim was in when it was sent,
//! and a lost lease stays lost).

use std::collections::{BTreeSet, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};
use std::sync::Mutex as StdMutex;
use tokio::runtime::Handle;

use tokio::sync::{oneshot, watch, Notify};
use tokio::time::{sleep_until, Instant};

use super::lease::{Lease, Verdict};
use crate::backend::{AnyTicket, Claim, DynBackend, Renewal, MIN_RENEW_CALL as MIN_CALL_LIMIT};
use crate::error::{Error, ErrorKind};
use crate::sync::LockExt;

/// Handle to the shared renewal task of one client.
///
/// Leases reach the task through an inbox, not a channel: a new lease is due long after the
/// task's next wake-up in nearly every case, so taking a lock or releasing one wakes no other
/// thread (on a loaded machine a cross-thread wake-up costs as much as the round trip itself).
/// The task drains the inbox whenever it wakes, and is woken early only for a lease due before
/// its next timer, for a pile of released leases, or to shut down.
#[derive(Clone)]
pub(crate) struct Engine {
    shared: Arc<EngineState>,
}

struct EngineState {
    inbox: StdMutex<Inbox>,
    wake: Notify,
    /// Cleared when the task ends: shut down, or gone with its runtime.
    alive: watch::Sender<bool>,
}

#[derive(Default)]
struct Inbox {
    track: Vec<Arc<Lease>>,
    forget: Vec<u64>,
    shutdown: Option<oneshot::Sender<Vec<Arc<Lease>>>>,
    /// While the task sleeps: its next timer (`None`: it has none). While it is awake it
    /// drains the inbox before sleeping again, so nothing needs to wake it.
    asleep_until: Option<Option<Instant>>,
}

/// How many released leases may wait in the inbox before the task is woken to drop them.
const FORGET_BATCH: usize = 256;

/// How the engine treats leases.
#[derive(Clone, Copy)]
pub(crate) struct EngineConfig {
    pub(crate) auto_renew: bool,
}

impl Engine {
    pub(crate) fn start(
        handle: &Handle,
        backend: Arc<dyn DynBackend>,
        config: EngineConfig,
    ) -> Self {
        let shared = Arc::new(EngineState {
            inbox: StdMutex::new(Inbox::default()),
            wake: Notify::new(),
            alive: watch::Sender::new(true),
        });
        // Made before the task is spawned: a task dropped before its first poll (its runtime
        // shutting down) clears `alive` too.
        handle.spawn(run(backend, config, Alive(shared.clone())));
        Self { shared }
    }

    pub(crate) fn is_running(&self) -> bool {
        *self.shared.alive.borrow()
    }

    /// Resolves once the task has ended.
    pub(crate) async fn gone(&self) {
        let mut alive = self.shared.alive.subscribe();
        // The sender lives in `shared`, which `self` keeps: the wait ends only by the flag.
        let _ = alive.wait_for(|alive| !alive).await;
    }

    fn inbox(&self) -> std::sync::MutexGuard<'_, Inbox> {
        self.shared.inbox.locked()
    }

    /// Schedules the lease (again) with its current schedule.
    pub(crate) fn track(&self, lease: &Arc<Lease>) {
        // If the task is gone (its runtime shut down), the local deadline still makes the
        // guard report lost through `Lease::is_lost` and `Lease::lost`.
        let s = *lease.schedule();
        let due = s
            .lost_at(lease.drift())
            .map_or(s.next, |lost| lost.min(s.next));
        let mut inbox = self.inbox();
        inbox.track.push(lease.clone());
        let wake = match inbox.asleep_until {
            Some(Some(next)) => due < next,
            Some(None) => true,
            None => false,
        };
        drop(inbox);
        if wake {
            self.shared.wake.notify_one();
        }
    }

    /// Stops the task; `tx` receives the leases it still tracked, or is dropped if the task is
    /// gone (its runtime shut down): it tracks nothing then.
    pub(crate) fn shutdown(&self, tx: oneshot::Sender<Vec<Arc<Lease>>>) {
        let mut inbox = self.inbox();
        // Under the inbox's lock: the task, ending, clears `alive` before it takes the lock to
        // drop a sender left here.
        if !*self.shared.alive.borrow() {
            return;
        }
        inbox.shutdown = Some(tx);
        drop(inbox);
        self.shared.wake.notify_one();
    }

    /// Stops renewal of `lease`.
    ///
    /// A lease released before the task took it in (most short holds of a busy service) is
    /// taken back out of the inbox here, so the task never handles it, and the last reference
    /// to it goes with its guard, on the guard's thread, not in a batch on the task's: a batch
    /// of frees overflows the allocator's per-thread cache, and later allocations of those
    /// sizes take its slow path (benches/README.md, "blocks freed where they were made").
    /// Its id still goes to the task, which may hold the lease from an earlier `track`.
    pub(crate) fn forget(&self, lease: &Lease) {
        let mut inbox = self.inbox();
        // The caller holds the lease, so the references taken back free nothing here, under
        // the lock.
        take_back(&mut inbox.track, lease.id);
        inbox.forget.push(lease.id);
        let wake = inbox.forget.len() == FORGET_BATCH && inbox.asleep_until.is_some();
        drop(inbox);
        if wake {
            self.shared.wake.notify_one();
        }
    }
}

/// How far back from its end [`take_back`] looks through the inbox: a lease released soon
/// after it was taken is near the end; one held longer has usually been taken in already, and
/// looking through the whole inbox for it would cost more than the task's handling of it.
const TAKE_BACK_SCAN: usize = 64;

/// Removes the entries for lease `id` from among the last [`TAKE_BACK_SCAN`] of `track`.
fn take_back(track: &mut Vec<Arc<Lease>>, id: u64) {
    let mut i = track.len();
    let stop = i.saturating_sub(TAKE_BACK_SCAN);
    while i > stop {
        i -= 1;
        if track.get(i).is_some_and(|l| l.id == id) {
            // Order in the inbox does not matter: the task schedules each lease by its own
            // state, whatever came before it.
            track.swap_remove(i);
        }
    }
}

/// A lease as the task tracks it.
struct Tracked {
    lease: Arc<Lease>,
    /// Its key in the timer set, if it has a timer.
    at: Option<Instant>,
    /// The generation a renewal call is out for: no second call for it until that one ends.
    in_flight: Option<u64>,
}

/// One renewal call: each lease with the generation and state it was sent in.
struct Sent {
    batch: Vec<(Arc<Lease>, u64, bool)>,
    at: Instant,
    results: Vec<Renewal>,
}

struct Task {
    backend: Arc<dyn DynBackend>,
    config: EngineConfig,
    tracked: HashMap<u64, Tracked, BuildHasherDefault<IdHasher>>,
    timers: BTreeSet<(Instant, u64)>,
    calls: FuturesUnordered<BoxFuture<'static, Sent>>,
}

/// Hashes lease ids, which this client numbers itself (nothing an outsider picks), with one
/// multiplication instead of SipHash: the task looks one up for every lease taken and released.
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, id: u64) {
        self.0 = (self.0 ^ id).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// Clears `alive` when the task ends, however it ends.
struct Alive(Arc<EngineState>);

impl Drop for Alive {
    fn drop(&mut self) {
        self.0.alive.send_replace(false);
        // A shutdown asked of a task that will not answer (dropped with its runtime) hears so.
        let unanswered = self.0.inbox.locked().shutdown.take();
        drop(unanswered);
    }
}

async fn run(backend: Arc<dyn DynBackend>, config: EngineConfig, alive: Alive) {
    let shared = alive.0.clone();
    let mut reconnects = backend.reconnects();
    let mut task = Task {
        backend,
        config,
        tracked: HashMap::default(),
        timers: BTreeSet::new(),
        calls: FuturesUnordered::new(),
    };
    // A connection came back since the inbox was last drained: every held lease is renewed
    // once the leases taken since the task last woke (still in the inbox) are tracked too.
    let mut reconnected = false;
    loop {
        // Take in what arrived; go to sleep only with an empty inbox, saying until when, in
        // the same critical section, so a lease due earlier wakes us.
        let next = loop {
            let (tracks, forgets, shutdown) = {
                let mut inbox = shared.inbox.locked();
                if inbox.track.is_empty() && inbox.forget.is_empty() && inbox.shutdown.is_none() {
                    let next = task.timers.first().map(|(at, _)| *at);
                    inbox.asleep_until = Some(next);
                    break next;
                }
                inbox.asleep_until = None;
                (
                    std::mem::take(&mut inbox.track),
                    std::mem::take(&mut inbox.forget),
                    inbox.shutdown.take(),
                )
            };
            for lease in tracks {
                task.track(lease);
            }
            for id in forgets {
                task.untrack(id);
            }
            if let Some(tx) = shutdown {
                let _ = tx.send(task.tracked.into_values().map(|t| t.lease).collect());
                return;
            }
        };
        if std::mem::take(&mut reconnected) {
            task.renew_held_now();
        }
        tokio::select! {
            () = shared.wake.notified() => {}
            Some(sent) = task.calls.next(), if !task.calls.is_empty() => task.apply(sent),
            moved = async {
                match reconnects.as_mut() {
                    Some(r) => r.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            } => {
                if moved {
                    reconnected = true;
                } else {
                    reconnects = None;
                }
            }
            () = sleep_until(next.unwrap_or_else(Instant::now)), if next.is_some() => task.round(),
        }
        shared.inbox.locked().asleep_until = None;
    }
}

impl Task {
    fn track(&mut self, lease: Arc<Lease>) {
        if lease.is_done() {
            return;
        }
        let id = lease.id;
        let entry = self.tracked.entry(id).or_insert(Tracked {
            lease,
            at: None,
            in_flight: None,
        });
        Self::retime(&mut self.timers, self.config, id, entry);
    }

    fn untrack(&mut self, id: u64) {
        if let Some(Tracked { at: Some(at), .. }) = self.tracked.remove(&id) {
            self.timers.remove(&(at, id));
        }
    }

    /// Gives `t` the timer its schedule asks for: the next renewal (unless one is out for this
    /// generation, or renewal is off) or the lease deadline, whichever is first.
    fn retime(
        timers: &mut BTreeSet<(Instant, u64)>,
        config: EngineConfig,
        id: u64,
        t: &mut Tracked,
    ) {
        if let Some(old) = t.at.take() {
            timers.remove(&(old, id));
        }
        let s = *t.lease.schedule();
        let renewing = t.in_flight == Some(s.generation);
        let renew = match s.held {
            _ if renewing => None,
            Some(_) if !(t.lease.renews(config.auto_renew) || s.confirm) => None,
            _ => Some(s.next),
        };
        let at = match (renew, s.lost_at(t.lease.drift())) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if let Some(at) = at {
            timers.insert((at, id));
        }
        t.at = at;
    }

    /// Handles every timer that is due: marks leases past their deadline lost, and sends one
    /// call renewing everything due now or within a sixth of its TTL.
    fn round(&mut self) {
        let now = Instant::now();
        let mut looked_at = Vec::new();
        while let Some(&(at, id)) = self.timers.first() {
            let horizon = self
                .tracked
                .get(&id)
                .map_or(now, |t| now + t.lease.claim.ttl() / 6);
            if at > horizon {
                break;
            }
            self.timers.pop_first();
            looked_at.push(id);
        }

        let mut batch = Vec::new();
        for id in looked_at {
            let Some(t) = self.tracked.get_mut(&id) else {
                continue;
            };
            t.at = None;
            if t.lease.is_done() {
                self.tracked.remove(&id);
                continue;
            }
            let s = *t.lease.schedule();
            if s.lost_at(t.lease.drift()).is_some_and(|at| now >= at) {
                tracing::warn!(
                    key = t.lease.claim.key(),
                    "lock lost: the lease ran out before a renewal confirmed it"
                );
                t.lease.claim.mark_lost();
                self.tracked.remove(&id);
                continue;
            }
            let wanted = s.held.is_none() || t.lease.renews(self.config.auto_renew) || s.confirm;
            let ttl = t.lease.claim.ttl();
            if wanted && t.in_flight != Some(s.generation) && s.next <= now + ttl / 6 {
                t.in_flight = Some(s.generation);
                batch.push((t.lease.clone(), s.generation, s.held.is_some()));
            }
            Self::retime(&mut self.timers, self.config, id, t);
        }
        if !batch.is_empty() {
            self.send(batch);
        }
    }

    /// A connection came back: renews every held lease now, whatever its schedule (and
    /// whether or not a renewal sent before the drop is still pending), so a lock that vanished
    /// with the outage is reported lost within a round trip.
    fn renew_held_now(&mut self) {
        let batch: Vec<(Arc<Lease>, u64, bool)> = self
            .tracked
            .values_mut()
            .filter_map(|t| {
                let s = *t.lease.schedule();
                if t.lease.is_done() || s.held.is_none() {
                    return None;
                }
                t.in_flight = Some(s.generation);
                Some((t.lease.clone(), s.generation, true))
            })
            .collect();
        if !batch.is_empty() {
            tracing::debug!(
                leases = batch.len(),
                "reconnected: renewing every held lease now"
            );
            self.send(batch);
        }
    }

    /// Sends one renewal call for `batch`, abandoned when the next renewal of its shortest
    /// lease would be due anyway.
    fn send(&mut self, batch: Vec<(Arc<Lease>, u64, bool)>) {
        let backend = self.backend.clone();
        let limit = batch
            .iter()
            .map(|(l, ..)| l.claim.ttl() / 3)
            .min()
            .unwrap_or(MIN_CALL_LIMIT)
            .max(MIN_CALL_LIMIT);
        self.calls.push(Box::pin(async move {
            let at = Instant::now();
            let name = backend.name();
            let results = {
                let pairs: Vec<(&Claim, &AnyTicket)> =
                    batch.iter().map(|(l, ..)| (&l.claim, &l.ticket)).collect();
                match tokio::time::timeout(limit, backend.renew(&pairs)).await {
                    Ok(results) => results,
                    Err(_) => {
                        let stuck = Error::new(ErrorKind::Backend, "renewal got no reply in time")
                            .transient();
                        vec![Renewal::Failed(stuck); pairs.len()]
                    }
                }
            };
            let failed = results
                .iter()
                .filter(|r| matches!(r, Renewal::Failed(_)))
                .count();
            super::metrics::renewed(name, at.elapsed(), failed);
            Sent { batch, at, results }
        }));
    }

    /// Judges each reply of a finished call against its lease.
    fn apply(&mut self, sent: Sent) {
        let Sent { batch, at, results } = sent;
        let mut results = results.into_iter();
        for (lease, generation, held) in batch {
            let result = results.next().unwrap_or_else(|| {
                Renewal::Failed(Error::new(
                    ErrorKind::Backend,
                    "backend returned fewer renewals than claims",
                ))
            });
            let Some(t) = self.tracked.get_mut(&lease.id) else {
                continue;
            };
            if t.in_flight == Some(generation) {
                t.in_flight = None;
            }
            let ttl = lease.claim.ttl();
            let verdict = match result {
                Renewal::Extended(until) if held => lease.extend(generation, at, until),
                // The server granted a queued claim before this renewal ran: a grant, as good
                // as the message that may never come. The waiting acquisition is woken to
                // confirm it (and take its own lease); the queue schedule moves on, so the
                // claim is not renewed again at once.
                Renewal::Extended(until) => lease.granted_while_queued(generation, at, until),
                Renewal::Queued(until) if !held => lease.keep_queued(generation, at, until),
                // Held, yet the server lists the claim as anything but the owner.
                Renewal::Queued(_) | Renewal::NotOwner if held => lease.refused(generation),
                // A queue entry that vanished: the waiter re-checks and re-queues on its own.
                Renewal::Queued(_) | Renewal::NotOwner => {
                    lease.retry_at(generation, at + ttl / 3);
                    Verdict::Kept
                }
                Renewal::Failed(err) => {
                    let verdict = lease.failed(generation, ttl);
                    if verdict == Verdict::Kept {
                        tracing::debug!(key = lease.claim.key(), error = %err, "renewal failed, retrying");
                    }
                    verdict
                }
            };
            if verdict == Verdict::Lost {
                tracing::warn!(
                    key = lease.claim.key(),
                    "lock lost: the server no longer lists us as owner, or the lease ran out"
                );
                lease.claim.mark_lost();
                self.untrack(lease.id);
                continue;
            }
            if let Some(t) = self.tracked.get_mut(&lease.id) {
                Self::retime(&mut self.timers, self.config, lease.id, t);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::backend::memory::MemoryBackend;
    use crate::backend::{LockKind, Owners};
    use crate::core::lease::default_drift;

    fn lease(id: u64) -> Arc<Lease> {
        let claim = Claim::new(
            "ns".into(),
            "k".into(),
            Duration::from_secs(30),
            LockKind::Exclusive,
            "memory",
            Owners::default().next(),
        );
        Arc::new(Lease::new(id, claim, Box::new(()), default_drift))
    }

    // A current-thread runtime: the task runs only once the test awaits.
    #[tokio::test]
    async fn a_lease_released_before_the_task_took_it_in_is_held_by_nothing_else() {
        let backend: Arc<dyn DynBackend> = Arc::new(MemoryBackend::new());
        let engine = Engine::start(
            &Handle::current(),
            backend,
            EngineConfig { auto_renew: true },
        );
        // Due long after the task's first wake: the inbox keeps them.
        let (kept, short) = (lease(1), lease(2));
        engine.track(&kept);
        engine.track(&short);
        engine.track(&short);
        assert!(short.finish());
        engine.forget(&short);
        // Taken back, both entries, at once: its guard's reference is the last one.
        assert_eq!(Arc::strong_count(&short), 1);
        // The other lease stays with the engine.
        assert_eq!(Arc::strong_count(&kept), 2);
        let (tx, rx) = oneshot::channel();
        engine.shutdown(tx);
        let left = rx.await.unwrap_or_default();
        assert_eq!(left.iter().map(|l| l.id).collect::<Vec<_>>(), [1]);
    }
}
