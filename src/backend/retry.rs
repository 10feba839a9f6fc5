//! Trying again, for the backends whose calls and connections fail and come back: a pause that
//! doubles up to a bound, and the loop that sends a call until it is answered, noting whether a
//! failed attempt may have run on the server anyway (then the answer describes the state that
//! attempt left). Which failures are tried again, after what pause, and which leave the call in
//! doubt is each backend's policy, handed to [`until_answered`].

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{Error, ErrorKind, Result};

/// A pause that doubles after every failure, from a first one up to a longest one.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Backoff {
    first: Duration,
    longest: Duration,
    next: Duration,
}

impl Backoff {
    /// Pauses from `first`, doubling up to `longest`.
    pub(crate) const fn new(first: Duration, longest: Duration) -> Self {
        Self {
            first,
            longest,
            next: first,
        }
    }

    /// The pause to wait now: the first one doubled at every [`grow`](Self::grow), never
    /// longer than the longest.
    pub(crate) fn current(&self) -> Duration {
        self.next.min(self.longest)
    }

    /// Doubles the pause (past the longest too, for [`exhausted`](Self::exhausted)).
    pub(crate) fn grow(&mut self) {
        self.next = self.next.saturating_mul(2);
    }

    /// Back to the first pause, after a success.
    pub(crate) fn reset(&mut self) {
        self.next = self.first;
    }

    /// Whether the pause has doubled past the longest: a schedule that gives up then has
    /// waited every pause it allows.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn exhausted(&self) -> bool {
        self.next > self.longest
    }
}

/// Why one attempt of a call failed.
pub(crate) enum Failure<E> {
    /// The service's client failed, or the server refused.
    Call(E),
    /// The application's pool lent no connection (see [`pool`](Self::pool)).
    Pool(Error),
    /// No answer in time.
    Timeout,
}

impl<E> Failure<E> {
    /// The application's pool `which` (`deadpool`, `bb8`) lent no connection: `cause`.
    #[cfg_attr(
        not(any(
            feature = "redis-deadpool",
            feature = "redis-bb8",
            feature = "postgres-deadpool"
        )),
        allow(dead_code)
    )]
    pub(crate) fn pool(which: &str, cause: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self::Pool(
            Error::new(
                ErrorKind::Backend,
                format!("no connection from the {which} pool"),
            )
            .with_source(cause),
        )
    }

    /// The error the call reports: `service` (`redis`, `postgres`) names the server, `what`
    /// the call, `limit` the deadline it ran out of; `describe` names a client's error.
    pub(crate) fn describe(
        self,
        service: &str,
        what: &str,
        limit: Duration,
        describe: impl FnOnce(&str, E) -> Error,
    ) -> Error {
        match self {
            Self::Call(e) => describe(what, e),
            Self::Pool(e) => e,
            // Not answered: the crate's rule (`Error::is_transient`) calls that transient.
            Self::Timeout => Error::new(
                ErrorKind::Backend,
                format!("{service} {what} got no answer within {limit:?}"),
            )
            .transient(),
        }
    }
}

/// What a backend's policy does after a failed attempt.
pub(crate) enum Retry {
    /// Sends the call again, after `pause` if any (else at once).
    Again {
        pause: Option<Duration>,
        /// Whether the failed attempt may have run on the server.
        in_doubt: bool,
    },
    /// Gives up: the call fails with this error.
    Fail(Error),
}

/// A call's answer, after however many attempts it took.
pub(crate) struct Answered<T> {
    pub(crate) value: T,
    /// When the answered attempt was sent: a lease the answer grants runs from then, not from
    /// a first attempt that timed out.
    pub(crate) sent: Instant,
    /// Whether an earlier attempt may have run on the server (it failed after the request
    /// could have been sent), so the answer describes the state that attempt left.
    pub(crate) in_doubt: bool,
}

/// Sends `attempt` until it is answered or the policy, told of each failure, gives up. The
/// policy is made (by `policy`) only once an attempt failed.
///
/// The first attempt runs here; what follows a failure (the policy's state, the failure, the
/// pauses) runs boxed. Every lock's calls await this, and a future holds room for everything it
/// may await: with the retries inline, a Redis lock's boxed futures grew past the allocator's
/// small sizes (about 1 KiB), a cost paid on every lock; now only a call that failed pays a box.
pub(crate) async fn until_answered<T, F, A, P>(
    mut attempt: impl FnMut() -> A,
    policy: impl FnOnce() -> P,
) -> Result<Answered<T>>
where
    A: Future<Output = std::result::Result<T, F>>,
    P: FnMut(F) -> Retry,
{
    let sent = Instant::now();
    match attempt().await {
        Ok(value) => Ok(Answered {
            value,
            sent,
            in_doubt: false,
        }),
        Err(failure) => Box::pin(after_failure(attempt, policy(), failure)).await,
    }
}

/// [`until_answered`] once an attempt failed with `failure`.
async fn after_failure<T, F, A>(
    mut attempt: impl FnMut() -> A,
    mut policy: impl FnMut(F) -> Retry,
    mut failure: F,
) -> Result<Answered<T>>
where
    A: Future<Output = std::result::Result<T, F>>,
{
    let mut in_doubt = false;
    loop {
        match policy(failure) {
            Retry::Again {
                pause,
                in_doubt: doubt,
            } => {
                in_doubt |= doubt;
                if let Some(pause) = pause {
                    tokio::time::sleep(pause).await;
                }
            }
            Retry::Fail(err) => return Err(err),
        }
        let sent = Instant::now();
        failure = match attempt().await {
            Ok(value) => {
                return Ok(Answered {
                    value,
                    sent,
                    in_doubt,
                })
            }
            Err(failure) => failure,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_longest() {
        let ms = Duration::from_millis;
        let mut b = Backoff::new(ms(20), ms(100));
        let mut seen = Vec::new();
        for _ in 0..5 {
            seen.push(b.current());
            b.grow();
        }
        assert_eq!(seen, [ms(20), ms(40), ms(80), ms(100), ms(100)]);
        b.reset();
        assert_eq!(b.current(), ms(20));
    }

    #[test]
    fn a_bounded_schedule_ends_after_the_longest() {
        let ms = Duration::from_millis;
        let mut b = Backoff::new(ms(25), ms(400));
        let mut waited = Vec::new();
        while !b.exhausted() {
            waited.push(b.current());
            b.grow();
        }
        assert_eq!(waited, [ms(25), ms(50), ms(100), ms(200), ms(400)]);
    }

    #[test]
    fn backoff_never_overflows() {
        let mut b = Backoff::new(Duration::from_millis(20), Duration::from_secs(2));
        for _ in 0..200 {
            b.grow();
        }
        assert_eq!(b.current(), Duration::from_secs(2));
    }
}
