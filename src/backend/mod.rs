//! The one seam between the lock API and a coordination service.
//!
//! Everything users touch (guards, renewal, the lost signal, cancellation, timeouts) is written
//! once above this trait. A backend answers five questions about a *claim* (one attempt by one
//! owner to hold one key):
//!
//! | call | memory | Redis (single, Cluster, Sentinel) | Redlock | ZooKeeper | PostgreSQL |
//! |---|---|---|---|---|---|
//! | [`acquire`](Backend::acquire) | grant, or join the queue | script: grant, or subscribe, enqueue and return the holder's PTTL | the script on every node; a majority of grants is a grant | create the sequential node (once), list, watch the node ahead | function: grant, or LISTEN, enqueue and return the holder's lease end |
//! | [`wait`](Backend::wait) | in-process wake-up, or the holder's expiry | a grant message on our channel, or the PTTL deadline | grant messages from a majority, or the earliest lease end | the watch on the node ahead, or a session change | a NOTIFY for us, or the lease end |
//! | [`release`](Backend::release) | hand off to the queue head | compare the owner, hand the lock to the live queue head and publish it | release on every node, each handing on | delete our node (found by its protection prefix if need be) | compare the owner, hand on, NOTIFY the new owner |
//! | [`renew`](Backend::renew) | extend deadlines | one script call for every lease and queue entry (one per slot on a Cluster) | one call per node; a lease holds while a majority renewed it | the session's epoch: leases last while the session does | one statement for every lease and queue entry |
//! | [`downgrade`](Backend::downgrade) | write hold to read hold in place | one script | on every node, kept while a majority did | a read node before the write node goes (Curator's layout) | one statement |
//!
//! The backend remembers what it learned about a claim (a subscription, a node name) in its
//! [`Ticket`](Backend::Ticket), which the layer above creates *before* the first call. So when a
//! `lock()` future is dropped anywhere, even before the first call returned, the claim and its
//! ticket are still there to [`release`](Backend::release), which removes every trace.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::inspect::{ForceReleased, Inspection};

mod claim;
mod erased;
#[cfg(any(feature = "redis", feature = "postgres"))]
mod handoff;
#[cfg(any(feature = "redis", feature = "postgres"))]
mod hub;
mod leader;
#[cfg(feature = "memory")]
pub mod memory;
mod owner;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "redis")]
mod redis;
#[cfg(feature = "redlock")]
mod redlock;
#[cfg(any(feature = "redis", feature = "postgres"))]
mod retry;
mod wire;
#[cfg(feature = "zookeeper")]
mod zookeeper;

/// What a claim asks for. One key holds one family of lock (a mutex, a read-write lock, or a
/// semaphore with a given number of permits); a backend refuses a claim of another family on
/// a key in use with [`ErrorKind::KindMismatch`](crate::ErrorKind::KindMismatch).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LockKind {
    /// One holder at a time ([`Mutex`](crate::Mutex)).
    Exclusive,
    /// Shared with other readers, excluded by a writer ([`RwLock::read`](crate::RwLock::read)).
    Read,
    /// One holder, excluding readers too ([`RwLock::write`](crate::RwLock::write)).
    Write,
    /// `count` of the `max` permits of a semaphore ([`Semaphore`](crate::Semaphore)).
    Permits {
        /// How many permits this claim takes (1 to `max`).
        count: u32,
        /// How many permits the semaphore has; every claim on the key must agree.
        max: u32,
    },
    /// Leadership of an election ([`Election`](crate::Election)): one holder at a time, like
    /// [`Exclusive`](Self::Exclusive), carrying the value it proclaims ([`Claim::value`]).
    Leader,
}

impl LockKind {
    /// The family of locks this kind belongs to: one key holds one family.
    pub fn family(self) -> Family {
        match self {
            LockKind::Exclusive => Family::Mutex,
            LockKind::Leader => Family::Election,
            LockKind::Read | LockKind::Write => Family::RwLock,
            LockKind::Permits { max, .. } => Family::Semaphore { max },
        }
    }

