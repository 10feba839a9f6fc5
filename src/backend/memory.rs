//! The in-process backend: the same FIFO, lease, handoff and fencing rules as the remote
//! backends, inside one process. It is the embedded default, not a mock.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex, MutexGuard as StdMutexGuard};

use tokio::sync::{watch, Notify};
use tokio::time::{sleep_until, Instant};

use super::{
    Attempt, Backend, Claim, Family, Grant, Leader, LeaderWatch, LockKind, LostSignal, Renewal,
};
use crate::error::{Error, Result};
use crate::inspect::{ForceReleased, Holder as Seen, Inspection, Waiter as SeenWaiting};
use crate::sync::LockExt;

/// How many operations pass between sweeps of leases that expired with nobody watching.
const SWEEP_EVERY: u64 = 1024;

/// Locks that live in this process: for a single replica, for tests, and as the quickstart's
/// backend.
///
/// Waiters are served in arrival order; a release hands the lock straight to the next waiter
/// and wakes it (no barging, no polling). A lease that is not renewed expires after its TTL, the
/// old holder's guard is marked lost and the next waiter gets the lock. Fencing tokens come from
/// one counter, so they increase across every grant of every key. A key nobody holds or waits
/// for takes no memory: one released or given up is removed at once, one whose lease ran out
/// with nobody watching at the next sweep (every 1,024 operations on the backend).
///
/// `MemoryBackend` is a cheap `Clone` handle: keep one to look at [`stats`](Self::stats) while
/// a [`LockClient`](crate::LockClient) built from another clone uses it.
///
/// # Examples
///
/// ```
/// use distlock::{backend::MemoryBackend, LockClient};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), distlock::Error> {
/// let backend = MemoryBackend::new();
/// let a = LockClient::builder(backend.clone()).build()?;
/// let b = LockClient::builder(backend.clone()).build()?;
/// let held = a.mutex("partition:3").lock().await?;
/// assert!(b.mutex("partition:3").try_lock().await.unwrap_err().is_would_block());
/// held.release().await?;
/// assert_eq!(backend.stats().keys, 0);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Default)]
pub struct MemoryBackend {
    shared: Arc<Store>,
}

#[derive(Default)]
struct Store {
    state: StdMutex<State>,
    fence: AtomicU64,
}

#[derive(Default)]
struct State {
    keys: HashMap<Arc<str>, KeyState>,
    ops: u64,
    /// Elections someone observes: moved whenever the key's leader changes.
    watches: HashMap<Arc<str>, watch::Sender<u64>>,
}

#[derive(Default)]
struct KeyState {
    holders: Vec<Holder>,
    queue: VecDeque<Waiter>,
}

struct Holder {
    owner: Arc<str>,
    kind: LockKind,
    fence: u64,
    valid_until: Instant,
    lost: LostSignal,
    /// What a leader proclaims (empty for other kinds).
    value: Arc<[u8]>,
}

struct Waiter {
    owner: Arc<str>,
    /// When it queued.
    since: Instant,
    kind: LockKind,
    ttl: std::time::Duration,
    wake: Arc<Notify>,
    lost: LostSignal,
    value: Arc<[u8]>,
}

/// What a claim keeps between calls: the wake-up its grant is announced on.
#[derive(Default)]
pub struct MemoryTicket {
    wake: Arc<Notify>,
}

impl std::fmt::Debug for MemoryTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryTicket").finish_non_exhaustive()
    }
}

/// A snapshot of what a [`MemoryBackend`] holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemoryStats {
    /// Keys with any state (a holder or a waiter).
    pub keys: usize,
    /// Keys with a holder whose lease has not expired.
    pub held: usize,
    /// Live holders across every key (readers and permit holders count one each).
    pub holders: usize,
    /// Claims waiting in queues.
    pub waiters: usize,
}

