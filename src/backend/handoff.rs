//! Direct handoff over messages, shared by the backends whose releasing holder grants the lock
//! to the next waiter and tells it so (Redis pub/sub, PostgreSQL NOTIFY).
//!
//! A message names one owner: a grant (`"<owner> <fence> <server ms> <px>"`: the lock is yours
//! under a provisional lease of `px` ms from `server ms` on the server's clock) or, for the
//! waiter next in line behind it, when that provisional lease ends (`"<owner> <server ms>
//! <px>"`). Each waiting claim has a [`Mailbox`] that keeps the strongest wake-up not yet read,
//! and a [`ServerClock`] that places server times on the local clock, no later than they are.

use std::future::Future;
use std::sync::Mutex as StdMutex;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::{sleep_until, Instant};

use super::Grant;
use crate::error::{Error, Result};
use crate::sync::LockExt;

/// The lease a handed-off lock gets until its new owner confirms it, unless configured: it
/// bounds how long a lock handed to a waiter that just died stays stuck.
pub(crate) const DEFAULT_HANDOFF_TTL: Duration = Duration::from_secs(2);

/// Refuses a provisional handoff lease too short to be confirmed.
pub(crate) fn check_handoff_ttl(ttl: Duration) -> Result<()> {
    if ttl < crate::MIN_TTL {
        return Err(Error::invalid_config(format_args!(
            "handoff ttl of {ttl:?} is below the minimum of {:?}",
            crate::MIN_TTL
        )));
    }
    Ok(())
}

/// A grant announced to its new owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Handoff {
    pub(crate) fence: u64,
    pub(crate) server_ms: i64,
    pub(crate) px: u64,
}

/// The end of a provisional lease handed to the waiter ahead of us.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LeaseEnd {
    pub(crate) server_ms: i64,
    pub(crate) px: u64,
}

/// What woke a waiter, strongest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wake {
    Granted(Handoff),
    /// Messages may have been missed (reconnect): ask the server.
    Recheck,
    /// The lock went to the waiter just ahead of us: ask again when its lease ends, in case it
    /// died before confirming it.
    NextInLine(LeaseEnd),
}

/// Reads a message: a handoff (four fields) or a next-in-line hint (three), and the owner it
/// names.
pub(crate) fn parse(payload: &str) -> Option<(&str, Wake)> {
    let parts: Vec<&str> = payload.split(' ').collect();
    match parts[..] {
        [owner, fence, server_ms, px] => Some((
            owner,
            Wake::Granted(Handoff {
                fence: fence.parse().ok()?,
                server_ms: server_ms.parse().ok()?,
                px: px.parse().ok()?,
            }),
        )),
        [owner, server_ms, px] => Some((
            owner,
            Wake::NextInLine(LeaseEnd {
                server_ms: server_ms.parse().ok()?,
                px: px.parse().ok()?,
            }),
        )),
        _ => None,
    }
}

/// One waiting claim's wake-ups.
#[derive(Default)]
pub(crate) struct Mailbox {
    slot: StdMutex<Option<Wake>>,
    notify: Notify,
}

impl Mailbox {
    pub(crate) fn put(&self, wake: Wake) {
        let mut slot = self.slot.locked();
        // A grant is never overwritten, nor a re-check by a mere hint.
        let keep = matches!(
            (*slot, wake),
            (Some(Wake::Granted(_)), _) | (Some(Wake::Recheck), Wake::NextInLine(_))
        );
        if !keep {
            *slot = Some(wake);
        }
        drop(slot);
        self.notify.notify_one();
    }

    /// Waits for the next wake-up.
    pub(crate) async fn recv(&self) -> Wake {
        loop {
            let wake = self.slot.locked().take();
            if let Some(wake) = wake {
                return wake;
            }
            // `notify_one` stores a permit, so a wake-up between the check and here is kept.
            self.notify.notified().await;
        }
    }
}

/// The pairing of the local and the server clock from a claim's last request.
#[derive(Default)]
pub(crate) struct ServerClock(StdMutex<Option<(Instant, i64)>>);

impl ServerClock {
    /// Records that a request sent at `sent` was answered with the server's clock at
    /// `server_ms` (so the server's clock read at most that when the request was sent).
    pub(crate) fn pair(&self, sent: Instant, server_ms: i64) {
        *self.0.locked() = Some((sent, server_ms));
    }

    /// Whether `server_ms` (server clock) is before the server answered the last request: a
    /// message sent then told of something that answer already took into account.
    #[cfg(feature = "redlock")]
    pub(crate) fn predates(&self, server_ms: i64) -> bool {
        self.0
            .locked()
            .is_some_and(|(_, at_sent)| server_ms < at_sent)
    }