    /// One claim that asks for what `self` and `other` ask of the same key: the stronger of a
    /// read-write lock's two sides (write over read), the same kind twice as itself; `None`
    /// when they are different families (or different permit counts), which one key cannot be.
    pub(crate) fn merged(self, other: LockKind) -> Option<LockKind> {
        match (self, other) {
            (a, b) if a == b => Some(a),
            (LockKind::Write, LockKind::Read) | (LockKind::Read, LockKind::Write) => {
                Some(LockKind::Write)
            }
            _ => None,
        }
    }

    /// Whether holding a key as `self` already gives what `inner` asks of it (a nested call
    /// that may run without taking anything): the same kind, or write for read.
    #[cfg_attr(not(feature = "macros"), allow(dead_code))]
    pub(crate) fn covers(self, inner: LockKind) -> bool {
        self.merged(inner) == Some(self)
    }

    /// Whether a claim of this kind can hold the lock alongside holders of `others`, as the
    /// queue rules see it: a writer or exclusive claim only alone, a reader with readers, and
    /// permits while the semaphore has enough left.
    pub fn fits<I: IntoIterator<Item = LockKind>>(self, others: I) -> bool {
        let mut others = others.into_iter();
        match self {
            LockKind::Exclusive | LockKind::Write | LockKind::Leader => others.next().is_none(),
            LockKind::Read => others.all(|k| k == LockKind::Read),
            LockKind::Permits { count, max } => {
                let used: u64 = others
                    .map(|k| match k {
                        LockKind::Permits { count, .. } => u64::from(count),
                        _ => u64::from(max),
                    })
                    .sum();
                used + u64::from(count) <= u64::from(max)
            }
        }
    }
}

/// The family of a [`LockKind`]: what a key is, while anyone holds or waits for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Family {
    /// A [`Mutex`](crate::Mutex).
    Mutex,
    /// An [`RwLock`](crate::RwLock).
    RwLock,
    /// A [`Semaphore`](crate::Semaphore) with `max` permits.
    Semaphore {
        /// Its number of permits.
        max: u32,
    },
    /// An [`Election`](crate::Election).
    Election,
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Family::Mutex => f.write_str("a mutex"),
            Family::RwLock => f.write_str("a read-write lock"),
            Family::Semaphore { max } => write!(f, "a semaphore of {max} permits"),
            Family::Election => f.write_str("an election"),
        }
    }
}

/// The lock is ours: the fencing token and how long the lease is valid on this machine's clock.
///
/// Built with [`Grant::new`] (the lease the claim asked for) or [`Grant::provisional`] (a
/// shorter lease the new owner must confirm).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Grant {
    /// Strictly increasing per key across all grants.
    pub fence: u64,
    /// The lease is certainly valid until this instant, measured from when the request that
    /// produced the grant was *sent* (the layer above subtracts a clock-drift margin too).
    pub valid_until: Instant,
    /// The lease is a short one the backend set on the new owner's behalf (a lock handed to a
    /// waiter by its releasing holder): the layer above renews it once to the claim's TTL even
    /// when automatic renewal is off, so that a waiter that died before confirming it blocks
    /// the key only that long.
    pub provisional: bool,
}

impl Grant {
    /// A grant of the lease the claim asked for.
    ///
    /// ```
    /// use distlock::backend::Grant;
    /// use tokio::time::{Duration, Instant};
    ///
    /// let grant = Grant::new(7, Instant::now() + Duration::from_secs(30));
    /// assert!(!grant.provisional);
    /// ```
    pub fn new(fence: u64, valid_until: Instant) -> Self {
        Self {
            fence,
            valid_until,
            provisional: false,
        }
    }

