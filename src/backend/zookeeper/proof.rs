//! From when the **leader** is sure to have heard from our session: the instant a lease counts
//! from. A lease is valid for the granted session timeout from that instant.
//!
//! Only the leader expires sessions, a session timeout after the last activity *it* heard of.
//! A follower does not tell it of a session's requests as they come: it touches the session in
//! its own table, and reports the sessions it touched in its reply to the leader's next ping
//! (`Learner.ping`, `LearnerHandler` on `PING`). A write the follower forwards does not touch
//! the session at the leader. So a write acknowledged through a follower does not prove the
//! session alive at the leader when it was sent: with the follower cut off right after, the
//! leader expires the session a timeout after the last ping report that reached it, which may
//! be long before.
//!
//! What does hold:
//!
//! 1. A request R we sent and saw acknowledged touched the session at its server between R's
//!    send and R's ack.
//! 2. The leader pings each follower every `tickTime / 2`; the follower's reply carries every
//!    session touched since its last reply. So R's touch is on its way to the leader no later
//!    than about `tickTime / 2` after R's ack. We wait [`report_within`] (that, and a quarter
//!    tick more for the ping loop's and the follower's scheduling).
//! 3. A follower's ping replies and the writes it forwards share its one TCP stream to the
//!    leader, read in order. So a quorum write W *sent* at least [`report_within`] after R's
//!    *ack*, and acknowledged, was committed by a leader that had already read the ping reply
//!    carrying R's touch: the leader heard of the session at R's send or later.
//! 4. If the client moved to another server between R and W, its reconnect revalidated the
//!    session at the leader, which touches it there (after R's ack). If R or W reached the
//!    leader itself, it touched the session there directly. Either way 3's conclusion holds.
//! 5. Creating the session goes through the leader, which starts its clock then: the leader
//!    heard of the session no earlier than when we began to connect.
//!
//! So the proven instant is the latest send of an acknowledged request R such that some
//! acknowledged quorum write was sent at least [`report_within`] after R's ack, or the instant
//! we began to connect. The leader rounds expiry *up* to its next tick, which only helps.
//!
//! A client does not know the ensemble's `tickTime`: it is
//! [`ZkBackendBuilder::server_tick`](super::ZkBackendBuilder::server_tick), at most half the
//! granted session timeout (ZooKeeper's least session timeout is two ticks).
//!
//! Only the last few requests are kept (a handful per `tickTime`), and nothing is sent for
//! them: the writes the locks make anyway (creates, deletes, renewals) prove each other. A
//! grant after a long quiet spell sends what it needs ([`Proof::lasting`],
//! `Inner::proof`).

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

/// How many unproven requests are kept. Older ones matter only when no newer one qualifies,
/// and dropping one only makes a lease shorter.
const KEPT: usize = 16;

/// How long after a request's ack a quorum write must be sent to prove it, for an ensemble
/// whose `tickTime` is at most `tick`, clamped to half the session timeout `session`.
pub(super) fn report_within(tick: Duration, session: Duration) -> Duration {
    let tick = tick.min(session / 2);
    tick / 2 + tick / 4
}

/// What the leader is known to have heard of one session (one hub epoch).
#[derive(Debug, Clone)]
pub(super) struct Proof {
    epoch: u64,
    session: Duration,
    report: Duration,
    /// The leader heard from the session at this instant or later.
    proven: Instant,
    /// Acknowledged requests `(sent, acked)` not proven yet, acks increasing and at least a
    /// quarter of `report` apart (of requests acknowledged closer together, the first is kept:
    /// one that is never old enough to qualify would be useless).
    pending: VecDeque<(Instant, Instant)>,
}

impl Proof {
    /// A session of hub epoch `epoch`, granted `session`, whose connect began at `connecting`;
    /// `tick` is the ensemble's largest `tickTime` as configured.
    pub(super) fn new(epoch: u64, connecting: Instant, session: Duration, tick: Duration) -> Self {
        Self {
            epoch,
            session,
            report: report_within(tick, session),
            proven: connecting,
            pending: VecDeque::new(),
        }
    }

    pub(super) fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The instant the leader is known to have heard from the session at or after.
    pub(super) fn proven(&self) -> Instant {
        self.proven
    }

