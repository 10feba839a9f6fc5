//! A claim: one owner's attempt to hold one key, and the flag that says its ownership is gone.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use super::{LockKind, Owner};

/// One attempt by one owner to hold one key, from the moment it is queued until it is released.
///
/// Backends read the key, namespace, owner token and TTL from it, and may mark it lost when they
/// learn, on their own, that ownership is gone (a ZooKeeper session expired, a memory lease
/// timed out and was handed on).
#[derive(Clone)]
pub struct Claim {
    namespace: Arc<str>,
    key: Arc<str>,
    kind: LockKind,
    /// The lost signal, and with it what the claim's clones share ([`ClaimState`]): one
    /// allocation per claim (a busy service makes many).
    lost: LostSignal,
}

/// The part of a [`Claim`] its clones share.
struct ClaimState {
    /// The owner token, a hyphenated UUID (ASCII).
    owner: Owner,
    /// The lease length asked for, in nanoseconds: a guard's `extend(ttl)` changes it for its
    /// own renewals.
    ttl: AtomicU64,
    /// A write hold turned into a read hold ([`Backend::downgrade`](super::Backend::downgrade)).
    downgraded: AtomicBool,
    /// The acquisition gave the claim up ([`Claim::is_abandoned`]).
    abandoned: AtomicBool,
    /// What a leadership claim proclaims ([`LockKind::Leader`]); none (empty) for the others.
    value: StdMutex<Option<Arc<[u8]>>>,
    /// Set once the claim is known lost.
    lost: AtomicBool,
    /// Woken once, when `lost` is set.
    lost_set: tokio::sync::Notify,
    /// The gauges the claim counts in while its guard holds ([`crate::core::metrics::held`]):
    /// taken out once, by its release or its loss, whichever comes first, and decremented on
    /// the very handles that were incremented (so a recorder set for one thread gets both).
    #[cfg(feature = "metrics")]
    gauges: StdMutex<Option<crate::core::metrics::Counted>>,
}

impl Claim {
    pub(crate) fn new(
        namespace: Arc<str>,
        key: Arc<str>,
        ttl: Duration,
        kind: LockKind,
        backend: &'static str,
        owner: Owner,
    ) -> Self {
        Self {
            namespace,
            key,
            kind,
            lost: LostSignal {
                shared: Arc::new(ClaimState {
                    owner,
                    ttl: AtomicU64::new(nanos(ttl)),
                    downgraded: AtomicBool::new(false),
                    abandoned: AtomicBool::new(false),
                    value: StdMutex::new(None),
                    lost: AtomicBool::new(false),
                    lost_set: tokio::sync::Notify::new(),
                    #[cfg(feature = "metrics")]
                    gauges: StdMutex::new(None),
                }),
                backend,
                kind,
            },
        }
    }

    /// What the claim's clones share (kept with its lost signal).
    fn state(&self) -> &ClaimState {
        &self.lost.shared
    }

    /// The claim with `value` as what it proclaims.
    pub(crate) fn with_value(self, value: Arc<[u8]>) -> Self {
        self.set_value(value);
        self
    }

    /// The namespace of the client that made the claim; backends put every name they touch
    /// under it.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The user's key, already checked against the shared rules and
    /// [`Backend::validate_key`](super::Backend::validate_key).
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The owner token: a v4 UUID in lowercase hyphenated form, unique to this claim. Its bits
    /// come from the client's key, drawn from the operating system once, and a counter: no two
    /// claims share one, within a client or across clients, as with random v4 UUIDs.
    /// Servers compare it before extending or deleting anything.
    pub fn owner(&self) -> &str {
        std::str::from_utf8(&self.state().owner).unwrap_or_default()
    }

    /// The lease length asked for. It changes only when the claim's guard extends its lease
    /// with a new TTL ([`MutexGuard::extend`](crate::MutexGuard::extend)), and then only
    /// together with the lease's generation, so a renewal reply computed with the old TTL is
    /// never applied to the new lease.
    pub fn ttl(&self) -> Duration {
        Duration::from_nanos(self.state().ttl.load(Ordering::Acquire))
    }

    /// Sets the lease length later renewals ask for.
    pub(crate) fn set_ttl(&self, ttl: Duration) {
        self.state().ttl.store(nanos(ttl), Ordering::Release);
    }

    /// What kind of hold is asked for, or held: a write claim reads as [`LockKind::Read`]
    /// once it was downgraded.
    pub fn kind(&self) -> LockKind {
        if self.kind == LockKind::Write && self.state().downgraded.load(Ordering::Acquire) {
            LockKind::Read
        } else {
            self.kind
        }
    }