    /// A grant under a provisional lease, to be confirmed by a renewal (see
    /// [`provisional`](Grant::provisional)).
    ///
    /// ```
    /// use distlock::backend::Grant;
    /// use tokio::time::{Duration, Instant};
    ///
    /// let grant = Grant::provisional(8, Instant::now() + Duration::from_secs(2));
    /// assert!(grant.provisional);
    /// ```
    pub fn provisional(fence: u64, valid_until: Instant) -> Self {
        Self {
            fence,
            valid_until,
            provisional: true,
        }
    }
}

/// The outcome of one [`Backend::acquire`] call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Attempt {
    /// The lock is ours.
    Granted(Grant),
    /// Not ours yet. With `wait == true` the claim holds its place in the queue; with
    /// `wait == false` nothing was left on the server.
    Queued {
        /// When to check again even without a notification: the holder's lease deadline, as
        /// learned from the server. `None` when only a notification can help.
        recheck_at: Option<Instant>,
    },
}

/// The outcome of renewing one claim. It says what the server extended, because a renewal sent
/// for a queued claim may be answered after a handoff made that claim the holder: only a lease
/// extension of a claim that held the lock when the call was sent moves its lease.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Renewal {
    /// The claim holds the lock, and its lease is extended and certainly valid until this
    /// instant (measured from when the renewal was sent).
    Extended(Instant),
    /// The claim is queued, and its place is kept until this instant.
    Queued(Instant),
    /// The server says the claim does not own the lock: it is lost, stop renewing it.
    NotOwner,
    /// The server could not be asked. The layer above retries until the lease deadline.
    Failed(Error),
}

