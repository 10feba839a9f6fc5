//! Waiting for a handoff: a message, or the moment to ask the server again.

use std::future::Future;

use tokio::time::{sleep_until, Instant};

use super::{LeaseEnd, Mailbox, ServerClock, Wake};
use crate::backend::Grant;
use crate::error::Result;

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

/// [`Backend::wait`](crate::backend::Backend::wait) for a claim with a mailbox: sleeps until a
/// message or `recheck_at`. Returns the grant a message proves; `None` to ask the server again.
/// `on_grant` runs before a grant is returned (to drop the claim's registration).
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
