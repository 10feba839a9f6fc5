//! What an election reads from a service: its leader ([`Leader`]) and a signal that moves when
//! the leader may have changed ([`LeaderWatch`]).

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::error::{Error, Result};

/// The leader of an election, as read from the service: what it proclaims, its term (the
/// fencing token of its leadership, which strictly increases from one leader to the next), and
/// how long its lease has left as the service counts it.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), distlock::Error> {
/// let client = distlock::LockClient::memory();
/// let election = client.election("scheduler");
/// let leading = election.campaign("worker-7").await?;
/// let leader = election.leader().await?.expect("someone leads");
/// assert_eq!(leader.value_str(), Some("worker-7"));
/// assert_eq!(leader.term(), leading.term());
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Leader {
    value: Arc<[u8]>,
    term: u64,
    lease_left: Duration,
}

impl Leader {
    /// A leader read from a service (for [`Backend::leader`](super::Backend::leader)).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let leader = distlock::Leader::new(&b"worker-7"[..], 42, Duration::from_secs(3));
    /// assert_eq!(leader.term(), 42);
    /// ```
    pub fn new(value: impl Into<Arc<[u8]>>, term: u64, lease_left: Duration) -> Self {
        Self {
            value: value.into(),
            term,
            lease_left,
        }
    }

    /// What the leader proclaims: the value it campaigned with, or the last it proclaimed.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let leader = distlock::Leader::new(&b"10.0.0.7:8080"[..], 1, Duration::ZERO);
    /// assert_eq!(leader.value(), b"10.0.0.7:8080");
    /// ```
    pub fn value(&self) -> &[u8] {
        &self.value
    }

    /// [`value`](Self::value) as text, if it is UTF-8.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let leader = distlock::Leader::new(&b"worker-7"[..], 1, Duration::ZERO);
    /// assert_eq!(leader.value_str(), Some("worker-7"));
    /// ```
    pub fn value_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.value).ok()
    }

    /// The leadership's term: its fencing token, higher than every earlier leader's.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// assert_eq!(distlock::Leader::new(&b""[..], 7, Duration::ZERO).term(), 7);
    /// ```
    pub fn term(&self) -> u64 {
        self.term
    }

    /// The lease the leader had left when it was read, as the service counts it. A leader
    /// that renews keeps extending it; one that died leads until it runs out.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let leader = distlock::Leader::new(&b""[..], 7, Duration::from_secs(2));
    /// assert_eq!(leader.lease_left(), Duration::from_secs(2));
    /// ```
    pub fn lease_left(&self) -> Duration {
        self.lease_left
    }

    /// Whether `other` is the same leadership saying the same thing (term and value; the
    /// lease left is not compared).
    pub(crate) fn same(&self, other: &Leader) -> bool {
        self.term == other.term && self.value == other.value
    }
}

impl fmt::Debug for Leader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leader")
            .field("value", &String::from_utf8_lossy(&self.value))
            .field("term", &self.term)
            .field("lease_left", &self.lease_left)
            .finish()
    }
}

/// A signal that moves whenever an election's leader may have changed, from
/// [`Backend::watch_leader`](super::Backend::watch_leader). It may move without a change
/// (observers read the leader again and compare), never the other way round.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), distlock::Error> {
/// let (tx, rx) = tokio::sync::watch::channel(0u64);
/// let mut watch = distlock::LeaderWatch::new(rx);
/// tx.send_modify(|n| *n += 1);
/// watch.changed().await?;
/// # Ok(())
/// # }
/// ```
pub struct LeaderWatch {
    changes: watch::Receiver<u64>,
    _keep: Option<Box<dyn Any + Send + Sync>>,
}

impl LeaderWatch {
    /// A watch on `changes`, a counter the backend moves at every possible change.
    ///
    /// # Examples
    ///
    /// ```
    /// let (_tx, rx) = tokio::sync::watch::channel(0u64);
    /// let watch = distlock::LeaderWatch::new(rx);
    /// # drop(watch);
    /// ```
    pub fn new(changes: watch::Receiver<u64>) -> Self {
        Self {
            changes,
            _keep: None,
        }
    }

    /// Keeps `keep` (a subscription, say) alive as long as the watch is.
    ///
    /// # Examples
    ///
    /// ```
    /// let (_tx, rx) = tokio::sync::watch::channel(0u64);
    /// let subscription = std::sync::Arc::new(());
    /// let watch = distlock::LeaderWatch::new(rx).keeping(subscription);
    /// # drop(watch);
    /// ```
    #[must_use]
    pub fn keeping(mut self, keep: impl Any + Send + Sync) -> Self {
        self._keep = Some(Box::new(keep));
        self
    }

    /// Waits until the signal moves (at once if it moved since the last wait or since the
    /// watch was made).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Closed`](crate::ErrorKind::Closed) once the backend dropped the signal
    /// (it shut down).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a move that happened while no one waited is seen by the next call.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let (tx, rx) = tokio::sync::watch::channel(0u64);
    /// let mut watch = distlock::LeaderWatch::new(rx);
    /// drop(tx);
    /// assert!(watch.changed().await.is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn changed(&mut self) -> Result<()> {
        self.changes.changed().await.map_err(|_| Error::closed())
    }
}

impl fmt::Debug for LeaderWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaderWatch")
            .field("changes", &*self.changes.borrow())
            .finish_non_exhaustive()
    }
}
