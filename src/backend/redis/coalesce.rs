//! Coalescing: the acquire (and release) calls one backend has in flight at the same moment go
//! to the server as ONE function call, with a reply per claim. A busy service whose
//! tasks lock many keys through one client pays one script call, and one request, for many
//! locks: the per-call cost (reading the request, starting the function, writing the reply) is
//! what dominates the server's CPU per lock once the scripts are lean.
//!
//! Each script with a coalesced form (`<name>_many`, see `script.rs`) has a lane. A call that
//! finds its lane idle goes at once, alone, from its caller (nothing added while the client is
//! quiet). Calls that come while one is out queue behind it, and go as one coalesced call when
//! it is answered, sent by a spawned task that goes on until none is left; so the batches grow
//! with the load. Queued calls are sent by that task, not by a caller: a caller dropped after
//! queueing does not drop the others' replies, and its own call is still sent and answered,
//! as a single call whose request was sent runs on the server after its caller went. The
//! acquisition's drop guard waits for that answer before it releases (see `core/acquire.rs`),
//! exactly as for a single call; if it gives up waiting (its bound is the claim's TTL) and
//! releases, the queued acquire, not sent yet, is not sent at all (the release marks its claim
//! [abandoned](Claim::is_abandoned) first). A caller that sent its call
//! alone and is dropped leaves what queued behind it to a task as well, on the runtime the
//! backend was built in.
//!
//! Calls wait behind the one out for at most [`HOLD`]: a call whose reply is late or lost (it
//! waits out its timeout, and is sent again) does not hold up the calls queued behind it, which
//! go as the next batch while it is still out. The first call to queue behind the one out keeps
//! that watch for the others (so a client with one call out at a time sets no timer: a timer
//! due before the runtime's next one wakes the thread parked on its driver, a system call per
//! lock); the lane's `turn` says which call out holds it, so a call passed over leaves it alone.
//!
//! Coalescing is off on a Cluster (one call's keys must share a slot, and a busy service's keys
//! rarely do) and where scripts go by `EVALSHA`.

use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use ::redis::{FromRedisValue, RedisResult, Value};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::call::{Call, Parts};
use super::commands::{redis_error, Request};
use super::RedisBackend;
use crate::backend::Claim;
use crate::error::{Error, ErrorKind, Result};
use crate::sync::LockExt;

/// The most claims one coalesced call carries.
const MAX_BATCH: usize = 128;
/// How long calls queued in a lane wait for the call that is out before they go as a batch of
/// their own. Far above a reply's time on a working connection (coalescing still batches
/// everything that comes while a call is answered), far below a call's timeout: a release
/// queued behind a reply that was lost reaches the server, and hands the lock on, within this
/// instead of after the lost call's whole retry loop (three timeouts).
const HOLD: Duration = Duration::from_millis(250);

/// A claim's reply: the value, whether an earlier attempt may have run, when it was sent.
type Reply = Result<(Value, bool, Instant)>;

/// A queued claim's reply, with its parts handed back: the caller frees them as it goes on,
/// where its next call's parts are allocated, rather than the lane's task freeing a whole
/// batch's at once (more blocks of one size than the allocator's per-thread cache holds, so
/// they go to its shared lists, and the next calls' allocations miss the cache).
type Answer = (Reply, Parts);

/// A call queued in a lane: its parts, where its [`Answer`] goes, and for an acquire, its
/// claim, left out of the batch once [abandoned](Claim::is_abandoned).
struct QueuedCall {
    parts: Parts,
    answers: oneshot::Sender<Answer>,
    acquiring: Option<Claim>,
}

impl QueuedCall {
    /// Whether the call still goes: a release always does; an acquire whose claim was
    /// abandoned (its release goes, or went, out) would overtake that release and take the
    /// lock for no one.
    fn wanted(&self) -> bool {
        self.acquiring.as_ref().is_none_or(|c| !c.is_abandoned())
    }
}

/// The lanes of one backend, by script name.
pub(super) struct Coalescer {
    lanes: Mutex<Lanes>,
    /// The runtime the backend was built in (its connections' tasks run there): queued calls
    /// are sent from a task on it, not on the runtime of whichever caller went first.
    runtime: tokio::runtime::Handle,
}