/// A coordination service that can hold leased, fenced, FIFO locks.
///
/// Implement it with plain `async fn`s. Every method gets the [`Claim`] and the backend's own
/// per-claim [`Ticket`](Self::Ticket).
///
/// # Cancel safety
///
/// The layer above drops [`wait`](Self::wait) futures at any await point (timeouts, aborted
/// tasks) and then calls [`release`](Self::release) for the same claim from a spawned task. An
/// [`acquire`](Self::acquire) call out when the acquisition is cancelled is not dropped: the
/// task drives it to its end first, so the release reaches the server after it even when the
/// two go out on different connections (a pool). `release` must remove the claim's queue entry
/// *and* a grant that may have raced with the drop, using only the claim and its ticket.
/// Before that release the claim is marked [abandoned](Claim::is_abandoned): a request for it
/// that the backend queued and has not sent yet must not be sent.
///
/// # Examples
///
/// ```
/// use distlock::backend::MemoryBackend;
/// use distlock::LockClient;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), distlock::Error> {
/// let backend = MemoryBackend::new();
/// let client = LockClient::builder(backend.clone()).namespace("billing").build()?;
/// let guard = client.mutex("invoice:7").lock().await?;
/// assert_eq!(backend.stats().held, 1);
/// guard.release().await?;
/// # Ok(())
/// # }
/// ```
pub trait Backend: Send + Sync + 'static {
    /// What the backend remembers about one claim between calls. Created with `Default`
    /// before the first call.
    type Ticket: Default + Send + Sync + 'static;

    /// Whether queued claims must be kept alive by the renewal task (Redis queue entries
    /// expire; ZooKeeper nodes and in-process queues do not).
    const RENEWS_WAITERS: bool = false;

    /// Whether this backend can hold claims of `kind`. The default is [`LockKind::Exclusive`]
    /// only, so a backend written before read-write locks and semaphores refuses them (with
    /// [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported), before any I/O) instead of treating them as mutexes.
    fn supports(&self, kind: LockKind) -> bool {
        matches!(kind, LockKind::Exclusive)
    }

    /// Rejects keys this service cannot hold, before any I/O. The shared rules (non-empty,
    /// at most [`MAX_KEY_LEN`](crate::MAX_KEY_LEN) bytes, no NUL) are already checked.
    ///
    /// # Errors
    ///
    /// An [`ErrorKind::InvalidKey`](crate::ErrorKind::InvalidKey) error naming the broken rule.
    fn validate_key(&self, key: &str) -> Result<()> {
        let _ = key;
        Ok(())
    }

    /// Whether the claim has reached the server's queue (a queue entry, a node whose create
    /// may have succeeded), in this call or an earlier one. A claim that has is past its first
    /// contact: the layer above treats a transient error of its first [`acquire`](Self::acquire)
    /// like one of a later call and rides the outage out until the claim's own deadline. The
    /// default, `false`, makes a first call that finds no server fail at once.
    fn has_queued(&self, ticket: &Self::Ticket) -> bool {
        let _ = ticket;
        false
    }

    /// Takes the lock, or (with `wait`) joins or keeps the claim's place in the FIFO queue.
    /// Called again after every wake-up, so it must be idempotent and must report a grant that
    /// a releasing holder handed to this claim.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Backend`](crate::ErrorKind::Backend) when the service fails; the layer above then releases the claim.
    fn acquire(
        &self,
        claim: &Claim,
        ticket: &Self::Ticket,
        wait: bool,
    ) -> impl Future<Output = Result<Attempt>> + Send;

    /// Sleeps until the claim may have become grantable: a notification, or `recheck_at`.
    /// Returns a grant if the notification itself proves one, otherwise `None` and the layer
    /// above calls [`acquire`](Self::acquire) again. Spurious wake-ups are fine; sleep-polling
    /// on a fixed interval is not.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Backend`](crate::ErrorKind::Backend) when the service fails while waiting.
    fn wait(
        &self,
        claim: &Claim,
        ticket: &Self::Ticket,
        recheck_at: Option<Instant>,
    ) -> impl Future<Output = Result<Option<Grant>>> + Send;

    /// Removes every trace of the claim: its queue entry, or its grant, handing the lock to the
    /// next live waiter. Compares the owner server-side. Returns whether the claim held the
    /// lock; when a retry finds nothing after an attempt whose reply was lost (which may have
    /// released the grant itself), return `true`: the layer above knows locally whether the
    /// lease was still valid. Idempotent.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Backend`](crate::ErrorKind::Backend) when the service fails.
    fn release(
        &self,
        claim: &Claim,
        ticket: &Self::Ticket,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// Turns the claim's write hold into a read hold in one step, so no writer queued behind
    /// it can take the lock in between; readers queued behind it may then be granted. The grant
    /// keeps its fencing token. Called only for a held [`LockKind::Write`] claim; the default
    /// refuses.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported) by default; [`ErrorKind::Lost`](crate::ErrorKind::Lost) if the claim no longer holds
    /// the lock; [`ErrorKind::Backend`](crate::ErrorKind::Backend) when the service fails.
    fn downgrade(
        &self,
        claim: &Claim,
        ticket: &Self::Ticket,
    ) -> impl Future<Output = Result<Grant>> + Send {
        let _ = ticket;
        let refused = Error::unsupported(format_args!(
            "this backend cannot downgrade a write lock (`{}`)",
            claim.key()
        ));
        async move { Err(refused) }
    }

    /// Extends many leases and queue entries, ideally in one round trip. Returns one
    /// [`Renewal`] per input, in order.
    fn renew(
        &self,
        claims: &[(&Claim, &Self::Ticket)],
    ) -> impl Future<Output = Vec<Renewal>> + Send;

    /// A counter that moves every time one of the backend's connections (or sessions) comes
    /// back after a drop (or opens late, after locks were taken). The renewal engine renews
    /// every held lease at once when it moves, so a holder whose lock vanished with the outage
    /// (a server restarted without its data) is told within a round trip of the reconnect
    /// instead of at its next scheduled renewal.
    /// `None` (the default) for a backend without connections.
    fn reconnects(&self) -> Option<watch::Receiver<u64>> {
        None
    }

    /// The lease this service gives every claim, whatever TTL the claim asks for (a ZooKeeper
    /// session's timeout): a client built on this backend takes it as its default TTL, so the
    /// renewal schedule and the lost deadline follow the lease the service really keeps.
    /// `None` (the default): each claim's lease is the TTL it asks for.
    fn lease(&self) -> Option<Duration> {
        None
    }

    /// A short name for the backend (`memory`, `redis`, `zookeeper`, ...), used as the
    /// `backend` label of metrics.
    fn name(&self) -> &'static str {
        "custom"
    }

    /// Reads what `key` (in `namespace`) looks like now: holders, waiters, and as what (see
    /// [`Inspection`]). The key has passed the shared rules and
    /// [`validate_key`](Self::validate_key). The default says the backend cannot.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported) by default; [`ErrorKind::Backend`](crate::ErrorKind::Backend) if the service fails.
    fn inspect(
        &self,
        namespace: &str,
        key: &str,
    ) -> impl Future<Output = Result<Inspection>> + Send {
        let refused = Error::unsupported(format_args!("this backend cannot inspect `{key}`"));
        let _ = namespace;
        async move { Err(refused) }
    }

    /// The operator's unlock: drops every holder of `key` (in `namespace`) at once, whoever
    /// they are, and hands the lock on to the waiters as their releases would. The fencing
    /// counter stays above every token handed out, so the next grant's token exceeds the
    /// dropped holders'; their renewals then get [`Renewal::NotOwner`] (their guards report
    /// lost). The key has passed the shared rules and [`validate_key`](Self::validate_key).
    /// The default says the backend cannot.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported) by default; [`ErrorKind::Backend`](crate::ErrorKind::Backend) if the service fails.
    fn force_release(
        &self,
        namespace: &str,
        key: &str,
    ) -> impl Future<Output = Result<ForceReleased>> + Send {
        let refused = Error::unsupported(format_args!("this backend cannot force-release `{key}`"));
        let _ = namespace;
        async move { Err(refused) }
    }

    /// Elections: publishes the claim's [`value`](Claim::value) as what the leader says, in
    /// place of the value it had, without giving up leadership. Called only for a held
    /// [`LockKind::Leader`] claim, after [`Claim::value`] changed. The default says the
    /// backend cannot.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Lost`](crate::ErrorKind::Lost) if the claim no longer leads;
    /// [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported) by default;
    /// [`ErrorKind::Backend`](crate::ErrorKind::Backend) if the service fails.
    fn proclaim(
        &self,
        claim: &Claim,
        ticket: &Self::Ticket,
    ) -> impl Future<Output = Result<()>> + Send {
        let _ = ticket;
        let refused = Error::unsupported(format_args!(
            "this backend has no elections (`{}`)",
            claim.key()
        ));
        async move { Err(refused) }
    }

    /// Elections: who leads `key` (in `namespace`) now: the holder's value, term (its fencing
    /// token) and the lease it has left; `None` while nobody leads. The key has passed the
    /// shared rules and [`validate_key`](Self::validate_key). The default says the backend
    /// cannot.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::KindMismatch`](crate::ErrorKind::KindMismatch) if the key is in use as
    /// another kind of lock; [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported) by
    /// default; [`ErrorKind::Backend`](crate::ErrorKind::Backend) if the service fails.
    fn leader(
        &self,
        namespace: &str,
        key: &str,
    ) -> impl Future<Output = Result<Option<Leader>>> + Send {
        let refused = Error::unsupported(format_args!("this backend has no elections (`{key}`)"));
        let _ = namespace;
        async move { Err(refused) }
    }

    /// Elections: a signal that moves whenever the leader of `key` (in `namespace`) may have
    /// changed (a grant, a release, a proclaimed value; a lease that ran out need not move it:
    /// observers also re-read when the leader's lease ends). Taken *before* reading
    /// [`leader`](Self::leader), so no change between the read and the wait is missed. The
    /// default says the backend cannot.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported) by default;
    /// [`ErrorKind::Backend`](crate::ErrorKind::Backend) if the service fails.
    fn watch_leader(
        &self,
        namespace: &str,
        key: &str,
    ) -> impl Future<Output = Result<LeaderWatch>> + Send {
        let refused = Error::unsupported(format_args!("this backend has no elections (`{key}`)"));
        let _ = namespace;
        async move { Err(refused) }
    }

    /// Closes connections and sessions. Called once by
    /// [`LockClient::shutdown`](crate::LockClient::shutdown) after pending releases finished.
    fn shutdown(&self) -> impl Future<Output = ()> + Send {
        async {}
    }
}