    /// What a leadership claim ([`LockKind::Leader`]) proclaims: the value it was made with,
    /// or the last one [`Backend::proclaim`](super::Backend::proclaim) was asked to publish. Empty for other kinds.
    pub fn value(&self) -> Arc<[u8]> {
        let value = (self.state().value.lock())
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        value.unwrap_or_else(|| {
            // Every claim but a leader's has none: one shared empty value, not one each.
            static EMPTY: std::sync::LazyLock<Arc<[u8]>> =
                std::sync::LazyLock::new(|| Arc::from(&[][..]));
            EMPTY.clone()
        })
    }

    /// The gauges the claim counts in (see [`ClaimState::gauges`]).
    #[cfg(feature = "metrics")]
    pub(crate) fn gauges(&self) -> &StdMutex<Option<crate::core::metrics::Counted>> {
        &self.state().gauges
    }

    /// Sets what the claim proclaims.
    pub(crate) fn set_value(&self, value: Arc<[u8]>) {
        *(self.state().value.lock()).unwrap_or_else(std::sync::PoisonError::into_inner) =
            Some(value);
    }

    /// Records that the server turned this write hold into a read hold.
    pub(crate) fn set_downgraded(&self) {
        self.state().downgraded.store(true, Ordering::Release);
    }

    /// Records that the acquisition gave the claim up: its release is about to be sent.
    pub(crate) fn abandon(&self) {
        self.state().abandoned.store(true, Ordering::Release);
    }

    /// Whether the acquisition gave the claim up: it was cancelled (or failed) with an
    /// [`acquire`](super::Backend::acquire) call out, stopped waiting for that call, and sends
    /// the claim's [`release`](super::Backend::release) next. A backend holding a request for
    /// the claim that it has not sent yet (queued to go with others) must not send it after
    /// all: it would reach the server after the release and take the lock for no one.
    ///
    /// # Examples
    ///
    /// ```
    /// # use distlock::backend::Claim;
    /// // A backend's calls queued to go together: an abandoned claim's acquire stays out.
    /// fn still_wanted(claim: &Claim) -> bool {
    ///     !claim.is_abandoned()
    /// }
    /// # let _ = still_wanted;
    /// ```
    pub fn is_abandoned(&self) -> bool {
        self.state().abandoned.load(Ordering::Acquire)
    }

    /// Marks the claim lost: its guard reports [`is_lost`](crate::MutexGuard::is_lost) and
    /// wakes everything waiting in [`lost`](crate::MutexGuard::lost). Idempotent.
    pub fn mark_lost(&self) {
        if self.lost.mark() {
            tracing::debug!(key = self.key(), "lock marked lost");
        }
    }

    /// Whether the claim was marked lost.
    pub fn is_lost(&self) -> bool {
        self.lost.is_set()
    }

    pub(crate) fn lost_signal(&self) -> &LostSignal {
        &self.lost
    }
}

impl fmt::Debug for Claim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Claim")
            .field("namespace", &self.namespace)
            .field("key", &self.key)
            .field("owner", &self.owner())
            .field("ttl", &self.ttl())
            .field("kind", &self.kind)
            .field("lost", &self.is_lost())
            .finish()
    }
}

/// `d` in whole nanoseconds, saturating (584 years).
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A one-way "ownership is gone" flag that wakes every watcher.
///
/// A flag and one [`Notify`](tokio::sync::Notify) in one small allocation: every claim makes
/// one, and a `watch` channel (eight wake-up lists, a lock around its value) cost a busy
/// service a large allocation per lock and eight wake-up passes per release.
#[derive(Clone)]
pub(crate) struct LostSignal {
    /// The claim's shared state, which holds the flag.
    shared: Arc<ClaimState>,
    /// For the lost-locks metric: the backend's name and the claim's kind.
    backend: &'static str,
    kind: LockKind,
}

impl LostSignal {
    /// Sets the flag; true if it was not set before (and then counts the loss).
    pub(crate) fn mark(&self) -> bool {
        let first = !self.shared.lost.swap(true, Ordering::AcqRel);
        if first {
            self.shared.lost_set.notify_waiters();
            crate::core::metrics::lost(self.backend, self.kind);
            // A lost lock is held no more, whenever its guard goes.
            self.unheld();
        }
        first
    }

    /// Takes the claim out of the locks-held gauges, if it still counts there.
    pub(crate) fn unheld(&self) {
        #[cfg(feature = "metrics")]
        crate::core::metrics::unheld(&self.shared.gauges);
    }

    pub(crate) fn is_set(&self) -> bool {
        self.shared.lost.load(Ordering::Acquire)
    }

    /// Ends once the flag is set.
    ///
    /// # Cancel safety
    /// Cancel safe: it only waits.
    pub(crate) async fn wait(&self) {
        loop {
            let set = self.shared.lost_set.notified();
            let mut set = std::pin::pin!(set);
            // Listening before the flag is read: a `mark` between the two still wakes it.
            set.as_mut().enable();
            if self.is_set() {
                return;
            }
            set.await;
        }
    }
}