impl Coalescer {
    /// Lanes whose queued calls are sent on `runtime`.
    pub(super) fn new(runtime: tokio::runtime::Handle) -> Self {
        Self {
            lanes: Mutex::default(),
            runtime,
        }
    }
}

/// The lanes of one backend, by script name: a few at most, so a list, searched without
/// hashing the name at every call.
#[derive(Default)]
struct Lanes(Vec<(&'static str, Lane)>);

impl Lanes {
    /// The lane of `name`, made if there is none.
    fn entry(&mut self, name: &'static str) -> &mut Lane {
        let i = self
            .0
            .iter()
            .position(|(n, _)| *n == name)
            .unwrap_or_else(|| {
                self.0.push((name, Lane::default()));
                self.0.len() - 1
            });
        &mut self.0[i].1
    }

    fn get_mut(&mut self, name: &str) -> Option<&mut Lane> {
        self.0
            .iter_mut()
            .find(|(n, _)| *n == name)
            .map(|(_, lane)| lane)
    }
}

/// The calls of one script waiting to be sent, and whether a call is out.
#[derive(Default)]
struct Lane {
    queued: Vec<QueuedCall>,
    sending: bool,
    /// Which call out holds the lane (sends what queued once it is answered): moved on when the
    /// queue goes on without it (see [`HOLD`]).
    turn: u64,
}

impl RedisBackend {
    /// Runs `call` like [`Commands::invoke_noting_doubt`](super::commands::Commands),
    /// coalesced with the calls of the same script this backend has in flight at the same
    /// moment. A queued call's parts move to its lane. `acquiring` is the claim of an acquire
    /// (none for a release).
    ///
    /// # Cancel safety
    /// Once this has queued the call, dropping it does not unsend it: the call goes out with
    /// its batch, and its reply is dropped. Except an acquire whose claim was abandoned
    /// before its batch went: it is left out.
    pub(super) async fn invoke_coalesced<'a, T: FromRedisValue + Send>(
        &'a self,
        what: &'static str,
        acquiring: Option<&Claim>,
        call: Call<'a>,
    ) -> Result<(T, bool, Instant)> {
        let mut next = None;
        let go = match call.coalescible().filter(|_| !self.inner.cluster) {
            None => Go::Alone(call),
            Some(name) => {
                let mut lanes = self.inner.coalescer.lanes.locked();
                let lane = lanes.entry(name);
                let at = At {
                    backend: self,
                    what,
                    name,
                    turn: lane.turn,
                };
                if lane.sending {
                    let (tx, rx) = oneshot::channel();
                    // The first to queue behind the call out watches it for all. (Not made
                    // otherwise: a watch dropped passes the lane on, which takes this lock.)
                    let watch = if lane.queued.is_empty() {
                        Some(Watch(at))
                    } else {
                        None
                    };
                    // Moved, not copied: most calls of a busy client queue.
                    lane.queued
                        .extend(call.into_parts().map(|parts| QueuedCall {
                            parts,
                            answers: tx,
                            acquiring: acquiring.cloned(),
                        }));
                    Go::Queued(rx, watch)
                } else {
                    // Nothing out: this call goes at once, alone, and the calls that queue
                    // behind it meanwhile go as one when it is answered (or dropped, or
                    // passed over).
                    lane.sending = true;
                    next = Some(Turn(at));
                    Go::Alone(call)
                }
            }
        };
        let call = match go {
            Go::Alone(call) => call,
            Go::Queued(rx, watch) => {
                // No reply: the lane's sending task ended before it answered, with the runtime
                // the backend's connections ran on.
                let reply = queued(rx, watch).await.ok_or_else(Error::runtime_gone)?;
                let (value, in_doubt, sent) = reply?;
                let value = T::from_redis_value(value).map_err(|e| redis_error(what, e.into()))?;
                return Ok((value, in_doubt, sent));
            }
        };
        let reply = self.inner.commands.invoke_noting_doubt(what, &call).await;
        drop(next);
        reply
    }

    /// Sends the lane's queued calls, a batch at a time, until none is left or the lane is
    /// passed on (its `turn` is no longer this task's).
    async fn send_lane(self, what: &'static str, name: &'static str, turn: u64) {
        loop {
            let batch: Vec<_> = {
                let mut lanes = self.inner.coalescer.lanes.locked();
                let Some(lane) = lanes.get_mut(name) else {
                    return;
                };
                if lane.turn != turn {
                    // Passed over: another task sends what queued.
                    return;
                }
                if lane.queued.is_empty() {
                    lane.sending = false;
                    return;
                }
                let n = lane.queued.len().min(MAX_BATCH);
                lane.queued.drain(..n).filter(QueuedCall::wanted).collect()
            };
            if batch.is_empty() {
                continue;
            }
            self.send_batch(what, batch).await;
        }
    }

    /// Sends one batch and hands each claim its reply. Claims that cannot go as one call
    /// (their shared arguments differ) go as batches of one, all at once.
    async fn send_batch(&self, what: &'static str, batch: Vec<QueuedCall>) {
        let scripts = self.inner.scripts;
        let all: Vec<&Parts> = batch.iter().map(|q| &q.parts).collect();
        let groups: Vec<Vec<usize>> = if scripts.many_of(&all).is_some() {
            vec![(0..batch.len()).collect()]
        } else {
            (0..batch.len()).map(|i| vec![i]).collect()
        };
        let batches: Vec<Batch<'_>> = groups
            .into_iter()
            .map(|among| Batch {
                backend: self,
                claims: &batch,
                among,
                carried: Mutex::default(),
            })
            .collect();
        let sent = batches
            .iter()
            .map(|b| self.inner.commands.invoke_noting_doubt(what, b));
        let replies: Vec<Result<(Vec<Value>, bool, Instant)>> =
            futures::future::join_all(sent).await;
        let mut out: Vec<Option<Reply>> = batch.iter().map(|_| None).collect();
        for (b, reply) in batches.iter().zip(replies) {
            b.hand_out(what, reply, &mut out);
        }
        drop(batches);
        for (q, reply) in batch.into_iter().zip(out) {
            // A claim the answered attempt did not carry was abandoned: nobody waits for it.
            if let Some(reply) = reply {
                let _ = q.answers.send((reply, q.parts));
            }
        }
    }
}

/// Claims of one lane sent as one coalesced call: a request built anew at every attempt from
/// the claims still [wanted](QueuedCall::wanted): an acquire abandoned since the last attempt
/// is left out of the next, which would otherwise take its lock for no one after the release,
/// as a call sent alone stops when its cleanup drops it.
struct Batch<'a> {
    backend: &'a RedisBackend,
    claims: &'a [QueuedCall],
    /// This batch's claims: indexes in `claims`.
    among: Vec<usize>,
    /// The claims the last attempt carried, in its order.
    carried: Mutex<Vec<usize>>,
}