#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use self::postgres::{PgBackend, PgBackendBuilder, PgTicket};
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use self::redis::{RedisBackend, RedisBackendBuilder, RedisTicket};
#[cfg(feature = "redlock")]
#[cfg_attr(docsrs, doc(cfg(feature = "redlock")))]
pub use self::redlock::{RedlockBackend, RedlockBackendBuilder, RedlockNode, RedlockTicket};
#[cfg(feature = "zookeeper")]
#[cfg_attr(docsrs, doc(cfg(feature = "zookeeper")))]
pub use self::zookeeper::{
    ZkAcl, ZkBackend, ZkBackendBuilder, ZkTicket, DEFAULT_SERVER_TICK, DEFAULT_SESSION_TIMEOUT,
    MIN_SESSION_TIMEOUT,
};
#[cfg(feature = "memory")]
pub use memory::{MemoryBackend, MemoryStats};

/// The runtime a backend is built in, where it starts its background tasks; refused outside
/// one.
#[cfg(any(feature = "redis", feature = "postgres"))]
pub(crate) fn require_runtime() -> Result<tokio::runtime::Handle> {
    tokio::runtime::Handle::try_current().map_err(|_| Error::no_runtime())
}

/// How long the renewal engine gives one [`Backend::renew`] call before it abandons it and
/// retries: a third of the shortest TTL in the batch, and at least this. A backend that asks
/// several servers bounds each one's answer well within that window.
pub(crate) const MIN_RENEW_CALL: Duration = Duration::from_millis(50);

