//! Direct handoff over messages, shared by the backends whose releasing holder grants the lock
//! to the next waiter and tells it so (Redis pub/sub, Redlock's nodes, PostgreSQL NOTIFY).
//!
//! A message names one owner: a grant (`"<owner> <fence> <server ms> <px>"`: the lock is yours
//! under a provisional lease of `px` ms from `server ms` on the server's clock) or, for the
//! waiter next in line behind it, when that provisional lease ends (`"<owner> <server ms>
//! <px>"`). Each waiting claim has a [`Mailbox`] that keeps the strongest wake-up not yet read,
//! and a [`ServerClock`] that places server times on the local clock, no later than they are;
//! the two make its [`HandoffTicket`]. A claim listens before it queues and stops once granted
//! ([`acquire`](mod@acquire)), and the servers' answers to it are read the same way everywhere ([`reply`],
//! [`renewal`]).

mod acquire;
mod clock;
mod mailbox;
mod message;
pub(crate) mod renewal;
pub(crate) mod reply;
mod ticket;
pub(crate) mod wait;

use std::time::Duration;

use crate::error::{Error, Result};

pub(crate) use self::acquire::{acquire, Asking, Listener};
pub(crate) use self::clock::ServerClock;
pub(crate) use self::mailbox::Mailbox;
pub(crate) use self::message::{parse, Wake};
pub(crate) use self::ticket::{HandoffTicket, Listening};
pub(crate) use self::wait::wait_for_handoff;

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
    if ttl > crate::MAX_TTL {
        return Err(Error::invalid_config(format_args!(
            "handoff ttl of {ttl:?} is above the maximum of {:?}",
            crate::MAX_TTL
        )));
    }
    Ok(())
}
