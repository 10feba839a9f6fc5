//! What a key looks like on the server right now: who holds it, who waits, as what.

use std::time::Duration;

use crate::backend::{Family, LockKind};

/// A snapshot of one key, as [`LockClient::inspect`](crate::LockClient::inspect) reads it.
///
/// It is a read taken at one instant: by the time you look at it, holders may have released
/// and waiters may have been granted. Use it to watch and debug, never to decide who holds a
/// lock.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Inspection {
    /// The key, as asked for (without the namespace).
    pub key: String,
    /// What the key is in use as, or `None` if nobody holds or waits for it.
    pub family: Option<Family>,
    /// The claims that hold the key (several for readers and permits).
    pub holders: Vec<Holder>,
    /// The claims that wait for it, first in line first.
    pub waiters: Vec<Waiter>,
}

/// One claim holding a key.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holder {
    /// As what: [`LockKind::Exclusive`], [`LockKind::Read`], [`LockKind::Write`],
    /// [`LockKind::Leader`] (an election), or a number of permits (`max` is 0 where the backend
    /// does not record it).
    pub kind: LockKind,
    /// Its fencing token, where the backend can tell it.
    pub fencing_token: Option<u64>,
    /// How much of its lease is left, where the backend can tell: a ZooKeeper lease is the
    /// holder's session, which only its own client knows.
    pub lease_left: Option<Duration>,
}

/// One claim waiting for a key.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Waiter {
    /// As what it waits (see [`Holder::kind`]).
    pub kind: LockKind,
    /// How long it has waited, where the backend records when it queued (memory, ZooKeeper
    /// and Redlock do, Redlock by the waiter's own clock; Redis does not).
    pub waited: Option<Duration>,
}

/// What [`LockClient::force_release`](crate::LockClient::force_release) removed from a key:
/// the holders it dropped. Their guards learn it at their next renewal (memory and ZooKeeper
/// holders at once: [`is_lost`](crate::MutexGuard::is_lost) turns true), and every later grant of the key has
/// a fencing token above all of theirs.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ForceReleased {
    /// The key, as asked for (without the namespace).
    pub key: String,
    /// What the key was in use as, or `None` if nobody held or waited for it.
    pub family: Option<Family>,
    /// The holders that were dropped (none if the key was not held). Waiters stay queued; the
    /// first of them that fits is granted.
    pub removed: Vec<Holder>,
}

impl ForceReleased {
    /// Nothing removed from `key`.
    #[cfg(any(
        feature = "memory",
        feature = "redis",
        feature = "zookeeper",
        feature = "postgres"
    ))]
    pub(crate) fn nothing(key: &str) -> Self {
        Self {
            key: key.to_owned(),
            family: None,
            removed: Vec::new(),
        }
    }
}

impl Inspection {
    /// An empty snapshot of `key`: free, nobody waiting.
    #[cfg(any(
        feature = "memory",
        feature = "redis",
        feature = "zookeeper",
        feature = "postgres"
    ))]
    pub(crate) fn free(key: &str) -> Self {
        Self {
            key: key.to_owned(),
            family: None,
            holders: Vec::new(),
            waiters: Vec::new(),
        }
    }

    /// Whether nobody holds or waits for the key.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let client = distlock::LockClient::memory();
    /// assert!(client.inspect("reports").await?.is_free());
    /// let permit = client.semaphore("reports", 2).acquire().await?;
    /// assert!(!client.inspect("reports").await?.is_free());
    /// # drop(permit); Ok(())
    /// # }
    /// ```
    pub fn is_free(&self) -> bool {
        self.holders.is_empty() && self.waiters.is_empty()
    }
}