pub use self::claim::Claim;
#[cfg(feature = "memory")]
pub(crate) use self::claim::LostSignal;
pub(crate) use self::erased::{AnyTicket, DynBackend};
pub use self::leader::{Leader, LeaderWatch};
pub(crate) use self::owner::{Owner, Owners};

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{Claim, LockKind};

    #[tokio::test]
    async fn the_lost_signal_wakes_every_watcher_once_and_later_ones_at_once() {
        let (ns, key, ttl) = ("ns".into(), "k".into(), Duration::from_secs(1));
        let owner = super::Owners::default().next();
        let claim = Claim::new(ns, key, ttl, LockKind::Exclusive, "memory", owner);
        let watchers: Vec<_> = (0..3)
            .map(|_| {
                let signal = claim.lost_signal().clone();
                tokio::spawn(async move { signal.wait().await })
            })
            .collect();
        tokio::task::yield_now().await;
        assert!(!claim.is_lost());
        // Not set: nobody is woken.
        let early = tokio::time::timeout(Duration::from_millis(20), claim.lost_signal().wait());
        assert!(early.await.is_err(), "wait ended before the claim was lost");
        assert!(claim.lost_signal().mark());
        assert!(!claim.lost_signal().mark(), "marked lost twice");
        for watcher in watchers {
            tokio::time::timeout(Duration::from_secs(5), watcher)
                .await
                .expect("a watcher was not woken")
                .expect("a watcher panicked");
        }
        // A clone made before, and a watcher that comes after, see it at once.
        assert!(claim.clone().is_lost());
        tokio::time::timeout(Duration::from_secs(5), claim.lost_signal().wait())
            .await
            .expect("a late watcher was not told");
    }
}
