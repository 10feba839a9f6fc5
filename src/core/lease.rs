//! Leases: what one claim's lease is known to be, the lost signal, and release on drop.
//!
//! A [`Lease`] records the claim's grant and how long it is certainly valid on this machine's
//! clock. The renewal engine ([`super::renewal`]) extends it; every rule that decides whether a
//! lease still stands lives here, so the engine, the guard and `is_lost()` agree:
//!
//! - the lease is lost once its deadline, less a clock-drift margin, has passed, and that is
//!   final: a renewal reply that lands later does not revive it;
//! - a renewal reply speaks only for the state the claim was in when the call was *sent* (a
//!   queue-entry renewal sent before a handoff says nothing about the lease that followed).

use std::future::Future as _;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex as StdMutex;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::{sleep_until, Instant};

use crate::backend::{AnyTicket, Claim, Grant};
use crate::sync::LockExt;

/// The smallest pause before retrying a failed renewal.
const MIN_RETRY: Duration = Duration::from_millis(10);

/// The clock-drift margin subtracted from every lease: 1% of the lease's length plus 2 ms
/// (Redlock's figures).
pub(crate) fn default_drift(span: Duration) -> Duration {
    span / 100 + Duration::from_millis(2)
}

/// One claim as the renewal engine and its guard share it.
pub(crate) struct Lease {
    pub(crate) id: u64,
    pub(crate) claim: Claim,
    pub(crate) ticket: AnyTicket,
    drift: fn(Duration) -> Duration,
    schedule: StdMutex<Schedule>,
    /// Set once the claim is being released: renewal stops for good.
    done: AtomicBool,
    /// Whether the engine renews this lease: [`RENEW_DEFAULT`] (as the client says),
    /// [`RENEW_ON`] or [`RENEW_OFF`] (set by its guard).
    renew: AtomicU8,
    /// Woken when a renewal sent while the claim was queued finds it holding the lock: the
    /// server granted it (a handoff whose message never arrived).
    granted: Notify,
}

/// A lease renews as its client's `auto_renew` says.
const RENEW_DEFAULT: u8 = 0;
/// A lease whose guard turned renewal on.
const RENEW_ON: u8 = 1;
/// A lease whose guard turned renewal off: it ends one TTL after its last grant or extension.
const RENEW_OFF: u8 = 2;

/// What is known about a lease, and when to look at it next.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Schedule {
    /// The grant, once the claim holds the lock.
    pub(crate) held: Option<Grant>,
    /// The length of the lease behind `held.valid_until`, measured from when the request that
    /// produced it was sent: the drift margin is a share of it.
    pub(crate) span: Duration,
    /// Moves on when the claim changes state (queued to held). A renewal sent in an older
    /// generation must not change this one.
    pub(crate) generation: u64,
    /// When the engine should renew (or, for a queued claim, keep its place) next.
    pub(crate) next: Instant,
    /// The grant is provisional (a lock handed to this claim under a short lease, see
    /// [`Grant::provisional`]): renew it once even when automatic renewal is off.
    pub(crate) confirm: bool,
    /// When the claim was granted.
    pub(crate) held_since: Option<Instant>,
}

impl Schedule {
    /// When the held lease must be taken as lost: its deadline less the drift margin.
    pub(crate) fn lost_at(&self, drift: fn(Duration) -> Duration) -> Option<Instant> {
        let held = self.held?;
        Some(
            held.valid_until
                .checked_sub(drift(self.span))
                .unwrap_or(held.valid_until),
        )
    }
}

/// A renewal reply, judged against the lease it was sent for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Applied: the lease (or queue entry) is extended.
    Kept,
    /// The reply cannot move this lease: it was sent for another state, or it came too late.
    Stale,
    /// The lease is gone (past its deadline, or the server says so): mark it lost.
    Lost,
}

impl Lease {
    pub(crate) fn new(
        id: u64,
        claim: Claim,
        ticket: AnyTicket,
        drift: fn(Duration) -> Duration,
    ) -> Self {
        let next = Instant::now() + claim.ttl() / 3;
        Self {
            id,
            claim,
            ticket,
            drift,
            schedule: StdMutex::new(Schedule {
                held: None,
                span: Duration::ZERO,
                generation: 0,
                next,
                confirm: false,
                held_since: None,
            }),
            done: AtomicBool::new(false),
            renew: AtomicU8::new(RENEW_DEFAULT),
            granted: Notify::new(),
        }
    }

