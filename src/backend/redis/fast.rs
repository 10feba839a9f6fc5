//! The uncontended mutex acquire as plain commands, without a script.
//!
//! Most acquisitions of a busy service find their key free. For those, one pipeline of four
//! plain commands takes the lock: `SET <lock> <owner> NX PX <ttl>` (the hold: the bare owner
//! token, expiring with the lease), `INCR <ns>:fence` (the namespace's counter: see
//! `scripts/plain.lua`), `EXISTS <queue>` (whether anyone waits in line) and `TIME`. The
//! fencing token is the larger of the counter and the server's time in µs, as the scripts'
//! floor makes it: a counter restored from an older snapshot (or lost with the server's data)
//! lies below tokens handed out before, the server's clock does not. The counter is not
//! lifted here; every later draw is floored at a later time, so tokens still increase. A
//! script call costs the server several times what a plain command does (see
//! benches/README.md, "Web-service shape"), so this path runs none; the release's script
//! deletes such a hold at its first comparison.
//!
//! The grant is taken as is only when all four hold true; anything else goes to the acquire
//! script, which settles it (`acquire.lua`, the hold that is ours without a recorded token):
//! - The `SET` took the lock. If it did not, the lock is busy: a waiting claim goes on to
//!   listen and queue (the script's first look would tell it nothing more), a try goes to the
//!   script, which tells a busy mutex from another kind of lock.
//! - Nobody is queued: the queue's key exists while anyone is in it. A holder whose lease ran
//!   out may have left waiters in line, and the `SET` may have barged past them: the script
//!   then hands the lock to the live head of the queue, if there is one, and queues this claim
//!   behind it.
//! - The token is one `next_fence` started (at least `FENCE_LOW`): a counter `INCR` just made
//!   (the last one expired) restarts at server time in the script. Such a counter has no
//!   expiry until the script starts it; a claim dropped in between leaves it so, and the next
//!   acquire of the namespace restarts it (one key per namespace at most). Nor is it past
//!   `FENCE_HIGH`, where the script fails the claim (a counter set by hand).
//! - The reply came within half the TTL of the request. Tokens must increase in the order of
//!   the grants, and `INCR` and `TIME` run just after the `SET` that granted, so an earlier
//!   holder's token could only be the larger if they ran after its hold expired: after its
//!   whole TTL. Its reply then comes later than that, so it never takes the grant as is. (Other
//!   locks' draws from the same counter between the two only skip tokens.)
//!
//! A key this client waited on a moment ago (its channel still subscribed: it lingers two
//! seconds after its last waiter) skips the pipeline: busy keys stay busy, and there it would
//! cost a round trip and three commands for nothing before the claim queues.
//!
//! Only on a single server: where the scripts lift tokens above the clocks (Sentinel: a
//! failover can set a counter back) and on a Cluster, the counters are per lock and the
//! acquire script runs.

use ::redis::Value;
use tokio::time::Instant;

use super::keys::millis;
use super::{Keys, RedisBackend};
use crate::backend::handoff::reply::granted;
use crate::backend::{Claim, Grant, LockKind};
use crate::error::Result;

/// The least token `next_fence` hands out (`FENCE_LOW` in `scripts/common.lua`): below it, a
/// counter was made by `INCR` alone.
const FENCE_LOW: i64 = 1 << 40;

/// Tokens from here on (2^53) are past what the scripts count exactly (`FENCE_HIGH` in
/// `scripts/common.lua`): such a counter was set by hand, and the script fails the claim with
/// an error that says so.
const FENCE_HIGH: i64 = 1 << 53;

/// What the pipeline found.
pub(super) enum Fast {
    /// The lock, with its token, under a lease from when the pipeline was sent.
    Granted(Grant),
    /// Held by someone else (or another kind of lock's key).
    Busy,
    /// Ours, maybe, but not to be taken as is: the acquire script settles it.
    Settle,
}

impl RedisBackend {
    /// Whether `claim` tries the plain commands first.
    pub(super) fn goes_fast(&self, claim: &Claim) -> bool {
        self.inner.plain && claim.kind() == LockKind::Exclusive
    }

    /// Sends the pipeline for `claim` (see the module's docs).
    pub(super) async fn acquire_fast(&self, claim: &Claim, keys: &Keys) -> Result<Fast> {
        // Each command sized up front: this runs at every uncontended lock.
        let (lock, owner, fence, queue) = (keys.lock(), keys.owner(), keys.fence(), keys.queue());
        let mut set = ::redis::Cmd::with_capacity(6, lock.len() + owner.len() + 32);
        set.arg("SET")
            .arg(lock)
            .arg(owner)
            .arg("NX")
            .arg("PX")
            .arg(millis(claim.ttl()));
        let mut incr = ::redis::Cmd::with_capacity(2, fence.len() + 4);
        incr.arg("INCR").arg(fence);
        let mut exists = ::redis::Cmd::with_capacity(2, queue.len() + 6);
        exists.arg("EXISTS").arg(queue);
        let mut pipe = ::redis::Pipeline::with_capacity(4);
        pipe.ignore_errors()
            .add_command(set)
            .add_command(incr)
            .add_command(exists)
            .add_command(::redis::cmd("TIME"));
        let (reply, _, sent): (Vec<Value>, bool, Instant) = self
            .inner
            .commands
            .invoke_noting_doubt("acquire", &pipe)
            .await?;
        Ok(read(claim, &reply, sent, Instant::now()))
    }
}

