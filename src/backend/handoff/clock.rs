//! The pairing of a claim's local clock with the server's, to place server times locally.

use std::sync::Mutex as StdMutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::sync::LockExt;

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

#[cfg(test)]
mod tests {
    use super::*;

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