impl MemoryBackend {
    /// Creates an empty backend.
    ///
    /// # Examples
    ///
    /// ```
    /// let backend = distlock::backend::MemoryBackend::new();
    /// assert_eq!(backend.stats().keys, 0);
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// Counts keys, live holders and waiters.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let backend = distlock::backend::MemoryBackend::new();
    /// let client = distlock::LockClient::builder(backend.clone()).build()?;
    /// let _guard = client.mutex("k").lock().await?;
    /// assert_eq!(backend.stats().held, 1);
    /// # Ok(())
    /// # }
    /// ```
    pub fn stats(&self) -> MemoryStats {
        let state = self.lock_state();
        let now = Instant::now();
        let mut stats = MemoryStats {
            keys: state.keys.len(),
            ..MemoryStats::default()
        };
        for ks in state.keys.values() {
            stats.waiters += ks.queue.len();
            let live = ks.holders.iter().filter(|h| h.valid_until > now).count();
            stats.holders += live;
            if live > 0 {
                stats.held += 1;
            }
        }
        stats
    }

    fn lock_state(&self) -> StdMutexGuard<'_, State> {
        // A panic while holding this mutex cannot leave the maps half-updated in a way that
        // breaks exclusion (each step is a single insert or remove), so keep serving.
        self.shared.state.locked()
    }

    fn next_fence(&self) -> u64 {
        self.shared.fence.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Runs `f` on the claim's key's state (see [`at_key`](Self::at_key)).
    fn with_key<R>(&self, claim: &Claim, f: impl FnOnce(&Self, &mut KeyState, Instant) -> R) -> R {
        self.at_key(full_name(claim), f)
    }

    /// Runs `f` on the state of the key `name`, with expired holders removed and every
    /// grantable waiter granted, then drops the state if the key became idle, and tells the
    /// key's observers if its leader changed.
    fn at_key<R>(&self, name: Arc<str>, f: impl FnOnce(&Self, &mut KeyState, Instant) -> R) -> R {
        let mut state = self.lock_state();
        let now = Instant::now();
        state.ops += 1;
        if state.ops.is_multiple_of(SWEEP_EVERY) {
            state.keys.retain(|_, ks| {
                ks.expire_holders(now);
                !ks.is_idle()
            });
        }
        // Only an election someone observes needs its leader compared.
        let observed = state.watches.contains_key(&name);
        let leader = |ks: &KeyState| {
            ks.leader()
                .filter(|_| observed)
                .map(|h| (h.fence, h.value.clone()))
        };
        let ks = state.keys.entry(name.clone()).or_default();
        let before = leader(ks);
        ks.expire_holders(now);
        self.grant_pass(ks, now);
        let result = f(self, ks, now);
        let changed = leader(ks) != before;
        if ks.is_idle() {
            state.keys.remove(&name);
        }
        if changed {
            if let Some(tx) = state.watches.get(&name) {
                tx.send_modify(|n| *n = n.wrapping_add(1));
            }
        }
        result
    }

    /// Grants waiters from the head of the queue while the head fits beside the holders, and
    /// wakes each: readers behind a writer wait for it, a large permit request at the head is
    /// not overtaken by smaller ones behind it.
    fn grant_pass(&self, ks: &mut KeyState, now: Instant) {
        while ks.queue.front().is_some_and(|w| ks.fits(w.kind)) {
            let Some(next) = ks.queue.pop_front() else {
                break;
            };
            ks.holders.push(Holder {
                owner: next.owner,
                kind: next.kind,
                fence: self.next_fence(),
                valid_until: now + next.ttl,
                lost: next.lost,
                value: next.value,
            });
            next.wake.notify_one();
        }
    }
}

impl std::fmt::Debug for MemoryBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryBackend")
            .field("stats", &self.stats())
            .finish()
    }
}

fn full_name(claim: &Claim) -> Arc<str> {
    name_of(claim.namespace(), claim.key())
}

fn name_of(namespace: &str, key: &str) -> Arc<str> {
    // Namespaces cannot contain ':', so the split is unambiguous.
    format!("{namespace}:{key}").into()
}

impl KeyState {
    fn is_idle(&self) -> bool {
        self.holders.is_empty() && self.queue.is_empty()
    }

    /// Removes holders whose lease ran out, marking them lost.
    fn expire_holders(&mut self, now: Instant) {
        self.holders.retain(|h| {
            let live = h.valid_until > now;
            if !live {
                h.lost.mark();
            }
            live
        });
    }