/// Reads the pipeline's reply, sent at `sent` and read at `now`.
fn read(claim: &Claim, reply: &[Value], sent: Instant, now: Instant) -> Fast {
    match reply {
        [Value::Nil, ..] => Fast::Busy,
        [Value::Okay | Value::SimpleString(_), Value::Int(fence), Value::Int(0), time]
            if (FENCE_LOW..FENCE_HIGH).contains(fence)
                && now.saturating_duration_since(sent) < claim.ttl() / 2 =>
        {
            match server_us(time) {
                Some(us) if us < FENCE_HIGH => granted("redis", claim, (*fence).max(us), sent)
                    .map_or(Fast::Settle, Fast::Granted),
                _ => Fast::Settle,
            }
        }
        _ => Fast::Settle,
    }
}

/// The server's time in µs from `TIME`'s reply (seconds and microseconds, as strings).
fn server_us(time: &Value) -> Option<i64> {
    let Value::Array(parts) = time else {
        return None;
    };
    let [secs, micros] = parts.as_slice() else {
        return None;
    };
    let number = |v: &Value| match v {
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse::<i64>().ok(),
        Value::Int(n) => Some(*n),
        _ => None,
    };
    number(secs)?
        .checked_mul(1_000_000)?
        .checked_add(number(micros)?)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn claim() -> Claim {
        Claim::new(
            "ns".into(),
            "k".into(),
            Duration::from_secs(10),
            LockKind::Exclusive,
            "redis",
            crate::backend::Owners::default().next(),
        )
    }

    /// `TIME`'s reply at `us` µs since 1970.
    fn time(us: i64) -> Value {
        let part = |n: i64| Value::BulkString(n.to_string().into_bytes());
        Value::Array(vec![part(us / 1_000_000), part(us % 1_000_000)])
    }

    #[test]
    fn only_a_prompt_grant_with_a_started_counter_is_taken_as_is() {
        let (claim, sent) = (claim(), Instant::now());
        let early = time(FENCE_LOW + 3);
        let reply = |set: Value, incr: Value| vec![set, incr, Value::Int(0), early.clone()];
        let queued = |set: Value, incr: Value| vec![set, incr, Value::Int(1), early.clone()];
        let started = Value::Int(FENCE_LOW + 7);
        let taken = |reply: &[Value], after: Duration| read(&claim, reply, sent, sent + after);

        match taken(
            &reply(Value::Okay, started.clone()),
            Duration::from_millis(2),
        ) {
            Fast::Granted(grant) => assert_eq!(grant.fence, 1 << 40 | 7),
            _ => panic!("a prompt grant was not taken"),
        }
        // A counter behind the server's clock (restored from an older snapshot): the token is
        // the clock.
        let later = FENCE_LOW + 1_000_000_007;
        match taken(
            &[Value::Okay, started.clone(), Value::Int(0), time(later)],
            Duration::ZERO,
        ) {
            Fast::Granted(grant) => assert_eq!(grant.fence, later as u64),
            _ => panic!("a prompt grant was not taken"),
        }
        assert!(matches!(
            taken(&reply(Value::Nil, started.clone()), Duration::ZERO),
            Fast::Busy
        ));
        // Someone queued: the script settles it.
        assert!(matches!(
            taken(&queued(Value::Okay, started.clone()), Duration::ZERO),
            Fast::Settle
        ));
        // The counter not a number (INCR refused), new, or the reply late: the same.
        let refused = ::redis::parse_redis_value(b"-ERR value is not an integer\r\n")
            .expect("a server error's text");
        for (incr, after) in [
            (refused, Duration::ZERO),
            (Value::Int(1), Duration::ZERO),
            (started.clone(), Duration::from_secs(5)),
        ] {
            assert!(matches!(
                taken(&reply(Value::Okay, incr), after),
                Fast::Settle
            ));
        }
        // No clock to floor the token with: the script settles it.
        assert!(matches!(
            taken(
                &[Value::Okay, started, Value::Int(0), Value::Nil],
                Duration::ZERO
            ),
            Fast::Settle
        ));
        assert!(matches!(taken(&[], Duration::ZERO), Fast::Settle));
    }
}