    /// Places `server_ms + px` (server clock) on the local clock, no later than it really is.
    /// `None` if we never learned the server's clock, or the moment is from before then.
    pub(crate) fn local_time(&self, server_ms: i64, px: u64) -> Option<Instant> {
        let (sent, at_sent) = (*self.0.locked())?;
        let since = u64::try_from(server_ms.checked_sub(at_sent)?).ok()?;
        Some(sent + Duration::from_millis(since.saturating_add(px)))
    }
}

/// Moves `deadline` to `at` if that is earlier (or sets it).
pub(crate) fn earliest(deadline: &mut Option<Instant>, at: Instant) {
    *deadline = Some(deadline.map_or(at, |d| d.min(at)));
}

/// Awaits `wake`, or `None` once `deadline` (if any) passes.
pub(crate) async fn before<T>(
    wake: impl Future<Output = T>,
    deadline: Option<Instant>,
) -> Option<T> {
    match deadline {
        Some(at) => tokio::select! {
            wake = wake => Some(wake),
            () = sleep_until(at) => None,
        },
        None => Some(wake.await),
    }
}

/// A wait with no mailbox to listen on: sleeps until `recheck_at`, then asks the server again.
pub(crate) async fn recheck(recheck_at: Option<Instant>) -> Result<Option<Grant>> {
    if let Some(at) = recheck_at {
        sleep_until(at).await;
    }
    Ok(None)
}

/// The waiter ahead of us got the lock on a provisional lease (`end`): if it dies before
/// confirming it, the lock is ours to take when that lease ends, so look again then. False if
/// the moment cannot be placed on our clock (look again now).
pub(crate) fn next_in_line(
    clock: &ServerClock,
    end: LeaseEnd,
    deadline: &mut Option<Instant>,
) -> bool {
    match clock.local_time(end.server_ms, end.px) {
        Some(at) => {
            earliest(deadline, at);
            true
        }
        None => false,
    }
}

/// [`Backend::wait`](super::Backend::wait) for a claim with a mailbox: sleeps until a message
/// or `recheck_at`. Returns the grant a message proves; `None` to ask the server again. `on_grant`
/// runs before a grant is returned (to drop the claim's registration).
pub(crate) async fn wait_for_handoff(
    mailbox: Option<&Mailbox>,
    clock: &ServerClock,
    recheck_at: Option<Instant>,
    on_grant: impl FnOnce(),
) -> Result<Option<Grant>> {
    let Some(mailbox) = mailbox else {
        return recheck(recheck_at).await;
    };
    let mut deadline = recheck_at;
    loop {
        let Some(wake) = before(mailbox.recv(), deadline).await else {
            return Ok(None);
        };
        match wake {
            Wake::Recheck => return Ok(None),
            Wake::NextInLine(end) => {
                if !next_in_line(clock, end, &mut deadline) {
                    return Ok(None);
                }
            }
            Wake::Granted(handoff) => {
                let Some(valid_until) = clock.local_time(handoff.server_ms, handoff.px) else {
                    return Ok(None);
                };
                on_grant();
                return Ok(Some(Grant::provisional(handoff.fence, valid_until)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_handoff_messages() {
        let (owner, h) = parse("a-b-c 1763000000000001 1763000000000 2000").unwrap();
        assert_eq!(owner, "a-b-c");
        assert_eq!(
            h,
            Wake::Granted(Handoff {
                fence: 1_763_000_000_000_001,
                server_ms: 1_763_000_000_000,
                px: 2000
            })
        );
        let (owner, next) = parse("d-e 1763000000000 300").unwrap();
        assert_eq!(owner, "d-e");
        assert_eq!(
            next,
            Wake::NextInLine(LeaseEnd {
                server_ms: 1_763_000_000_000,
                px: 300
            })
        );
        assert!(parse("garbage").is_none());
        assert!(parse("o x 1 2").is_none());
        assert!(parse("o 1 2 3 4").is_none());
    }

    #[test]
    fn server_times_land_no_later_than_they_are() {
        let clock = ServerClock::default();
        assert!(clock.local_time(1_000, 50).is_none());
        let sent = Instant::now();
        clock.pair(sent, 1_000);
        assert_eq!(
            clock.local_time(1_200, 300),
            Some(sent + Duration::from_millis(500))
        );
        // From before the pairing: unknown.
        assert!(clock.local_time(999, 300).is_none());
    }
}
