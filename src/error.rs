//! The one error type of the crate.

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;

/// A `Result` whose error is [`distlock::Error`](Error).
pub type Result<T, E = Error> = std::result::Result<T, E>;

type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// What went wrong, in a form to match on.
///
/// New kinds may be added; match with a wildcard arm, or use the `is_*` predicates on [`Error`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The lock is held elsewhere (or has waiters ahead of us) and the call was not allowed to wait:
    /// [`Mutex::try_lock`](crate::Mutex::try_lock).
    WouldBlock,
    /// The deadline of [`Mutex::lock_timeout`](crate::Mutex::lock_timeout) passed before the lock
    /// was granted.
    Timeout,
    /// Ownership was lost: the lease expired, the server refused a renewal, or the session that held
    /// it ended.
    Lost,
    /// The key is empty, too long, contains a NUL byte, or breaks a backend's rule (for example a
    /// `..` path segment on ZooKeeper).
    InvalidKey,
    /// A configuration value is unusable: a zero TTL, an empty namespace, a malformed address.
    InvalidConfig,
    /// The coordination service failed or could not be reached.
    Backend,
    /// [`LockClient::shutdown`](crate::LockClient::shutdown) was called on this client, or the
    /// tokio runtime it was built in has shut down.
    Closed,
    /// The call was made outside a Tokio runtime, so there is nowhere to run lease renewal.
    NoRuntime,
    /// A blocking call ([`Mutex::blocking_lock`](crate::Mutex::blocking_lock) and the like)
    /// was made inside a current-thread tokio runtime, where blocking its one thread would
    /// stall every task: use the async form, or call it from a thread of your own or a
    /// multi-thread runtime.
    InAsyncContext,
    /// The key is in use on the server as another kind of lock (a mutex asked for as a
    /// read-write lock, a semaphore asked for with another number of permits, ...). One key
    /// holds one kind of lock at a time.
    KindMismatch,
    /// The backend cannot do this: a kind of lock or an operation it does not implement (for
    /// example a semaphore on a backend written for mutexes only).
    Unsupported,
}

/// The error of every fallible operation in this crate.
///
/// The message says what this layer was doing; the cause, if any, is reached through
/// [`source`](StdError::source), never repeated in the message. `Error` is cheap to clone.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), distlock::Error> {
/// let client = distlock::LockClient::memory();
/// let _held = client.mutex("jobs:nightly").lock().await?;
/// match client.mutex("jobs:nightly").try_lock().await {
///     Err(err) if err.is_would_block() => assert_eq!(err.kind(), distlock::ErrorKind::WouldBlock),
///     other => panic!("expected would-block, got {other:?}"),
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Error {
    kind: ErrorKind,
    message: Arc<str>,
    source: Option<Arc<dyn StdError + Send + Sync + 'static>>,
    transient: bool,
}

impl Error {
    /// Builds an error of `kind` with a lowercase message that describes this layer only.
    ///
    /// Backends use this (with [`with_source`](Self::with_source)) to report their failures.
    ///
    /// # Examples
    ///
    /// ```
    /// use distlock::{Error, ErrorKind};
    /// let err = Error::new(ErrorKind::Backend, "server closed the connection");
    /// assert!(err.is_backend());
    /// assert_eq!(err.to_string(), "server closed the connection");
    /// ```
    pub fn new(kind: ErrorKind, message: impl Into<Arc<str>>) -> Self {
        Self {
            kind,
            message: message.into(),
            source: None,
            transient: false,
        }
    }

    /// Marks the failure as passing (a dropped connection, a timeout): a queued `lock()`
    /// retries it instead of giving up. Backends mark what they know to be transient, by the
    /// rule [`is_transient`](Self::is_transient) states.
    ///
    /// # Examples
    ///
    /// ```
    /// use distlock::{Error, ErrorKind};
    /// let err = Error::new(ErrorKind::Backend, "connection reset").transient();
    /// assert!(err.is_transient());
    /// ```
    #[must_use]
    pub fn transient(mut self) -> Self {
        self.transient = true;
        self
    }

