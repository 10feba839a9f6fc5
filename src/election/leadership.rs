//! [`Leadership`]: the guard of an election's leader.

use std::sync::Arc;

use crate::core::guard::guard_methods;
use crate::core::held::Held;
use crate::error::Result;

/// Proof of leading an [`Election`](super::Election): leadership lasts while the guard lives,
/// renewed in the background like a lock's lease.
///
/// Dropping it steps down (resigns in a spawned task; nothing blocks); use
/// [`resign`](Self::resign) to learn the outcome. Leadership can be lost (the leader stalled
/// past its lease, the service expired its session, an operator unlocked it): check
/// [`is_lost`](Self::is_lost) or await [`lost`](Self::lost), and fence what the leader writes
/// with its [`term`](Self::term).
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), distlock::Error> {
/// let client = distlock::LockClient::memory();
/// let leading = client.election("scheduler").campaign("worker-7").await?;
/// let schedule = async { /* run the scheduler, fencing writes with leading.term() */ };
/// tokio::select! {
///     biased; // loss first: after a pause past the lease, not one more step
///     () = leading.lost() => eprintln!("no longer the leader, stopping"),
///     () = schedule => {}
/// }
/// leading.resign().await?;
/// # Ok(())
/// # }
/// ```
#[must_use = "if unused the leadership will immediately be resigned"]
#[clippy::has_significant_drop]
pub struct Leadership {
    held: Held,
}

guard_methods!(
    Leadership,
    "let guard = client.election(\"k\").campaign(\"me\").await?;",
    "The fencing token of this leadership: its [`term`](Self::term)."
);

impl Leadership {
    pub(crate) fn new(held: Held) -> Self {
        Self { held }
    }

    /// The term of this leadership: strictly greater than every earlier leader's term in the
    /// same election (its fencing token). Storage that remembers the largest term it has seen
    /// can refuse a deposed leader's writes.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let client = distlock::LockClient::memory();
    /// let election = client.election("scheduler");
    /// let first = election.campaign("a").await?;
    /// let term = first.term();
    /// first.resign().await?;
    /// assert!(election.campaign("b").await?.term() > term);
    /// # Ok(())
    /// # }
    /// ```
    pub fn term(&self) -> u64 {
        self.held.fencing_token()
    }

    /// What this leader proclaims now, as the service last accepted it: the value it
    /// campaigned with, or the last value a [`proclaim`](Self::proclaim) published. A proclaim
    /// that failed, or was cancelled, leaves it as it was.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let client = distlock::LockClient::memory();
    /// let leading = client.election("scheduler").campaign("worker-7").await?;
    /// assert_eq!(&*leading.value(), b"worker-7");
    /// # Ok(())
    /// # }
    /// ```
    pub fn value(&self) -> Arc<[u8]> {
        self.held.claim_value()
    }

    /// Publishes `value` in place of what this leader proclaimed, without stepping down:
    /// [`Election::leader`](super::Election::leader) and
    /// [`Election::observe`](super::Election::observe) show it from now on.
    ///
    /// # Errors
    ///
    /// [`Lost`](crate::ErrorKind::Lost) if leadership was lost (the guard then reports it),
    /// [`Backend`](crate::ErrorKind::Backend) if the service fails (the old value may still
    /// show; proclaiming again is safe), [`Unsupported`](crate::ErrorKind::Unsupported) for a
    /// value larger than the backend holds (1 MiB on Redis and Redlock, 1 MiB − 16 KiB on
    /// ZooKeeper), before any I/O. Either way [`value`](Self::value) keeps the value
    /// the service last accepted.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe in the sense that dropping the future leaves either value proclaimed, and
    /// nothing else behind; [`value`](Self::value) returns the new one only once the service
    /// accepted it.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let client = distlock::LockClient::memory();
    /// let election = client.election("scheduler");
    /// let leading = election.campaign("starting").await?;
    /// leading.proclaim("ready").await?;
    /// assert_eq!(election.leader().await?.unwrap().value_str(), Some("ready"));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn proclaim(&self, value: impl AsRef<[u8]>) -> Result<()> {
        self.held.proclaim(Arc::from(value.as_ref())).await
    }

    /// Steps down now and reports the outcome: the next candidate in line leads. The same as
    /// [`release`](Self::release); dropping the guard does it in a spawned task.
    ///
    /// # Errors
    ///
    /// - [`Lost`](crate::ErrorKind::Lost) if leadership had already been lost, so this leader
    ///   may not have been the only one to the end,
    /// - [`Backend`](crate::ErrorKind::Backend) if the service could not be told; the lease
    ///   then runs out after its TTL.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the resignation completes in a spawned task even if this future is
    /// dropped; only its result is lost.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let client = distlock::LockClient::memory();
    /// let election = client.election("scheduler");
    /// election.campaign("a").await?.resign().await?;
    /// assert!(election.leader().await?.is_none());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn resign(self) -> Result<()> {
        self.held.release().await
    }
}