impl Batch<'_> {
    /// Hands each claim the last attempt carried its part of `reply`, in `out`; a failure to
    /// every claim of the batch (see [`replies`]).
    fn hand_out(
        &self,
        what: &str,
        reply: Result<(Vec<Value>, bool, Instant)>,
        out: &mut [Option<Reply>],
    ) {
        let carried = std::mem::take(&mut *self.carried.locked());
        for (i, reply) in replies(what, &self.among, carried, reply) {
            if let Some(slot) = out.get_mut(i) {
                *slot = Some(reply);
            }
        }
    }
}

/// Each claim's reply, by its index: the values of the attempt that was answered to the claims
/// it `carried`, in order; a failure to every claim `among` the batch's, also where no attempt
/// was sent (a pool's checkout or the sentinels' lookup failed first, so none carried any):
/// the claims still wanted must get the error itself (a transient one, which a waiter rides
/// out), not find their reply lost.
fn replies(
    what: &str,
    among: &[usize],
    carried: Vec<usize>,
    reply: Result<(Vec<Value>, bool, Instant)>,
) -> Vec<(usize, Reply)> {
    let e = match reply {
        Ok((values, in_doubt, sent)) if values.len() == carried.len() => {
            return carried
                .into_iter()
                .zip(values)
                .map(|(i, value)| match value {
                    Value::BulkString(text) => (i, Err(claim_error(what, &text))),
                    value => (i, Ok((value, in_doubt, sent))),
                })
                .collect();
        }
        Ok((values, ..)) => Error::new(
            ErrorKind::Backend,
            format!(
                "redis {what}: {} replies to a coalesced call of {}",
                values.len(),
                carried.len()
            ),
        ),
        Err(e) => e,
    };
    among.iter().map(|&i| (i, Err(e.clone()))).collect()
}

