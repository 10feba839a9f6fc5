//! Following an election's leader once per client, however many observe it: one task reads
//! the leader at every change the service announces and at every lease end, and shares each
//! new reading with every observer of that election in the client
//! ([`Election::observe`](crate::Election::observe)). The cost to the service is that of one
//! observer, whether there are one or two hundred. The task runs on the client's runtime.

use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::{sleep, sleep_until, Instant};

use super::acquire::Target;
use super::rules::validate_key;
use crate::backend::{Leader, LeaderWatch};
use crate::error::{ErrorKind, Result};
use crate::sync::LockExt;

/// The first and the longest pause before a follow reads again after an error.
const MIN_PAUSE: Duration = Duration::from_millis(50);
const MAX_PAUSE: Duration = Duration::from_secs(2);

/// How long reads may fail with a transient error before observers are told.
const QUIET_FAILURES: Duration = Duration::from_secs(1);

/// The least a follow waits for a leader's lease to end before it reads again, so that a lease
/// the service reports as ending now is not read again in a tight loop.
const MIN_LEASE_WAIT: Duration = Duration::from_millis(5);

/// A reading, and whether the follow goes on after it (not after an error that cannot pass).
pub(crate) type Reading = (Result<Option<Leader>>, bool);

/// The latest reading of a follow, numbered from 1 (0: nothing read yet).
#[derive(Clone, Default)]
pub(crate) struct Published {
    pub(crate) seq: u64,
    pub(crate) reading: Option<Reading>,
}

/// The elections followed in one client. Each follow's task holds its sender; the map only
/// points at it, so a follow whose task ended starts again at the next subscription.
#[derive(Default)]
pub(crate) struct Followed {
    by_key: StdMutex<HashMap<Arc<str>, Weak<watch::Sender<Published>>>>,
}

impl Followed {
    /// The readings of `target`'s election, from the client's follow of it, started if none
    /// runs.
    ///
    /// # Errors
    ///
    /// The client's runtime could not be started (one of its own, for a client built outside
    /// any).
    pub(crate) fn subscribe(&self, target: &Target) -> Result<watch::Receiver<Published>> {
        let key = target.key.clone();
        let mut by_key = self.by_key.locked();
        if let Some(tx) = by_key.get(&key).and_then(Weak::upgrade) {
            return Ok(tx.subscribe());
        }
        let home = target.core.home.handle()?;
        by_key.retain(|_, tx| tx.strong_count() > 0);
        let (tx, rx) = watch::channel(Published::default());
        let tx = Arc::new(tx);
        by_key.insert(key.clone(), Arc::downgrade(&tx));
        drop(by_key);
        // A runtime that has shut down drops the task at once, and with it the sender: the
        // receiver then hears that the follow ended.
        home.spawn(drive(Follow::new(target.clone()), key, tx));
        Ok(rx)
    }

    /// Ends `tx`'s follow if nobody subscribed to it meanwhile.
    fn retire(&self, key: &Arc<str>, tx: &Arc<watch::Sender<Published>>) -> bool {
        let mut by_key = self.by_key.locked();
        if tx.receiver_count() > 0 {
            return false;
        }
        if by_key
            .get(key)
            .is_some_and(|mine| std::ptr::eq(mine.as_ptr(), Arc::as_ptr(tx)))
        {
            by_key.remove(key);
        }
        true
    }
}

/// A follow's task: publishes every new reading until nobody subscribes any more, the client
/// shuts down, or an error cannot pass.
async fn drive(mut follow: Follow, key: Arc<str>, tx: Arc<watch::Sender<Published>>) {
    loop {
        tokio::select! {
            next = follow.next() => {
                let Some((reading, go_on)) = next else { return };
                tx.send_modify(|p| {
                    p.seq += 1;
                    p.reading = Some((reading, go_on));
                });
                if !go_on {
                    return;
                }
            }
            () = tx.closed() => {
                let core = follow.target.core.clone();
                if core.followed.retire(&key, &tx) {
                    return;
                }
            }
        }
    }
}

/// A follow's state between readings.
struct Follow {
    target: Target,
    closed: watch::Receiver<bool>,
    /// Taken before each read, so no change between a read and the wait is missed.
    watch: Option<LeaderWatch>,
    /// What was published last (`None`: nothing yet).
    last: Option<Option<Leader>>,
    /// How long to wait before the next try, after an error.
    pause: Duration,
    /// Since when every read failed.
    failing_since: Option<Instant>,
}

impl Follow {
    fn new(target: Target) -> Self {
        Self {
            closed: target.core.closed(),
            target,
            watch: None,
            last: None,
            pause: Duration::ZERO,
            failing_since: None,
        }
    }

    /// The next new reading; `None` once the client (or the backend) shut down. Cancel safe:
    /// dropped anywhere, the next call reads again.
    async fn next(&mut self) -> Option<Reading> {
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
                    // A change read while under way (a Redlock lead settled on one node of
                    // two) fails for a moment: read again before telling every observer.
                    let failing = *self.failing_since.get_or_insert_with(Instant::now);
                    if e.is_transient() && failing.elapsed() < QUIET_FAILURES {
                        continue;
                    }
                    // An outage passes, and so does a lock held on the key (it is released);
                    // a backend without elections, or a key it refuses, stays so.
                    let go_on = e.is_transient() || e.kind() == ErrorKind::KindMismatch;
                    return Some((Err(e), go_on));
                }
            };
            self.pause = Duration::ZERO;
            self.failing_since = None;
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
        let core = &self.target.core;
        core.check_open()?;
        validate_key(&self.target.key)?;
        core.backend.validate_key(&self.target.key)?;
        if self.watch.is_none() {
            self.watch = Some(
                core.backend
                    .watch_leader(&core.config.namespace, &self.target.key)
                    .await?,
            );
        }
        core.backend
            .leader(&core.config.namespace, &self.target.key)
            .await
    }
}
