//! Reading an election's leader: once ([`read`]) or as a stream of changes ([`stream`]).

use std::time::Duration;

use futures::Stream;
use tokio::sync::watch;
use tokio::time::{sleep, sleep_until, Instant};

use crate::backend::{Leader, LeaderWatch};
use crate::core::acquire::Target;
use crate::core::rules::validate_key;
use crate::error::{ErrorKind, Result};

/// The first and the longest pause before a stream tries again after an error.
const MIN_PAUSE: Duration = Duration::from_millis(50);
const MAX_PAUSE: Duration = Duration::from_secs(2);

/// The least a stream waits for a leader's lease to end before it reads again, so that a lease
/// the service reports as ending now is not read again in a tight loop.
const MIN_LEASE_WAIT: Duration = Duration::from_millis(5);

/// Who leads the election `target` names now.
pub(super) async fn read(target: &Target) -> Result<Option<Leader>> {
    let core = &target.core;
    core.check_open()?;
    validate_key(&target.key)?;
    core.backend.validate_key(&target.key)?;
    core.backend
        .leader(&core.config.namespace, &target.key)
        .await
}

/// The leader now, then at every change: see [`Election::observe`](super::Election::observe).
pub(super) fn stream(
    target: Target,
) -> impl Stream<Item = Result<Option<Leader>>> + Send + 'static {
    let follow = Follow {
        closed: target.core.closed(),
        target,
        watch: None,
        last: None,
        pause: Duration::ZERO,
    };
    futures::stream::unfold(Some(follow), |follow| async move {
        let mut follow = follow?;
        let (item, go_on) = follow.next().await?;
        Some((item, go_on.then_some(follow)))
    })
}

/// A stream's state between items.
struct Follow {
    target: Target,
    closed: watch::Receiver<bool>,
    /// Taken before each read, so no change between a read and the wait is missed.
    watch: Option<LeaderWatch>,
    /// What was yielded last (`None`: nothing yet).
    last: Option<Option<Leader>>,
    /// How long to wait before the next try, after an error.
    pause: Duration,
}

impl Follow {
    /// The next item, and whether the stream goes on after it; `None` once the client (or the
    /// backend) shut down.
    async fn next(&mut self) -> Option<(Result<Option<Leader>>, bool)> {
        loop {
            if *self.closed.borrow() {
                return None;
            }
            if !self.pause.is_zero() {
                tokio::select! {
                    () = sleep(self.pause) => {}
                    _ = self.closed.wait_for(|closed| *closed) => return None,
                }
            }
            let now = match self.read().await {
                Ok(now) => now,
                Err(e) => {
                    self.pause = (self.pause * 2).clamp(MIN_PAUSE, MAX_PAUSE);
                    // An outage passes, and so does a lock held on the key (it is released);
                    // a backend without elections, or a key it refuses, stays so.
                    let go_on = e.is_transient() || e.kind() == ErrorKind::KindMismatch;
                    return Some((Err(e), go_on));
                }
            };
            self.pause = Duration::ZERO;
            let same = self.last.as_ref().is_some_and(|last| match (last, &now) {
                (Some(a), Some(b)) => a.same(b),
                (None, None) => true,
                _ => false,
            });
            if !same {
                self.last = Some(now.clone());
                return Some((Ok(now), true));
            }
            // Nothing new: wait for the service to say something may have changed, or for the
            // leader's lease to end (a leader that died is not announced by every service).
            let lease_end = now
                .as_ref()
                .map(|l| Instant::now() + l.lease_left().max(MIN_LEASE_WAIT));
            let watch = self.watch.as_mut()?;
            tokio::select! {
                moved = watch.changed() => {
                    if moved.is_err() {
                        return None;
                    }
                }
                () = sleep_until(lease_end.unwrap_or_else(Instant::now)), if lease_end.is_some() => {}
                _ = self.closed.wait_for(|closed| *closed) => return None,
            }
        }
    }

    /// Watches (once) and reads the leader.
    async fn read(&mut self) -> Result<Option<Leader>> {
        if self.watch.is_none() {
            let core = &self.target.core;
            core.check_open()?;
            validate_key(&self.target.key)?;
            core.backend.validate_key(&self.target.key)?;
            self.watch = Some(
                core.backend
                    .watch_leader(&core.config.namespace, &self.target.key)
                    .await?,
            );
        }
        read(&self.target).await
    }
}