    /// What the key is now, if anyone holds or waits for it.
    fn family(&self) -> Option<Family> {
        self.holders
            .first()
            .map(|h| h.kind)
            .or_else(|| self.queue.front().map(|w| w.kind))
            .map(LockKind::family)
    }

    fn fits(&self, kind: LockKind) -> bool {
        kind.fits(self.holders.iter().map(|h| h.kind))
    }

    /// The holder of an election, if the key is one and someone leads.
    fn leader(&self) -> Option<&Holder> {
        self.holders.iter().find(|h| h.kind == LockKind::Leader)
    }

    fn holder(&self, owner: &str) -> Option<&Holder> {
        self.holders.iter().find(|h| &*h.owner == owner)
    }

    fn grant_of(&self, owner: &str) -> Option<Grant> {
        self.holder(owner)
            .map(|h| Grant::new(h.fence, h.valid_until))
    }

    fn position(&self, owner: &str) -> Option<usize> {
        self.queue.iter().position(|w| &*w.owner == owner)
    }

    /// The earliest moment a holder's lease runs out: when a waiter should look again.
    fn next_expiry(&self) -> Option<Instant> {
        self.holders.iter().map(|h| h.valid_until).min()
    }
}

impl Backend for MemoryBackend {
    type Ticket = MemoryTicket;

    fn supports(&self, _kind: LockKind) -> bool {
        true
    }

