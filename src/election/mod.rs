//! `Election`: leader election across processes, on the same guard contract as the locks.
//!
//! One leader at a time per election: [`campaign`](Election::campaign) waits in FIFO order like
//! [`Mutex::lock`](crate::Mutex::lock) and returns a [`Leadership`] guard (renewed in the
//! background, lost signal, resign on drop) whose [`term`](Leadership::term) is its fencing
//! token. Anyone can read who leads ([`leader`](Election::leader)) and follow every change
//! ([`observe`](Election::observe)); [`lead`](Election::lead) runs a piece of work only while
//! leading, campaigning again whenever leadership is lost.

mod leadership;
mod observe;
mod worker;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, TryFutureExt};

pub use self::leadership::Leadership;
use crate::backend::{Leader, LockKind};
use crate::core::acquire::{Mode, Target};
use crate::core::Core;
use crate::error::Result;

/// An election named by a key: the processes that campaign on it take turns to lead, one at a
/// time, in the order they asked.
///
/// A cheap handle (no I/O until used); clone it or make a new one from the client at will.
/// Backends: memory, Redis (single server, Cluster, Sentinel), Redlock (a lead counts once a
/// majority of nodes hold it confirmed under one owner and term), PostgreSQL (direct or through
/// PgBouncer) and ZooKeeper (a Curator `LeaderLatch` on the same path).
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), distlock::Error> {
/// let client = distlock::LockClient::memory();
/// let election = client.election("scheduler");
/// let leading = election.campaign("worker-7").await?;
/// // ... only the leader runs the scheduler; fence its writes with the term ...
/// assert_eq!(election.leader().await?.unwrap().term(), leading.term());
/// leading.resign().await?;
/// assert!(election.leader().await?.is_none());
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Election {
    target: Target,
}

impl Election {
    pub(crate) fn new(core: Arc<Core>, name: String) -> Self {
        Self {
            target: Target::new(core, name),
        }
    }

    /// The election's name (its key), without the client's namespace.
    ///
    /// # Examples
    ///
    /// ```
    /// let client = distlock::LockClient::memory();
    /// assert_eq!(client.election("scheduler").name(), "scheduler");
    /// ```
    pub fn name(&self) -> &str {
        &self.target.key
    }

    /// Uses `ttl` as the leadership lease instead of the client's TTL: a leader that dies is
    /// replaced within about this long. A zero or too short TTL is reported by the next
    /// campaign.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let client = distlock::LockClient::memory();
    /// let election = client.election("scheduler").with_ttl(Duration::from_secs(5));
    /// # let _ = election;
    /// ```
    #[must_use]
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.target.ttl = Some(ttl);
        self
    }

    fn claim(
        &self,
        value: impl AsRef<[u8]>,
        mode: Mode,
        deadline: Option<tokio::time::Instant>,
    ) -> impl Future<Output = Result<Leadership>> + Send + 'static {
        self.target
            .with_value(Arc::from(value.as_ref()))
            .acquire_until(LockKind::Leader, mode, deadline)
            .map_ok(Leadership::new)
    }

    /// Waits to lead, proclaiming `value` (an address, a worker id: what the others read with
    /// [`leader`](Self::leader)), and returns the leadership guard.
    ///
    /// Candidates are served in the order they asked, woken by the service, never by a polling
    /// loop. Leadership lasts until the guard is resigned or dropped, or lost (see
    /// [`Leadership::lost`]).
    ///
    /// # Errors
    ///
    /// - [`InvalidKey`](crate::ErrorKind::InvalidKey) or
    ///   [`InvalidConfig`](crate::ErrorKind::InvalidConfig) before any I/O,
    /// - [`Unsupported`](crate::ErrorKind::Unsupported) on a backend without elections, or for
    ///   a value larger than the backend holds (as [`Leadership::proclaim`]),
    /// - [`KindMismatch`](crate::ErrorKind::KindMismatch) if the key is in use as a lock,
    /// - [`Backend`](crate::ErrorKind::Backend) if the service fails,
    /// - [`Closed`](crate::ErrorKind::Closed) if the client is shut down,
    /// - [`NoRuntime`](crate::ErrorKind::NoRuntime) outside a Tokio runtime.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, like [`Mutex::lock`](crate::Mutex::lock): dropping the future gives up the
    /// place in line and leaves nothing behind (a leadership granted just then is resigned).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let client = distlock::LockClient::memory();
    /// let leading = client.election("scheduler").campaign("10.0.0.7:8080").await?;
    /// assert_eq!(&*leading.value(), b"10.0.0.7:8080");
    /// # Ok(())
    /// # }
    /// ```
    pub fn campaign(
        &self,
        value: impl AsRef<[u8]>,
    ) -> impl Future<Output = Result<Leadership>> + Send + 'static {
        self.claim(value, Mode::Wait, None)
    }

    /// Waits to lead, blocking this thread: [`campaign`](Self::campaign) for synchronous code.
    /// It runs on the runtime the client was built in or, for a client built outside any, on
    /// a small runtime of the client's own.
    ///
    /// # Errors
    ///
    /// - [`InAsyncContext`](crate::ErrorKind::InAsyncContext) inside a current-thread tokio
    ///   runtime (use the async form there); on a multi-thread runtime's thread it blocks in
    ///   place (`tokio::task::block_in_place`),
    /// - [`NoRuntime`](crate::ErrorKind::NoRuntime) for a client built in a current-thread
    ///   runtime or whose runtime has shut down,
    /// - otherwise the errors of [`campaign`](Self::campaign).
    ///
    /// # Cancel safety
    ///
    /// Not a future: it returns once the call is over. The guard it returns resigns on drop
    /// as any other, renewed meanwhile by the runtime the client was built in (or its own).
    ///
    /// # Examples
    ///
    /// ```
    /// let client = distlock::LockClient::memory(); // no runtime needed
    /// let leading = client.election("scheduler").blocking_campaign("worker-7")?;
    /// assert!(leading.term() > 0);
    /// # Ok::<(), distlock::Error>(())
    /// ```
    pub fn blocking_campaign(&self, value: impl AsRef<[u8]>) -> Result<Leadership> {
        let call = self.campaign(value);
        self.target.core.home.block_on("blocking_campaign", call)
    }

    /// Leads only if nobody leads or waits to, without waiting.
    ///
    /// # Errors
    ///
    /// An error with [`is_would_block`](crate::Error::is_would_block) if someone leads or
    /// waits; otherwise the errors of [`campaign`](Self::campaign).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a leadership granted as the future is dropped is resigned.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let client = distlock::LockClient::memory();
    /// let election = client.election("scheduler");
    /// let leading = election.try_campaign("a").await?;
    /// assert!(election.try_campaign("b").await.unwrap_err().is_would_block());
    /// # drop(leading);
    /// # Ok(())
    /// # }
    /// ```
    pub fn try_campaign(
        &self,
        value: impl AsRef<[u8]>,
    ) -> impl Future<Output = Result<Leadership>> + Send + 'static {
        self.claim(value, Mode::Try, None)
    }

    /// Waits to lead at most `timeout`.
    ///
    /// # Errors
    ///
    /// An error with [`is_timeout`](crate::Error::is_timeout) if leadership did not come in
    /// time; otherwise the errors of [`campaign`](Self::campaign).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, like [`campaign`](Self::campaign); the timeout itself is such a
    /// cancellation.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let client = distlock::LockClient::memory();
    /// let election = client.election("scheduler");
    /// let _leading = election.campaign("a").await?;
    /// let err = election.campaign_timeout("b", Duration::from_millis(20)).await.unwrap_err();
    /// assert!(err.is_timeout());
    /// # Ok(())
    /// # }
    /// ```
    pub fn campaign_timeout(
        &self,
        value: impl AsRef<[u8]>,
        timeout: Duration,
    ) -> impl Future<Output = Result<Leadership>> + Send + 'static {
        self.claim(
            value,
            Mode::Wait,
            crate::core::rules::deadline_after(timeout),
        )
    }

    /// Who leads now: the leader's value, term and lease left, or `None` while nobody does. A
    /// snapshot: to act on leadership, campaign; to follow it, [`observe`](Self::observe).
    ///
    /// # Errors
    ///
    /// [`InvalidKey`](crate::ErrorKind::InvalidKey) before any I/O,
    /// [`Unsupported`](crate::ErrorKind::Unsupported) on a backend without elections,
    /// [`KindMismatch`](crate::ErrorKind::KindMismatch) if the key is in use as a lock,
    /// [`Backend`](crate::ErrorKind::Backend) if the service fails,
    /// [`Closed`](crate::ErrorKind::Closed) after the client's shutdown.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let client = distlock::LockClient::memory();
    /// let election = client.election("scheduler");
    /// assert!(election.leader().await?.is_none());
    /// let _leading = election.campaign("worker-7").await?;
    /// assert_eq!(election.leader().await?.unwrap().value_str(), Some("worker-7"));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn leader(&self) -> Result<Option<Leader>> {
        observe::read(&self.target).await
    }

    /// Follows the election: yields who leads now (`None`: nobody), then again each time the
    /// leader or its value changes. Changes that come faster than they are read are folded
    /// into the latest, which is never missed. Woken by the service (or at the leader's lease
    /// end, when a dead leader's lease runs out), never by a polling loop. An error (the
    /// service unreachable for a second, or the key held as a lock for now) is yielded and the
    /// stream goes on trying, with a growing pause (at most 2 s); it ends when the client shuts down, or
    /// after an error that cannot pass (a backend without elections, a key it refuses). The
    /// streams of one election on one client (and its clones) share one reading per change:
    /// they cost the service what one stream does, and a new stream starts from the shared
    /// reading of the leader.
    ///
    /// # Errors
    ///
    /// Items are the errors of [`leader`](Self::leader).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the stream, or a `next()` on it, loses nothing the next read
    /// would not show.
    ///
    /// # Examples
    ///
    /// ```
    /// use futures::StreamExt;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let client = distlock::LockClient::memory();
    /// let election = client.election("scheduler");
    /// let mut changes = Box::pin(election.observe());
    /// assert!(changes.next().await.unwrap()?.is_none());
    /// let leading = election.campaign("worker-7").await?;
    /// let now = changes.next().await.unwrap()?.unwrap();
    /// assert_eq!(now.term(), leading.term());
    /// # Ok(())
    /// # }
    /// ```
    pub fn observe(&self) -> impl Stream<Item = Result<Option<Leader>>> + Send + 'static {
        observe::stream(self.target.clone())
    }

    /// Runs `work` only while leading: campaigns with `value`, calls `work` with the term
    /// (the fencing token to guard its writes with) and polls what it returns while
    /// leadership lasts. If leadership is lost, the work's future is dropped (cancelled),
    /// and after a pause (growing while terms keep ending early) it campaigns again. When the
    /// work finishes, leadership is resigned and its output returned.
    ///
    /// # Errors
    ///
    /// The errors of [`campaign`](Self::campaign), except transient ones (the service
    /// unreachable for a while), which it rides out by campaigning again after a pause.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future drops the work and resigns (or gives up the place in
    /// line), as dropping a guard does.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::Error> {
    /// let client = distlock::LockClient::memory();
    /// let runs = client
    ///     .election("scheduler")
    ///     .lead("worker-7", |term| async move {
    ///         // ... run the scheduler; writes carry `term` ...
    ///         term
    ///     })
    ///     .await?;
    /// assert!(runs > 0);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn lead<F, Fut, T>(&self, value: impl AsRef<[u8]>, work: F) -> Result<T>
    where
        F: FnMut(u64) -> Fut,
        Fut: Future<Output = T>,
    {
        worker::lead(self, Arc::from(value.as_ref()), work).await
    }
}

impl fmt::Debug for Election {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Election")
            .field("namespace", &self.target.core.config.namespace)
            .field("name", &self.target.key)
            .field("ttl", &self.target.ttl())
            .finish()
    }
}