    /// Whether the same call may succeed later with nothing changed, on every backend alike:
    ///
    /// - **true** when the service was not reached or did not answer: connection refused,
    ///   reset or dropped, a call or connect timed out, no session (ZooKeeper), or the server
    ///   said "not now" (Redis `LOADING`, `TRYAGAIN`, `CLUSTERDOWN`, `MASTERDOWN`, `READONLY`
    ///   during a failover; PostgreSQL connection errors, shutdown, too many connections,
    ///   serialization failure or deadlock);
    /// - **false** for answers that will not change by themselves: bad input or configuration,
    ///   authentication or permission refused, a key held as another kind of lock, a missing
    ///   schema, an unsupported operation; and for every kind other than
    ///   [`ErrorKind::Backend`] (a busy lock or a timed-out wait is not a failure of the
    ///   service).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let client = distlock::LockClient::memory();
    /// let _held = client.mutex("k").lock().await.unwrap();
    /// let busy = client.mutex("k").try_lock().await.unwrap_err();
    /// assert!(!busy.is_transient());
    /// # }
    /// ```
    pub fn is_transient(&self) -> bool {
        self.transient
    }

    /// Attaches the underlying cause, reachable through [`source`](StdError::source).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::error::Error as _;
    /// use distlock::{Error, ErrorKind};
    /// let io = std::io::Error::other("connection reset");
    /// let err = Error::new(ErrorKind::Backend, "renewal failed").with_source(io);
    /// assert_eq!(err.source().map(|e| e.to_string()).as_deref(), Some("connection reset"));
    /// ```
    #[must_use]
    pub fn with_source(mut self, source: impl Into<BoxError>) -> Self {
        self.source = Some(Arc::from(source.into()));
        self
    }

    pub(crate) fn would_block(key: &str) -> Self {
        Self::new(
            ErrorKind::WouldBlock,
            format!("lock `{key}` is held or has waiters"),
        )
    }

    pub(crate) fn timeout(key: &str) -> Self {
        Self::new(
            ErrorKind::Timeout,
            format!("timed out waiting for lock `{key}`"),
        )
    }

    pub(crate) fn lost(key: &str) -> Self {
        Self::new(ErrorKind::Lost, format!("lock `{key}` was lost"))
    }

    pub(crate) fn invalid_key(reason: impl fmt::Display) -> Self {
        Self::new(ErrorKind::InvalidKey, format!("invalid lock key: {reason}"))
    }

    pub(crate) fn invalid_config(reason: impl fmt::Display) -> Self {
        Self::new(
            ErrorKind::InvalidConfig,
            format!("invalid configuration: {reason}"),
        )
    }

    pub(crate) fn closed() -> Self {
        Self::new(ErrorKind::Closed, "lock client was shut down")
    }

    pub(crate) fn runtime_gone() -> Self {
        Self::new(
            ErrorKind::Closed,
            "the tokio runtime this lock client was built in has shut down: a client lives as \
             long as its runtime (build one per runtime)",
        )
    }

    pub(crate) fn kind_mismatch(reason: impl fmt::Display) -> Self {
        Self::new(ErrorKind::KindMismatch, reason.to_string())
    }

    pub(crate) fn unsupported(reason: impl fmt::Display) -> Self {
        Self::new(ErrorKind::Unsupported, reason.to_string())
    }

    pub(crate) fn no_runtime() -> Self {
        Self::new(
            ErrorKind::NoRuntime,
            "no tokio runtime: distlock must be used from within a tokio runtime",
        )
    }

    /// What went wrong.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The lock is held elsewhere and the call did not wait ([`ErrorKind::WouldBlock`]).
    pub fn is_would_block(&self) -> bool {
        self.kind == ErrorKind::WouldBlock
    }

    /// The wait deadline passed ([`ErrorKind::Timeout`]).
    pub fn is_timeout(&self) -> bool {
        self.kind == ErrorKind::Timeout
    }

    /// Ownership was lost ([`ErrorKind::Lost`]).
    pub fn is_lost(&self) -> bool {
        self.kind == ErrorKind::Lost
    }