    /// A request sent at `sent` was acknowledged at `acked`; `quorum` if it was a write (which
    /// the leader commits), so that it proves the requests acknowledged long enough before
    /// it was sent.
    pub(super) fn acked(&mut self, sent: Instant, acked: Instant, quorum: bool) {
        if quorum {
            if let Some(horizon) = sent.checked_sub(self.report) {
                while let Some(&(s, a)) = self.pending.front() {
                    if a > horizon {
                        break;
                    }
                    self.proven = self.proven.max(s);
                    self.pending.pop_front();
                }
            }
        }
        let spaced = self
            .pending
            .back()
            .is_none_or(|&(_, a)| acked >= a + self.report / 4);
        if spaced && sent > self.proven {
            self.pending.push_back((sent, acked));
            if self.pending.len() > KEPT {
                self.pending.pop_front();
            }
        }
    }

    /// Whether the proven instant leaves enough of a lease at `now` for a grant: a third of the
    /// session, and enough for a renewal to prove a request made now before the lease ends.
    pub(super) fn lasting(&self, now: Instant) -> bool {
        let needed = (self.session / 3).max(self.report * 4 / 3);
        self.proven + self.session > now + needed
    }

    /// When a quorum write sent then proves the latest acknowledged request we keep; `None`
    /// if none is kept (a write sent now proves nothing new, but is one).
    pub(super) fn provable_at(&self) -> Option<Instant> {
        self.pending.back().map(|&(_, a)| a + self.report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn proof(t0: Instant) -> Proof {
        // tick 400 ms: a report within 300 ms.
        Proof::new(1, t0, Duration::from_secs(6), 400 * MS)
    }

    #[test]
    fn the_tick_is_at_most_half_the_session() {
        assert_eq!(
            report_within(Duration::from_secs(2), Duration::from_secs(10)),
            1500 * MS
        );
        assert_eq!(
            report_within(Duration::from_secs(2), Duration::from_secs(2)),
            750 * MS
        );
    }

    #[test]
    fn a_write_proves_only_what_was_acknowledged_a_report_before_it_was_sent() {
        let t0 = Instant::now();
        let mut p = proof(t0);
        assert_eq!(p.proven(), t0);
        // A create through a follower: proves nothing by itself.
        p.acked(t0 + 1000 * MS, t0 + 1010 * MS, true);
        assert_eq!(p.proven(), t0);
        assert_eq!(p.provable_at(), Some(t0 + 1310 * MS));
        // A write sent too soon after it proves nothing either; it is kept in turn.
        p.acked(t0 + 1200 * MS, t0 + 1210 * MS, true);
        assert_eq!(p.proven(), t0);
        assert_eq!(p.provable_at(), Some(t0 + 1510 * MS));
        // One sent a report after the create's ack proves the create's send.
        p.acked(t0 + 1310 * MS, t0 + 1320 * MS, true);
        assert_eq!(p.proven(), t0 + 1000 * MS);
        // A read proves nothing, but can be proven.
        p.acked(t0 + 2000 * MS, t0 + 2005 * MS, false);
        assert_eq!(p.proven(), t0 + 1000 * MS);
        p.acked(t0 + 2400 * MS, t0 + 2410 * MS, true);
        assert_eq!(p.proven(), t0 + 2000 * MS);
    }

    #[test]
    fn proven_never_goes_back_and_the_kept_requests_are_bounded() {
        let t0 = Instant::now();
        let mut p = proof(t0);
        for i in 0..1000u32 {
            let sent = t0 + i * 10 * MS;
            p.acked(sent, sent + 5 * MS, i % 7 == 0);
            assert!(p.pending.len() <= KEPT);
        }
        let before = p.proven();
        assert!(before > t0 + 9000 * MS && before < t0 + 10_000 * MS - 300 * MS);
        // A late reply of an old write moves nothing back.
        p.acked(t0 + 100 * MS, t0 + 10_100 * MS, true);
        assert_eq!(p.proven(), before);
    }

    #[test]
    fn a_lease_must_last_a_third_of_the_session() {
        let t0 = Instant::now();
        let p = proof(t0);
        assert!(p.lasting(t0 + 3900 * MS));
        assert!(!p.lasting(t0 + 4000 * MS));
    }
}