    pub(crate) fn schedule(&self) -> std::sync::MutexGuard<'_, Schedule> {
        self.schedule.locked()
    }

    pub(crate) fn drift(&self) -> fn(Duration) -> Duration {
        self.drift
    }

    /// Records the grant and schedules the first renewal at a third of the lease. A
    /// provisional grant is marked to be confirmed.
    pub(crate) fn set_held(&self, grant: Grant) {
        let now = Instant::now();
        let span = grant.valid_until.saturating_duration_since(now);
        let mut s = self.schedule();
        s.held = Some(grant);
        s.held_since.get_or_insert(now);
        s.span = span;
        s.generation += 1;
        s.next = renew_at(now, grant.valid_until);
        s.confirm = grant.provisional;
    }

    /// Starts the hold's clock again (a write hold became a read hold); returns how long it ran.
    pub(crate) fn restart_hold(&self) -> Option<std::time::Duration> {
        let now = Instant::now();
        let mut s = self.schedule();
        let since = s.held_since.replace(now)?;
        Some(now.saturating_duration_since(since))
    }

    pub(crate) fn fence(&self) -> u64 {
        self.schedule().held.map_or(0, |g| g.fence)
    }

    /// When the held lease must be taken as lost; `None` while queued.
    pub(crate) fn lost_at(&self) -> Option<Instant> {
        self.schedule().lost_at(self.drift)
    }

    /// Whether the engine renews this lease, given the client's `auto_renew`.
    pub(crate) fn renews(&self, client_default: bool) -> bool {
        match self.renew.load(Ordering::Acquire) {
            RENEW_ON => true,
            RENEW_OFF => false,
            _ => client_default,
        }
    }

    /// Turns renewal of this lease on or off, whatever the client's default.
    pub(crate) fn set_renews(&self, on: bool) {
        let flag = if on { RENEW_ON } else { RENEW_OFF };
        self.renew.store(flag, Ordering::Release);
    }

    /// Starts an explicit extension with a new TTL, about to be sent at `sent`: later renewals
    /// ask for `ttl`, and the lease moves to a new generation so that no renewal reply
    /// computed with the old TTL is applied to it. Until the reply, the lease is taken to end
    /// no later than `sent + ttl` (a shorter TTL shortens it at once: the server may apply it
    /// at any moment from now). Returns the new generation, or `None` if the claim does not
    /// hold a lease that still stands.
    pub(crate) fn begin_extend(&self, ttl: Duration, sent: Instant) -> Option<u64> {
        let mut s = self.schedule();
        let standing = !self.claim.is_lost()
            && s.held.is_some()
            && s.lost_at(self.drift).is_none_or(|at| sent < at);
        if !standing {
            return None;
        }
        self.claim.set_ttl(ttl);
        let until = sent + ttl;
        let mut valid_until = until;
        if let Some(held) = s.held.as_mut() {
            if until < held.valid_until {
                held.valid_until = until;
            } else {
                valid_until = held.valid_until;
            }
        }
        if valid_until == until {
            s.span = ttl;
        }
        s.generation += 1;
        s.next = renew_at(sent, valid_until);
        Some(s.generation)
    }

    /// When the held lease must be taken as lost, on the std clock; `None` while queued.
    pub(crate) fn valid_until(&self) -> Option<std::time::Instant> {
        self.lost_at().map(Instant::into_std)
    }

    /// Stops renewal. Returns `false` if it was already stopped.
    pub(crate) fn finish(&self) -> bool {
        !self.done.swap(true, Ordering::AcqRel)
    }

    pub(crate) fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    /// Lost if a backend or the engine said so, or if the local deadline has passed (even when
    /// the engine has not run yet). Once true, it stays true.
    pub(crate) fn is_lost(&self) -> bool {
        if self.claim.is_lost() {
            return true;
        }
        if self.lost_at().is_some_and(|at| Instant::now() >= at) {
            self.claim.mark_lost();
            return true;
        }
        false
    }

    /// Applies a lease extension valid until `valid_until`, from a renewal sent at `sent` in
    /// generation `generation`.
    pub(crate) fn extend(&self, generation: u64, sent: Instant, valid_until: Instant) -> Verdict {
        let mut s = self.schedule();
        if s.generation != generation || s.held.is_none() {
            return Verdict::Stale;
        }
        if s.lost_at(self.drift).is_some_and(|at| Instant::now() >= at) || self.claim.is_lost() {
            // Too late: `is_lost()` may already have said so, and lost is final.
            return Verdict::Lost;
        }
        if let Some(g) = s.held.as_mut() {
            if valid_until > g.valid_until {
                g.valid_until = valid_until;
                s.span = valid_until.saturating_duration_since(sent);
            }
        }
        s.next = renew_at(sent, valid_until);
        s.confirm = false;
        Verdict::Kept
    }

    /// Applies a queue-entry extension (the claim keeps its place until `until`).
    pub(crate) fn keep_queued(&self, generation: u64, sent: Instant, until: Instant) -> Verdict {
        let mut s = self.schedule();
        if s.generation != generation || s.held.is_some() {
            return Verdict::Stale;
        }
        s.next = renew_at(sent, until);
        Verdict::Kept
    }

    /// A renewal sent in `generation` while the claim was queued found it holding the lock,
    /// extended until `until`: the server granted it (a handoff whose message was lost or is
    /// still on its way). That is a grant: the waiting acquisition is woken to confirm it with
    /// the server, as a message would wake it. The reply does not set the lease (the grant's
    /// fencing token comes with the confirmation), but it moves the next renewal as a queue
    /// renewal would, so the claim is not renewed again at once.
    pub(crate) fn granted_while_queued(
        &self,
        generation: u64,
        sent: Instant,
        until: Instant,
    ) -> Verdict {
        let mut s = self.schedule();
        if s.generation != generation || s.held.is_some() {
            return Verdict::Stale;
        }
        s.next = renew_at(sent, until);
        drop(s);
        // Stores a permit if the acquisition is not waiting right now (it is between calls).
        self.granted.notify_one();
        Verdict::Kept
    }

    /// Resolves once a renewal has found this queued claim holding the lock (see
    /// [`granted_while_queued`](Self::granted_while_queued)).
    pub(crate) async fn granted_by_renewal(&self) {
        self.granted.notified().await;
    }

    /// The server refused a renewal sent in `generation`: lost if the claim held the lock then
    /// and still does.
    pub(crate) fn refused(&self, generation: u64) -> Verdict {
        let s = self.schedule();
        if s.generation == generation && s.held.is_some() {
            Verdict::Lost
        } else {
            Verdict::Stale
        }
    }

    /// A renewal sent in `generation` failed (no answer, or an error): lost once past the
    /// deadline, otherwise try again after a pause that leaves room for several attempts.
    pub(crate) fn failed(&self, generation: u64, ttl: Duration) -> Verdict {
        let now = Instant::now();
        let mut s = self.schedule();
        if s.generation != generation {
            return Verdict::Stale;
        }
        if s.lost_at(self.drift).is_some_and(|at| now >= at) {
            return Verdict::Lost;
        }
        let until = s.held.map_or(now + ttl, |g| g.valid_until);
        let pause = (until.saturating_duration_since(now) / 4)
            .min(ttl / 10)
            .max(MIN_RETRY);
        s.next = now + pause;
        Verdict::Kept
    }

    /// Sets when to try again after a renewal that failed or was refused in `generation`.
    pub(crate) fn retry_at(&self, generation: u64, at: Instant) {
        let mut s = self.schedule();
        if s.generation == generation {
            s.next = at;
        }
    }

    /// Resolves once the lease is known lost: marked by a backend or the engine, or past its
    /// deadline (even if the engine that would mark it is gone).
    pub(crate) async fn lost(&self) {
        let signal = self.claim.lost_signal();
        loop {
            if self.is_lost() {
                return;
            }
            match self.lost_at() {
                None => return signal.wait().await,
                Some(at) => {
                    let (wait, sleep) = (signal.wait(), sleep_until(at));
                    tokio::pin!(wait, sleep);
                    // The deadline is checked at every poll, not only when the timer fires: a
                    // task that resumes past it (a paused process) may be polled before the
                    // timer driver has run, and must see the loss then.
                    let marked = std::future::poll_fn(|cx| {
                        if self.is_lost() || wait.as_mut().poll(cx).is_ready() {
                            return std::task::Poll::Ready(true);
                        }
                        // Deadlines only move later: check again, and sleep on if extended.
                        sleep.as_mut().poll(cx).map(|()| false)
                    })
                    .await;
                    if marked {
                        return;
                    }
                }
            }
        }
    }
}

