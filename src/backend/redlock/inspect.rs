//! What a lock looks like across the nodes: the claims holding a majority of them and the
//! claims queued on any of them, by priority.

use std::collections::BTreeMap;
use std::time::Duration;

use ::redis::FromRedisValue;
use futures::future::join_all;
use tokio::time::Instant;

use super::keys::Keys;
use super::library;
use super::quorum::held_until;
use super::scripts::{ForceRelease, Inspect};
use super::RedlockBackend;
use crate::backend::redis::call::{wall_clock_us, Call};
use crate::backend::redis::kind_of_code;
use crate::backend::redis::scripts::Inspect as RedisInspect;
use crate::backend::wire::parse_family;
use crate::backend::{Family, LockKind};
use crate::error::Result;
use crate::inspect::{ForceReleased, Holder, Inspection, Waiter};

/// The inspect script's reply: the family (`''`, `mutex`, `election` or `rw`), holders as owner, kind,
/// token, lease ms; waiters as queue entry, priority.
pub(super) type Reply = (String, Vec<String>, Vec<String>);

/// One node's answer to the inspect script.
pub(super) struct NodeView {
    family: Option<Family>,
    /// Owner, kind, fencing token and lease left of each live holder there.
    holders: Vec<(String, LockKind, u64, Duration)>,
    /// Live waiters there: owner, kind and priority (the waiter's clock in µs when it first
    /// asked).
    waiting: Vec<(String, LockKind, u64)>,
}

fn kind_of(k: &str) -> LockKind {
    kind_of_code(k, 0).unwrap_or(LockKind::Exclusive)
}

impl NodeView {
    pub(super) fn parse((family, holders, waiting): Reply) -> Self {
        // Semaphores never reach a Redlock node: a mutex, an election, a read-write lock, or
        // nothing.
        let family = parse_family(&family).filter(|f| !matches!(f, Family::Semaphore { .. }));
        // A plain queue entry waits for a mutex, or for the lead of an election.
        let plain = match family {
            Some(Family::Election) => LockKind::Leader,
            _ => LockKind::Exclusive,
        };
        let holders = holders
            .chunks(4)
            .filter_map(|h| match h {
                [owner, kind, fence, left] => Some((
                    owner.clone(),
                    kind_of(kind),
                    fence.parse().unwrap_or(0),
                    Duration::from_millis(left.parse().unwrap_or(0)),
                )),
                _ => None,
            })
            .collect();
        let waiting = waiting
            .chunks(2)
            .filter_map(|pair| {
                let [entry, score] = pair else { return None };
                // Scores come back as decimal numbers; priorities are integers below 2^53.
                let priority = score.parse::<f64>().ok()? as u64;
                Some(match entry.split_once(':') {
                    Some((kind, owner)) => (owner.to_owned(), kind_of(kind), priority),
                    None => (entry.clone(), plain, priority),
                })
            })
            .collect();
        Self {
            family,
            holders,
            waiting,
        }
    }
}

/// Merges the views of the nodes that answered (each with when it was asked): holders are the
/// claims that hold at least `quorum` of them, each with the largest token among them and the
/// lease its majority keeps; waiters are every live claim queued on any node, by priority.
pub(super) fn merge(key: &str, quorum: usize, views: Vec<(NodeView, Instant)>) -> Inspection {
    let mut holds: BTreeMap<String, (LockKind, u64, Vec<Instant>)> = BTreeMap::new();
    let mut waiting: BTreeMap<String, (u64, LockKind)> = BTreeMap::new();
    let mut family = None;
    for (view, sent) in views {
        family = family.or(view.family);
        for (owner, kind, fence, left) in view.holders {
            let entry = holds.entry(owner).or_insert((kind, 0, Vec::new()));
            entry.1 = entry.1.max(fence);
            entry.2.push(sent + left);
        }
        for (owner, kind, priority) in view.waiting {
            let w = waiting.entry(owner).or_insert((priority, kind));
            w.0 = w.0.min(priority);
        }
    }
    let mut seen = Inspection::free(key);
    let now = Instant::now();
    for (owner, (kind, fence, deadlines)) in holds {
        let Some(until) = held_until(deadlines, quorum) else {
            continue;
        };
        waiting.remove(&owner);
        seen.holders.push(Holder {
            kind,
            fencing_token: Some(fence),
            lease_left: Some(until.saturating_duration_since(now)),
        });
    }
    let wall_us = wall_clock_us();
    let mut queued: Vec<(u64, LockKind)> = waiting.into_values().collect();
    queued.sort_by_key(|(priority, _)| *priority);
    for (priority, kind) in queued {
        seen.waiters.push(Waiter {
            kind,
            waited: Some(Duration::from_micros(wall_us.saturating_sub(priority))),
        });
    }
    if !seen.is_free() {
        seen.family = family;
    }
    seen
}

impl RedlockBackend {
    pub(super) async fn inspect_key(&self, namespace: &str, key: &str) -> Result<Inspection> {
        let keys = Keys::named(namespace, key, &self.inner.client_id, "");
        let inv = library::call(&Inspect(RedisInspect { keys: &keys }));
        let views = self.gather("inspect", &inv, |reply: Reply| reply).await?;
        Ok(merge(key, self.inner.quorum, views))
    }

    /// The operator's unlock on every node (`force_release.lua`, gated by each node's rejoin
    /// delay): each drops every holder there, keeps its fencing counter at their tokens at
    /// least (a quorum's token was settled on each node it held, so every later quorum's token
    /// is above it) and hands on. Reports the holders dropped from a majority of the nodes.
    pub(super) async fn force_release_key(
        &self,
        namespace: &str,
        key: &str,
    ) -> Result<ForceReleased> {
        let keys = Keys::named(namespace, key, &self.inner.client_id, "");
        let inv = library::call(&ForceRelease {
            keys: &keys,
            handoff_ttl: self.inner.handoff_ttl,
            rejoin_ms: self.rejoin_ms(),
        });
        // Each node lists what it dropped as the inspect script lists holders.
        let dropped = |(family, removed): (String, Vec<String>)| (family, removed, Vec::new());
        let views = self.gather("force_release", &inv, dropped).await?;
        let seen = merge(key, self.inner.quorum, views);
        let mut out = ForceReleased::nothing(key);
        (out.family, out.removed) = (seen.family, seen.holders);
        Ok(out)
    }

    /// Runs `inv` on every node at once: the view of each node that answered (its reply as
    /// `reply` reads it), if a quorum did.
    async fn gather<R: FromRedisValue + Send>(
        &self,
        what: &str,
        inv: &Call<'_>,
        reply: impl Fn(R) -> Reply,
    ) -> Result<Vec<(NodeView, Instant)>> {
        let calls = self
            .inner
            .nodes
            .iter()
            .map(|node| node.call::<R>(what, inv));
        let (mut views, mut first_error) = (Vec::new(), None);
        for answer in join_all(calls).await {
            match answer {
                Ok((r, sent)) => views.push((NodeView::parse(reply(r)), sent)),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        if views.len() < self.inner.quorum {
            return Err(self.no_quorum_from(views.len(), what, first_error));
        }
        Ok(views)
    }
}
