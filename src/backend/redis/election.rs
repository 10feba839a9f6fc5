//! Elections on Redis: a leadership claim is a mutex claim (one FIFO queue, direct handoff,
//! renewal, the fencing counter's token as the term) whose hold also says it is an election's
//! and, once its client confirmed the lead, carries the value it proclaims (see `common.lua`).
//!
//! A lead handed to a waiting candidate is provisional until the candidate's client confirms
//! it by asking again (`wait_claim` turns the grant message into a re-ask): until then it is
//! not reported, nor announced, so a candidate whose host died in line is never seen leading.
//! Every change of the confirmed leader (a confirmed grant, a proclaim, a leader's release, an
//! operator's unlock) is published on the election's channel, `<lock>:e`, where observers
//! listen through the hub; a lease that runs out is not (observers re-read when it ends).

use std::time::Duration;

use ::redis::Value;

use super::scripts::{LeaderOf, Proclaim};
use super::{Keys, RedisBackend, RedisTicket};
use crate::backend::wire::{check_value_len, kind_mismatch};
use crate::backend::{Claim, Leader, LeaderWatch, LockKind};
use crate::error::{Error, ErrorKind, Result};

/// The most bytes an election's value may hold (a campaign's or a proclaim's): the value lives
/// in the leader's hold, which every renewal and every candidate's call reads on the server.
/// Redlock keeps the value on every node alike.
pub(crate) const MAX_VALUE_LEN: usize = 1 << 20;

/// Refuses a value larger than [`MAX_VALUE_LEN`], before any I/O.
pub(crate) fn validate_value(key: &str, value: &[u8]) -> Result<()> {
    check_value_len("redis", key, value, MAX_VALUE_LEN)
}

/// The channel an election's changes are published on: `<lock>:e` (the lock's hash tag, so
/// its Cluster slot).
pub(crate) fn channel_of(keys: &Keys) -> String {
    format!("{}:e", keys.lock())
}

/// The confirmed leader one server holds, as `leader.lua` reports it.
pub(crate) struct HeldLead {
    pub(crate) term: u64,
    pub(crate) lease_left: Duration,
    pub(crate) value: Vec<u8>,
    /// The leader's owner token (Redlock's nodes agree on a leader by it).
    #[cfg(feature = "redlock")]
    pub(crate) owner: String,
}

/// `leader.lua`'s reply: the confirmed leader, `None` while nobody leads, or the kind mismatch
/// if `key` is in use as another kind of lock.
pub(crate) fn parse_leader(key: &str, reply: &[Value]) -> Result<Option<HeldLead>> {
    let int = |i: usize| -> Option<i64> { ::redis::from_redis_value_ref(reply.get(i)?).ok() };
    match int(0) {
        Some(0) => Ok(None),
        Some(-1) => {
            let family: String = reply
                .get(1)
                .and_then(|v| ::redis::from_redis_value_ref(v).ok())
                .unwrap_or_default();
            Err(kind_mismatch(key, &family, LockKind::Leader))
        }
        Some(1) => {
            let term = int(1)
                .and_then(|t| u64::try_from(t).ok())
                .ok_or_else(malformed)?;
            let left = int(2).ok_or_else(malformed)?;
            let bytes = |i: usize| -> Result<Vec<u8>> {
                reply
                    .get(i)
                    .and_then(|v| ::redis::from_redis_value_ref(v).ok())
                    .ok_or_else(malformed)
            };
            Ok(Some(HeldLead {
                term,
                lease_left: Duration::from_millis(u64::try_from(left).unwrap_or(0)),
                value: bytes(3)?,
                #[cfg(feature = "redlock")]
                owner: String::from_utf8_lossy(&bytes(4)?).into_owned(),
            }))
        }
        _ => Err(malformed()),
    }
}

fn malformed() -> Error {
    Error::new(
        ErrorKind::Backend,
        "redis leader returned a malformed reply",
    )
}

impl RedisBackend {
    /// Publishes the claim's value as what its leader says.
    pub(super) async fn proclaim_claim(&self, claim: &Claim, ticket: &RedisTicket) -> Result<()> {
        let value = claim.value();
        validate_value(claim.key(), &value)?;
        let keys = self.keys_of(ticket, claim);
        let inv = self.call(&Proclaim {
            keys,
            value: &value,
        });
        let leads: i64 = self.inner.commands.invoke("proclaim", &inv).await?;
        match leads {
            1 => Ok(()),
            _ => Err(Error::lost(claim.key())),
        }
    }

    /// Who leads the election `key` of `namespace`: its confirmed leader.
    pub(super) async fn leader_of(&self, namespace: &str, key: &str) -> Result<Option<Leader>> {
        let keys = self.names(namespace, key);
        let inv = self.call(&LeaderOf { keys: &keys });
        let reply: Vec<Value> = self.inner.commands.invoke("leader", &inv).await?;
        Ok(parse_leader(key, &reply)?.map(|l| Leader::new(l.value, l.term, l.lease_left)))
    }

    /// A signal the hub moves at every message on the election's channel (subscribed before
    /// this returns) and whenever messages may have been missed.
    pub(super) async fn watch_leader_of(&self, namespace: &str, key: &str) -> Result<LeaderWatch> {
        let keys = self.names(namespace, key);
        let (changes, subscription) = self.inner.hub.watch(&channel_of(&keys)).await?;
        Ok(LeaderWatch::new(changes).keeping(subscription))
    }
}
