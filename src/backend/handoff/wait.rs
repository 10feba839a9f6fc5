//! Waiting for a handoff: a message, or the moment to ask the server again.

use std::future::Future;

use tokio::time::{sleep_until, Instant};

use super::{HandoffTicket, Listening, ServerClock, Wake};
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

/// What a wake-up means to a claim waiting on one server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Heard {
    /// Ask the server again.
    Ask,
    /// Keep waiting (until the deadline, which the wake-up may have moved).
    Wait,
    /// The lock was handed to us with this fencing token, under a provisional lease that ends
    /// at `until` on the local clock.
    Granted { fence: u64, until: Instant },
}

/// Reads a wake-up from the server whose clock is `clock`. A next-in-line hint: the waiter
/// ahead of us got the lock on a provisional lease, and if it dies before confirming it, the
/// lock is ours to take when that lease ends, so `deadline` moves there. A moment that cannot
/// be placed on our clock, or a re-check: ask the server now.
pub(crate) fn heard(clock: &ServerClock, wake: Wake, deadline: &mut Option<Instant>) -> Heard {
    match wake {
        Wake::Recheck => Heard::Ask,
        Wake::NextInLine(end) => match clock.local_time(end.server_ms, end.px) {
            Some(at) => {
                earliest(deadline, at);
                Heard::Wait
            }
            None => Heard::Ask,
        },
        Wake::Granted(handoff) => match clock.local_time(handoff.server_ms, handoff.px) {
            Some(until) => Heard::Granted {
                fence: handoff.fence,
                until,
            },
            None => Heard::Ask,
        },
    }
}

/// [`Backend::wait`](crate::backend::Backend::wait) for a claim on one server: sleeps until a
/// message or `recheck_at`. Returns the grant a message proves, and then unregisters the claim;
/// `None` to ask the server again.
pub(crate) async fn wait_for_handoff<L: Listening>(
    ticket: &HandoffTicket<L>,
    recheck_at: Option<Instant>,
) -> Result<Option<Grant>> {
    let Some(mailbox) = ticket.mailbox() else {
        return recheck(recheck_at).await;
    };
    let mut deadline = recheck_at;
    loop {
        let Some(wake) = before(mailbox.recv(), deadline).await else {
            return Ok(None);
        };
        match heard(&ticket.clock, wake, &mut deadline) {
            Heard::Ask => return Ok(None),
            Heard::Wait => {}
            Heard::Granted { fence, until } => {
                ticket.set(None);
                return Ok(Some(Grant::provisional(fence, until)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::backend::handoff::message::{Handoff, LeaseEnd};

    #[test]
    fn a_wake_up_is_read_on_the_local_clock() {
        let clock = ServerClock::default();
        let mut deadline = None;
        let grant = Wake::Granted(Handoff {
            fence: 7,
            server_ms: 1_100,
            px: 200,
        });
        // Before the clocks were paired nothing can be placed: ask the server.
        assert_eq!(heard(&clock, grant, &mut deadline), Heard::Ask);
        let sent = Instant::now();
        clock.pair(sent, 1_000);
        assert_eq!(
            heard(&clock, grant, &mut deadline),
            Heard::Granted {
                fence: 7,
                until: sent + Duration::from_millis(300)
            }
        );
        let hint = Wake::NextInLine(LeaseEnd {
            server_ms: 1_050,
            px: 100,
        });
        assert_eq!(heard(&clock, hint, &mut deadline), Heard::Wait);
        assert_eq!(deadline, Some(sent + Duration::from_millis(150)));
        assert_eq!(heard(&clock, Wake::Recheck, &mut deadline), Heard::Ask);
    }
}