/// When to renew a lease valid until `valid_until`, as of `now`: a third of the way in.
pub(crate) fn renew_at(now: Instant, valid_until: Instant) -> Instant {
    now + valid_until.saturating_duration_since(now) / 3
}

/// Allocates lease ids for one client.
#[derive(Default)]
pub(crate) struct LeaseIds(AtomicU64);

impl LeaseIds {
    pub(crate) fn next(&self) -> u64 {
        self.0.fetch_add(1, Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::LockKind;

    fn lease(ttl: Duration) -> Lease {
        let owner = crate::backend::Owners::default().next();
        let claim = Claim::new(
            "ns".into(),
            "k".into(),
            ttl,
            LockKind::Exclusive,
            "memory",
            owner,
        );
        Lease::new(0, claim, Box::new(()), default_drift)
    }

    #[test]
    fn the_drift_margin_is_a_share_of_the_lease_not_of_the_ttl() {
        // A 1 s TTL asked for, a 10 s lease granted (a ZooKeeper session): 1% of 10 s.
        let l = lease(Duration::from_secs(1));
        let until = Instant::now() + Duration::from_secs(10);
        l.set_held(Grant::new(1, until));
        let margin = until - l.lost_at().unwrap();
        assert!(margin >= Duration::from_millis(95), "{margin:?}");
        assert!(
            !l.schedule().confirm,
            "a grant longer than the TTL needs no confirmation"
        );
    }

    #[test]
    fn a_provisional_grant_is_confirmed_even_without_renewal() {
        // A 300 ms handoff lease for a 10 s TTL.
        let l = lease(Duration::from_secs(10));
        l.set_held(Grant::provisional(
            1,
            Instant::now() + Duration::from_millis(300),
        ));
        assert!(l.schedule().confirm);
        // The grant says so, not its length: a full grant short of the TTL (a ZooKeeper lease
        // counted from an older proof of the session) needs no confirmation.
        let short = lease(Duration::from_secs(10));
        short.set_held(Grant::new(1, Instant::now() + Duration::from_secs(6)));
        assert!(!short.schedule().confirm);
        let full = lease(Duration::from_secs(10));
        full.set_held(Grant::new(1, Instant::now() + Duration::from_secs(10)));
        assert!(!full.schedule().confirm);
    }

    #[test]
    fn a_reply_sent_before_a_grant_does_not_move_its_lease() {
        let l = lease(Duration::from_secs(3));
        let queued = l.schedule().generation;
        let sent = Instant::now();
        let until = sent + Duration::from_millis(300);
        l.set_held(Grant::new(7, until));
        // A queue renewal sent while queued, answered after the handoff.
        assert_eq!(
            l.extend(queued, sent, sent + Duration::from_secs(3)),
            Verdict::Stale
        );
        assert_eq!(l.refused(queued), Verdict::Stale);
        assert_eq!(l.schedule().held.map(|g| g.valid_until), Some(until));
        // A renewal of the lease itself moves it.
        let held = l.schedule().generation;
        assert_eq!(
            l.extend(held, sent, sent + Duration::from_secs(3)),
            Verdict::Kept
        );
        assert_eq!(l.refused(held), Verdict::Lost);
    }

    #[test]
    fn a_shorter_ttl_shortens_the_lease_at_once_and_old_replies_do_not_stretch_it() {
        let l = lease(Duration::from_secs(10));
        let granted = Instant::now();
        l.set_held(Grant::new(1, granted + Duration::from_secs(10)));
        // A renewal goes out with the 10 s TTL...
        let old = l.schedule().generation;
        // ...then the guard asks for 1 s: the lease ends within 1 s of now before any reply.
        let sent = Instant::now();
        let new = l.begin_extend(Duration::from_secs(1), sent).unwrap();
        assert_eq!(l.claim.ttl(), Duration::from_secs(1));
        assert!(l.lost_at().unwrap() <= sent + Duration::from_secs(1));
        // The old renewal's reply lands last: the server may have applied the 1 s TTL after
        // it, so it must not give the lease back its 10 s.
        assert_eq!(
            l.extend(old, granted, granted + Duration::from_secs(10)),
            Verdict::Stale
        );
        assert!(l.lost_at().unwrap() <= sent + Duration::from_secs(1));
        // The extension's own reply applies.
        assert_eq!(
            l.extend(new, sent, sent + Duration::from_secs(1)),
            Verdict::Kept
        );
        // A lost lease cannot be extended.
        l.claim.mark_lost();
        assert!(l
            .begin_extend(Duration::from_secs(5), Instant::now())
            .is_none());
    }
}
