//! What a renewal's answer says of each claim, and the answer for every claim of a call that
//! failed.

use std::time::Duration;

use tokio::time::Instant;

use crate::backend::Renewal;
use crate::error::Error;

/// What a server did for one claim in a renewal call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RenewAnswer {
    /// The claim holds the lock there, and its lease was extended.
    Lease,
    /// The claim waits there, and its place in the queue was kept.
    Place,
    /// The claim neither holds the lock nor waits there.
    Neither,
}

impl RenewAnswer {
    /// Reads a code of the Redis renewal scripts (`renewal.lua`): 1 lease extended, 2 place
    /// kept, 0 neither; `None` for -1, a claim whose keys could not be read (they hold another
    /// type, overwritten behind our back), or any code the scripts do not send.
    #[cfg(feature = "redis")]
    pub(crate) fn of_code(code: i64) -> Option<Self> {
        match code {
            1 => Some(RenewAnswer::Lease),
            2 => Some(RenewAnswer::Place),
            0 => Some(RenewAnswer::Neither),
            _ => None,
        }
    }

    /// The renewal of a claim of `ttl` on one server, for a call sent at `sent`.
    pub(crate) fn renewal(self, sent: Instant, ttl: Duration) -> Renewal {
        match self {
            RenewAnswer::Lease => Renewal::Extended(sent + ttl),
            RenewAnswer::Place => Renewal::Queued(sent + ttl),
            RenewAnswer::Neither => Renewal::NotOwner,
        }
    }
}

/// The answer for each of `n` claims of a renewal call that failed with `err`: every one failed.
pub(crate) fn fail_all(n: usize, err: &Error) -> Vec<Renewal> {
    std::iter::repeat_with(|| Renewal::Failed(err.clone()))
        .take(n)
        .collect()
}