    /// The key was rejected before any I/O ([`ErrorKind::InvalidKey`]).
    pub fn is_invalid_key(&self) -> bool {
        self.kind == ErrorKind::InvalidKey
    }

    /// A configuration value was rejected ([`ErrorKind::InvalidConfig`]).
    pub fn is_invalid_config(&self) -> bool {
        self.kind == ErrorKind::InvalidConfig
    }

    /// The coordination service failed ([`ErrorKind::Backend`]).
    pub fn is_backend(&self) -> bool {
        self.kind == ErrorKind::Backend
    }

    /// The client was shut down ([`ErrorKind::Closed`]).
    pub fn is_closed(&self) -> bool {
        self.kind == ErrorKind::Closed
    }

    /// The key is in use as another kind of lock ([`ErrorKind::KindMismatch`]).
    pub fn is_kind_mismatch(&self) -> bool {
        self.kind == ErrorKind::KindMismatch
    }

    /// The backend cannot do what was asked ([`ErrorKind::Unsupported`]).
    pub fn is_unsupported(&self) -> bool {
        self.kind == ErrorKind::Unsupported
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Error");
        d.field("kind", &self.kind).field("message", &self.message);
        if let Some(source) = &self.source {
            d.field("source", source);
        }
        d.finish()
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl StdError for Error {
    /// The cause: the innermost error that still says something new. A client library's error
    /// that ends with its own cause's text (redis-rs around an I/O error, tokio-postgres'
    /// "error connecting to server: …") is passed over for that cause, so a report of the
    /// chain says each thing once.
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        let mut cause: &(dyn StdError + 'static) = self.source.as_deref()?;
        while let Some(inner) = cause.source() {
            let said = inner.to_string();
            if said.is_empty() || !cause.to_string().ends_with(&said) {
                break;
            }
            cause = inner;
        }
        Some(cause)
    }
}

/// For functions that return `std::io::Result` (e.g. under `#[distributed_lock]`): timeouts
/// become `TimedOut`, a busy lock `WouldBlock`, bad input `InvalidInput`, the rest `Other`; the
/// distlock error stays reachable through `get_ref`/`into_inner`.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let client = distlock::LockClient::memory();
/// let err = client.mutex("").try_lock().await.unwrap_err();
/// let io: std::io::Error = err.into();
/// assert_eq!(io.kind(), std::io::ErrorKind::InvalidInput);
/// # }
/// ```
impl From<Error> for std::io::Error {
    fn from(e: Error) -> Self {
        use std::io::ErrorKind as Io;
        let kind = match e.kind {
            ErrorKind::Timeout => Io::TimedOut,
            ErrorKind::WouldBlock => Io::WouldBlock,
            ErrorKind::InvalidKey | ErrorKind::InvalidConfig => Io::InvalidInput,
            _ => Io::Other,
        };
        std::io::Error::new(kind, e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl fmt::Display for Layer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
    }

    impl StdError for Layer {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            self.1.as_deref().map(|l| l as &(dyn StdError + 'static))
        }
    }

    fn chain(e: &Error) -> Vec<String> {
        let mut out = Vec::new();
        let mut cause = e.source();
        while let Some(c) = cause {
            out.push(c.to_string());
            cause = c.source();
        }
        out
    }

    #[test]
    fn a_cause_that_only_repeats_its_own_cause_is_passed_over() {
        let io = Layer("refused", None);
        let wrapper = Layer("error connecting: refused", Some(Box::new(io)));
        let err = Error::new(ErrorKind::Backend, "connect failed").with_source(wrapper);
        assert_eq!(chain(&err), ["refused"]);
        // A cause that says more than its own cause stays, and so does one above a silent one.
        let kept = Layer("timed out", Some(Box::new(Layer("reset", None))));
        let err = Error::new(ErrorKind::Backend, "x").with_source(kept);
        assert_eq!(chain(&err), ["timed out", "reset"]);
        let silent = Layer("failed", Some(Box::new(Layer("", None))));
        let err = Error::new(ErrorKind::Backend, "x").with_source(silent);
        assert_eq!(chain(&err), ["failed", ""]);
    }
}