impl Request for Batch<'_> {
    fn send<C, T>(&self, con: &mut C) -> impl Future<Output = RedisResult<T>> + Send
    where
        C: ::redis::aio::ConnectionLike + Send,
        T: FromRedisValue + Send,
    {
        let wanted: Vec<usize> = (self.among.iter().copied())
            .filter(|&i| self.claims.get(i).is_some_and(QueuedCall::wanted))
            .collect();
        let parts: Vec<&Parts> = wanted
            .iter()
            .filter_map(|&i| self.claims.get(i))
            .map(|q| &q.parts)
            .collect();
        let inner = &self.backend.inner;
        let call = inner.scripts.call_many(inner.functions.as_ref(), &parts);
        *self.carried.locked() = if call.is_some() { wanted } else { Vec::new() };
        async move {
            match call {
                Some(call) => call.invoke_async(con).await,
                // Nothing left to send (every claim was abandoned).
                None => T::from_redis_value(Value::Array(Vec::new())).map_err(Into::into),
            }
        }
    }
}

/// One turn of a lane: the call out that holds it, by its `turn`.
struct At<'a> {
    backend: &'a RedisBackend,
    what: &'static str,
    name: &'static str,
    turn: u64,
}

impl At<'_> {
    /// Sends what queued (from a task) if the lane is still this turn's, else leaves it. With
    /// `over`, the call out is passed over: it keeps its reply, and the queue goes on without
    /// it under a new turn; without, the lane is idle if nothing queued.
    fn pass_on(&self, over: bool) {
        let coalescer = &self.backend.inner.coalescer;
        let mut lanes = coalescer.lanes.locked();
        let Some(lane) = lanes.get_mut(self.name) else {
            return;
        };
        if lane.turn != self.turn {
            return;
        }
        if lane.queued.is_empty() {
            // Passed over with nothing queued, the call out still holds the lane; else the
            // lane is idle.
            if !over {
                lane.sending = false;
            }
            return;
        }
        if over {
            lane.turn = lane.turn.wrapping_add(1);
        }
        let turn = lane.turn;
        drop(lanes);
        let mut unsent = Unsent {
            backend: self.backend.clone(),
            name: self.name,
            turn,
            done: false,
        };
        let what = self.what;
        coalescer.runtime.spawn(async move {
            let lane = unsent.backend.clone();
            lane.send_lane(what, unsent.name, turn).await;
            unsent.sent();
        });
    }
}

/// A lane's sending task, until it is done: dropped before (its runtime shut down, the task
/// dropped unrun or mid-batch), it drops what queued in its turn and leaves the lane idle. The
/// callers find their replies gone (see `invoke_coalesced`) instead of waiting for a task
/// that will never run.
struct Unsent {
    backend: RedisBackend,
    name: &'static str,
    turn: u64,
    /// The task ran to its end: nothing to undo.
    done: bool,
}

impl Unsent {
    /// The task ran to its end: nothing to undo.
    fn sent(&mut self) {
        self.done = true;
    }
}

impl Drop for Unsent {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let dropped = {
            let mut lanes = self.backend.inner.coalescer.lanes.locked();
            match lanes.get_mut(self.name) {
                Some(lane) if lane.turn == self.turn => {
                    lane.sending = false;
                    std::mem::take(&mut lane.queued)
                }
                _ => Vec::new(),
            }
        };
        // Outside the lock: the senders' receivers wake.
        drop(dropped);
    }
}

