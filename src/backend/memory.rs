//! The in-process backend: the same FIFO, lease, handoff and fencing rules as the remote
//! backends, inside one process. It is the embedded default, not a mock.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex, MutexGuard as StdMutexGuard};

use tokio::sync::Notify;
use tokio::time::{sleep_until, Instant};

use super::{Attempt, Backend, Claim, Grant, LostSignal, Renewal};
use crate::error::Result;

/// How many operations pass between sweeps of leases that expired with nobody watching.
const SWEEP_EVERY: u64 = 1024;

/// Locks that live in this process: for a single replica, for tests, and as the quickstart's
/// backend.
///
/// Waiters are served in arrival order; a release hands the lock straight to the next waiter
/// and wakes it (no barging, no polling). A lease that is not renewed expires after its TTL, the
/// old holder's guard is marked lost and the next waiter gets the lock. Fencing tokens come from
/// one counter, so they increase across every grant of every key. A key nobody holds or waits
/// for takes no memory.
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
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    state: StdMutex<State>,
    fence: AtomicU64,
}

#[derive(Default)]
struct State {
    keys: HashMap<Arc<str>, KeyState>,
    ops: u64,
}

#[derive(Default)]
struct KeyState {
    holder: Option<Holder>,
    queue: VecDeque<Waiter>,
}

struct Holder {
    owner: Arc<str>,
    fence: u64,
    valid_until: Instant,
    lost: LostSignal,
}

struct Waiter {
    owner: Arc<str>,
    ttl: std::time::Duration,
    wake: Arc<Notify>,
    lost: LostSignal,
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
            if ks.holder.as_ref().is_some_and(|h| h.valid_until > now) {
                stats.held += 1;
            }
        }
        stats
    }

    fn lock_state(&self) -> StdMutexGuard<'_, State> {
        // A panic while holding this mutex cannot leave the maps half-updated in a way that
        // breaks exclusion (each step is a single insert or remove), so keep serving.
        self.shared
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn next_fence(&self) -> u64 {
        self.shared.fence.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Runs `f` on the key's state, then drops the state if the key became idle.
    fn with_key<R>(&self, claim: &Claim, f: impl FnOnce(&Self, &mut KeyState, Instant) -> R) -> R {
        let mut state = self.lock_state();
        let now = Instant::now();
        state.ops += 1;
        if state.ops % SWEEP_EVERY == 0 {
            state.keys.retain(|_, ks| {
                expire_holder(ks, now);
                !ks.is_idle()
            });
        }
        let name = full_name(claim);
        let ks = state.keys.entry(name.clone()).or_default();
        expire_holder(ks, now);
        if ks.holder.is_none() && !ks.queue.is_empty() {
            self.hand_off(ks, now);
        }
        let result = f(self, ks, now);
        if ks.is_idle() {
            state.keys.remove(&name);
        }
        result
    }

    /// Gives the free lock to the head of the queue and wakes it.
    fn hand_off(&self, ks: &mut KeyState, now: Instant) {
        if let Some(next) = ks.queue.pop_front() {
            ks.holder = Some(Holder {
                owner: next.owner,
                fence: self.next_fence(),
                valid_until: now + next.ttl,
                lost: next.lost,
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
    // Namespaces cannot contain ':', so the split is unambiguous.
    format!("{}:{}", claim.namespace(), claim.key()).into()
}

fn expire_holder(ks: &mut KeyState, now: Instant) {
    if ks.holder.as_ref().is_some_and(|h| h.valid_until <= now) {
        if let Some(old) = ks.holder.take() {
            old.lost.mark();
        }
    }
}

impl KeyState {
    fn is_idle(&self) -> bool {
        self.holder.is_none() && self.queue.is_empty()
    }

    fn grant_of(&self, owner: &str) -> Option<Grant> {
        self.holder
            .as_ref()
            .filter(|h| &*h.owner == owner)
            .map(|h| Grant {
                fence: h.fence,
                valid_until: h.valid_until,
            })
    }

    fn position(&self, owner: &str) -> Option<usize> {
        self.queue.iter().position(|w| &*w.owner == owner)
    }
}

impl Backend for MemoryBackend {
    type Ticket = MemoryTicket;

    async fn acquire(&self, claim: &Claim, ticket: &MemoryTicket, wait: bool) -> Result<Attempt> {
        Ok(self.with_key(claim, |this, ks, now| {
            if let Some(grant) = ks.grant_of(claim.owner()) {
                return Attempt::Granted(grant);
            }
            if ks.holder.is_none() && ks.queue.is_empty() {
                let grant = Grant {
                    fence: this.next_fence(),
                    valid_until: now + claim.ttl(),
                };
                ks.holder = Some(Holder {
                    owner: claim.owner.clone(),
                    fence: grant.fence,
                    valid_until: grant.valid_until,
                    lost: claim.lost_signal().clone(),
                });
                return Attempt::Granted(grant);
            }
            if wait && ks.position(claim.owner()).is_none() {
                ks.queue.push_back(Waiter {
                    owner: claim.owner.clone(),
                    ttl: claim.ttl(),
                    wake: ticket.wake.clone(),
                    lost: claim.lost_signal().clone(),
                });
            }
            Attempt::Queued {
                recheck_at: ks.holder.as_ref().map(|h| h.valid_until),
            }
        }))
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
            if ks.grant_of(claim.owner()).is_some() {
                ks.holder = None;
                this.hand_off(ks, now);
                return true;
            }
            if let Some(i) = ks.position(claim.owner()) {
                ks.queue.remove(i);
            }
            false
        }))
    }

    async fn renew(&self, claims: &[(&Claim, &MemoryTicket)]) -> Vec<Renewal> {
        claims
            .iter()
            .map(|(claim, _)| {
                self.with_key(claim, |_, ks, now| {
                    if let Some(h) = ks.holder.as_mut().filter(|h| *h.owner == *claim.owner()) {
                        h.valid_until = now + claim.ttl();
                        Renewal::Extended(h.valid_until)
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
