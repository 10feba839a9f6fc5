//! What a server's answers to one claim mean, read the same way on every server that hands
//! locks on by message: a grant, a place in the queue, a release, a downgrade.

use std::time::Duration;

use tokio::time::Instant;

use super::ServerClock;
use crate::backend::wire::fence_of;
use crate::backend::{Claim, Grant};
use crate::error::{Error, Result};

/// The lock granted on `service` with fencing token `fence`, for a request sent at `sent`: its
/// lease is the claim's TTL from then.
pub(crate) fn granted(service: &str, claim: &Claim, fence: i64, sent: Instant) -> Result<Grant> {
    Ok(Grant::new(fence_of(service, fence)?, sent + claim.ttl()))
}

/// How long a queued claim waits for the lease ahead of it to end, `left_ms` as the server
/// wrote it: at least 1 ms (0, in its last millisecond, or less: look again at once, but never
/// in a tight loop). The codes a server writes for no lease to wait out are each backend's to
/// read.
pub(crate) fn lease_left(left_ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(left_ms).unwrap_or(0).max(1))
}

/// The server queued the claim, answering a request sent at `sent` with its clock at
/// `server_ms`: pairs the claim's clock with the server's (to place a handoff) and returns the
/// moment to ask again, `wait` from now.
pub(crate) fn queued(
    clock: &ServerClock,
    sent: Instant,
    server_ms: i64,
    wait: Duration,
) -> Instant {
    clock.pair(sent, server_ms);
    Instant::now() + wait
}

/// Whether a release finds the lock held: it was held on `held` servers, and `in_doubt` more
/// may have released it already (an attempt whose reply was lost), so a retry that finds
/// nothing there is no sign of loss (the layer above checks the lease locally). `needed`: on
/// how many it must be held (1, or a quorum).
pub(crate) fn released(held: usize, in_doubt: usize, needed: usize) -> bool {
    held + in_doubt >= needed
}

/// A downgrade's answer from one server: `done`, then the read hold's fencing token (`fence`,
/// read only then) under the claim's TTL from `sent`; refused, the write hold was lost.
pub(crate) fn downgraded(
    service: &str,
    claim: &Claim,
    done: bool,
    sent: Instant,
    fence: impl FnOnce() -> Result<i64>,
) -> Result<Grant> {
    if !done {
        return Err(Error::lost(claim.key()));
    }
    granted(service, claim, fence()?, sent)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queued_claim_looks_again_when_the_lease_ahead_ends() {
        assert_eq!(lease_left(250), Duration::from_millis(250));
        assert_eq!(lease_left(0), Duration::from_millis(1));
        assert_eq!(lease_left(-7), Duration::from_millis(1));
    }

    #[test]
    fn a_release_in_doubt_counts_as_held() {
        assert!(released(1, 0, 1));
        assert!(released(0, 1, 1));
        assert!(!released(0, 0, 1));
        assert!(released(1, 1, 2));
        assert!(!released(1, 0, 2));
    }
}