/// Where a call goes: alone (nothing was out, or it cannot be coalesced), or queued behind the
/// call out, with its reply to come.
enum Go<'a> {
    Alone(Call<'a>),
    Queued(oneshot::Receiver<Answer>, Option<Watch<'a>>),
}

/// A call sent alone, holding the lane: once it is answered or dropped, sends what queued
/// behind it (from a task), or marks the lane idle if nothing did; unless it was passed over.
struct Turn<'a>(At<'a>);

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.0.pass_on(false);
    }
}

/// The first call queued behind the call out, watching it for the queue: dropped before it
/// is ended, it passes the call out over (see [`HOLD`]).
struct Watch<'a>(At<'a>);

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        self.0.pass_on(true);
    }
}

impl Watch<'_> {
    /// Ends the watch, passing nothing on: the call it watched was answered (this call's
    /// reply came, so its batch went).
    fn end(self) {
        // Only references inside: nothing to free.
        std::mem::forget(self);
    }
}

/// Waits for the reply of a call queued in a lane; `watch` if it is the first queued behind
/// the call out. Apart from [`RedisBackend::invoke_coalesced`], whose every call's future
/// would otherwise be this one's size more.
async fn queued(mut rx: oneshot::Receiver<Answer>, watch: Option<Watch<'_>>) -> Option<Reply> {
    let Some(watch) = watch else {
        return reply_of(rx.await);
    };
    // Not a `match` on the timed wait: its scrutinee would stay in this future across the
    // second wait below, with room for a whole answer.
    if let Ok(answer) = tokio::time::timeout(HOLD, &mut rx).await {
        watch.end();
        return reply_of(answer);
    }
    // The call out held the queue up past the hold: the watch, dropped, passes it over.
    // (Dropped with this call, it passes it over too.)
    drop(watch);
    reply_of(rx.await)
}

/// The reply in a queued claim's answer; its parts are dropped here, on the caller's side.
/// (Taken apart at once where the answer comes, so no future keeps room for a whole answer.)
fn reply_of(answer: std::result::Result<Answer, oneshot::error::RecvError>) -> Option<Reply> {
    answer.ok().map(|(reply, _parts)| reply)
}

/// A claim's error in a coalesced reply (the server's error text, see `MANY_LUA`), as the
/// error the same call alone would have met.
fn claim_error(what: &str, text: &[u8]) -> Error {
    let mut resp = Vec::with_capacity(text.len() + 3);
    resp.push(b'-');
    resp.extend(text.iter().filter(|b| !matches!(b, b'\r' | b'\n')));
    resp.extend_from_slice(b"\r\n");
    match ::redis::parse_redis_value(&resp) {
        Ok(Value::ServerError(e)) => redis_error(what, e.into()),
        _ => Error::new(
            ErrorKind::Backend,
            format!("redis {what} failed: {}", String::from_utf8_lossy(text)),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch whose every attempt failed before anything was sent (nothing carried): each of
    /// its claims gets the failure itself, transient as it was.
    #[test]
    fn a_failure_reaches_every_claim_of_the_batch_even_with_nothing_sent() {
        let e = Error::new(ErrorKind::Backend, "redis acquire failed").transient();
        let got = replies("acquire", &[2, 5], Vec::new(), Err(e));
        let errs: Vec<_> = got
            .iter()
            .map(|(i, r)| (*i, r.as_ref().err().map(Error::is_transient)))
            .collect();
        assert_eq!(errs, [(2, Some(true)), (5, Some(true))]);
    }

    /// The answered attempt's values go to the claims it carried, in order; a claim's error
    /// text becomes its error.
    #[test]
    fn values_go_to_the_claims_the_answered_attempt_carried() {
        let now = Instant::now();
        let values = vec![Value::Int(7), Value::BulkString(b"ERR no".to_vec())];
        let got = replies("acquire", &[0, 1, 2], vec![0, 2], Ok((values, false, now)));
        assert_eq!(got.len(), 2);
        assert!(matches!(got[0], (0, Ok((Value::Int(7), false, _)))));
        assert!(matches!(got[1], (2, Err(_))));
    }
}