    fn name(&self) -> &'static str {
        "memory"
    }

    async fn inspect(&self, namespace: &str, key: &str) -> Result<Inspection> {
        Ok(self.at_key(name_of(namespace, key), |_, ks, now| {
            let mut seen = Inspection::free(key);
            seen.family = ks.family();
            seen.holders = ks
                .holders
                .iter()
                .map(|h| Seen {
                    kind: h.kind,
                    fencing_token: Some(h.fence),
                    lease_left: Some(h.valid_until.saturating_duration_since(now)),
                })
                .collect();
            seen.waiters = ks
                .queue
                .iter()
                .map(|w| SeenWaiting {
                    kind: w.kind,
                    waited: Some(now.saturating_duration_since(w.since)),
                })
                .collect();
            seen
        }))
    }

    async fn force_release(&self, namespace: &str, key: &str) -> Result<ForceReleased> {
        Ok(self.at_key(name_of(namespace, key), |this, ks, now| {
            let mut removed = ForceReleased::nothing(key);
            removed.family = ks.family();
            // Every holder goes at once, marked lost (in this process its guard can be told
            // at once; its renewal would find nothing anyway). The one counter hands every
            // later grant a greater token.
            removed.removed = ks
                .holders
                .drain(..)
                .map(|h| {
                    h.lost.mark();
                    Seen {
                        kind: h.kind,
                        fencing_token: Some(h.fence),
                        lease_left: Some(h.valid_until.saturating_duration_since(now)),
                    }
                })
                .collect();
            this.grant_pass(ks, now);
            removed
        }))
    }

    async fn proclaim(&self, claim: &Claim, _ticket: &MemoryTicket) -> Result<()> {
        self.with_key(claim, |_, ks, _| {
            match ks.holders.iter_mut().find(|h| *h.owner == *claim.owner()) {
                Some(h) => {
                    h.value = claim.value();
                    Ok(())
                }
                None => Err(Error::lost(claim.key())),
            }
        })
    }

    async fn leader(&self, namespace: &str, key: &str) -> Result<Option<Leader>> {
        self.at_key(name_of(namespace, key), |_, ks, now| {
            if let Some(family) = ks.family().filter(|f| *f != Family::Election) {
                return Err(Error::kind_mismatch(format_args!(
                    "`{key}` is {family} here, not an election"
                )));
            }
            Ok(ks.leader().map(|h| {
                Leader::new(
                    h.value.clone(),
                    h.fence,
                    h.valid_until.saturating_duration_since(now),
                )
            }))
        })
    }

    async fn watch_leader(&self, namespace: &str, key: &str) -> Result<LeaderWatch> {
        let mut state = self.lock_state();
        let name = name_of(namespace, key);
        if let Some(tx) = state.watches.get(&name) {
            return Ok(LeaderWatch::new(tx.subscribe()));
        }
        // Forget the elections nobody observes any more.
        state.watches.retain(|_, tx| tx.receiver_count() > 0);
        let (tx, rx) = watch::channel(0);
        state.watches.insert(name, tx);
        Ok(LeaderWatch::new(rx))
    }

    async fn acquire(&self, claim: &Claim, ticket: &MemoryTicket, wait: bool) -> Result<Attempt> {
        self.with_key(claim, |this, ks, now| {
            if let Some(grant) = ks.grant_of(claim.owner()) {
                return Ok(Attempt::Granted(grant));
            }
            let kind = claim.kind();
            if let Some(family) = ks.family().filter(|f| *f != kind.family()) {
                return Err(Error::kind_mismatch(format_args!(
                    "`{}` is {family} here, asked for as {}",
                    claim.key(),
                    kind.family()
                )));
            }
            if ks.queue.is_empty() && ks.fits(kind) {
                let grant = Grant::new(this.next_fence(), now + claim.ttl());
                ks.holders.push(Holder {
                    owner: claim.owner().into(),
                    kind,
                    fence: grant.fence,
                    valid_until: grant.valid_until,
                    lost: claim.lost_signal().clone(),
                    value: claim.value(),
                });
                return Ok(Attempt::Granted(grant));
            }
            if wait && ks.position(claim.owner()).is_none() {
                ks.queue.push_back(Waiter {
                    owner: claim.owner().into(),
                    since: now,
                    kind,
                    ttl: claim.ttl(),
                    wake: ticket.wake.clone(),
                    lost: claim.lost_signal().clone(),
                    value: claim.value(),
                });
            }
            Ok(Attempt::Queued {
                recheck_at: ks.next_expiry(),
            })
        })
    }

    async fn wait(
        &self,
        _claim: &Claim,
        ticket: &MemoryTicket,
        recheck_at: Option<Instant>,
    ) -> Result<Option<Grant>> {
        match recheck_at {
            Some(at) => tokio::select! {
                () = ticket.wake.notified() => {}
                () = sleep_until(at) => {}
            },
            None => ticket.wake.notified().await,
        }
        Ok(None)
    }

    async fn release(&self, claim: &Claim, _ticket: &MemoryTicket) -> Result<bool> {
        Ok(self.with_key(claim, |this, ks, now| {
            let held = match ks.holders.iter().position(|h| *h.owner == *claim.owner()) {
                Some(i) => {
                    ks.holders.swap_remove(i);
                    true
                }
                None => {
                    if let Some(i) = ks.position(claim.owner()) {
                        ks.queue.remove(i);
                    }
                    false
                }
            };
            // A released holder, or a waiter gone from the head, may let others in.
            this.grant_pass(ks, now);
            held
        }))
    }

    async fn downgrade(&self, claim: &Claim, _ticket: &MemoryTicket) -> Result<Grant> {
        self.with_key(claim, |this, ks, now| {
            let Some(h) = ks
                .holders
                .iter_mut()
                .find(|h| *h.owner == *claim.owner() && h.kind == LockKind::Write)
            else {
                return Err(Error::lost(claim.key()));
            };
            h.kind = LockKind::Read;
            // The lease is set again, as the servers' downgrades set it (never shorter).
            h.valid_until = h.valid_until.max(now + claim.ttl());
            let grant = Grant::new(h.fence, h.valid_until);
            this.grant_pass(ks, now);
            Ok(grant)
        })
    }

    async fn renew(&self, claims: &[(&Claim, &MemoryTicket)]) -> Vec<Renewal> {
        claims
            .iter()
            .map(|(claim, _)| {
                self.with_key(claim, |_, ks, now| {
                    if let Some(h) = ks.holders.iter_mut().find(|h| *h.owner == *claim.owner()) {
                        // Never shortens a lease, as the servers' renewals do.
                        let until = now + claim.ttl();
                        h.valid_until = h.valid_until.max(until);
                        Renewal::Extended(until)
                    } else if ks.position(claim.owner()).is_some() {
                        Renewal::Queued(now + claim.ttl())
                    } else {
                        Renewal::NotOwner
                    }
                })
            })
            .collect()
    }
}
